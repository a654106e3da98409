"""The prefix cache's cost model and what it says of data/prefix.csv (longctx.analysis.prefix) ->
data/prefix_fits.json.

A prompt of L tokens whose first P are served from the cache prefills the n = L - P new tokens, each
attending to every token before it: TTFT = a + b n + c (L^2 - P^2) (the linear work per new token, the
attention pairs of the new tokens; a cold prompt is P = 0, the cold fit a + b L + c L^2). P is what the
server says it cached where it reports it, else what it should have (prefix.csv's new_tokens).

Per configuration:
- `model`: a, b, c (non-negative, relative residuals, residual bootstrap: longctx.core.fitting.BasisFit) fitted
  jointly over the ok trials of the hit-rate points and the ok single-request trials of results.csv (P = 0,
  or the cached count they report); `cold_check`: each coefficient against the cold fit of fits.json (the
  ratio, and whether each lies inside the other's interval); `curves`: the model against L at each hit rate
  measured, P as the server should cache it (the hit rate's prefix rounded down to the granularity).
- `points`: per (L, h): the median TTFT with a bootstrap interval (trials resampled), the model's prediction
  with its interval and the deviation, the cold TTFT at L (the hit-rate axis' own h = 0 point, the cold control
  measured the same way, else the sweep's in results.csv, else the cold fit's prediction: `cold.basis` says which), the saving against cold measured
  (cold / hit medians, with Welch's interval on the logs of the two points' trials from
  longctx.analysis.compare.MIN_TRIALS a side, none below) and predicted (model(L, 0) / model(L, P)), and the
  cached-count check (ok / mismatch / unreported, every mismatch with both numbers).
- `conversations`: per turn the measured TTFT against the model's prediction (with its interval) at its
  context and cached count, with the cache and for the control (cache flushed before every turn).
- `checks`: the cached-count check over every trial and turn, the mismatches listed.

Bootstrap, confidence and seed are fits.json's settings (--settings overrides them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import write_atomic
from ..core.fitting import LEVEL, BasisFit, median_draws, percentile_interval
from ..core.numbers import finite, is_number, json_plain, ratio
from .compare import MIN_TRIALS, welch_log_interval
from .fits import bootstrap_settings
from .load_summary import median_estimate, rng_for
from .prefix import CHECKS, COLUMNS
from .tables import failure_reasons, ok_rows

NAMES = ("a_s", "b_s_per_token", "c_s_per_token2")
MODEL = "ttft = a + b*(L - P) + c*(L^2 - P^2)"
CURVE_POINTS = 60


class PrefixFit(BasisFit):
    """TTFT = a + b (L - P) + c (L^2 - P^2) over prompts of L tokens with P of them cached."""

    def __init__(self, lengths, cached, y, n_boot: int = 0, level: float = LEVEL, seed: int = 0):
        L, P = np.asarray(lengths, float), np.asarray(cached, float)
        super().__init__(NAMES, self.design(L, P), y, n_boot, level, seed)
        self.L, self.P = L[self.kept], P[self.kept]

    def design(self, L, P=0.0) -> np.ndarray:
        L = np.atleast_1d(np.asarray(L, float))
        P = np.broadcast_to(np.asarray(P, float), L.shape)
        return np.column_stack([np.ones_like(L), L - P, L**2 - P**2])

    def estimate(self, L, P) -> dict:
        """{value, low, high} of the model at (L, P)."""
        value = float(self.predict(L, P)[0])
        draws = self.predict_draws(L, P)
        lo, hi = (self.interval(draws[:, 0]) if draws is not None else None) or [None, None]
        return {"value": value, "low": lo, "high": hi}


def expected_cached(L: int, h: float, granularity: int | None, cache: bool = True) -> int:
    """What a server should cache of a prompt of L tokens whose shared prefix is round(h L): rounded down to
    the granularity, at most L - 1 (the last token is always computed); 0 with the cache off."""
    if not cache:
        return 0
    g = max(1, int(granularity or 1))
    return int(max(0, min((int(round(h * L)) // g) * g, L - 1)))


def _rank(L: np.ndarray, P: np.ndarray) -> int:
    if not len(L):
        return 0
    X = np.column_stack([np.ones_like(L), L - P, L**2 - P**2])
    return int(np.linalg.matrix_rank(X / np.abs(X).max(axis=0).clip(min=1e-300)))


def _num(df: pd.DataFrame, column: str) -> np.ndarray:
    return pd.to_numeric(df[column], errors="coerce").to_numpy(float) if column in df else np.full(len(df), np.nan)


def _fit_rows(g: pd.DataFrame, cold: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """(L, P, TTFT) of the hit-rate trials and the cold trials the model is fitted to, and how many of each."""
    hit = g[(g["kind"] == "hit_rate") & (g["role"] == "trial") & g["status"].eq("ok")]
    L, n, y = _num(hit, "prompt_tokens"), _num(hit, "new_tokens"), _num(hit, "ttft_s")
    L = np.where(np.isfinite(L), L, _num(hit, "length"))
    keep = np.isfinite(L) & np.isfinite(n) & np.isfinite(y) & (y > 0)
    Lc = _num(cold, "length")
    Pc = np.nan_to_num(_num(cold, "cached_tokens"), nan=0.0)
    yc = _num(cold, "ttft_s")
    keep_c = np.isfinite(Lc) & np.isfinite(yc) & (yc > 0)
    return (np.concatenate([L[keep], Lc[keep_c]]), np.concatenate([(L - n)[keep], Pc[keep_c]]),
            np.concatenate([y[keep], yc[keep_c]]), int(keep.sum()), int(keep_c.sum()))


def _cold_check(fit: PrefixFit, cold: dict | None) -> dict | None:
    """Each coefficient of the model against the cold fit's (fits.json prefill): the ratio, and whether each
    lies inside the other's interval (None where that interval is unknown)."""
    if not cold:
        return None
    out = {}
    mine = fit.summary()
    for name in NAMES:
        v, c = mine[name], finite(cold.get(name))
        ci_v, ci_c = mine["ci"].get(name), (cold.get("ci") or {}).get(name)

        def inside(x, ci):
            if x is None or not ci or ci[0] is None or ci[1] is None:
                return None
            return bool(ci[0] <= x <= ci[1])

        out[name] = {"prefix": v, "prefix_ci": ci_v, "cold": c, "cold_ci": ci_c,
                     "ratio": v / c if c else None, "prefix_inside_cold": inside(v, ci_c), "cold_inside_prefix": inside(c, ci_v)}
    return out



