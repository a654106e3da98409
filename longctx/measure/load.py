"""Workloads under load, in the sweep's server bring-up: closed loop, open loop, interference.

Every request keeps the sweep's guarantees: exactly L prompt tokens as the server counts them
(the same Prompter), a prefix unique to it, times taken at the socket (the asyncio client of
longctx.measure.transport), a failure kept as a request with its reason. All requests of a workload
point run on one event loop, so the client sends and reads many streams at once without threads.

- closed loop: c requests in flight; as one ends the next is sent, until `requests` are done (or
  duration_s has passed: what was not sent by then is not a request of the point).
- open loop: requests sent at the times of a seeded arrival schedule (Poisson, or gamma gaps with
  a coefficient of variation `burstiness`) whatever the server does; each request's schedule lag
  (its first byte written minus its scheduled time) is recorded, so that a client that could not
  keep up shows as lag instead of hiding latency (coordinated omission). The bodies are built
  before the schedule starts.
- wake (longctx.measure.wake): single requests after set idle gaps, before the open loops.
- interference: `background` streams decode at background_length tokens; once each has decoded
  steady_tokens, one prompt of L tokens is sent; once its first token came and each stream decoded
  tail_tokens more, the streams are ended by the client (their events kept). The analysis reads
  the streams' gaps around the injected prefill from the event times recorded here.

The server's /metrics (the adapter's canonical names) is scraped through every point, on the
same clock as the requests' events: every time in a point is an offset from its t0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

import httpx
import numpy as np

from ..engines import EngineAdapter
from .stream import DONE_MARK, StreamRecord
from .transport import async_timed_client
from .handover import HELD_CLOSED, SEND_AT, EndWatcher, Gate
from .prompts import Prompter, check_counts
from .scrape import Scraper

log = logging.getLogger("longctx.measure.load")
# Open loop: the schedule starts this long after its bodies are built; each request is started SEND_AHEAD_S
# before its time (built, its connection taken) and its first byte held until then (handover.SEND_AT)
LEAD_S = 0.05
SEND_AHEAD_S = 0.025
# Interference: background streams decode at most this many tokens where no prediction of the window exists
BACKGROUND_TOKENS = 1024


def arrival_schedule(rate: float, n: int, arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """n send times (s from the start, the first at 0) of arrivals at `rate` per second: exponential gaps
    (poisson), or gamma gaps with mean 1/rate and coefficient of variation `burstiness` (gamma)."""
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif arrival == "gamma":
        shape = 1.0 / burstiness**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    else:
        raise ValueError(f"arrival {arrival!r}: allowed values: poisson, gamma")
    return [0.0] + np.cumsum(gaps[: n - 1]).round(9).tolist()


@dataclass
class LoadContext:
    """What every workload point needs: the client, the server's paths, the prompts, the settings."""

    client: httpx.AsyncClient
    base: str
    generate_path: str
    prompter: Prompter
    adapter: EngineAdapter
    key: str  # the run's unique-prefix key (run id / configuration)
    load: dict  # config key load
    timeout_s: Callable[[int, int], float]  # (prompt tokens, requests in flight at most) -> a request's timeout
    flush: Callable[[], "asyncio.Future | None"] | None = None
    warm_path: str | None = None  # a cheap GET (the health path) sent before an open loop's schedule starts

    def scraper(self, t0: float) -> Scraper | None:
        m = self.load["metrics"]
        if not m["enabled"] or not self.adapter.metric_names:
            return None
        return Scraper(self.client, self.base + self.adapter.metrics_path, self.adapter.metric_names, m["interval_s"], t0)


async def send_request(ctx: LoadContext, body: bytes, length: int, output_tokens: int, t0: float, timeout_s: float,
                       record: StreamRecord | None = None, keep_on_cancel: bool = False, **extra) -> dict:
    """One request: its summary (prompt count checked) with its times as offsets from t0 and its events."""
    rec = record if record is not None else StreamRecord()
    cancelled = False
    try:
        summary = await ctx.prompter.agenerate(ctx.client, ctx.base + ctx.generate_path, body, timeout_s, length, record=rec)
    except asyncio.CancelledError:
        if not keep_on_cancel:
            raise
        cancelled = True  # the client ended it (an interference stream): what arrived is kept
        summary = rec.summary()
    check_counts(summary, length, output_tokens)
    if cancelled:
        summary["early_stop"] = False
    summary.update(extra, timeout_s=timeout_s, sent_s=round(rec.t_sent - t0, 6) if rec.t_sent else None,
                   event_times=[round(t - t0, 6) for t in rec.event_times], event_tokens=list(rec.event_tokens),
                   queue_s=queue_time(summary.get("server_timestamps")), ended_by_client=cancelled)
    if cancelled and rec.event_times:  # ended on purpose: not a failure of the server
        summary.update(status="ok", reason=None)
    for k in ("t_sent", "t_first_token", "t_last_token"):
        if summary.get(k) is not None:
            summary[k.replace("t_", "", 1) + "_s"] = round(summary.pop(k) - t0, 6)
    return summary


