"""data/raw/<configuration>/load.json (longctx.measure's load workloads) -> three tables:

- data/load_requests.csv: one row per request of the closed- and open-loop workloads, failed ones too
  (a workload that failed before it sent anything is one failed row, index empty; a raw file that is
  missing or cannot be read is one failed row of its configuration, kind empty, with the reason).
  Beside the contract's columns, `itl_list_s` keeps the request's per-token gaps as a JSON list (a
  chunk's gap divided among the tokens it carries, as StreamRecord.summary gives them): the point's ITL
  percentiles are taken over every token gap of its requests (longctx.analysis.slo), and the request's
  own itl_p50/p99/max_s summarise the same list. The sweep's lone request sent just before and after a closed-
  or open-loop point (measure.loadrun.sweep_twins) is a row of kind `sweep_twin`, with the point's level and
  length, `twin_of` the point's kind and `twin` its side (before, after): no workload's figure counts it.
- data/load_interference.csv: one row per victim per trial of the interference probe. From the victim's
  event_times (offsets from the workload's t0, like the injected request's sent_s): its gaps are the times
  between token-carrying events; steady_itl_s the median of the gaps that ended before the injected
  request was sent; the window runs from that send to the injected request's first token plus one steady
  gap (window_s is the send -> first token part); worst_gap_s the largest gap overlapping the window;
  extra_s the sum over the gaps overlapping it of (gap - steady): the time the stream lost to the
  injection (a gap shorter than steady gives some back).
- data/load_metrics.csv: the server's /metrics samples, one row per (sample, name), and at each sample
  time what the client knows is resident (client_resident_low, client_resident_high, tokens: resident_bounds);
  and client_stall_s: each time the client's event loop woke over 20 ms late, the part of that it was kept off
  the CPUs (late minus its CPU time meanwhile), from the point's client_lag.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import write_atomic
from ..core.numbers import finite
from ..engines.base import arg_value
from .aggregate import read_raw

log = logging.getLogger("longctx.analysis.load")

FORMAT = "longctx.load/1"
REQUEST_COLUMNS = [
    "configuration", "kind", "level", "length", "index", "status", "reason", "scheduled_s", "sent_s",
    "schedule_lag_s", "ttft_s", "tpot_s", "itl_p50_s", "itl_p99_s", "itl_max_s", "e2e_s", "queue_s",
    "prompt_tokens", "completion_tokens", "output_tokens", "first_token_s", "last_token_s", "duration_s",
    "itl_list_s", "service_ttft_s", "service_e2e_s", "idle_s", "twin", "twin_of",
]
TWIN_KIND = "sweep_twin"  # the rows of the sweep's lone request sent beside a load point (measure.loadrun.sweep_twins)
INTERFERENCE_COLUMNS = [
    "configuration", "length", "background", "background_length", "chunked_prefill_size", "trial", "victim",
    "status", "reason", "steady_itl_s", "worst_gap_s", "extra_s", "window_s", "injected_ttft_s",
]
METRICS_COLUMNS = ["configuration", "kind", "level", "length", "trial", "t_s", "name", "value"]
CLIENT_LOW, CLIENT_HIGH = "client_resident_low", "client_resident_high"
CLIENT_STALL = "client_stall_s"  # the client's event loop late while this process got no CPU (measure.load._lag_watch)


def request_itl(r: dict) -> list[float]:
    """A request's per-token gaps: its itl_s where the client gave them, else from its events (a chunk's gap
    divided among the tokens it carries); none where its tokens did not arrive apart (longctx.measure.burst:
    the gaps are a buffer's, not the server's)."""
    if r.get("burst"):
        return []
    if isinstance(r.get("itl_s"), list):
        return [float(x) for x in r["itl_s"] if finite(x) is not None]
    t, n = r.get("event_times") or [], r.get("event_tokens") or []
    out: list[float] = []
    for i in range(1, min(len(t), len(n))):
        k = int(n[i] or 0)
        out += [(t[i] - t[i - 1]) / k] * k if k > 0 else []
    return out


def first_token_s(r: dict) -> float | None:
    """The offset from t0 of a request's first token: its first event, else sent_s + ttft_s."""
    t = r.get("event_times") or []
    if t:
        return float(t[0])
    sent, ttft = finite(r.get("sent_s")), finite(r.get("ttft_s"))
    return sent + ttft if sent is not None and ttft is not None else None


