"""Confidence bands around the fitted scaling models, for the plots and their captions.

A band is the pointwise bootstrap interval that longctx.analysis.fits writes into fits.json for each
configuration: `curves` = {"length": [...], "prefill": {"fit", "lo", "hi"}, "decode": {...}}, the
fitted curve and the percentile interval of the bootstrap refits' curves (Fit.curve_interval) on a
log-spaced grid of lengths reaching the extrapolation length; "lo" and "hi" are null when the fits
were made without resamples (analysis.bootstrap: 0). Between grid lengths the band is interpolated on
log L; outside the grid it is NaN (no band drawn there).
"""

from __future__ import annotations

import numpy as np

KINDS = ("prefill", "decode")


def band(fit: dict, kind: str, grid) -> tuple[np.ndarray, np.ndarray] | None:
    """(lower, upper) of the `kind` curve of one configuration's fits on grid, or None without an interval."""
    curves = (fit or {}).get("curves") or {}
    c = curves.get(kind)
    if not c or c.get("lo") is None or c.get("hi") is None:
        return None
    at = np.asarray(curves["length"], float)
    g = np.asarray(grid, float)
    inside = (g >= at[0]) & (g <= at[-1])
    x = np.log(np.where(inside, g, at[0]))
    lo = np.interp(x, np.log(at), np.asarray(c["lo"], float))
    hi = np.interp(x, np.log(at), np.asarray(c["hi"], float))
    return np.where(inside, lo, np.nan), np.where(inside, hi, np.nan)


def describe(analysis: dict, kind: str) -> str:
    """The caption's words for the shaded bands of `kind`, from fits.json (its settings and curves)."""
    st = analysis.get("settings") or {}
    fits = (analysis.get("configurations") or {}).values()
    if not any(kind in f for f in fits):
        return "no fit, no band"
    if not any(band(f, kind, [f["curves"]["length"][0]]) is not None for f in fits if kind in f and f.get("curves")):
        return "no band (the fits were made without bootstrap resamples)"
    return f"the fit's {st.get('confidence', 0.95):.0%} bootstrap interval ({st.get('bootstrap')} resamples)"
