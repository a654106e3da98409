"""Each configuration against the baseline: the speedup at each length, with its interval and what it means.

The speedup is the ratio of geometric means over the successful single-request trials (longctx.analysis.tables:
ok_rows, as the per-length medians take them): TTFT, the baseline's over the configuration's; decode, the
configuration's rate over the baseline's. Above 1 is faster, both ways.

Its interval is Welch's t interval of the difference of the two sides' mean log values, exponentiated: times and
rates are positive and their noise is relative, so their logs are near normal, and Welch's degrees of freedom allow
the two sides different noise. Its coverage, shown by tests/test_compare.py over thousands of seeded pairs with
relative noise of 2% to 30% over an absolute floor, equal and unequal on the two sides, is 93% to 97% at a stated
95% from MIN_TRIALS trials a side (3, the default trials); at 2 a side it is ~97.7% (too wide to be what it says),
and the bootstrap of a ratio of medians that came before it covered 71% at 2 and 89% at 3. The verdict follows:

- "faster": the interval lies wholly above 1;
- "slower": wholly below 1;
- "no measurable difference": it includes 1, so the measurements do not tell this configuration from
  the baseline (a ratio of 1.04 from three noisy trials is not a gain);
- "no interval": fewer than MIN_TRIALS trials on a side (too few for an interval that covers what it says).

Every speedup carries its trial counts (trials, baseline_trials), which the report prints beside its verdict.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from .fits import SETTINGS
from .tables import ok_rows

FASTER, SLOWER, SAME, NO_INTERVAL = "faster", "slower", "no measurable difference", "no interval"
VERDICTS = (FASTER, SLOWER, SAME, NO_INTERVAL)
# metric: (column of results.csv, whether a smaller value is faster)
METRICS = {"ttft": ("ttft_s", True), "decode": ("decode_tok_s", False)}
MIN_TRIALS = 3  # on each side, for an interval (its coverage is shown from 3; at 2 it over-covers)
METHOD = "welch-log"  # recorded with the verdicts (headline.intervals.method)


def verdict(ci) -> str:
    """What an interval [low, high] of a speedup says; NO_INTERVAL without one."""
    if ci is None:
        return NO_INTERVAL
    lo, hi = ci
    return FASTER if lo > 1 else SLOWER if hi < 1 else SAME


def welch_log_interval(num, den, level: float) -> np.ndarray:
    """The `level` interval [low, high] of the ratio of geometric means num / den: Welch's t interval of the
    difference of their mean logs, exponentiated. num, den: positive values along the last axis (at least 2 each);
    leading axes are separate comparisons (an array of intervals, shape (..., 2)). Where every value on both sides
    is the same the ratio is known exactly (low = high)."""
    ln, ld = np.log(np.asarray(num, float)), np.log(np.asarray(den, float))
    diff = ln.mean(axis=-1) - ld.mean(axis=-1)
    vn, vd = ln.var(axis=-1, ddof=1) / ln.shape[-1], ld.var(axis=-1, ddof=1) / ld.shape[-1]
    se = np.sqrt(vn + vd)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (vn + vd) ** 2 / (vn**2 / (ln.shape[-1] - 1) + vd**2 / (ld.shape[-1] - 1))
    half = np.where(se > 0, stats.t.ppf(0.5 + level / 2, np.where(se > 0, df, 1.0)) * se, 0.0)
    return np.exp(np.stack([diff - half, diff + half], axis=-1))


def speedup(base, other, smaller_is_faster: bool, level: float = SETTINGS["confidence"]) -> dict | None:
    """One comparison: `other`'s trials against the baseline's (`base`), non-positive and NaN values left out.
    {ratio, ci, verdict, trials, baseline_trials}; ci is [low, high] or None. None where a side has no trial."""
    b = np.asarray(base, float)
    o = np.asarray(other, float)
    b, o = b[np.isfinite(b) & (b > 0)], o[np.isfinite(o) & (o > 0)]
    if not len(b) or not len(o):
        return None
    num, den = (b, o) if smaller_is_faster else (o, b)
    ratio = math.exp(np.log(num).mean() - np.log(den).mean())
    ci = [float(x) for x in welch_log_interval(num, den, level)] if min(len(b), len(o)) >= MIN_TRIALS else None
    return {"ratio": ratio, "ci": ci, "verdict": verdict(ci), "trials": int(len(o)), "baseline_trials": int(len(b))}


def against_baseline(df: pd.DataFrame, baseline: str, settings: dict | None = None) -> dict[tuple[str, int], dict]:
    """From results.csv's rows: per (configuration, length) that both it and the baseline measured, for
    each configuration other than the baseline, {metric: speedup(...)} for the METRICS (a metric without
    a ratio is absent). settings: confidence (fits.json's "settings"; defaults:
    longctx.analysis.fits.SETTINGS)."""
    st = {**SETTINGS, **(settings or {})}
    ok = ok_rows(df)
    groups = {key: g for key, g in ok.groupby(["configuration", "length"], sort=True)}
    out: dict[tuple[str, int], dict] = {}
    for (name, length), g in groups.items():
        ref = groups.get((baseline, length))
        if name == baseline or ref is None:
            continue
        row = {}
        for metric, (column, smaller) in METRICS.items():
            if column not in g:
                continue
            s = speedup(ref[column], g[column], smaller, st["confidence"])
            if s is not None:
                row[metric] = s
        out[(str(name), int(length))] = row
    return out