def page_size(provenance: dict) -> int:
    """The KV page (block) size the server ran with: its args, else the block size the adapter recorded with
    the pool's budget (vLLM's: its platform's default where no flag sets it), else its info; 1 where none says."""
    value = arg_value(provenance.get("args") or {}, "page-size", "block-size")
    if value is None:
        value = (((provenance.get("kv_pool") or {}).get("budget")) or {}).get("block_size")
    if value is None:
        value = (provenance.get("server_info") or {}).get("page_size")
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def _level(w: dict):
    """A point's level: its concurrency (closed) or rate (open), the background streams (interference); a
    point the runner could not measure says only `level`."""
    key = {"closed": "concurrency", "open": "rate", "interference": "background"}.get(w.get("kind"))
    return w.get(key) if w.get(key) is not None else None if w.get("kind") == "interference" else w.get("level")


def _request_row(base: dict, r: dict) -> dict:
    itl = request_itl(r)
    last = (r.get("event_times") or [None])[-1]
    row = {**base, **{k: r.get(k) for k in ("index", "scheduled_s", "sent_s", "schedule_lag_s", "ttft_s", "tpot_s",
                                               "e2e_s", "queue_s", "prompt_tokens", "completion_tokens", "idle_s")},
           "status": r.get("status") or "failed", "reason": r.get("reason"),
           "first_token_s": first_token_s(r), "last_token_s": last,
           "service_ttft_s": r.get("ttft_s"), "service_e2e_s": r.get("e2e_s")}
    lag = finite(r.get("schedule_lag_s"))
    if base.get("kind") == "open" and lag is not None and lag > 0:
        # an open loop's user waits from the scheduled arrival, not from the send: a send that left late (the client
        # or the machine busy) is the user's wait too. ttft_s and e2e_s (what the percentiles, SLOs and goodput read)
        # run from the scheduled time; service_ttft_s and service_e2e_s keep the server's share, from the send
        row.update(ttft_s=finite(r.get("ttft_s")) + lag if finite(r.get("ttft_s")) is not None else None,
                   e2e_s=finite(r.get("e2e_s")) + lag if finite(r.get("e2e_s")) is not None else None)
    if itl:
        # itl_max_s, what the ITL SLO holds a request to: the largest wait between two of its events, as its user
        # waited (a chunk's gap is not divided among the tokens it carries)
        t = [x for x in (finite(v) for v in r.get("event_times") or []) if x is not None]
        waits = [b - a for a, b in zip(t, t[1:])]
        row.update(itl_p50_s=float(np.quantile(itl, 0.5)), itl_p99_s=float(np.quantile(itl, 0.99)),
                   itl_max_s=max(waits) if waits else max(itl), itl_list_s=json.dumps(itl))
    return row


def _span(w: dict, requests: list[dict]) -> float | None:
    """The point's span: the workload's duration_s, else from t0 to its last request's end."""
    d = finite(w.get("duration_s"))
    if d is not None:
        return d
    ends = [x for r in requests for x in [_end(r)] if x is not None]
    return max(ends) if ends else None


def _end(r: dict) -> float | None:
    """When a request's stream ended (offset from t0): sent_s + e2e_s, else its last event."""
    sent, e2e = finite(r.get("sent_s")), finite(r.get("e2e_s"))
    if sent is not None and e2e is not None:
        return sent + e2e
    t = r.get("event_times") or []
    return float(t[-1]) if t else None


def resident_bounds(requests: list[dict], t: float, page: int, prompt_default: int | None = None,
                    horizon: float | None = None) -> tuple[int, int]:
    """What the client knows of the tokens resident in the server's KV pool at time t (offset from t0), as
    (low, high), each request rounded up to the page size:

    - a request that has its first token and not its last: at least prompt_tokens + the tokens received
      so far - 1 (the last token received has its KV written at the next step), at most prompt_tokens +
      received + one step's tokens (the server allocates the step it is computing before the client sees
      it; a step's tokens: the request's largest event);
    - one sent without a first token yet: at most its prompt + one step (nothing at least: it may still
      wait in the queue); a failed one without events until its stream ended, else until horizon;
    - one whose last token came: at most its prompt and tokens until its stream ended; one the client
      ended itself (ended_by_client: an interference stream) at most that for good, the client does not
      know when the server noticed.
    The reference engine showed each of the three margins (a slot allocated before the first token
    arrives; a first token counted before its KV is; a cancelled stream held after the client left)."""

    def pages(n: float) -> int:
        return int(math.ceil(max(n, 0) / page) * page)

    low = high = 0
    for r in requests:
        sent = finite(r.get("sent_s"))
        if sent is None or t < sent:
            continue
        prompt = finite(r.get("prompt_tokens"))
        prompt = prompt if prompt is not None else (prompt_default or 0)
        times, tokens = r.get("event_times") or [], [int(k or 0) for k in r.get("event_tokens") or []]
        step = max(tokens, default=1) or 1
        end = _end(r)
        if times and times[0] <= t:
            got = sum(k for x, k in zip(times, tokens) if x <= t)
            if t < times[-1]:
                low += pages(prompt + got - 1)
                high += pages(prompt + got + step)
            elif r.get("ended_by_client") or (end is not None and t < end):
                high += pages(prompt + got)
        elif times or t < (end if end is not None else horizon if horizon is not None else math.inf):
            high += pages(prompt + step)
    return low, high