def queue_time(ts: dict | None) -> float | None:
    """Time the request waited before the server scheduled it, where its timestamps say (received, scheduled)."""
    if ts and ts.get("scheduled") is not None and ts.get("received") is not None:
        return ts["scheduled"] - ts["received"]
    return None


def point_status(requests: list[dict]) -> tuple[str, str | None]:
    bad = [r for r in requests if r["status"] != "ok"]
    status = "ok" if not bad else ("partial" if len(bad) < len(requests) else "failed")
    reasons = sorted({r["reason"] or "failed" for r in bad})
    return status, "; ".join(f"{sum((r['reason'] or 'failed') == why for r in bad)} of {len(requests)}: {why}"
                             for why in reasons) or None


async def _with_scrape(ctx: LoadContext, t0: float, work) -> tuple[object, dict | None, list]:
    """A point's work with the server's /metrics scraped through it, the event loop's own lateness watched
    (_lag_watch), and Python's cyclic garbage collector held off until it ends: a collection stops the event loop
    for its whole length (a gen-2 pass over the run's objects took 25-35 ms of this process's CPU here, beside 2-4 ms
    ones), so a send due meanwhile would go late; a point's requests make few cycles, and they are collected once it
    ends. Returns (the work's result, the scrape's record, the loop's lateness)."""
    scraper = ctx.scraper(t0)
    if scraper is not None:
        scraper.start()
    lags: list[list[float]] = []
    watch = asyncio.create_task(_lag_watch(t0, lags))
    collecting = gc.isenabled()
    gc.freeze()  # what exists already is not traversed again (unfrozen, and collected as usual, after the point)
    gc.disable()
    try:
        result = await work
    finally:
        if collecting:
            gc.enable()
        gc.unfreeze()
        watch.cancel()
        metrics = await scraper.stop() if scraper is not None else None
    return result, metrics, lags


LAG_TICK_S, LAG_MIN_S = 0.005, 0.02


async def _lag_watch(t0: float, out: list) -> None:
    """Wakes every LAG_TICK_S and notes each wake-up later than LAG_MIN_S: [t (from t0), how late, this process's
    CPU time meanwhile] (late with little CPU: the machine kept the client off its CPUs; with as much CPU: the client
    was busy). Sends and reads due in such a stretch went late by as much."""
    while True:
        a, cpu = time.perf_counter(), time.process_time()
        await asyncio.sleep(LAG_TICK_S)
        late = time.perf_counter() - a - LAG_TICK_S
        if late > LAG_MIN_S:
            out.append([round(a - t0, 6), round(late, 6), round(time.process_time() - cpu, 6)])


