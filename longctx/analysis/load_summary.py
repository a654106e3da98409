"""The load workloads' tables (longctx.analysis.load) -> data/load.json: per configuration, per workload
point its distributions, throughput and goodput (longctx.analysis.slo); the interference probe's stalls
and their fit; the server's KV gauge against what the client knows is resident; and the SLO frontier
(longctx.analysis.slo).

- Distributions: p50, p90 and p99 (numpy's linear quantiles) over the successful requests of a point, each
  only where the point has enough values for it (MIN_SAMPLES: 1 / (1 - q), so that the quantile is not the
  maximum: 10 for p90, 100 for p99); with fewer the record holds the maximum and n instead ("max of n").
  Each quantile's interval is the exact distribution-free one of two order statistics (order_statistic_interval:
  its coverage, at least fits.json's confidence for any continuous distribution, is recorded with it), or none
  where n is too small for one. TTFT, TPOT, end-to-end, queue (where the server reported it) and schedule lag
  are one value per request; ITL is taken over every token gap of the point's requests (load_requests.csv's
  itl_list_s): a request's gaps are not independent of each other, so its quantiles have no interval.
- Throughput over the point's span (duration_s): output tokens of the successful requests per second, and
  successful requests per second.
- Interference: per injected length, the medians (bootstrap intervals) of the victims' worst gap and
  extra time; the stall fit is extra = a + k ceil(L / chunk) where the probe ran with a chunked-prefill
  size (basis "chunks": k, per_chunk_s, is the time per chunk), else extra = a + b L (basis "linear":
  per_token_s); ordinary least squares over the victims, the slope's interval from a pairs bootstrap.
- KV reconciliation: the server's tokens (used_tokens, else token_usage x pool_tokens) at each sample
  against the client's [low, high] (longctx.analysis.load.resident_bounds); a sample outside
  [low (1 - margin), high (1 + margin)] is flagged with both.
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from ..core.errors import write_atomic
from ..core.fitting import percentile_interval, resamples
from ..core.numbers import finite, json_plain
from ..specs.pool import observed_pool
from .fits import bootstrap_settings
from .load import CLIENT_HIGH, CLIENT_LOW, INTERFERENCE_COLUMNS, METRICS_COLUMNS, REQUEST_COLUMNS, TWIN_KIND
from .memory import adapter_of
from .slo import DEFAULT_SLO, frontier, goodput
from .tables import failure_reasons

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
MEDIAN = {"p50": 0.5}

FIGURES = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "queue": "queue_s", "schedule_lag": "schedule_lag_s"}

DEFAULT_MARGIN = 0.1


def rng_for(seed: int, *keys) -> np.random.Generator:
    """A generator of its own per figure: an interval does not depend on what else was measured."""
    return np.random.default_rng([int(seed), *(zlib.crc32(str(k).encode()) for k in keys)])


def min_samples(q: float) -> int:
    """The fewest values a quantile q is reported from: 1 / (1 - q) (10 for p90, 100 for p99), below which the
    quantile is the sample's maximum; 1 for the median and below."""
    return 1 if q <= 0.5 else int(math.ceil(1 / (1 - q) - 1e-9))


def order_statistic_interval(values, q: float, level: float) -> tuple[float, float, float] | None:
    """The exact distribution-free interval of the q quantile: [X(j), X(k)] of the sorted values, with j the largest
    and k the smallest order (1-based) that leave at most (1 - level) / 2 on each side by the binomial law of the count
    of values below the quantile; (low, high, coverage), the coverage P(j <= B < k), B ~ Binomial(n, q), at least
    `level` for any continuous distribution. None where n is too small for either end."""
    v = np.sort(np.asarray(values, float))
    orders = _orders(int(v.size), float(q), float(level))
    if orders is None:
        return None
    j, k, coverage = orders
    return float(v[j - 1]), float(v[k - 1]), coverage


@functools.lru_cache(maxsize=4096)
def has_interval(n: int, q: float, level: float) -> bool:
    """Whether n values give the q quantile an order-statistic interval at `level` (order_statistic_interval)."""
    return _orders(int(n), float(q), float(level)) is not None