COUNTED = ("loose", "controls", "hit_mismatch", "hit_expected")  # _check_counts' tallies beyond CHECKS


def _check_counts(rows: pd.DataFrame) -> dict:
    """The cached-count check of rows (requests) that succeeded (a failed one has no count to check): how many of
    each outcome, and the mismatches with both numbers. A check that can fail counts as a match: `ok`, a request
    that expected a hit (expected_cached > 0) at a known granularity and got its count; `loose`, one that expected
    a hit where the granularity is not known (any count within UNKNOWN_SPAN of the shared tokens passes, so it is
    told apart); `controls`, requests that expected 0 (no prefix, a flushed cache, the cache off) and got 0, which
    are not matches of anything. `mismatch` counts every disagreement, `hit_mismatch` those that expected a hit."""
    rows = rows[rows["status"].eq("ok")]
    checks = rows["cached_check"].fillna("unreported")
    expected = pd.to_numeric(rows.get("expected_cached"), errors="coerce").fillna(0) > 0 if len(rows) else checks.eq("")
    known = pd.to_numeric(rows.get("granularity"), errors="coerce").notna() if len(rows) else checks.eq("")
    out = {k: int((checks == k).sum()) for k in CHECKS}
    out.update(ok=int((checks.eq("ok") & expected & known).sum()), loose=int((checks.eq("ok") & expected & ~known).sum()),
               controls=int((checks.eq("ok") & ~expected).sum()), hit_mismatch=int((checks.eq("mismatch") & expected).sum()),
               hit_expected=int(expected.sum()))
    out["n"] = int(len(rows))
    out["mismatches"] = [{"trial": _opt_int(r.get("trial")), "turn": _opt_int(r.get("turn")),
                          "expected": _opt_int(r.get("expected_cached")), "expected_low": _opt_int(r.get("expected_cached_low")),
                          "server": _opt_int(r.get("cached_tokens"))}
                         for r in rows[checks == "mismatch"].to_dict("records")]
    return out


def _opt_int(x) -> int | None:
    v = finite(x)
    return int(v) if v is not None else None


