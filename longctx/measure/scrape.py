"""The server's own /metrics through a load point: scraped at an interval, each sample with its GET's start and end.

Each engine's metric names (the adapter's metric_names: canonical name -> the sample names it may have)
are read from the Prometheus exposition; counts of requests and counters are summed over the server's
label sets, the others (token counts, fractions of the pool, replicated per rank) taken at their largest.
"""

from __future__ import annotations

import asyncio
import time

import httpx

# Canonical metrics summed over the server's label sets (requests, counters); the others (token counts,
# fractions of the pool) are replicated per rank and taken at their largest
SUMMED = ("running", "queued", "retracted_total", "preemptions_total", "gen_throughput")


def _sample(line: str) -> tuple[str, float] | None:
    """(name, value) of one exposition sample line `name{labels} value [timestamp]` (labels may hold quoted braces,
    spaces and escaped quotes); None for a line that is not one."""
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name, i, quoted = line[:brace], brace + 1, False
        while i < len(line):
            ch = line[i]
            if quoted and ch == "\\":
                i += 2
                continue
            if ch == '"':
                quoted = not quoted
            elif ch == "}" and not quoted:
                break
            i += 1
        rest = line[i + 1:].split()
    else:
        name, rest = line[:space] if space != -1 else line, line[space + 1:].split() if space != -1 else []
    if not rest:
        return None
    try:
        return name, float(rest[0])
    except ValueError:
        return None


def parse_metrics(text: str, names: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """The canonical metrics `names` finds in a Prometheus exposition (the first sample name found of each). Only the
    lines of the sample names wanted are parsed: a vLLM exposition is hundreds of kB, scraped every interval on the
    event loop that also times the requests (tests/test_load.py holds it to prometheus_client's parser)."""
    wanted = {n for candidates in names.values() for n in candidates}
    by_name: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        cut = min((i for i in (line.find("{"), line.find(" ")) if i != -1), default=len(line))
        if line[:cut] not in wanted:
            continue
        sample = _sample(line)
        if sample:
            by_name.setdefault(sample[0], []).append(sample[1])
    out = {}
    for canonical, candidates in names.items():
        found = next((by_name[n] for n in candidates if n in by_name), None)
        if found:
            out[canonical] = sum(found) if canonical in SUMMED else max(found)
    return out


class Scraper:
    """GET the server's metrics every interval_s while a point runs; samples at the midpoint of each GET, with the
    GET's start and end (the server's answer is from some moment between them). A server may render its /metrics
    on the event loop that streams its tokens and takes new requests (vLLM's API server: 0.3 to 0.5 s a GET on 2
    cores under load, and a closed loop of 2 then ran its requests one after another, their tokens held back until
    each GET was answered): the next GET waits at least (1 - MAX_SHARE) / MAX_SHARE times the last one's length,
    so that GETs hold the server at most MAX_SHARE of the time; `busy_share` says how much they did."""

    MAX_SHARE = 0.1

    def __init__(self, client: httpx.AsyncClient, url: str, names: dict, interval_s: float, t0: float):
        self.client, self.url, self.names, self.interval_s, self.t0 = client, url, names, interval_s, t0
        self.samples: list[list] = []
        self.error: str | None = None
        self._task: asyncio.Task | None = None
        self._busy_s = 0.0  # the GETs' lengths, summed

    async def _loop(self) -> None:
        while True:
            took = await self.sample()
            await asyncio.sleep(max(self.interval_s, took * (1 - self.MAX_SHARE) / self.MAX_SHARE))

    async def sample(self) -> float:
        """One GET and its sample; how long the GET took."""
        a = time.perf_counter()
        try:
            r = await self.client.get(self.url, timeout=max(5.0, 4 * self.interval_s))
        except httpx.HTTPError as exc:
            self.error = f"{self.url}: {type(exc).__name__}: {exc}"
            return time.perf_counter() - a
        b = time.perf_counter()
        self._busy_s += b - a
        if r.status_code != 200:
            self.error = f"{self.url} answered HTTP {r.status_code}"
            return b - a
        values = parse_metrics(r.text, self.names)
        if not values:
            self.error = f"{self.url} has none of {', '.join(sorted(self.names))}"
        # the server answered at some moment of the GET: its start and end kept beside the midpoint
        self.samples.append([round((a + b) / 2 - self.t0, 6), values, round(a - self.t0, 6), round(b - self.t0, 6)])
        return b - a

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> dict:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            await self.sample()  # the state once the point ended
        span = (self.samples[-1][3] if self.samples else 0.0) - (self.samples[0][2] if self.samples else 0.0)
        return {"path": self.url, "interval_s": self.interval_s, "samples": self.samples,
                "busy_share": round(self._busy_s / span, 4) if span > 0 else None,
                "names": {k: list(v) for k, v in self.names.items()}, "error": self.error}