def _orders(n: int, q: float, level: float) -> tuple[int, int, float] | None:
    """The orders (1-based) j < k of order_statistic_interval and its coverage, which depend on n, q and level only."""
    if n < 2:
        return None
    tail = (1 - level) / 2
    cdf = special.bdtr(np.arange(n + 1), n, q)  # cdf[i] = P(B <= i)
    lows = [j for j in range(1, n + 1) if cdf[j - 1] <= tail]
    highs = [k for k in range(1, n + 1) if 1 - cdf[k - 1] <= tail]
    if not lows or not highs or max(lows) >= min(highs):
        return None
    j, k = max(lows), min(highs)
    return j, k, float(cdf[k - 1] - cdf[j - 1])


def quantiles(values, level: float, qs: dict = QUANTILES, intervals: bool = True) -> dict:
    """{p50: {value, low, high, coverage}, p90, p99, n, max} of the finite values: each quantile where there are
    min_samples for it (else value None: the record's max and n say what there is), with its order-statistic
    interval where `intervals` and n allow one."""
    v = np.asarray(pd.to_numeric(pd.Series(values, dtype=object), errors="coerce"), float)
    v = v[np.isfinite(v)]
    out: dict = {"n": int(v.size), "max": float(v.max()) if v.size else None}
    for name, q in qs.items():
        enough = v.size >= min_samples(q) and v.size > 0
        one = {"value": float(np.quantile(v, q)) if enough else None, "low": None, "high": None, "coverage": None,
               "n": int(v.size), "min_n": min_samples(q)}
        if not enough and v.size:
            one["max"] = float(v.max())  # what a quantile of too few values would be: their maximum, said so
        ci = order_statistic_interval(v, q, level) if enough and intervals else None
        if ci:
            one["low"], one["high"], one["coverage"] = ci
        out[name] = one
    return out


def percentiles(values, n_boot: int, level: float, rng: np.random.Generator, qs: dict = QUANTILES) -> dict:
    """{p50: {value, low, high}, p90, p99, n} of the finite values; low and high from a percentile bootstrap
    (None with fewer than 2 values or no resamples)."""
    v = np.asarray(pd.to_numeric(pd.Series(values, dtype=object), errors="coerce"), float)
    v = v[np.isfinite(v)]
    out: dict = {"n": int(v.size)}
    draws = None
    if n_boot and v.size >= 2:
        draws = np.quantile(resamples(v, n_boot, rng), list(qs.values()), axis=1)
    for i, (name, q) in enumerate(qs.items()):
        lo, hi = (percentile_interval(draws[i], level) if draws is not None else None) or (None, None)
        out[name] = {"value": float(np.quantile(v, q)) if v.size else None, "low": lo, "high": hi}
    return out


def median_estimate(values, st: dict, *key) -> dict:
    """{value, low, high}: the median of the finite values with its percentile-bootstrap interval (percentiles; st:
    bootstrap, confidence and seed; key: the figure's own generator, rng_for)."""
    return percentiles(values, st["bootstrap"], st["confidence"], rng_for(st["seed"], *key), MEDIAN)["p50"]


def probe_median(victims: pd.DataFrame, column: str, level: float) -> dict:
    """{value, low, high, probes}: the median over an interference point's victims, with an interval only over
    independent probes. The victims of one probe share its injected prefill (their stalls move together), so they
    are one observation: the interval is the distribution-free order-statistic interval of the median of the probes'
    own medians, where there are enough probes for one at `level` (6 at 95%), else none."""
    v = pd.to_numeric(victims[column], errors="coerce")
    keep = v.notna()
    value = float(v[keep].median()) if keep.any() else None
    trials = victims["trial"] if "trial" in victims else pd.Series(0, index=victims.index)
    per_probe = v[keep].groupby(trials[keep].fillna(0)).median()
    ci = order_statistic_interval(per_probe.to_numpy(float), 0.5, level) if len(per_probe) else None
    return {"value": value, "low": ci[0] if ci else None, "high": ci[1] if ci else None, "probes": int(len(per_probe))}


HELD_MIN = 0.9  # a closed-loop point that keeps its level in flight less than this share of its time is flagged