def _get_span(sample, t: float) -> tuple[float, float]:
    """The GET's start and end of a metrics sample (a file written before they were kept: its midpoint alone)."""
    try:
        a, b = float(sample[2]), float(sample[3])
    except (TypeError, ValueError, IndexError):
        return t, t
    return (a, b) if a <= t <= b else (t, t)


def resident_span_bounds(requests: list[dict], span: tuple[float, float], page: int, prompt_default: int | None = None,
                         horizon: float | None = None) -> tuple[int, int]:
    """resident_bounds over a stretch of time (a, b): the lowest low and the highest high in it, for a server that
    answered at some moment of it (a /metrics GET's start and end; slow GETs, seconds long on a busy 2-core machine,
    made a midpoint's bounds flag a gauge read at another moment). The bounds change only at the requests' sent,
    event and end times: they are read at a, b and on both sides of each such time between them."""
    a, b = span
    if b <= a:
        return resident_bounds(requests, a, page, prompt_default, horizon)
    marks = set()
    for r in requests:
        for x in [r.get("sent_s"), _end(r), *(r.get("event_times") or [])]:
            x = finite(x)
            if x is not None and a < x < b:
                marks.update((x, math.nextafter(x, -math.inf)))
    pairs = [resident_bounds(requests, t, page, prompt_default, horizon) for t in sorted({a, b, *marks})]
    return min(p[0] for p in pairs), max(p[1] for p in pairs)


def _metric_rows(base: dict, w: dict, requests: list[dict], page: int, prompt_default: int | None) -> list[dict]:
    m = w.get("metrics") or {}
    if m.get("error"):
        log.warning("%s %s %s: /metrics: %s", base["configuration"], base["kind"], base["length"], m["error"])
    rows = []
    horizon = _span(w, requests)
    for sample in m.get("samples") or []:
        try:
            t, values = float(sample[0]), dict(sample[1])
        except (TypeError, ValueError, IndexError):
            continue
        rows += [{**base, "t_s": t, "name": k, "value": finite(v)} for k, v in sorted(values.items())]
        low, high = resident_span_bounds(requests, _get_span(sample, t), page, prompt_default, horizon)
        rows += [{**base, "t_s": t, "name": CLIENT_LOW, "value": low}, {**base, "t_s": t, "name": CLIENT_HIGH, "value": high}]
    for lag in w.get("client_lag") or []:  # [t, late, CPU meanwhile]: the part of the lateness the client did not use
        try:
            t, late, cpu = (float(x) for x in lag[:3])
        except (TypeError, ValueError):
            continue
        rows.append({**base, "t_s": t, "name": CLIENT_STALL, "value": max(0.0, late - cpu)})
    return rows


def victim_figures(victim: dict, sent: float, first: float) -> dict:
    """steady_itl_s, worst_gap_s, extra_s of one victim stream against an injected request sent at `sent`
    whose first token came at `first` (offsets from t0, as the victim's event_times); status and reason say
    why a figure is missing."""
    t = [float(x) for x in victim.get("event_times") or []]
    gaps = [(t[i - 1], t[i]) for i in range(1, len(t))]
    before = [b - a for a, b in gaps if b <= sent]
    if not before:
        return {"status": "failed", "reason": "no gap of this victim ended before the injected request was sent"}
    steady = float(np.median(before))
    w0, w1 = sent, first + steady
    inside = [b - a for a, b in gaps if b > w0 and a < w1]
    if not inside:
        return {"status": "failed", "reason": "this victim had no gap overlapping the injection's window",
                "steady_itl_s": steady}
    return {"status": "ok", "reason": None, "steady_itl_s": steady, "worst_gap_s": max(inside),
            "extra_s": float(sum(g - steady for g in inside))}


