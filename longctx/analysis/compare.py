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

A table of many such verdicts is one family (`change`, for a version against an earlier one): each of its m
intervals is taken at level 1 - (1 - confidence) / m (Bonferroni, `family_level`), so that the chance that any
interval of the table misses its true ratio, and so of any wrong verdict in the table, is at most 1 - confidence
whatever the rows' dependence. Its cost is width: with 3 trials a side (Welch's degrees of freedom near 4) a
95% family of 40 takes the t quantile 8.1 instead of 2.8. `detectable_change` says what that costs in words:
the smallest change, at a row's noise and trial counts, that its interval would find beyond the margin in
DETECTION of reruns (tests/test_version_compare.py shows both by simulation).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import special

from ..core.fitting import LEVEL
from .tables import ok_rows

FASTER, SLOWER, SAME, NO_INTERVAL = "faster", "slower", "no measurable difference", "no interval"
VERDICTS = (FASTER, SLOWER, SAME, NO_INTERVAL)


class Metric(NamedTuple):
    column: str  # of results.csv (and of a version's kept trials)
    smaller_is_faster: bool
    words: str  # its name in a sentence


# the figures every comparison looks at: a configuration against the baseline, a version against an earlier one, an
# A/B's two sides, a drafting configuration against its twin
METRICS = {"ttft": Metric("ttft_s", True, "TTFT"), "decode": Metric("decode_tok_s", False, "decode")}
MARGIN = 0.05  # a change whose interval lies wholly within 1 +- MARGIN is no change worth the name (report.regression_margin)
MIN_TRIALS = 3  # on each side, for an interval (its coverage is shown from 3; at 2 it over-covers)
METHOD = "welch-log"  # recorded with the verdicts (headline.intervals.method)
CORRECTION = "bonferroni"  # how a family of intervals holds together (family_level)
DETECTION = 0.8  # the share of reruns in which a change of detectable_change's size is found


def verdict(ci) -> str:
    """What an interval [low, high] of a speedup says; NO_INTERVAL without one."""
    if ci is None:
        return NO_INTERVAL
    lo, hi = ci
    return FASTER if lo > 1 else SLOWER if hi < 1 else SAME


RESOLUTIONS = (1.0, 0.1, 0.01, 1e-3, 1e-4, 1e-5, 1e-6)  # timer steps (s) a side's values may all be multiples of


def timer_resolution(num, den) -> np.ndarray:
    """Per comparison (the leading axes), the coarsest of RESOLUTIONS that every value of both sides is a whole
    multiple of (imported results in whole milliseconds: 1e-3), else 0 (a clock finer than any of them)."""
    v = np.concatenate([np.asarray(num, float), np.asarray(den, float)], axis=-1)
    out = np.zeros(v.shape[:-1])
    for r in reversed(RESOLUTIONS):  # finest first: a coarser step that also fits overrides it
        q = v / r
        whole = np.all(np.abs(q - np.round(q)) <= 1e-6 * np.maximum(1.0, np.abs(q)), axis=-1)
        out = np.where(whole, r, out)
    return out


