"""The service-level objectives of the load workloads: what a limit is at a length, goodput (the share
of a point's requests meeting every SLO set), and the SLO frontier (the longest context that meets them
at each concurrency). longctx.analysis.load_summary applies them to the tables of longctx.analysis.load.

- Goodput: a request meets the SLOs when it succeeded and meets every one set: ttft_s against its TTFT,
  itl_s against its own largest wait between two events (itl_max_s, as config/schema.yaml says: a chunk's
  wait whole, not divided among its tokens), tpot_s against its TPOT
  (a figure it lacks does not meet). Each SLO is a number or a {length: value} map: the entry of the
  largest length not above L applies (below the smallest length, the smallest's). The share counts every
  request of the point (failed and timed-out ones in the denominator), with a Wilson interval; rate_s is
  the met requests per second of the point's span.
- Frontier (closed loop): at each concurrency c a measured length passes when its goodput share reaches
  slo.attainment. Where a pass is followed by a fail the answer is the longest pass below that fail
  (basis "measured"; limited_by the SLO with the lowest share at the fail, or "failures" where failed
  requests alone explain it). Else a model (basis "model"): TTFT_c(L) = r_c TTFT_1(L), TTFT_1 the prefill
  fit of fits.json and r_c the median over c's measured lengths of the attainment quantile of their TTFTs
  over TTFT_1 (the quantile, not the median: a point passes when that share of its requests meets the
  SLO); for itl_s and tpot_s the decode step t0 + beta c L of the decode fit (the KV reads of all c
  requests), scaled alike by its own r_c (ratios: each r_c); the longest L meeting them, kept between the
  longest pass and the shortest fail above it (clipped: true where the model said otherwise).
  Every answer is capped by the pool, c (L + output_tokens) <= pool tokens, and the context length,
  L + output_tokens <= context (limited_by "pool" or "context"). Where a fit an SLO needs is missing:
  only the measured answer (the longest pass, with open_above: nothing above it failed) and the pool.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.special import ndtri

from ..core.fitting import decode_curve, prefill_curve

SLO_KEYS = {"ttft_s": ("ttft_s", "ttft"), "itl_s": ("itl_max_s", "itl"), "tpot_s": ("tpot_s", "tpot")}

DEFAULT_SLO = {"ttft_s": None, "itl_s": None, "tpot_s": None, "attainment": 0.9}


def slo_at(value, length: float) -> float | None:
    """An SLO's limit at a length: a number, or a {length: value} map (the entry of the largest length not
    above L, as config/schema.yaml says; below the smallest, the smallest's); None where it is not set."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return float(value)
    pts = sorted((float(k), float(v)) for k, v in value.items() if v is not None)
    if not pts:
        return None
    below = [v for k, v in pts if k <= float(length)]
    return below[-1] if below else pts[0][1]


def wilson(k: int, n: int, level: float) -> tuple[float | None, float | None]:
    """The Wilson score interval of a share k / n."""
    if n <= 0:
        return None, None
    z = float(ndtri(1 - (1 - level) / 2))
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def goodput(rows: pd.DataFrame, slo: dict, length: float, duration: float | None, level: float) -> dict:
    """The share and rate of a point's requests (rows with an index) meeting every SLO set at its length."""
    ok = rows["status"].eq("ok")
    met = ok.copy()
    by, keys = [], {}
    for key, (column, _) in SLO_KEYS.items():
        limit = slo_at(slo.get(key), length)
        if limit is None:
            continue
        meets = ok & (pd.to_numeric(rows[column], errors="coerce") <= limit)
        by.append(key)
        keys[key] = float(meets.mean()) if len(rows) else None
        met &= meets
    n, k = len(rows), int(met.sum())
    lo, hi = wilson(k, n, level)
    return {"share": k / n if n else None, "low": lo, "high": hi, "met": k, "n": n, "by": by, "keys": keys,
            "ok_share": float(ok.mean()) if n else None,
            "rate_s": k / duration if duration else None}


def _binding(p: dict) -> str:
    """What failed a point: the SLO with the lowest share, or its failed requests."""
    g = p["goodput"]
    if not g["keys"] or not g["n"]:
        return "failures"
    key = min(g["keys"], key=lambda k: g["keys"][k])
    return "failures" if g["keys"][key] >= (g["ok_share"] or 0) else SLO_KEYS[key][1]


