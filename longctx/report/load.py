"""What the report shows of the load workloads (issue 18): data/load.json (longctx.analysis.load) and
data/load_metrics.csv read into rows the LaTeX section and its Markdown twin print alike.

`read` gives load.json as a dict (an absent file, or none given, is an empty one); `view` shapes it for
the templates: per configuration the closed- and open-loop points (percentiles with their intervals,
goodput, the failed requests with their reasons), the interference probe and its fit, the SLO frontier,
the KV reconciliation (flagged gauges with both numbers) and the server's own series in brief. The figures
(longctx.report.figures.load) take the same representative metrics point per configuration (`representative`)
that the section names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..analysis.load_summary import HELD_MIN, has_interval, min_samples
from ..core.numbers import is_number

KINDS = ("closed", "open")
SLO_KEYS = ("ttft_s", "itl_s", "tpot_s")
SLO_WORDS = {"ttft_s": "TTFT", "itl_s": "ITL", "tpot_s": "TPOT"}
METRICS_COLUMNS = ("configuration", "kind", "level", "length", "trial", "t_s", "name", "value")
# the server's series the section summarises (the adapters' canonical names), in this order
SERIES = ("running", "queued", "used_tokens", "token_usage", "retracted_total", "preemptions_total")
FLAGGED_SHOWN = 8  # flagged reconciliation samples listed per configuration; the rest are counted


def read(path: str | Path | None) -> dict:
    """load.json as a dict; {} where there is no file."""
    if not path or not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text())


def read_metrics(path: str | Path | None) -> pd.DataFrame:
    """load_metrics.csv; an empty frame of its columns where there is no file (or an empty one)."""
    if path and Path(path).exists() and Path(path).stat().st_size:
        df = pd.read_csv(path)
        if len(df.columns):
            return df
    return pd.DataFrame(columns=list(METRICS_COLUMNS))


def time_words(x: float) -> str:
    """A time in a sentence: '850 ms', '3.4 s'."""
    return f"{x * 1e3:.3g} ms" if x < 1 else (f"{x:,.0f} s" if x >= 1000 else f"{x:.3g} s")


def slo_words(slo: dict | None) -> list[str]:
    """The SLOs set, in words: ['TTFT at most 10 s', 'ITL at most 200 ms'] (per length: each length's target)."""
    out = []
    for key in SLO_KEYS:
        v = (slo or {}).get(key)
        if is_number(v):
            out.append(f"{SLO_WORDS[key]} at most {time_words(float(v))}")
        elif isinstance(v, dict) and v:
            per = ", ".join(f"{time_words(float(t))} at {int(float(L)):,}" for L, t in sorted(v.items(), key=lambda kv: float(kv[0])))
            out.append(f"{SLO_WORDS[key]} at most {per} tokens")
    return out


def slo_value(slo: dict | None, key: str, length: int | None = None) -> float | None:
    """The SLO `key` at `length` (a number, or the per-length map's entry for it); None where unset."""
    v = (slo or {}).get(key)
    if is_number(v):
        return float(v)
    if isinstance(v, dict) and length is not None:
        for L, t in v.items():
            if int(float(L)) == int(length) and is_number(t):
                return float(t)
    return None


def _level_words(kind: str, level) -> str:
    if kind == "closed":
        return f"{_num(level)} in flight"
    if kind == "open":
        return f"{_num(level)} req/s"
    return "injected"


def _num(x) -> str:
    return f"{int(x)}" if is_number(x) and float(x) == int(float(x)) else f"{float(x):g}" if is_number(x) else str(x)


QUANTILE_OF = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def gate(record: dict, level: float) -> dict:
    """A percentile record as it may be printed, whatever wrote it (an older load.json printed a p99 of 6 requests
    with an interval): no value below min_samples (their maximum instead, said so), and no interval where the n
    allows none at `level` (longctx.analysis.load_summary: the same rules as it applies)."""
    out = dict(record)
    for name, q in QUANTILE_OF.items():
        r = out.get(name)
        if not isinstance(r, dict):
            continue
        n = r.get("n") if is_number(r.get("n")) else out.get("n")
        if not is_number(n):
            continue
        r = dict(r)
        if int(n) < min_samples(q) and r.get("value") is not None:
            r.update(value=None, low=None, high=None, coverage=None, max=r.get("max", out.get("max")), min_n=min_samples(q))
        if r.get("low") is not None and not has_interval(int(n), q, level):
            r.update(low=None, high=None, coverage=None)
        out[name] = r
    return out


def median_min_n(level: float) -> int:
    """The fewest requests whose median has an order-statistic interval at `level` (6 at 95%)."""
    return next(n for n in range(2, 200) if has_interval(n, 0.5, level))


def _point(kind: str, p: dict, level: float = 0.95) -> dict:
    """A closed or open point as the tables print it (the percentile records as load.json has them, gated)."""
    n = p.get("n")
    ok = p.get("ok")
    failed = p.get("failed")
    if failed is None and is_number(n) and is_number(ok):
        failed = int(n) - int(ok)
    reasons = [str(r) for r in p.get("reasons") or [] if r]
    stats = {k: gate({"p50": None, "p90": None, "p99": None, "n": None, **(p.get(k) or {})}, level)
             for k in ("ttft", "itl", "tpot", "e2e", "queue", "schedule_lag")}
    g = {"share": None, "low": None, "high": None, "rate_s": None, "met": None, "n": None, "by": [], **(p.get("goodput") or {})}
    return {"kind": kind, "level": p.get("level"), "level_text": _level_words(kind, p.get("level")), "length": p.get("length"),
            "n": n, "ok": ok, "failed": failed or 0, "reasons": reasons, "reason": "; ".join(reasons) or ("failed" if failed else None),
            **stats, "output_tok_s": p.get("output_tok_s"), "request_s": p.get("request_s"), "goodput": g,
            "goodput_share": {"value": g.get("share"), "low": g.get("low"), "high": g.get("high")},
            "status": p.get("status"), "queue_reported": bool(stats["queue"]["n"] or stats["queue"]["p50"]),
            # a closed-loop point's achieved concurrency (longctx.analysis.load_summary.held_level)
            "held": p.get("held"), "held_pct": 100 * p["held"]["share"] if (p.get("held") or {}).get("share") is not None else None}


def _interference(d: dict | None) -> dict:
    d = d or {}
    points = sorted((p for p in d.get("points") or []), key=lambda p: p.get("length") or 0)
    fit = d.get("fit") or None
    blank = {"n": None, "worst_gap": None, "extra": None, "steady_itl_s": None, "window_s": None, "background": None}
    fit = {"chunk": None, "per_chunk_s": None, "low": None, "high": None, "r2": None, "basis": "chunks", **fit} if fit else None
    return {"points": [{**blank, **p, "failed": p.get("failed") or 0, "reason": "; ".join(str(r) for r in p.get("reasons") or [] if r)
                        or p.get("reason")} for p in points],
            "fit": fit, "any": bool(points)}


def _frontier(rows) -> list[dict]:
    out = []
    for r in sorted(rows or [], key=lambda r: r.get("concurrency") or 0):
        out.append({"basis": None, "limited_by": None, "pool_bound": None, **r, "passes": sorted(int(x) for x in r.get("passes") or []), "fails": sorted(int(x) for x in r.get("fails") or []),
                    "max_length": r.get("max_length") if is_number(r.get("max_length")) and r.get("max_length") > 0 else None})
    return out


def representative(metrics: pd.DataFrame, name: str) -> dict | None:
    """The workload point of `name` whose server series the report shows: the closed loop at its highest
    concurrency and longest length (the most resident at once), else the open loop at its highest rate and
    longest length, else the interference probe's longest injected length (its first trial). None without
    a sample. {kind, level, length, trial}."""
    m = metrics[metrics["configuration"] == name] if len(metrics) else metrics
    if m.empty:
        return None
    for kind in ("closed", "open", "interference"):
        k = m[m["kind"] == kind]
        if k.empty:
            continue
        if kind == "interference":
            top = k.sort_values(["length", "trial"], ascending=[False, True]).iloc[0]
        else:
            top = k.sort_values(["level", "length"], ascending=[False, False]).iloc[0]
        trial = top["trial"] if "trial" in k and pd.notna(top["trial"]) else None
        return {"kind": kind, "level": top["level"] if pd.notna(top["level"]) else None, "length": int(top["length"]),
                "trial": trial}
    return None


def point_samples(metrics: pd.DataFrame, name: str, point: dict) -> pd.DataFrame:
    """The samples of one workload point (representative's dict) of configuration `name`."""
    m = metrics[(metrics["configuration"] == name) & (metrics["kind"] == point["kind"]) & (metrics["length"] == point["length"])]
    if point.get("level") is not None:
        m = m[m["level"] == point["level"]]
    if point.get("trial") is not None and "trial" in m:
        m = m[m["trial"] == point["trial"]]
    return m


def point_words(point: dict | None) -> str:
    """'the closed loop at 4 in flight, 16,384 tokens'."""
    if not point:
        return "no sample"
    what = {"closed": "the closed loop", "open": "the open loop", "interference": "the interference probe"}[point["kind"]]
    level = f" at {_level_words(point['kind'], point['level'])}" if point["kind"] != "interference" and point.get("level") is not None else ""
    return f"{what}{level}, {int(point['length']):,} tokens"


def _series(metrics: pd.DataFrame, name: str) -> dict:
    """The peaks of the server's own series over every workload of `name` (counters: the most they rose in one point)."""
    m = metrics[metrics["configuration"] == name] if len(metrics) else metrics
    # a sample: one scrape, at one time of one workload point
    out: dict = {"samples": len(m[["kind", "level", "length", "trial", "t_s"]].drop_duplicates()) if len(m) else 0}
    for s in SERIES:
        v = m[m["name"] == s] if len(m) else m
        if v.empty:
            out[s] = None
        elif s.endswith("_total"):
            rise = v.groupby(["kind", "level", "length", "trial"], dropna=False)["value"].agg(lambda x: x.max() - x.min())
            out[s] = float(rise.max())
        else:
            out[s] = float(v["value"].max())
    point = representative(metrics, name)
    out["point"] = point
    out["point_text"] = point_words(point)
    out["any"] = bool(out["samples"])
    return out


def _reconciliation(r: dict | None) -> dict:
    r = r or {}
    flagged = sorted(r.get("flagged") or [], key=lambda f: (str(f.get("kind")), f.get("level") or 0, f.get("length") or 0, f.get("t_s") or 0))
    blank = {"t_s": None, "kind": None, "level": None, "length": None, "server_tokens": None, "client_low": None, "client_high": None}
    rows = [{**blank, **f, "where": f"{f.get('kind')}, {_level_words(str(f.get('kind')), f.get('level'))}"
             if f.get("kind") in KINDS else str(f.get("kind") or "")} for f in flagged]
    return {"checked": r.get("checked") or 0, "low_above_zero": r.get("low_above_zero"), "margin": r.get("margin"),
            "gauge": r.get("gauge"), "flagged": rows[:FLAGGED_SHOWN],
            "more": max(0, len(rows) - FLAGGED_SHOWN), "count": len(rows), "any": bool(r.get("checked"))}


def view(load: dict, metrics: pd.DataFrame | None = None, order: list[str] | None = None) -> dict:
    """What the load section shows; {'any': False, ...} without a measured workload. order: the
    configurations' order (the config's), the rest by name."""
    metrics = metrics if metrics is not None else read_metrics(None)
    confs = (load or {}).get("configurations") or {}
    level = float(((load or {}).get("settings") or {}).get("confidence") or 0.95)
    names = [n for n in (order or []) if n in confs] + sorted(n for n in confs if n not in (order or []))
    out = []
    for name in names:
        c = confs[name] or {}
        points = {kind: sorted((_point(kind, p, level) for p in c.get(kind) or []),
                               key=lambda p: (p["length"] or 0, p["level"] or 0)) for kind in KINDS}
        inter = _interference(c.get("interference"))
        failures = [p for kind in KINDS for p in points[kind] if p["failed"]]
        failures += [{"kind": "interference", "level": None, "level_text": "injected", "length": p.get("length"), "n": p.get("n"),
                      "failed": p["failed"], "reason": p["reason"] or "failed"} for p in inter["points"] if p["failed"]]
        below = [{**b, "where": f"{_level_words('closed', b.get('level'))}, {int(b['length']):,} tokens"} for b in c.get("below_level") or []]
        out.append({"name": name, "status": c.get("status"), "reason": c.get("reason"), **points, "interference": inter,
                    "below_level": below,
                    "frontier": _frontier(c.get("frontier")), "reconciliation": _reconciliation(c.get("reconciliation")),
                    "series": _series(metrics, name), "failures": failures})
    slo = (load or {}).get("slo") or {}
    has = {k: any(c[k] for c in out) for k in KINDS}
    has["interference"] = any(c["interference"]["any"] for c in out)
    has["frontier"] = any(c["frontier"] for c in out)
    has["metrics"] = any(c["series"]["any"] or c["reconciliation"]["any"] for c in out)
    has["queue"] = any(p["queue_reported"] for c in out for k in KINDS for p in c[k])
    attainment = slo.get("attainment")
    return {"any": any(has.values()) or any(c["reason"] for c in out), "configurations": out, "has": has, "slo": slo,
            "slo_words": slo_words(slo), "attainment": attainment if is_number(attainment) else None, "held_min": HELD_MIN,
            "level_pct": f"{level * 100:.0f}", "median_min_n": median_min_n(level),
            "failures": [{"configuration": c["name"], **f} for c in out for f in c["failures"]],
            "unmeasured": [{"name": c["name"], "reason": c["reason"]} for c in out if c["reason"] and not (
                c["closed"] or c["open"] or c["interference"]["any"])]}


def stall_curve(lengths, fit: dict):
    """The fitted stall at each of lengths, as the analysis fits it (longctx.analysis.load_summary.interference):
    a + k x ceil(L / chunk) under chunked prefill ("chunks"), a + b x L otherwise ("linear"); with the
    interval's ends of the slope (low, high) alike."""
    import numpy as np

    L = np.asarray(lengths, float)
    a = float(fit["a_s"]) if is_number(fit.get("a_s")) else 0.0
    if fit.get("basis", "chunks") == "chunks":
        chunk = fit.get("chunk")
        if not is_number(chunk) or chunk <= 0 or not is_number(fit.get("per_chunk_s")):
            return None
        x, slope = np.ceil(L / chunk), float(fit["per_chunk_s"])
    else:
        if not is_number(fit.get("per_token_s")):
            return None
        x, slope = L, float(fit["per_token_s"])
    ends = tuple(a + x * float(fit[e]) if is_number(fit.get(e)) else None for e in ("low", "high"))
    return a + x * slope, ends