class _Cold:
    """The cold TTFT of a configuration at L: its own h = 0 point, else measured (results.csv), else the cold fit."""

    def __init__(self, cold_rows: pd.DataFrame, zero: dict[int, np.ndarray], fit: dict | None, st: dict, name: str):
        self.rows, self.zero, self.fit, self.st, self.name = cold_rows, zero, fit, st, name

    def at(self, L: int) -> tuple[dict | None, np.ndarray | None, str | None]:
        """({value, low, high}, the measured values (None: from the cold fit), basis)."""
        st = self.st
        # the hit-rate axis' own h = 0 point first: the cold control measured the same way, on the same server
        # minutes apart, where the sweep's lengths were measured earlier (a machine that slowed or sped up
        # between the two would otherwise show as a saving at h = 0)
        values, basis = (self.zero[L], "hit rate 0") if L in self.zero else (np.array([]), "measured")
        if not np.isfinite(values).any():
            values = _num(self.rows[self.rows["length"] == L], "ttft_s") if len(self.rows) else np.array([])
            basis = "measured"
        values = values[np.isfinite(values) & (values > 0)]
        if values.size:
            draws = median_draws(values, st["bootstrap"], rng_for(st["seed"], self.name, "cold", L))
            lo, hi = percentile_interval(draws, st["confidence"]) or (None, None)
            return {"value": float(np.median(values)), "low": lo, "high": hi}, values, basis
        f = self.fit
        if f and all(is_number(f.get(k)) for k in NAMES):
            value = f["a_s"] + f["b_s_per_token"] * L + f["c_s_per_token2"] * L * L
            return {"value": float(value), "low": None, "high": None}, None, "cold fit"
        return None, None, None


