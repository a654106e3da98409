"""Each configuration against the baseline: the speedup at each length, with its bootstrap interval and
what it means.

The speedup is the ratio of medians over the successful single-request trials (longctx.analysis.tables:
ok_rows, as the per-length medians take them): TTFT, the baseline's median over the configuration's;
decode, the configuration's median rate over the baseline's. Above 1 is faster, both ways.

Its interval is a percentile bootstrap: the trials of each side are resampled independently with
replacement (`bootstrap` times, seeded), and the ratio of the resampled medians taken each time; the
interval is the central `confidence` share of those ratios. The verdict follows from the interval:

- "faster": the interval lies wholly above 1;
- "slower": wholly below 1;
- "no measurable difference": it includes 1, so the measurements do not tell this configuration from
  the baseline (a ratio of 1.04 from three noisy trials is not a gain);
- "no interval": there is none to judge by: fewer than MIN_TRIALS trials on a side (one trial says
  nothing of its own noise), no resamples (analysis.bootstrap: 0), or too few usable resampled ratios.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pandas as pd

from ..core.fitting import median_draws, percentile_interval
from ..core.numbers import ratio as ratio_of
from .fits import SETTINGS
from .tables import ok_rows

FASTER, SLOWER, SAME, NO_INTERVAL = "faster", "slower", "no measurable difference", "no interval"
VERDICTS = (FASTER, SLOWER, SAME, NO_INTERVAL)
# metric: (column of results.csv, whether a smaller value is faster)
METRICS = {"ttft": ("ttft_s", True), "decode": ("decode_tok_s", False)}
MIN_TRIALS = 2  # on each side, for an interval (and at least longctx.core.fitting.MIN_DRAWS usable resampled ratios)


def verdict(ci) -> str:
    """What an interval [low, high] of a speedup says; NO_INTERVAL without one."""
    if ci is None:
        return NO_INTERVAL
    lo, hi = ci
    return FASTER if lo > 1 else SLOWER if hi < 1 else SAME


def speedup(base, other, smaller_is_faster: bool, n_boot: int = SETTINGS["bootstrap"],
            level: float = SETTINGS["confidence"], rng: np.random.Generator | None = None) -> dict | None:
    """One comparison: `other`'s trials against the baseline's (`base`), NaNs left out. {ratio, ci, verdict,
    trials, baseline_trials}; ci is [low, high] or None. None where a side has no trial or the ratio of
    medians is undefined (a median of 0 below the line)."""
    b = np.asarray(base, float)
    o = np.asarray(other, float)
    b, o = b[np.isfinite(b)], o[np.isfinite(o)]
    if not len(b) or not len(o):
        return None
    num, den = (b, o) if smaller_is_faster else (o, b)
    ratio = ratio_of(np.median(num), np.median(den))
    if ratio is None or not math.isfinite(ratio):
        return None
    ci = None
    if n_boot and min(len(b), len(o)) >= MIN_TRIALS:
        rng = rng if rng is not None else np.random.default_rng(SETTINGS["seed"])
        n, d = median_draws(num, n_boot, rng), median_draws(den, n_boot, rng)
        # the ratio of each pair of resampled medians, where the denominator is positive (NaN elsewhere: left out)
        ci = percentile_interval(np.divide(n, d, out=np.full(n.shape, np.nan), where=d > 0), level)
    return {"ratio": ratio, "ci": ci, "verdict": verdict(ci), "trials": int(len(o)), "baseline_trials": int(len(b))}


def _rng(seed: int, name: str, length: int, metric: str) -> np.random.Generator:
    """A generator of its own for each comparison, from the seed: a comparison's interval does not depend
    on which other configurations or lengths were measured, nor on their order."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), int(length), zlib.crc32(metric.encode())])


def against_baseline(df: pd.DataFrame, baseline: str, settings: dict | None = None) -> dict[tuple[str, int], dict]:
    """From results.csv's rows: per (configuration, length) that both it and the baseline measured, for
    each configuration other than the baseline, {metric: speedup(...)} for the METRICS (a metric without
    a ratio is absent). settings: bootstrap, confidence and seed (fits.json's "settings"; defaults:
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
            s = speedup(ref[column], g[column], smaller, st["bootstrap"], st["confidence"],
                        _rng(st["seed"], str(name), int(length), metric))
            if s is not None:
                row[metric] = s
        out[(str(name), int(length))] = row
    return out