def held_level(rows: pd.DataFrame, level: int, metrics: pd.DataFrame | None = None) -> dict | None:
    """The concurrency a closed-loop point achieved at the server side of its socket, from its requests' own sent and
    end times (sent_s + service_e2e_s; a request is in flight from its send to its end): over the stretch from its
    level-th send (the first wave sent) to its last (after it the loop only drains; where the first wave was every
    request, to the first end), the share of time with `level` or more in flight and
    the mean in flight; with the server's running gauge where the metrics hold one, its mean over that stretch; and
    from the metrics' client_stall_s (analysis.load), the longest and the total time this machine kept the client
    off its CPUs in that stretch (each a stretch in which an ended request could not be replaced). None without
    two sends."""
    sent = pd.to_numeric(rows["sent_s"], errors="coerce").to_numpy(float)
    e2e = pd.to_numeric(rows["e2e_s"], errors="coerce").to_numpy(float)
    if "service_e2e_s" in rows:  # an open loop's e2e_s runs from the schedule; the server's side from the send
        e2e = np.where(np.isfinite(service := pd.to_numeric(rows["service_e2e_s"], errors="coerce").to_numpy(float)), service, e2e)
    sends = np.sort(sent[np.isfinite(sent)])
    if sends.size < 2 or not level or sends.size < level:
        return None
    # from the moment the loop first had its level sent (its level-th send) to its last send; where every request
    # went in that first wave, to the first of them to end
    a, b = float(sends[int(level) - 1]), float(sends[-1])
    if b <= a:
        ends = [x + d for x, d in zip(sent, e2e) if np.isfinite(x) and np.isfinite(d)]
        b = min(ends, default=a)
    if b <= a:
        return None
    # a sweep over the sends (+1) and ends (-1), clipped to [a, b]: the time at each count in flight
    events = sorted([(float(x), 1) for x in sent[np.isfinite(sent)]]
                    + [(float(x + d), -1) for x, d in zip(sent, e2e) if np.isfinite(x) and np.isfinite(d)])
    n, t, held, area = 0, a, 0.0, 0.0
    for x, step in events:
        x = min(max(x, a), b)
        area += n * (x - t)
        held += (x - t) if n >= level else 0.0
        n, t = n + step, x
    out = {"level": int(level), "window_s": b - a, "share": held / (b - a), "mean_in_flight": area / (b - a),
           "server_running_mean": None, "below": held / (b - a) < HELD_MIN, "min_share": HELD_MIN,
           "client_stall_max_s": None, "client_stalled_s": None}
    if metrics is not None and len(metrics):
        t = pd.to_numeric(metrics["t_s"], errors="coerce")
        value = pd.to_numeric(metrics["value"], errors="coerce")
        inside = value[metrics["name"].eq("running") & (t >= a) & (t <= b)].dropna()
        if len(inside):
            out["server_running_mean"] = float(inside.mean())
        # the client's own: how long this machine kept it off its CPUs in the stretch (a slot it could not refill)
        stalls = value[metrics["name"].eq("client_stall_s") & (t >= a) & (t <= b)].dropna()
        out["client_stall_max_s"] = float(stalls.max()) if len(stalls) else 0.0
        out["client_stalled_s"] = float(stalls.sum()) if len(stalls) else 0.0
    return out


def point(rows: pd.DataFrame, slo: dict, st: dict, key: tuple) -> dict:
    """One workload point's figures (rows: its rows of load_requests.csv)."""
    reqs = rows[rows["index"].notna()]
    ok = reqs[reqs["status"].eq("ok")]
    length = float(rows["length"].iloc[0])
    duration = finite(rows["duration_s"].dropna().max()) if rows["duration_s"].notna().any() else None
    level = st["confidence"]
    out = {"level": _level(rows["level"].iloc[0]), "length": int(length), "n": len(reqs), "ok": len(ok),
           "failed": len(reqs) - len(ok), "reasons": failure_reasons(rows), "duration_s": duration,
           "output_tokens": finite(rows["output_tokens"].dropna().median()) if rows["output_tokens"].notna().any() else None}
    for name, column in FIGURES.items():
        out[name] = quantiles(ok[column], level)
    lists = [json.loads(x) for x in ok["itl_list_s"].dropna()] if "itl_list_s" in ok else []
    out["itl"] = {**quantiles([g for x in lists for g in x], level, intervals=False), "requests": len(lists)}
    tokens = pd.to_numeric(ok["completion_tokens"], errors="coerce").sum()
    out["output_tok_s"] = float(tokens) / duration if duration else None
    out["request_s"] = len(ok) / duration if duration else None
    out["goodput"] = goodput(reqs, slo, length, duration, level)
    return out