def _point(g: pd.DataFrame, fit: PrefixFit | None, cold: _Cold, st: dict, key: tuple) -> dict:
    """One (L, h) point of the hit-rate axis (g: its rows of prefix.csv)."""
    first = g.iloc[0]
    L = int(first["length"])
    h = float(first["hit_rate"])
    trials = g[g["role"] == "trial"]
    ok = trials[trials["status"].eq("ok")]
    y = _num(ok, "ttft_s")
    y = y[np.isfinite(y) & (y > 0)]
    new = _num(ok, "new_tokens")
    new = new[np.isfinite(new)]
    expected = _opt_int(g["expected_cached"].dropna().iloc[0]) if g["expected_cached"].notna().any() else None
    P = float(L - np.median(new)) if new.size else float(expected or 0)
    out = {"length": L, "hit_rate": h, "prefix_tokens": _opt_int(first.get("prefix_tokens")), "expected_cached": expected,
           "cached": P, "n": int(len(trials)), "ok": int(len(ok)), "failed": int(len(trials) - len(ok)),
           "reasons": failure_reasons(g[g["role"] != "warm"]),
           "warm": None, "status": first.get("point_status") if isinstance(first.get("point_status"), str) else None}
    warm = g[g["role"] == "warm"]
    if len(warm):
        w = warm.iloc[0]
        out["warm"] = {"status": w["status"], "reason": w["reason"] if isinstance(w["reason"], str) else None,
                       "ttft_s": finite(w["ttft_s"])}
    out["ttft"] = median_estimate(y, st, *key, "ttft")
    out["predicted"] = fit.estimate(L, P) if fit else None
    out["deviation"] = ratio(out["ttft"]["value"], (out["predicted"] or {}).get("value"))
    out["deviation"] = out["deviation"] - 1 if out["deviation"] is not None else None
    c, c_values, basis = cold.at(L)
    out["cold"] = {**c, "basis": basis} if c else None
    measured = ratio((c or {}).get("value"), out["ttft"]["value"])
    # Welch's interval on the logs, as a speedup's (longctx.analysis.compare): from MIN_TRIALS a side, none below
    # (a percentile bootstrap of 2 trials covered 70% where it said 95%)
    lo = hi = None
    n_cold = int(c_values.size) if c_values is not None else 0
    if measured is not None and min(n_cold, y.size) >= MIN_TRIALS:
        lo, hi = (float(x) for x in welch_log_interval(c_values, y, st["confidence"]))
    out["saving"] = {"ratio": measured, "low": lo, "high": hi, "n": int(y.size), "n_cold": n_cold,
                     "interval": "Welch" if lo is not None else f"none: fewer than {MIN_TRIALS} trials a side",
                     "seconds": c["value"] - out["ttft"]["value"] if measured is not None else None}
    if fit:
        d_hit, d_cold = fit.predict_draws(L, P), fit.predict_draws(L, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            plo, phi = (percentile_interval(d_cold[:, 0] / d_hit[:, 0], st["confidence"]) if d_hit is not None else None) or (None, None)
        value = ratio(float(fit.predict(L, 0.0)[0]), float(fit.predict(L, P)[0]))
        out["saving_predicted"] = {"ratio": value, "low": plo, "high": phi,
                                   "seconds": float(fit.predict(L, 0.0)[0] - fit.predict(L, P)[0])}
    else:
        out["saving_predicted"] = None
    out["check"] = _check_counts(trials)
    return out


def _conversation(g: pd.DataFrame, fit: PrefixFit | None) -> dict:
    first = g.iloc[0]
    turns = g[g["role"] == "turn"].sort_values("turn")
    rows = []
    for r in turns.to_dict("records"):
        L, new = finite(r.get("prompt_tokens")), finite(r.get("new_tokens"))
        P = L - new if L is not None and new is not None else None
        row = {"turn": _opt_int(r.get("turn")), "prompt_tokens": _opt_int(L), "previous_tokens": _opt_int(r.get("previous_tokens")),
               "expected_cached": _opt_int(r.get("expected_cached")), "cached_tokens": _opt_int(r.get("cached_tokens")),
               "cached_check": r.get("cached_check") if isinstance(r.get("cached_check"), str) else "unreported",
               "cached": P, "status": r.get("status"), "reason": r.get("reason") if isinstance(r.get("reason"), str) else None,
               "ttft_s": finite(r.get("ttft_s")) if r.get("status") == "ok" else None, "predicted": None, "deviation": None,
               "cold_predicted_s": None}
        if fit and L is not None and P is not None:
            row["predicted"] = fit.estimate(L, P)
            row["cold_predicted_s"] = float(fit.predict(L, 0.0)[0])
            dev = ratio(row["ttft_s"], row["predicted"]["value"])
            row["deviation"] = dev - 1 if dev is not None else None
        rows.append(row)
    devs = [abs(r["deviation"]) for r in rows if r["deviation"] is not None]
    ok = [r for r in rows if r["status"] == "ok"]
    cache = first.get("cache")
    return {"index": int(first["point"]), "cache": bool(cache) if isinstance(cache, (bool, np.bool_)) or is_number(cache) else None,
            "turn_tokens": _opt_int(first.get("turn_tokens")), "output_tokens": _opt_int(first.get("output_tokens")),
            "max_context": _opt_int(first.get("max_context")),
            "status": first.get("point_status") if isinstance(first.get("point_status"), str) else None,
            "reason": first.get("point_reason") if isinstance(first.get("point_reason"), str) else None,
            "reasons": failure_reasons(g), "n": len(rows), "ok": len(ok), "failed": len(rows) - len(ok),
            "median_abs_deviation": float(np.median(devs)) if devs else None,
            "turns": rows, "check": _check_counts(turns)}


def _curves(fit: PrefixFit, hit_rates: list[float], lengths: list[int], granularity: int | None, cache: bool) -> dict:
    grid = np.unique(np.geomspace(max(2, min(lengths) // 2), max(lengths) * 1.05, CURVE_POINTS).astype(int))
    out = {"length": grid.tolist(), "hit_rates": {}}
    for h in sorted(set(hit_rates) | {0.0}):
        P = np.array([expected_cached(int(L), h, granularity, cache) for L in grid], float)
        lo, hi = fit.curve_interval(grid, P)
        out["hit_rates"][f"{h:g}"] = {"hit_rate": h, "fit": fit.predict(grid, P).tolist(),
                                      "lo": None if lo is None else lo.tolist(), "hi": None if hi is None else hi.tolist()}
    return out


def _configuration(name: str, g: pd.DataFrame, cold_rows: pd.DataFrame, cold_fit: dict | None, st: dict) -> dict:
    granularity = _opt_int(g["granularity"].dropna().iloc[0]) if g["granularity"].notna().any() else None
    hit = g[g["kind"] == "hit_rate"]
    caches = hit["cache"].dropna() if len(hit) else g["cache"].dropna()
    cache = bool(caches.iloc[0]) if len(caches) else None
    out: dict = {"granularity": granularity, "cache": cache, "failed": failure_reasons(g[g["kind"].isna()]),
                 "model": None, "cold_check": None, "curves": None, "points": [], "conversations": []}
    L, P, y, n_hit, n_cold = _fit_rows(g, cold_rows)
    out["fitted_on"] = {"hit_rate_trials": n_hit, "cold_trials": n_cold}
    fit = None
    if _rank(L, P) >= len(NAMES) and len(y) >= len(NAMES):
        fit = PrefixFit(L, P, y, st["bootstrap"], st["confidence"], st["seed"])
        out["model"] = {"model": MODEL, **fit.summary(), **out["fitted_on"]}
        out["cold_check"] = _cold_check(fit, cold_fit)
    else:
        out["model_reason"] = (f"{len(y)} ok trials ({n_hit} with a prefix cached, {n_cold} cold) do not determine the "
                               "three coefficients (they need prompts of at least two lengths and at least one with a cached prefix)")
    zero = {}
    for (length, h), p in hit[hit["length"].notna() & hit["hit_rate"].notna()].groupby(["length", "hit_rate"], sort=True):
        if h == 0:
            ok = p[(p["role"] == "trial") & p["status"].eq("ok")]
            zero[int(length)] = _num(ok, "ttft_s")
    cold = _Cold(cold_rows, zero, cold_fit, st, name)
    for (length, h), p in hit[hit["length"].notna() & hit["hit_rate"].notna()].groupby(["length", "hit_rate"], sort=True):
        out["points"].append(_point(p, fit, cold, st, (name, int(length), float(h))))
    unplaced = hit[hit["length"].isna() | hit["hit_rate"].isna()]
    out["failed"] += failure_reasons(unplaced)
    conv = g[g["kind"] == "conversation"]
    for _, c in conv.groupby("point", sort=True):
        out["conversations"].append(_conversation(c, fit))
    if fit and out["points"]:
        out["curves"] = _curves(fit, [p["hit_rate"] for p in out["points"]], [p["length"] for p in out["points"]],
                                granularity, cache is not False)
    requests = g[g["role"].isin(["trial", "turn"])]
    checks = _check_counts(requests)
    where = []
    for r in requests[requests["cached_check"] == "mismatch"].to_dict("records"):
        where.append({"kind": r["kind"], "length": _opt_int(r.get("length")), "hit_rate": finite(r.get("hit_rate")),
                      "conversation": _opt_int(r.get("point")) if r["kind"] == "conversation" else None,
                      "cache": bool(r["cache"]) if r.get("cache") in (True, False) else None,
                      "trial": _opt_int(r.get("trial")), "turn": _opt_int(r.get("turn")),
                      "expected": _opt_int(r.get("expected_cached")), "expected_low": _opt_int(r.get("expected_cached_low")),
                      "server": _opt_int(r.get("cached_tokens"))})
    out["checks"] = {**{k: checks[k] for k in (*CHECKS, *COUNTED, "n")}, "mismatches": where}
    return out


def analyze_prefix(prefix: pd.DataFrame, results: pd.DataFrame | None, fits: dict | None, settings: dict | None = None) -> dict:
    prefix = prefix.reindex(columns=[*COLUMNS, *(c for c in prefix.columns if c not in COLUMNS)])
    st = bootstrap_settings(fits, settings)
    cold_all = ok_rows(results) if results is not None and len(results) else pd.DataFrame(columns=["configuration", "length", "ttft_s"])
    out = {"model": MODEL, "settings": st, "configurations": {}}
    for name in sorted(set(prefix["configuration"].dropna().astype(str))):
        g = prefix[prefix["configuration"] == name]
        cold_rows = cold_all[cold_all["configuration"] == name]
        cold_fit = (((fits or {}).get("configurations") or {}).get(name) or {}).get("prefill")
        out["configurations"][name] = _configuration(name, g, cold_rows, cold_fit, st)
    return out


def analyze_file(prefix_csv, out_json, results_csv=None, fits_json=None, settings: dict | None = None) -> dict:
    """data/prefix.csv (+ results.csv, fits.json) -> data/prefix_fits.json."""
    results = pd.read_csv(results_csv) if results_csv and Path(results_csv).exists() else None
    fits = json.loads(Path(fits_json).read_text()) if fits_json and Path(fits_json).exists() else None
    result = json_plain(analyze_prefix(pd.read_csv(prefix_csv), results, fits, settings))
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out_json, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result