def _interference_rows(base: dict, w: dict) -> list[dict]:
    base = {**base, **{k: w.get(k) for k in ("length", "background", "background_length", "chunked_prefill_size")},
            "trial": w.get("trial", w.get("level"))}  # a point not measured names its trial `level`
    inj = w.get("injected") or {}
    victims = w.get("victims") or []
    if not victims:
        return [{**base, "status": "failed", "reason": w.get("reason") or "no victim streams were recorded"}]
    sent, first = finite(inj.get("sent_s")), first_token_s(inj)
    rows = []
    for i, v in enumerate(victims):
        row = {**base, "victim": v.get("victim", v.get("index", i)), "injected_ttft_s": finite(inj.get("ttft_s")),
               "window_s": first - sent if sent is not None and first is not None else None}
        if (v.get("status") or "failed") != "ok":
            row.update(status="failed", reason=v.get("reason") or "the victim failed")
        elif sent is None or first is None:
            row.update(status="failed", reason=f"the injected request has no first token ({inj.get('reason') or inj.get('status')})")
        else:
            row.update(victim_figures(v, sent, first))
        rows.append(row)
    return rows


def raw_rows(path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(request rows, interference rows, metrics rows) of one raw load file."""
    configuration = path.parent.name
    raw, problem = read_raw(path)
    if raw is not None and raw.get("format") != FORMAT:
        raw, problem = None, f"not a {FORMAT} file (format {raw.get('format')!r})"
    if raw is None:
        return [{"configuration": configuration, "status": "failed", "reason": f"unreadable raw file {path} ({problem})"}], [], []
    configuration = raw.get("configuration") or configuration
    workloads = raw.get("workloads") or []
    if not workloads and raw.get("status") == "not configured":  # no load workloads for this configuration
        return [], [], []
    if not workloads:
        return [{"configuration": configuration, "status": raw.get("status") or "failed",
                 "reason": raw.get("reason") or "no workload was run"}], [], []
    page = page_size(raw.get("provenance") or {})
    requests, interference, metrics = [], [], []
    for w in workloads:
        kind = w.get("kind")
        base = {"configuration": configuration, "kind": kind, "level": _level(w), "length": w.get("length")}
        if kind == "interference":
            interference += _interference_rows({"configuration": configuration}, w)
            streams = [x for x in [w.get("injected")] if x] + list(w.get("victims") or [])
            metrics += _metric_rows({**base, "trial": w.get("trial", w.get("level"))}, w, streams, page, None)
            continue
        rs = w.get("requests") or []
        point = {**base, "output_tokens": w.get("output_tokens"), "duration_s": _span(w, rs)}
        if not rs:
            requests.append({**point, "status": "failed", "reason": w.get("reason") or "the workload sent no request"})
        for r in rs:  # the wake probe's level is each request's idle gap as asked (its idle_s: as measured)
            requests.append(_request_row({**point, "level": r.get("gap_s")} if kind == "wake" else point, r))
        metrics += _metric_rows({**base, "trial": None}, w, rs, page, w.get("length"))
        for r in w.get("sweep_twins") or []:  # level and length: those of the point they were sent beside (twin_of)
            requests.append(_request_row({**base, "kind": TWIN_KIND, "twin_of": kind,
                                          "output_tokens": r.get("completion_tokens"), "twin": r.get("twin")}, r))
    return requests, interference, metrics


def aggregate_load(raw_files: list[str | Path], out_requests: str | Path, out_interference: str | Path,
                   out_metrics: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    req, inter, met = [], [], []
    for path in sorted(map(Path, raw_files), key=lambda p: (p.parent.name, p.name)):
        r, i, m = raw_rows(path)
        req, inter, met = req + r, inter + i, met + m
    frames = (pd.DataFrame(req, columns=REQUEST_COLUMNS), pd.DataFrame(inter, columns=INTERFERENCE_COLUMNS),
              pd.DataFrame(met, columns=METRICS_COLUMNS))
    for df, out in zip(frames, (out_requests, out_interference, out_metrics)):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, df.to_csv(index=False))
    return frames