async def closed_loop(ctx: LoadContext, length: int, concurrency: int) -> dict:
    """`concurrency` workers, each sending its next request as its last one ends. The next request is built,
    connected and held (handover.Gate) once the one before it has half its tokens, and it is written as soon as the
    [DONE] of the one before reaches the socket, by a thread that watches for it (handover.EndWatcher) or by the
    read that meets it, whichever comes first: a slot is refilled in tens of microseconds, not after the event
    loop has parsed the ended request and set up the next one (2 ms median here; 64 streams that end together
    left the loop 40 ms behind, and the slots empty meanwhile). A held request whose connection the server
    closed meanwhile is sent again, unheld."""
    cfg, n_out = ctx.load["closed"], ctx.load["output_tokens"]
    n, duration = cfg["requests"], cfg["duration_s"]
    bodies = [ctx.prompter.body(length, f"{ctx.key}/closed/c{concurrency}/L{length}/{i}", n_out) for i in range(n)]
    timeout = ctx.timeout_s(length, concurrency)
    results: list[dict | None] = [None] * n
    state = {"next": 0}
    await warm(ctx)
    t0 = time.perf_counter()

    def take() -> int | None:
        if state["next"] >= n or (duration is not None and time.perf_counter() - t0 >= duration):
            return None
        state["next"] += 1
        return state["next"] - 1

    async def worker() -> None:
        queue: list[tuple[int, Gate, asyncio.Task]] = []  # this worker's request in flight, then the one armed after it

        def start(i: int, hold: Gate | None) -> tuple[int, Gate, asyncio.Task]:
            ends = Gate()

            def arm() -> None:
                j = take()
                if j is not None:
                    queue.append(start(j, ends))
                    if rec.wire is not None:
                        watcher.watch(rec.wire, ends)

            rec = StreamRecord(ends=ends, arm=(max(1, n_out // 2), arm))
            return i, ends, asyncio.create_task(_send_at(hold, ctx, bodies[i], length, n_out, t0, timeout, record=rec,
                                                         index=i))

        first = take()
        if first is None:
            return
        queue.append(start(first, None))
        try:
            while queue:
                i, ends, task = queue[0]
                result = await task
                queue.pop(0)
                if HELD_CLOSED in (result.get("reason") or ""):  # its connection went stale while it was held
                    queue.insert(0, start(i, None))
                    continue
                results[i] = result
                ends.open()  # a request that ended without [DONE] (an error): the one armed after it goes now
                if not queue and (j := take()) is not None:  # none armed (it ended before its last tokens)
                    queue.append(start(j, None))
        finally:
            for _, _, task in queue:
                task.cancel()

    with EndWatcher(DONE_MARK) as watcher:
        _, metrics, lags = await _with_scrape(ctx, t0, asyncio.gather(*(worker() for _ in range(concurrency))))
    requests = [r for r in results if r is not None]
    status, reason = point_status(requests)
    return {"kind": "closed", "length": length, "output_tokens": n_out, "concurrency": concurrency,
            "status": status, "reason": reason, "t0": t0, "duration_s": round(time.perf_counter() - t0, 6),
            "requests": requests, "metrics": metrics, "client_lag": lags}


async def warm(ctx: LoadContext) -> None:
    """The client's first request pays its one-off costs (38 ms here): a GET of the health path before a point."""
    if ctx.warm_path:
        try:
            await ctx.client.get(ctx.base + ctx.warm_path, timeout=10)
        except httpx.HTTPError:
            pass


async def _send_at(at: float | Gate | None, ctx: LoadContext, *args, **kwargs) -> dict:
    """send_request with its first byte held until `at` (handover.SEND_AT: a time, or a Gate's opening): built and
    connected beforehand (its send_setup_s then counts from that early start, the hold included)."""
    SEND_AT.set(at)
    return await send_request(ctx, *args, **kwargs)


async def open_loop(ctx: LoadContext, length: int, rate: float) -> dict:
    cfg, n_out = ctx.load["open"], ctx.load["output_tokens"]
    n = cfg["requests"]
    schedule = arrival_schedule(rate, n, cfg["arrival"], cfg["burstiness"], cfg["seed"])
    bodies = [ctx.prompter.body(length, f"{ctx.key}/open/r{rate:g}/L{length}/{i}", n_out) for i in range(n)]
    timeout = ctx.timeout_s(length, n)
    await warm(ctx)
    t0 = time.perf_counter() + LEAD_S

    async def send_all() -> list[dict]:
        tasks = []
        for i, at in enumerate(schedule):  # each started SEND_AHEAD_S early, its first byte held until its time
            await asyncio.sleep(max(0.0, t0 + at - SEND_AHEAD_S - time.perf_counter()))
            tasks.append(asyncio.create_task(_send_at(t0 + at, ctx, bodies[i], length, n_out, t0, timeout, index=i,
                                                      scheduled_s=at)))
        return list(await asyncio.gather(*tasks))

    requests, metrics, lags = await _with_scrape(ctx, t0, send_all())
    for r in requests:
        r["schedule_lag_s"] = round(r["sent_s"] - r["scheduled_s"], 6) if r.get("sent_s") is not None else None
    status, reason = point_status(requests)
    return {"kind": "open", "length": length, "output_tokens": n_out, "rate": rate, "arrival": cfg["arrival"],
            "burstiness": cfg["burstiness"], "seed": cfg["seed"], "status": status, "reason": reason, "t0": t0,
            "duration_s": round(time.perf_counter() - t0, 6), "requests": requests, "metrics": metrics, "client_lag": lags}


def background_tokens(cfg: dict, predict: Callable[[int], tuple[float, float] | None], length: int, limit: int | None) -> int:
    """Tokens each interference stream may decode: its steady and tail tokens, and enough to keep decoding
    through three times the injected prefill's predicted time at the stream's own TPOT (where the engine
    decodes beside a prefill), at most `limit` (the context or pool left beside its prompt)."""
    base = cfg["steady_tokens"] + cfg["tail_tokens"] + 16
    injected, stream = predict(length), predict(cfg["background_length"])
    extra = BACKGROUND_TOKENS
    if injected and stream and stream[1] > 0:
        extra = math.ceil(3 * injected[0] / stream[1])
    n = base + extra
    return max(base, min(n, limit)) if limit else n


async def interference(ctx: LoadContext, length: int, trial: int, chunk: int | None, bg_tokens: int) -> dict:
    cfg = ctx.load["interference"]
    b, lb = cfg["background"], cfg["background_length"]
    t0 = time.perf_counter()
    bodies = [ctx.prompter.body(lb, f"{ctx.key}/interference/L{length}/{trial}/bg{j}", bg_tokens) for j in range(b)]
    injected_body = ctx.prompter.body(length, f"{ctx.key}/interference/L{length}/{trial}/injected", 2)
    timeout = ctx.timeout_s(max(length, lb), b + 1) + ctx.timeout_s(lb, b + 1)
    records = [StreamRecord() for _ in range(b)]

    def tokens(rec: StreamRecord, after: float | None = None) -> int:
        return sum(n for t, n in zip(rec.event_times, rec.event_tokens) if after is None or t > after)

    async def wait_for(cond, tasks) -> bool:
        deadline = time.perf_counter() + timeout
        while not cond():
            if all(t.done() for t in tasks) or time.perf_counter() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def run() -> tuple[list[dict], dict | None, str | None]:
        tasks = [asyncio.create_task(send_request(ctx, body, lb, bg_tokens, t0, timeout, record=rec, keep_on_cancel=True,
                                                  victim=j))
                 for j, (body, rec) in enumerate(zip(bodies, records))]
        problem, injected = None, None
        if await wait_for(lambda: all(tokens(r) >= cfg["steady_tokens"] for r in records), tasks):
            injected = await send_request(ctx, injected_body, length, 2, t0, timeout, role="injected")
            first = injected.get("first_token_s")
            if first is not None:
                after = t0 + first
                if not await wait_for(lambda: all(tokens(r, after) >= cfg["tail_tokens"] for r in records), tasks):
                    problem = "a background stream ended before it decoded tail_tokens after the injected prefill"
        else:
            problem = "the background streams did not all reach steady_tokens"
        for t in tasks:
            t.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        victims = [v if isinstance(v, dict) else {**rec.summary(), "victim": j, "status": "failed",
                                                  "reason": f"the stream was not sent ({type(v).__name__})"}
                   for j, (v, rec) in enumerate(zip(ended, records))]
        return victims, injected, problem

    (victims, injected, problem), metrics, lags = await _with_scrape(ctx, t0, run())
    parts = victims + ([injected] if injected else [])
    status, reason = point_status(parts)
    if problem:
        status, reason = ("failed", "; ".join(filter(None, [problem, reason])))
    return {"kind": "interference", "length": length, "trial": trial, "background": b, "background_length": lb,
            "background_tokens": bg_tokens, "chunked_prefill_size": chunk, "status": status, "reason": reason,
            "t0": t0, "duration_s": round(time.perf_counter() - t0, 6), "injected": injected, "victims": victims,
            "metrics": metrics, "client_lag": lags}


async def run_point(ctx: LoadContext, kind: str, length: int, level: float, chunk: int | None = None,
                    bg_tokens: int = BACKGROUND_TOKENS) -> dict:
    if ctx.flush is not None:
        await ctx.flush()
    if kind == "closed":
        return await closed_loop(ctx, length, int(level))
    if kind == "open":
        return await open_loop(ctx, length, float(level))
    return await interference(ctx, length, int(level), chunk, bg_tokens)


def describe(point: dict) -> str:
    """A point in one progress line: what, its status, median TTFT of its requests."""
    kind, L = point["kind"], point["length"]
    what = {"closed": f"{point.get('concurrency')} in flight", "open": f"{point.get('rate', 0):g}/s arrivals",
            "interference": f"injected into {point.get('background')} streams (trial {point.get('trial', 0) + 1})",
            "wake": "single requests after the server idled"}[kind]
    reqs = point.get("requests") or ([point["injected"]] if point.get("injected") else [])
    ttfts = sorted(r["ttft_s"] for r in reqs if r.get("status") == "ok" and r.get("ttft_s") is not None)
    line = f"load {kind} L={L} {what}: {point['status']}"
    if ttfts:
        line += f", median TTFT {ttfts[len(ttfts) // 2]:.3f} s"
    return line + (f" ({point['reason'][:200]})" if point.get("reason") else "")


def new_client(headers: dict | None = None) -> httpx.AsyncClient:
    """The load workloads' client: socket-timed, a connection per request, as many at once as are sent;
    headers (the server's API key) go with every request."""
    return async_timed_client(headers=headers)


LEVEL_KEYS = {"closed": "concurrency", "open": "rate", "interference": "trial", "wake": "level"}


def point_key(point: dict) -> tuple[str, int, float]:
    return point["kind"], point["length"], point[LEVEL_KEYS[point["kind"]]]


def failed_point(kind: str, length: int, level: float, reason: str, **extra) -> dict:
    """A point that was not measured, or whose measurement raised: a row with its reason all the same."""
    return {"kind": kind, "length": length, LEVEL_KEYS[kind]: level, "status": "failed", "reason": reason,
            "requests": [], **extra}