def _level(x):
    v = float(x)
    return int(v) if v.is_integer() else v


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None]:
    A = np.column_stack([np.ones_like(x), x])
    (a, k), *_ = np.linalg.lstsq(A, y, rcond=None)
    ss = float(((y - y.mean()) ** 2).sum())
    return float(a), float(k), 1 - float(((y - a - k * x) ** 2).sum()) / ss if ss > 0 else None


def interference(df: pd.DataFrame, st: dict, name: str) -> dict:
    """The probe's points per injected length and the stall fit (None with fewer than 2 distinct x)."""
    n_boot, level, seed = st["bootstrap"], st["confidence"], st["seed"]
    ok = df[df["status"].eq("ok")]
    points = []
    for length, g in df.groupby("length", sort=True):
        o = g[g["status"].eq("ok")]
        wg = probe_median(o, "worst_gap_s", level)
        ex = probe_median(o, "extra_s", level)
        background = pd.to_numeric(g["background"], errors="coerce").dropna()
        points.append({"length": int(length), "n": len(o), "failed": len(g) - len(o), "reasons": failure_reasons(g),
                       "background": int(background.iloc[0]) if len(background) else None,
                       "worst_gap": wg, "extra": ex, "steady_itl_s": finite(o["steady_itl_s"].median()),
                       "window_s": finite(o["window_s"].median()), "injected_ttft_s": finite(o["injected_ttft_s"].median())})
    chunks = pd.to_numeric(df["chunked_prefill_size"], errors="coerce")
    chunk = int(chunks[chunks > 0].iloc[0]) if (chunks > 0).any() else None
    for p in points:  # what the stall is made of: how much of the injected prefill the streams waited through
        gap, ttft = (p["worst_gap"] or {}).get("value"), p["injected_ttft_s"]
        p["chunks"] = -(-p["length"] // chunk) if chunk else None
        p["stalled_share"] = gap / ttft if gap is not None and ttft else None
        p["mean_chunk_s"] = ttft / p["chunks"] if ttft and p["chunks"] else None
    L, y = ok["length"].to_numpy(float), pd.to_numeric(ok["extra_s"], errors="coerce").to_numpy(float)
    keep = np.isfinite(L) & np.isfinite(y)
    L, y = L[keep], y[keep]
    x = np.ceil(L / chunk) if chunk else L
    share = _share(ok, n_boot, level, rng_for(seed, name, "interference_share"))
    if len(np.unique(x)) < 2 or len(x) < 3:
        return {"points": points, "fit": {"basis": None, **share} if share["share"] is not None else None}
    a, k, r2 = _ols(x, y)
    rng = rng_for(seed, name, "interference_fit")
    draws = []
    for _ in range(n_boot):
        i = rng.integers(0, len(x), len(x))
        if len(np.unique(x[i])) >= 2:
            draws.append(_ols(x[i], y[i])[1])
    lo, hi = percentile_interval(draws, level) or (None, None)
    basis = "chunks" if chunk else "linear"
    return {"points": points, "fit": {"basis": basis, "chunk": chunk, "a_s": a, "slope_s": k, "low": lo, "high": hi,
                                      "r2": r2, "n": len(x), "per_chunk_s": k if chunk else None,
                                      "per_token_s": None if chunk else k,
                                      "model": "extra = a + k*ceil(L/chunk)" if chunk else "extra = a + b*L",
                                      **share}}


def wake(df: pd.DataFrame) -> dict | None:
    """The wake probe (longctx.measure.wake.wake_probe): per idle gap asked, the median idle the requests had and
    their median TTFT; extra_s, what a request after that idle paid beyond one after the shortest gap (0 where less:
    noise); None without two gaps measured."""
    ok = df[df["status"].eq("ok") & df["level"].notna()]
    rows = []
    for gap, g in ok.groupby(pd.to_numeric(ok["level"], errors="coerce"), sort=True):
        ttft = pd.to_numeric(g["ttft_s"], errors="coerce").dropna()
        idle = pd.to_numeric(g["idle_s"], errors="coerce").dropna()
        if len(ttft) and len(idle):
            rows.append({"gap_s": float(gap), "idle_s": float(idle.median()), "n": int(len(ttft)),
                         "ttft_s": float(ttft.median())})
    if len(rows) < 2:
        return None
    for x in rows:
        x["extra_s"] = max(0.0, x["ttft_s"] - rows[0]["ttft_s"])
    return {"length": int(pd.to_numeric(ok["length"], errors="coerce").dropna().iloc[0]), "points": rows}


def sweep_twins(rows: pd.DataFrame) -> dict:
    """The sweep's lone request sent just before and just after one load point at its length
    (longctx.measure.loadrun.sweep_twins; `rows`, its rows of kind sweep_twin): the requests sent, those that
    succeeded (n), their median TTFT and TPOT (seconds), the tokens they decoded, and each side's ("before", "after":
    its n and medians)."""
    def medians(part: pd.DataFrame) -> dict:
        return {q: (float(v.median()) if len(v := pd.to_numeric(part[f"{q}_s"], errors="coerce").dropna()) else None)
                for q in ("ttft", "tpot")}

    ok = rows[rows["status"].eq("ok")]
    out = pd.to_numeric(ok["completion_tokens"], errors="coerce").dropna()
    return {"sent": int(len(rows)), "n": int(len(ok)), **medians(ok),
            "output_tokens": int(out.median()) if len(out) else None,
            **{side: {"n": int(ok["twin"].eq(side).sum()), **medians(ok[ok["twin"].eq(side)])} for side in ("before", "after")}}


def _share(ok: pd.DataFrame, n_boot: int, level: float, rng) -> dict:
    """How much of the injected prompt's own prefill the streams lose: extra = share x its TTFT, least squares
    through the origin over the victims, with a bootstrap interval. Near 1: they wait through every chunk
    (prefill first, as SGLang schedules); near 1/chunks: one chunk at a time (mixed chunks)."""
    x = pd.to_numeric(ok["injected_ttft_s"], errors="coerce").to_numpy(float)
    y = pd.to_numeric(ok["extra_s"], errors="coerce").to_numpy(float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[keep], y[keep]
    if not len(x):
        return {"share": None, "share_low": None, "share_high": None}
    draws = []
    for _ in range(n_boot):
        i = rng.integers(0, len(x), len(x))
        draws.append(float((x[i] * y[i]).sum() / (x[i] ** 2).sum()))
    lo, hi = percentile_interval(draws, level) or (None, None)
    return {"share": float((x * y).sum() / (x**2).sum()), "share_low": lo, "share_high": hi}


def reconcile(df: pd.DataFrame, pool: int | None, margin: float) -> dict:
    """The server's KV tokens at each sample against the client's bounds, from both sides: a gauge above the
    highest the client allows, or below the lowest. Only a sample whose lower bound is above 0 can catch a gauge that
    reads too low (one stuck at 0 under load): `low_above_zero` counts them, so that a check that could not fail
    from below is said to be one."""
    flagged, checked, gauges, above_zero = [], 0, set(), 0
    for (kind, level, length, trial, t), g in df.groupby(["kind", "level", "length", "trial", "t_s"], dropna=False, sort=True):
        v = dict(zip(g["name"], pd.to_numeric(g["value"], errors="coerce")))
        low, high = finite(v.get(CLIENT_LOW)), finite(v.get(CLIENT_HIGH))
        server, gauge = finite(v.get("used_tokens")), "used_tokens"
        size = finite(v.get("pool_tokens")) or pool
        if server is None and finite(v.get("token_usage")) is not None and size:
            server, gauge = finite(v.get("token_usage")) * size, "token_usage x pool_tokens"
        if server is None or low is None or high is None:
            continue
        checked += 1
        above_zero += low * (1 - margin) > 0
        gauges.add(gauge)
        if not (low * (1 - margin) <= server <= high * (1 + margin)):
            flagged.append({"t_s": float(t), "kind": kind, "level": _level(level) if finite(level) is not None else None,
                            "length": int(length) if finite(length) is not None else None,
                            "trial": int(trial) if finite(trial) is not None else None,
                            "server_tokens": server, "client_low": low, "client_high": high, "gauge": gauge})
    return {"checked": checked, "low_above_zero": int(above_zero), "flagged": flagged, "margin": margin,
            "gauge": None if not gauges else gauges.pop() if len(gauges) == 1 else "mixed"}


def _entry(doc: dict | None, name: str) -> dict:
    return ((doc or {}).get("configurations") or {}).get(name) or {}


def _context(entry: dict, memory: dict) -> int | None:
    if memory.get("context_length"):
        return int(memory["context_length"])
    if entry.get("engine"):
        try:
            return adapter_of(entry).context_length(entry.get("args") or {}, entry.get("server_info") or {})
        except (KeyError, ValueError):
            return None
    return None


def analyze_load(requests: pd.DataFrame, interference_df: pd.DataFrame, metrics: pd.DataFrame, fits: dict | None,
                 provenance: dict | None, planner: dict | None, settings: dict | None) -> dict:
    settings = settings or {}
    requests, interference_df, metrics = (df.reindex(columns=[*cols, *(c for c in df.columns if c not in cols)])
                                          for df, cols in ((requests, REQUEST_COLUMNS), (interference_df, INTERFERENCE_COLUMNS),
                                                           (metrics, METRICS_COLUMNS)))
    slo = {**DEFAULT_SLO, **(settings.get("slo") or {})}
    load = settings.get("load") or {}
    margin = float(((load.get("metrics") or {}).get("kv_margin")) if (load.get("metrics") or {}).get("kv_margin") is not None else DEFAULT_MARGIN)
    st = bootstrap_settings(fits, settings)
    names = sorted(set(requests["configuration"].dropna()) | set(interference_df["configuration"].dropna())
                   | set(metrics["configuration"].dropna()))
    out = {"slo": slo, "settings": {**st, "kv_margin": margin}, "configurations": {}}
    for name in names:
        r = requests[requests["configuration"] == name]
        conf: dict = {"failed": failure_reasons(r[r["kind"].isna()]), "closed": [], "open": []}
        for kind in ("closed", "open"):
            for (level, length), g in r[r["kind"] == kind].groupby(["level", "length"], sort=True):
                p = point(g, slo, st, (name, kind, level, length))
                if kind == "closed":
                    m = metrics[metrics["configuration"].eq(name) & metrics["kind"].eq(kind)
                                & pd.to_numeric(metrics["level"], errors="coerce").eq(level)
                                & pd.to_numeric(metrics["length"], errors="coerce").eq(length)]
                    p["held"] = held_level(g[g["index"].notna()], int(level), m)
                twins = r[r["kind"].eq(TWIN_KIND) & r["twin_of"].eq(kind) & r["level"].eq(level) & r["length"].eq(length)]
                if len(twins):
                    p["sweep_twins"] = sweep_twins(twins)
                ok = g[g["status"].eq("ok") & g["index"].notna()]
                p["_values"] = {c: pd.to_numeric(ok[c], errors="coerce").dropna().to_numpy()
                               for c in ("ttft_s", "itl_max_s", "tpot_s")}  # the frontier's model scales by them
                conf[kind].append(p)
        conf["wake"] = wake(r[r["kind"] == "wake"])
        i = interference_df[interference_df["configuration"] == name]
        conf["interference"] = interference(i, st, name) if len(i) else {"points": [], "fit": None}
        entry, memory = _entry(provenance, name), _entry(planner, name).get("memory") or {}
        pool = observed_pool(entry)[0] or memory.get("observed_tokens")
        outs = [p["output_tokens"] for p in conf["closed"] if p["output_tokens"] is not None]
        out_tokens = float(np.median(outs)) if outs else float(load.get("output_tokens") or 0)
        # a point that did not keep its level in flight measured a lower concurrency than it names: not on the frontier
        held = [p for p in conf["closed"] if not (p.get("held") or {}).get("below")]
        conf["frontier"] = frontier(held, _entry(fits, name), pool, _context(entry, memory), slo, out_tokens)
        conf["below_level"] = [{"level": p["level"], "length": p["length"], **p["held"]}
                               for p in conf["closed"] if (p.get("held") or {}).get("below")]
        conf["pool_tokens"] = pool
        conf["reconciliation"] = reconcile(metrics[metrics["configuration"] == name], pool, margin)
        for p in conf["closed"] + conf["open"]:
            p.pop("_values")
        out["configurations"][name] = conf
    return out


def analyze_file(requests_csv, interference_csv, metrics_csv, out_json, fits_json=None, provenance_json=None,
                 planner_json=None, settings: dict | None = None) -> dict:
    def doc(p):
        return json.loads(Path(p).read_text()) if p and Path(p).exists() else None

    result = json_plain(analyze_load(pd.read_csv(requests_csv), pd.read_csv(interference_csv), pd.read_csv(metrics_csv),
                                 doc(fits_json), doc(provenance_json), doc(planner_json), settings))
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out_json, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result