def welch_log_interval(num, den, level: float) -> np.ndarray:
    """The `level` interval [low, high] of the ratio of geometric means num / den: Welch's t interval of the
    difference of their mean logs, exponentiated. num, den: positive values along the last axis (at least 2 each);
    leading axes are separate comparisons (an array of intervals, shape (..., 2)). A side's variance is floored by
    the timer's resolution (timer_resolution: r): values read to a step of r are off by up to r/2 each, the same way
    in every trial where the truth does not move, so a side's mean log is uncertain by (r / its mean)^2 / 12 however
    many trials agree (three 13 ms against three 12 ms read in whole milliseconds: [0.99, 1.18], not [1.083,
    1.083]). Only on a clock finer than every step of RESOLUTIONS are identical values an exact ratio."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    ln, ld = np.log(num), np.log(den)
    diff = ln.mean(axis=-1) - ld.mean(axis=-1)
    vn, vd = ln.var(axis=-1, ddof=1) / ln.shape[-1], ld.var(axis=-1, ddof=1) / ld.shape[-1]
    r = timer_resolution(num, den)
    vn = np.maximum(vn, (r / np.exp(ln.mean(axis=-1))) ** 2 / 12)
    vd = np.maximum(vd, (r / np.exp(ld.mean(axis=-1))) ** 2 / 12)
    se = np.sqrt(vn + vd)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (vn + vd) ** 2 / (vn**2 / (ln.shape[-1] - 1) + vd**2 / (ld.shape[-1] - 1))
    half = np.where(se > 0, special.stdtrit(np.where(se > 0, df, 1.0), 0.5 + level / 2) * se, 0.0)
    return np.exp(np.stack([diff - half, diff + half], axis=-1))


def speedup(base, other, smaller_is_faster: bool, level: float = LEVEL) -> dict | None:
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
    longctx.analysis.fits.SETTINGS: core.fitting.LEVEL)."""
    st = {"confidence": LEVEL, **(settings or {})}
    ok = ok_rows(df)
    groups = {key: g for key, g in ok.groupby(["configuration", "length"], sort=True)}
    out: dict[tuple[str, int], dict] = {}
    for (name, length), g in groups.items():
        ref = groups.get((baseline, length))
        if name == baseline or ref is None:
            continue
        row = {}
        for metric, (column, smaller, _) in METRICS.items():
            if column not in g:
                continue
            s = speedup(ref[column], g[column], smaller, st["confidence"])
            if s is not None:
                row[metric] = s
        out[(str(name), int(length))] = row
    return out


def family_level(tests: int, confidence: float) -> float:
    """The level of each of `tests` intervals that hold together with probability at least `confidence`
    (Bonferroni: valid whatever the dependence between them, e.g. TTFT and decode from the same trials)."""
    return 1 - (1 - confidence) / max(int(tests), 1)


def welch_df(n_before: int, n_now: int) -> float:
    """Welch's degrees of freedom where both sides have the same noise: 4 at 3 trials a side."""
    a, b = 1 / n_before, 1 / n_now
    return (a + b) ** 2 / (a**2 / (n_before - 1) + b**2 / (n_now - 1))


def width_cost(level: float, confidence: float, df: float) -> float:
    """How many times wider (in logs) an interval at `level` is than one at `confidence`, at Welch's `df`."""
    return float(special.stdtrit(df, 0.5 + level / 2) / special.stdtrit(df, 0.5 + confidence / 2))


def log_noise(before, now) -> float:
    """The pooled standard deviation of the two sides' logs (each about its own mean): a row's relative noise."""
    lb, ln = np.log(np.asarray(before, float)), np.log(np.asarray(now, float))
    dof = len(lb) + len(ln) - 2
    return float(math.sqrt(((len(lb) - 1) * lb.var(ddof=1) + (len(ln) - 1) * ln.var(ddof=1)) / dof)) if dof > 0 else math.nan


def median_unbiased(sd: float, dof: int) -> float:
    """A sample standard deviation over `dof` degrees of freedom scaled so that its median is the true one (the
    sample's is below it: 0.92 of it at 4): the noise a row's detectable change is figured at, so that half the
    reruns state it above the truth and half below."""
    return sd / math.sqrt(special.chdtri(dof, 0.5) / dof) if dof > 0 else math.nan


