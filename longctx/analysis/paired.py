"""A and B measured in one run, interleaved in blocks: the paired interval an A/B gates on.

The two sides (A, the baseline; B, the candidate) are measured alternately in blocks, in ABBA order
(longctx.core.interleave.schedule: A B B A A B B A ...), each block a few trials (or kernel calls) of one side. Neighbouring blocks pair
up, (1st, 2nd), (3rd, 4th), ..., so each pair holds one block of each side taken back to back: what the machine
did over the pair (a clock that drifts, a neighbour that competes for the cores) hits both. The unit of
replication is the pair, not the trial: trials of one block share its moment and are not independent of each
other, pairs far apart in time are. A pair's difference is d = mean log B - mean log A over its two blocks' values;
ABBA order makes a drift that is linear over four blocks cancel between a pair and the next.

The interval is Student's t on the n pairs' differences (n - 1 degrees of freedom), exponentiated: the ratio of
B's geometric mean to A's. It is one-sided for the gate's question: B is "slower" only where the bound on the
faster side clears 1 (and a regression where it clears the margin), at the family's level (a table of m
comparisons takes each at 1 - (1 - confidence) / m, Bonferroni: longctx.analysis.compare.family_level). The
bounds reported, [low, high], are the two one-sided bounds at that level. Coverage at the trial counts and noise
in use is shown by simulation (tests/test_ab_statistics.py, bench/ab_drift.py), with drift between and within runs.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import special

from ..core.interleave import SIDES, schedule
from .compare import DETECTION, FASTER, NO_INTERVAL, SAME, SLOWER, median_unbiased

__all__ = ["MIN_PAIRS", "SIDES", "detectable", "pair_differences", "paired_change", "schedule"]

MIN_PAIRS = 2  # pairs of neighbouring blocks with both sides measured, for an interval (1 degree of freedom)
METHOD = "paired-blocks-t"  # recorded with the verdicts
UNIT = "pair of neighbouring blocks (one of each side, back to back)"


def _clean(values) -> np.ndarray:
    v = np.asarray(values if values is not None else [], float)
    return v[np.isfinite(v) & (v > 0)]


def pair_differences(blocks: list[tuple[str, list[float]]]) -> tuple[np.ndarray, int]:
    """From blocks in the order they were measured, (side, values), paired (1st, 2nd), (3rd, 4th), ...: each pair's
    difference mean log B - mean log A, and how many pairs were left out (a block with no valid value, or a pair that
    does not hold one block of each side). Values that are not positive and finite are left out."""
    out, dropped = [], 0
    for i in range(0, len(blocks) - 1, 2):
        (s1, v1), (s2, v2) = blocks[i], blocks[i + 1]
        v1, v2 = _clean(v1), _clean(v2)
        if {s1, s2} != set(SIDES) or not len(v1) or not len(v2):
            dropped += 1
            continue
        a, b = (v1, v2) if s1 == "A" else (v2, v1)
        out.append(float(np.log(b).mean() - np.log(a).mean()))
    dropped += len(blocks) % 2  # a block left over without a neighbour
    return np.asarray(out, float), dropped


@lru_cache(maxsize=256)
def _detection_quantile(n: int, level: float, detection: float = DETECTION) -> float:
    """K such that a true log change of log(threshold) + K sigma is found beyond the threshold in `detection` of
    reruns, for the one-sided t bound at `level` from n pair differences of log-sd sigma: the bound's faster end,
    d + e - q s / sqrt(n), clears the threshold when d > log(threshold) + q s / sqrt(n) - e; drawn at sigma 1 from a
    fixed seed, so the figure is the same in every run."""
    rng = np.random.default_rng(47)
    draws = 20000
    s = np.sqrt(rng.chisquare(n - 1, draws) / (n - 1))
    e = rng.standard_normal(draws) / math.sqrt(n)
    need = special.stdtrit(n - 1, level) * s / math.sqrt(n) - e
    return float(np.quantile(need, detection))


def detectable(noise: float, n: int, level: float, threshold: float, detection: float = DETECTION) -> float | None:
    """The smallest change (a fraction) that the one-sided bound at `level` from n pairs of log-sd `noise` (the pair
    differences') finds beyond `threshold` (1 + margin, or more) in `detection` of reruns; None below MIN_PAIRS."""
    if n < MIN_PAIRS or not (noise >= 0):
        return None
    return float(threshold * math.exp(noise * _detection_quantile(int(n), float(level), detection)) - 1)


def paired_change(d, smaller_is_faster: bool, level: float, margin: float, tolerance: float = 0.0,
                  trials: tuple[int, int] = (0, 0)) -> dict | None:
    """B against A from the pairs' differences d (pair_differences), as a row of a family at `level`: {ratio: B/A of
    the geometric means (exp of the mean difference), ci: the one-sided bounds [low, high] at `level` (None below
    MIN_PAIRS), speedup and speedup_ci (above 1 faster: a time's ratio and bounds inverted), verdict (slower where
    the speedup's high bound is under 1, faster where its low bound is over 1, else no measurable difference; no
    interval without one), beyond_margin and regression (the faster-side bound clears (1 + margin)(1 + tolerance) on
    the slower side: tolerance is what else may have moved, 0 within one interleaved run), pairs, trials (B's,
    A's), noise (the pair differences' log sd), detectable (the change found beyond that threshold in DETECTION of
    reruns, at the median-unbiased noise)}. None without a pair."""
    d = np.asarray(d, float)
    d = d[np.isfinite(d)]
    n = len(d)
    if not n:
        return None
    mean = float(d.mean())
    ratio = math.exp(mean)
    ci = None
    noise = float(d.std(ddof=1)) if n >= 2 else math.nan
    if n >= MIN_PAIRS:
        half = float(special.stdtrit(n - 1, level)) * noise / math.sqrt(n)
        ci = [math.exp(mean - half), math.exp(mean + half)]
    speed = None if ci is None else ([1 / ci[1], 1 / ci[0]] if smaller_is_faster else ci)
    said = NO_INTERVAL if speed is None else FASTER if speed[0] > 1 else SLOWER if speed[1] < 1 else SAME
    threshold = (1 + margin) * (1 + tolerance)
    beyond = speed is not None and (speed[1] < 1 / threshold if said == SLOWER else speed[0] > threshold if said == FASTER else False)
    return {"ratio": ratio, "ci": ci, "speedup": 1 / ratio if smaller_is_faster else ratio, "speedup_ci": speed,
            "verdict": said, "beyond_margin": bool(beyond), "regression": bool(beyond and said == SLOWER),
            "pairs": n, "trials": int(trials[0]), "trials_before": int(trials[1]), "method": METHOD,
            "noise": noise if math.isfinite(noise) else None, "threshold": threshold,
            "detectable": detectable(median_unbiased(noise, n - 1), n, level, threshold) if n >= MIN_PAIRS else None}
