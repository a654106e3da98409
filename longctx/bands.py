"""Confidence bands around the fitted scaling models, for the plots.

A fit in fits.json may carry its own interval data (bootstrap intervals, for instance); the band
then comes from it. Recognised, per fit entry ("prefill" or "decode"):
- "band": {"lengths": [...], "lower": [...], "upper": [...]}: the curve's interval at those lengths
  (interpolated on log L in between);
- "samples" (or "bootstrap": {"samples": [...]}): coefficient sets, e.g. bootstrap refits, each a
  dict with the fit's coefficient keys; the band is the pointwise central `level` range of their curves;
- "ci" or "intervals" ({coefficient: [low, high]}), or "<coefficient>_ci": [low, high]: every model
  term is non-negative for L >= 0, so the curve of the low ends and that of the high ends bound it.
Without any of these, the band is derived from the fit's covariance: the weighted least squares of
longctx.analysis (relative residuals) on the coefficients the fit left free (those at their bound
of zero stay fixed), with Student's t at `level`.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

LEVEL = 0.95
MODELS = {
    "prefill": (("a_s", "b_s_per_token", "c_s_per_token2"), lambda L: [np.ones_like(L), L, L**2]),
    "decode": (("t0_s", "beta_s_per_token"), lambda L: [np.ones_like(L), L]),
}


def curve(kind: str, coef: dict, lengths) -> np.ndarray:
    names, basis = MODELS[kind]
    L = np.asarray(lengths, float)
    return sum(float(coef[n]) * term for n, term in zip(names, basis(L)))


def _coefficient_intervals(kind: str, fit: dict) -> dict | None:
    names, _ = MODELS[kind]
    table = fit.get("ci") or fit.get("intervals")
    if isinstance(table, dict) and all(n in table for n in names):
        return {n: table[n] for n in names}
    if all(f"{n}_ci" in fit for n in names):
        return {n: fit[f"{n}_ci"] for n in names}
    return None


def _samples(fit: dict) -> list | None:
    s = fit.get("samples")
    if s is None and isinstance(fit.get("bootstrap"), dict):
        s = fit["bootstrap"].get("samples")
    return s if isinstance(s, list) and len(s) >= 10 else None


def source(kind: str, fit: dict | None) -> str | None:
    """Where a band for this fit comes from: 'intervals' (fits.json's own), 'covariance', or None (no fit)."""
    if not fit:
        return None
    if isinstance(fit.get("band"), dict) or _samples(fit) or _coefficient_intervals(kind, fit):
        return "intervals"
    return "covariance"


def band(kind: str, fit: dict, grid, lengths=None, values=None, level: float = LEVEL):
    """(lower, upper) of the fitted curve on grid, or None where there is not enough to say."""
    grid = np.asarray(grid, float)
    b = fit.get("band")
    if isinstance(b, dict) and len(b.get("lengths", [])) >= 2:
        x = np.log(np.asarray(b["lengths"], float))
        return np.interp(np.log(grid), x, b["lower"]), np.interp(np.log(grid), x, b["upper"])
    samples = _samples(fit)
    if samples:
        curves = np.array([curve(kind, s, grid) for s in samples])
        tail = (1 - level) / 2 * 100
        return np.percentile(curves, tail, axis=0), np.percentile(curves, 100 - tail, axis=0)
    ci = _coefficient_intervals(kind, fit)
    if ci:
        return (curve(kind, {n: v[0] for n, v in ci.items()}, grid),
                curve(kind, {n: v[1] for n, v in ci.items()}, grid))
    if lengths is None or values is None:
        return None
    return covariance_band(kind, fit, lengths, values, grid, level)


def covariance_band(kind: str, fit: dict, lengths, values, grid, level: float = LEVEL):
    """The band from the fit's covariance: weights 1/y as in the fit, the free coefficients only."""
    names, basis = MODELS[kind]
    L, y = np.asarray(lengths, float), np.asarray(values, float)
    keep = np.isfinite(y) & (y > 0)
    L, y = L[keep], y[keep]
    coef = np.array([float(fit[n]) for n in names])
    free = coef > 0
    n, k = len(y), int(free.sum())
    if k == 0 or n <= k:
        return None
    X = np.column_stack(basis(L))
    Xw = X[:, free] / y[:, None]
    scale = np.abs(Xw).max(axis=0)
    scale[scale == 0] = 1.0
    resid = (y - X @ coef) / y
    s2 = float(resid @ resid) / (n - k)
    cov = s2 * np.linalg.pinv((Xw / scale).T @ (Xw / scale)) / np.outer(scale, scale)
    G = np.column_stack(basis(np.asarray(grid, float)))[:, free]
    se = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", G, cov, G), 0.0))
    half = stats.t.ppf(0.5 + level / 2, n - k) * se
    pred = G @ coef[free]
    return pred - half, pred + half


def describe(sources: set[str | None], level: float = LEVEL) -> str:
    """The caption's words for the shaded bands."""
    s = {x for x in sources if x}
    if not s:
        return "no fit, no band"
    if s == {"intervals"}:
        return f"the fit's {level:.0%} interval from fits.json"
    if s == {"covariance"}:
        return f"the fit's {level:.0%} confidence band (from its covariance)"
    return f"the fit's {level:.0%} interval from fits.json, else its confidence band from the covariance"