@lru_cache(maxsize=256)
def _detection_quantile(n_before: int, n_now: int, level: float, detection: float = DETECTION) -> float:
    """K such that a true log change of log(1 + margin) + K sigma is found beyond the margin in `detection` of
    reruns, for Welch's interval at `level` from lognormal trials of log-sd sigma on both sides: the interval's
    low end, d + e - q(df) se, clears the margin when d > log(1 + margin) + q(df) se - e; this draws e, se and df
    at sigma 1 (they scale with sigma, df does not) from a fixed seed, so the figure is the same in every run."""
    rng = np.random.default_rng(43)
    draws = 20000
    vb = rng.chisquare(n_before - 1, draws) / (n_before - 1) / n_before
    vn = rng.chisquare(n_now - 1, draws) / (n_now - 1) / n_now
    df = (vb + vn) ** 2 / (vb**2 / (n_before - 1) + vn**2 / (n_now - 1))
    e = rng.standard_normal(draws) * math.sqrt(1 / n_before + 1 / n_now)
    need = special.stdtrit(df, 0.5 + level / 2) * np.sqrt(vb + vn) - e
    return float(np.quantile(need, detection))


def detectable_change(noise: float, n_before: int, n_now: int, level: float, margin: float,
                      detection: float = DETECTION) -> float | None:
    """The smallest change (a fraction: 0.3 is 30% slower or faster) that a Welch interval at `level` would find
    beyond `margin` in `detection` of reruns, at this relative noise (log_noise) and these trial counts;
    None below MIN_TRIALS a side or without a noise figure."""
    if min(n_before, n_now) < MIN_TRIALS or not (noise >= 0):
        return None
    return float((1 + margin) * math.exp(noise * _detection_quantile(int(n_before), int(n_now), float(level), detection)) - 1)


def change(before, now, smaller_is_faster: bool, level: float, margin: float, tolerance: float = 0.0,
           one_sided: bool = False) -> dict | None:
    """`now`'s trials against `before`'s (non-positive and NaN values left out), as a row of a family at `level`
    (family_level): {ratio: now/before of the geometric means, ci: its Welch interval [low, high] or None (one_sided:
    the two one-sided bounds at `level`, each missing the truth in at most 1 - level of reruns: the interval at
    2 level - 1), speedup and speedup_ci: the same as a speedup (above 1 faster: a TTFT ratio and its interval
    inverted), verdict (as `verdict` reads the speedup: faster, slower, no measurable difference, no interval),
    beyond_margin (the whole interval lies beyond the threshold (1 + margin)(1 + tolerance) on the side of its
    verdict: a TTFT ratio above it, a rate ratio below its inverse, or the reverse; tolerance: what else may have
    moved between the two sides, such as the machine between two runs), regression (slower beyond it), trials now and
    before, noise (log_noise), threshold and detectable (detectable_change at that noise beyond the threshold,
    median_unbiased)}. None where a side has no trial."""
    b, o = np.asarray(before, float), np.asarray(now, float)
    b, o = b[np.isfinite(b) & (b > 0)], o[np.isfinite(o) & (o > 0)]
    if not len(b) or not len(o):
        return None
    two_sided = 2 * level - 1 if one_sided else level  # the two-sided interval whose ends are the one-sided bounds
    ratio = math.exp(np.log(o).mean() - np.log(b).mean())
    ci = [float(x) for x in welch_log_interval(o, b, two_sided)] if min(len(b), len(o)) >= MIN_TRIALS else None
    speed = None if ci is None else ([1 / ci[1], 1 / ci[0]] if smaller_is_faster else ci)  # as a speedup: above 1 faster
    said = verdict(speed)
    threshold = (1 + margin) * (1 + tolerance)
    beyond = speed is not None and (speed[1] < 1 / threshold if said == SLOWER else speed[0] > threshold if said == FASTER else False)
    noise = log_noise(b, o) if min(len(b), len(o)) >= 2 else math.nan
    return {"ratio": ratio, "ci": ci, "speedup": 1 / ratio if smaller_is_faster else ratio, "speedup_ci": speed,
            "verdict": said, "beyond_margin": bool(beyond), "regression": bool(beyond and said == SLOWER),
            "trials": int(len(o)), "trials_before": int(len(b)), "noise": noise if math.isfinite(noise) else None,
            "threshold": threshold,
            "detectable": detectable_change(median_unbiased(noise, len(b) + len(o) - 2), len(b), len(o), two_sided,
                                            threshold - 1)}