def frontier(points: list[dict], fit: dict, pool: int | None, context: int | None, slo: dict,
             output_tokens: float) -> list[dict]:
    """Per closed-loop concurrency, the longest length meeting the SLOs (the module's doc says how)."""
    att = float(slo.get("attainment", DEFAULT_SLO["attainment"]))
    prefill, decode = (fit or {}).get("prefill"), (fit or {}).get("decode")
    out = []
    for c in sorted({p["level"] for p in points}):
        pts = sorted((p for p in points if p["level"] == c), key=lambda p: p["length"])
        good = {p["length"]: p["goodput"]["share"] is not None and p["goodput"]["share"] >= att for p in pts}
        passes, fails = [L for L, g in good.items() if g], [L for L, g in good.items() if not g]
        bounds = {"pool": int(pool // c - output_tokens) if pool else None,
                  "context": int(context - output_tokens) if context else None}
        cap_by, cap = min(((k, v) for k, v in bounds.items() if v is not None), key=lambda kv: kv[1], default=(None, None))
        row = {"concurrency": c, "pool_bound": bounds["pool"], "context_bound": bounds["context"],
               "passes": passes, "fails": fails, "max_length": None, "basis": "measured", "limited_by": None,
               "open_above": False}
        above = [f for f in fails if passes and f > min(passes)]
        if above:
            first = min(above)
            row["max_length"] = max(L for L in passes if L < first)
            row["limited_by"] = _binding(next(p for p in pts if p["length"] == first))
        else:
            modelled = _model(pts, c, prefill, decode, slo, att, cap, cap_by)
            if modelled is not None:
                L, by, row["ratios"] = modelled
                lo = max(passes) if passes else None
                hi = min((f for f in fails if lo is None or f > lo), default=None)
                clipped = False
                if lo is not None and (L is None or L < lo):  # the measurements win over the model
                    L, clipped = lo, True
                if hi is not None and (L is None or L >= hi):
                    L, by, clipped = hi - 1, _binding(next(p for p in pts if p["length"] == hi)), True
                row.update(max_length=L, basis="model", limited_by=by, clipped=clipped)
            elif passes:
                row.update(max_length=max(passes), open_above=True)
        if cap is not None and row["max_length"] is not None and row["max_length"] > cap:
            row.update(max_length=cap, limited_by=cap_by)
        out.append(row)
    return out


def _model(pts: list[dict], c: int, prefill: dict | None, decode: dict | None, slo: dict, att: float,
           cap: int | None, cap_by: str | None) -> tuple[int | None, str | None, dict] | None:
    """(the longest L the model meets the SLOs to, what binds there, each SLO's ratio r_c), or None where a
    fit an SLO needs, or a measured value to scale it by, is missing. Each SLO's model is its fit scaled by
    r_c, the median over c's measured lengths of the attainment quantile of the successful requests'
    values over the fit there: TTFT_1(L) for ttft_s, the decode step t0 + beta c L for itl_s and tpot_s."""
    curves = {"ttft_s": (prefill, lambda L: float(prefill_curve(prefill, [L])[0])),
              "itl_s": (decode, lambda L: float(decode_curve(decode, [c * L])[0])),
              "tpot_s": (decode, lambda L: float(decode_curve(decode, [c * L])[0]))}
    checks, ratios = [], {}
    for key in SLO_KEYS:
        if slo_at(slo.get(key), 1) is None:
            continue
        fit, curve = curves[key]
        if not fit:
            return None
        column, name = SLO_KEYS[key]
        r = [np.quantile(p["_values"][column], att) / curve(p["length"]) for p in pts
             if len(p.get("_values", {}).get(column, ())) and curve(p["length"]) > 0]
        if not r:
            return None
        ratios[name] = float(np.median(r))
        checks.append((name, lambda L, key=key, curve=curve, k=ratios[name]: k * curve(L) <= slo_at(slo[key], L)))

    def failing(L: int) -> str | None:
        return next((name for name, ok in checks if not ok(L)), None)

    top = cap if cap is not None else 10**8
    if top < 1:
        return None, cap_by, ratios
    grid = sorted({int(x) for x in np.geomspace(1, top, 400)} | {top})
    bad = next((i for i, L in enumerate(grid) if failing(L)), None)
    if bad is None:
        return top, cap_by, ratios
    if bad == 0:
        return None, failing(grid[0]), ratios
    lo, hi = grid[bad - 1], grid[bad]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if failing(mid) else (mid, hi)
    return lo, failing(hi), ratios
