"""Per configuration: the scaling models (longctx.core.fitting) fitted to its measurements, set
against the model spec and the hardware's ceilings: effective KV bandwidth and attention FLOP rate as
fractions of the roofs, regime changes, the extrapolation to the longest request the deployment could
serve, and the roofline points. fit_file writes data/fits.json.

A partial length (some of its single-request trials succeeded, fewer than the protocol asked for:
longctx.analysis.tables.partial_lengths) stays out of the fits and of regime detection under the
setting partial_lengths: exclude (the default), unless the other lengths are too few for the fit (then
the fit stands on them and says so: on_partial_lengths); include fits it like any other. Each
configuration's `partial_lengths` lists them, with what they were used for.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from ..core.errors import write_atomic
from ..core.fitting import LEVEL, Fit, decode_summary, holdout, prefill_summary, reciprocal_interval, regime_change_in
from ..core.numbers import is_number
from . import bounds, kernel_records
from ..specs.pool import observed_pool
from .memory import adapter_of, kv_bytes, spec_absent_reason, spec_of
from .drafting import drafting
from .tables import ok_rows, partial_lengths, standing, step_seconds


SETTINGS = {"bootstrap": 1000, "confidence": LEVEL, "seed": 0, "regime_tolerance": 0.2, "partial_lengths": "exclude",
            "bounds": bounds.BOUNDS, "fit_quality": bounds.FIT_QUALITY}
# the distinct lengths each fit needs (longctx.core.fitting.Fit: a + bL + cL^2; t0 + beta L)
FIT_LENGTHS = {"prefill": 3, "decode": 2}
PARTIAL_MODES = ("exclude", "include")


def bootstrap_settings(fits: dict | None, settings: dict | None = None) -> dict:
    """bootstrap, confidence and seed as fits.json's settings give them (defaults: SETTINGS), `settings` (--settings)
    overriding them: what the analyses after the fits resample with."""
    keys = ("bootstrap", "confidence", "seed")
    st = {k: ((fits or {}).get("settings") or {}).get(k, SETTINGS[k]) for k in keys}
    st.update({k: settings[k] for k in keys if k in (settings or {})})
    return st


def max_length(entry: dict) -> tuple[int | None, str | None]:
    """The longest request the deployment could serve: the KV pool's tokens as the server allocated
    them (its info, else its log: longctx.specs.pool.observed_pool), capped by the context length."""
    if not entry:
        return None, None
    pool, _ = observed_pool(entry)
    ctx = adapter_of(entry).context_length(entry.get("args") or {}, entry.get("server_info") or {})
    if pool and ctx and int(ctx) < int(pool):
        return int(ctx), "the context length, below the KV pool's size"
    if pool:
        return int(pool), "the KV pool's size"
    return (int(ctx), "the context length; the KV pool's size is unknown") if ctx else (None, None)


def _flagged(g: pd.DataFrame, column: str) -> pd.Series:
    """Rows whose flag column is true (absent or empty: false)."""
    return g[column].eq(True) if column in g else pd.Series(False, index=g.index)


def _trusted(rows: pd.DataFrame, doubtful: pd.Series, kind: str) -> tuple[pd.DataFrame, list[int]]:
    """The rows a fit of `kind` stands on without the doubtful ones (estimated counts, contended trials, early stops),
    unless they leave too few lengths for the fit: then the doubtful trials stand at each length that has nothing
    else (the tables' rule for contended ones: longctx.analysis.tables.ok_rows), and the lengths where they do are
    returned (empty: the fit stands on none of them)."""
    bad = doubtful.reindex(rows.index, fill_value=False)
    keep = rows[~bad]
    if keep["length"].nunique() >= FIT_LENGTHS[kind] or rows["length"].nunique() < FIT_LENGTHS[kind]:
        return keep, []
    filled = standing(rows, bad, ("length",))
    return rows[~bad | filled], sorted(int(x) for x in rows.loc[filled, "length"].unique())


def _without_partial(rows: pd.DataFrame, partial: set[int], kind: str, mode: str) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """The rows a fit of `kind` stands on and those its regime detection looks at: without the partial
    lengths under exclude, unless the others are too few for the fit (then the fit takes them all, and
    True says so; the regime detection still leaves them out). include: every row, both."""
    if mode == "include" or not partial:
        return rows, rows, False
    out = rows["length"].isin(partial)
    fitted, stood = _trusted(rows, out, kind)
    return fitted, rows[~out], bool(stood)


def _pct(x, ref):
    return 100.0 * x / ref if x is not None and ref else None


# what each fit predicts, and the column it is measured by
PREDICTED = {"prefill": "ttft_s", "decode": "step_s"}


def prediction_check(rows: dict[str, pd.DataFrame | None], level: float, intervals: bool = True) -> dict:
    """How well the models fitted to the shorter lengths predicted the longer ones measured (the rows the
    regime detection looks at, partial lengths left out under exclude): per model, every cut
    (longctx.core.fitting.holdout, from as many lengths as the model has coefficients), and the headline:
    the model fitted to the first half of the lengths (at least as many as it needs) predicting the
    longest. A decode step's deviation is also given as the decode rate's (rate = tokens per step / step:
    measured rate / predicted rate - 1 = predicted step / measured step - 1)."""
    out: dict = {}
    for kind, g in rows.items():
        if g is None or g["length"].nunique() <= FIT_LENGTHS[kind]:
            continue
        cuts = holdout(kind, g["length"], g[PREDICTED[kind]], level, FIT_LENGTHS[kind], intervals)
        n = g["length"].nunique()
        half = max(FIT_LENGTHS[kind], -(-n // 2))
        head = next((c for c in cuts if c["lengths_fitted"] == half), None)
        out[kind] = {"cuts": cuts, "headline": None if head is None else {
            "fitted_up_to": head["fitted_up_to"], "lengths_fitted": half, "lengths": n, **head["predictions"][-1]}}
        if kind == "decode":
            for c in cuts:
                for r in c["predictions"]:
                    r["rate_deviation"] = r["predicted"] / r["measured"] - 1 if r["measured"] > 0 else None
            if head is not None:
                out[kind]["headline"]["rate_deviation"] = head["predictions"][-1]["rate_deviation"]
    return out


def _analyse_configuration(name: str, g: pd.DataFrame, entry: dict, calibration: dict | None, st: dict,
                           partial: dict[int, dict] | None = None) -> dict:
    from ..specs import hardware
    from . import roofline

    n_boot, level, seed = st["bootstrap"], st["confidence"], st["seed"]
    out: dict = {"lengths": sorted(int(x) for x in g["length"].unique())}
    spec = spec_of(entry) if entry else None
    args = entry.get("args") or {}
    kv, kv_source = kv_bytes(entry, spec) if entry else (None, None)
    if kv is None and "kv_bytes_per_token" in g and g["kv_bytes_per_token"].notna().any():
        kv, kv_source = float(g["kv_bytes_per_token"].dropna().iloc[0]), "results.csv"
    out["kv_bytes_per_token"], out["kv_bytes_source"] = kv, kv_source
    absent = spec_absent_reason(entry, spec) if entry else None
    if spec:
        out["model_spec"] = spec.to_dict()
    if absent:  # the spec does not describe the model exactly: what needs it is left out, with why
        out["model_spec_absent"] = absent
    exact = None if absent else spec  # what the FLOPs, the intensity and the roofline need
    fits: dict = {}
    # trials whose token counts were estimated stay out of the fits, and those that stopped early out of
    # decode's, unless the fit would have too few lengths without them (then they stand where their length has
    # nothing else, and the fit lists those lengths: on_flagged_lengths; _trusted)
    estimated, early = _flagged(g, "tokens_estimated"), _flagged(g, "early_stop")
    out["trials_estimated"], out["trials_early_stop"] = int(estimated.sum()), int(early.sum())
    # trials whose server got markedly less of its device (longctx.analysis.aggregate.flag_contended) stay out of
    # both fits likewise
    contended = _flagged(g, "contended")
    out["trials_contended"] = int(contended.sum())
    # trials whose tokens did not arrive apart (longctx.measure.burst) carry no decode figures: their TTFT is
    # fitted, and the decode fit never sees them (every one of them: no decode fit)
    out["trials_burst"] = int(_flagged(g, "burst").sum())
    doubtful = estimated | contended
    # the fits weigh relative residuals: only positive times count (a server may report 0)
    # partial lengths (fewer ok trials than configured) stay out of the fits and the regime detection
    # under exclude, unless the other lengths are too few for the fit (_without_partial)
    partial = partial or {}
    mode = st["partial_lengths"]
    if mode not in PARTIAL_MODES:
        raise ValueError(f"analysis.partial_lengths is {mode!r}; it is one of {', '.join(PARTIAL_MODES)}")
    p, p_flagged = _trusted(g[g["ttft_s"] > 0], doubtful, "prefill")
    p, p_regime, p_partial = _without_partial(p, set(partial), "prefill", mode)
    if p["length"].nunique() >= FIT_LENGTHS["prefill"]:
        fits["prefill"] = Fit("prefill", p["length"], p["ttft_s"], n_boot, level, seed)
        out["prefill"] = prefill_summary(fits["prefill"])
    d, d_flagged = _trusted(g[g["step_s"] > 0], doubtful | early, "decode")
    d, d_regime, d_partial = _without_partial(d, set(partial), "decode", mode)
    if d["length"].nunique() >= FIT_LENGTHS["decode"]:
        fits["decode"] = Fit("decode", d["length"], d["step_s"], n_boot, level, seed)
        out["decode"] = decode_summary(fits["decode"], kv)
    out["prediction"] = prediction_check({"prefill": p_regime if "prefill" in fits else None,
                                          "decode": d_regime if "decode" in fits else None}, level, bool(n_boot))
    for kind in fits:  # the regime detection walks the prediction check's cuts (the same fits of the same rows)
        out[kind]["regime_change"] = regime_change_in(kind, (out["prediction"].get(kind) or {}).get("cuts", []),
                                                      st["regime_tolerance"])
    if out.get("decode"):
        out["decode"].update(bw_pct_datasheet=None, bw_pct_measured=None, on_flagged_lengths=d_flagged,
                             on_partial_lengths=d_partial)
    if out.get("prefill"):
        out["prefill"].update(attention_flops=None, attention_pct_datasheet=None, attention_pct_measured=None,
                              on_flagged_lengths=p_flagged, on_partial_lengths=p_partial)
    used = {"prefill": (set(p["length"]) if "prefill" in fits else set(), set(p_regime["length"]) if "prefill" in fits else set()),
            "decode": (set(d["length"]) if "decode" in fits else set(), set(d_regime["length"]) if "decode" in fits else set())}
    out["partial_lengths"] = {
        "mode": mode,
        "lengths": [{"length": L, **counts, "fitted": {k: L in fits_ for k, (fits_, _) in used.items()},
                     "regime_detection": {k: L in regime for k, (_, regime) in used.items()}}
                    for L, counts in sorted(partial.items())],
    }
    # each fitted curve with its bootstrap band, from half the shortest length measured to past the
    # longest request the deployment could serve: the plots' bands (longctx.analysis.bands) and the extrapolation
    lmax, why = max_length(entry)
    measured_max = int(g["length"].max())
    grid = np.geomspace(max(1, int(g["length"].min()) // 2), max(measured_max, lmax or 0) * 1.05, 60)
    if fits:
        out["curves"] = {"length": grid.tolist()}
    for kind, f in fits.items():
        lo_, hi_ = f.curve_interval(grid)
        out["curves"][kind] = {"fit": f.predict(grid).tolist(), "lo": None if lo_ is None else lo_.tolist(),
                               "hi": None if hi_ is None else hi_.tolist()}
    if not entry:
        return _with_bounds(out, fits, p, d, kv, None, 1, {}, st, set(partial))
    dtype = spec.kv_cache_dtype if spec and spec.kv_cache_dtype in ("float32", "bfloat16", "float16") else "bfloat16"
    if spec and spec.weight_dtype == "float32":
        dtype = "float32"
    adapter = adapter_of(entry)
    # where the server computed: as the measurement recorded it (provenance device: vLLM's CPU build is a
    # CPU whatever its flags say), else as the engine's flags say
    device = entry.get("device") if entry.get("device") in ("cpu", "gpu", "remote") else adapter.compute_device(args)
    ceil = hardware.ceilings(device, entry.get("hardware") or {}, calibration, dtype)
    if spec and spec.weight_format:
        ceil = hardware.without_flops(ceil, f"the weights are {spec.weight_format} ({spec.field_sources.get('weight_format')}), "
                                            "whose arithmetic is not the plain-dtype matmul a FLOP roof times")
    out["ceilings"] = ceil
    dec = out.get("decode")
    if dec and dec.get("bw_eff_bytes_per_s"):
        bw, ci = dec["bw_eff_bytes_per_s"], (dec["ci"].get("bw_eff_GBps") or [None, None])
        for which in ("datasheet", "measured"):
            ref = (ceil.get(which) or {}).get("bandwidth_Bps")
            dec[f"bw_pct_{which}"] = _pct(bw, ref)
            dec["ci"][f"bw_pct_{which}"] = [_pct(x * 1e9, ref) if x is not None else None for x in ci] if ref else None
    pre = out.get("prefill")
    if pre and exact and pre["c_s_per_token2"] > 0:
        rate, pre["ci"]["attention_flops"] = bounds.attention_rate(exact.prefill_flops_per_pair(), pre["c_s_per_token2"],
                                                                   pre["ci"].get("c_s_per_token2"))
        pre["attention_flops"] = rate
        for which in ("datasheet", "measured"):
            pre[f"attention_pct_{which}"] = _pct(rate, (ceil.get(which) or {}).get("flops"))
    # extrapolation to the longest request the deployment could serve
    if lmax:
        pool, pool_source = observed_pool(entry)
        ex: dict = {"length": lmax, "why": why, "beyond_measured": lmax > measured_max, "longest_measured": measured_max,
                    "kv_pool_tokens": pool, "kv_pool_source": pool_source}
        accept = g[g["length"] == measured_max]["spec_accept_length"].median() if "spec_accept_length" in g else np.nan
        tokens_per_step = float(accept) if is_number(accept) else 1.0
        for kind, f in fits.items():
            value = float(f.predict([lmax])[0])
            draws = f.predict_draws([lmax])
            ci = f.interval(draws[:, 0]) if draws is not None else None
            key = "ttft_s" if kind == "prefill" else "step_s"
            ex[key], ex["ci_" + key] = value, ci
            if kind == "decode":
                ex["decode_tok_s"] = tokens_per_step / value
                ex["ci_decode_tok_s"] = reciprocal_interval(tokens_per_step, ci)
                ex["tokens_per_step"] = tokens_per_step
        out["extrapolation"] = ex
    q = adapter.verify_width(args)
    # roofline points from the median step time per length
    if exact and len(d):
        steps = [(int(x), float(v)) for x, v in d.groupby("length")["step_s"].median().items()]
        out["roofline"] = {"query_tokens": q, "intensity": exact.decode_intensity(q),
                           "points": roofline.decode_points(exact, q, steps, ceil)}
        for which in ("datasheet", "measured"):
            c = ceil.get(which) or {}
            out["roofline"][f"ridge_{which}"] = roofline.ridge(c.get("flops"), c.get("bandwidth_Bps"))
            out["roofline"][f"bound_{which}"] = roofline.bound(exact.decode_intensity(q), c.get("flops"), c.get("bandwidth_Bps"))
    return _with_bounds(out, fits, p, d, kv, exact, q, ceil, st, set(partial))


def _with_bounds(out: dict, fits: dict, p: pd.DataFrame, d: pd.DataFrame, kv, exact, q: int, ceil: dict, st: dict,
                 partial: set[int]) -> dict:
    """out with what bounds each phase at the longest length measured in full that its fit stood on (a partial
    length's few trials are not what a class is decided at), and whether each fit may carry a claim
    (longctx.analysis.bounds); without a model spec or ceilings, the classes that need them are unknown."""
    steps = {int(x): float(v) for x, v in d.groupby("length")["step_s"].median().items()} if "decode" in fits else {}
    ttfts = {int(x): float(v) for x, v in p.groupby("length")["ttft_s"].median().items()} if "prefill" in fits else {}

    def top(medians: dict[int, float]) -> int:
        return max((L for L in medians if L not in partial), default=max(medians))

    def counters(rows: pd.DataFrame, phase: str, L: int) -> dict:  # the GPU's own over a phase at L, where read
        at = rows[rows["length"] == L]
        got = {k: pd.to_numeric(at[f"{phase}_gpm_{k}_mean"], errors="coerce").median()
               for k in ("dram_bw_pct", "tensor_active_pct") if f"{phase}_gpm_{k}_mean" in at}
        return {k: float(v) for k, v in got.items() if pd.notna(v)}

    out["quality"] = {kind: bounds.quality(out.get(kind), kind, st) for kind in ("prefill", "decode")}
    out["bounds"] = {
        "decode": bounds.decode(out.get("decode"), steps, top(steps), kv, exact.decode_flops_per_kv_token() * q if exact else None,
                                q, ceil, st, counters(d, "decode", top(steps))) if steps else None,
        "prefill": bounds.prefill(out.get("prefill"), ttfts, top(ttfts), exact, ceil, st,
                                  counters(p, "prefill", top(ttfts))) if ttfts else None,
    }
    return out


def fit_all(df: pd.DataFrame, provenance: dict | None = None, calibration: dict | None = None,
            settings: dict | None = None, kernels: dict | None = None) -> dict:
    """Per configuration: the fits with their intervals, regime changes, and (with the provenance)
    the model spec, the hardware's ceilings, bandwidth and FLOP rates against them, the
    extrapolation to the longest request the deployment could serve and the roofline points."""
    st = {**SETTINGS, **(settings or {})}
    for group in ("bounds", "fit_quality"):  # groups of thresholds: a setting given replaces only its own default
        st[group] = {**SETTINGS[group], **((settings or {}).get(group) or {})}
    out: dict = {"settings": st, "configurations": {}}
    ok = ok_rows(df, contended=True).copy()  # the contended trials weighed below (_analyse_configuration)
    ok["step_s"] = step_seconds(ok) if "tpot_s" in ok else np.nan
    entries = (provenance or {}).get("configurations", {})
    partial = partial_lengths(df, provenance)
    for name, g in ok.groupby("configuration", sort=True):
        out["configurations"][name] = _analyse_configuration(name, g, entries.get(name, {}), calibration, st,
                                                             partial.get(name))
    for name, fit in out["configurations"].items():  # what the run holds for why (needs every configuration's fits)
        if (fit.get("bounds") or {}).get("decode"):
            fit["bounds"]["decode"]["evidence"] = bounds.evidence(name, out["configurations"], entries, kernels)
    if kernels is not None:  # the native kernels timed alone (rule bench_kernel): points for the roofline
        out["kernels"] = kernels
    out["drafting"] = drafting(df, provenance, st["confidence"])  # each drafting configuration against its twin
    return out


def fit_file(results_csv: str | Path, out_json: str | Path, provenance_json: str | Path | None = None,
             calibration_json: str | Path | None = None, settings: dict | None = None,
             kernel_bench: list[str | Path] | None = None) -> dict:
    prov = json.loads(Path(provenance_json).read_text()) if provenance_json else None
    cal = json.loads(Path(calibration_json).read_text()) if calibration_json else None
    fits = fit_all(pd.read_csv(results_csv), prov, cal, settings,
                   kernel_records.summary(kernel_bench) if kernel_bench else None)
    if cal is not None:
        fits["calibration"] = cal
    write_atomic(out_json, json.dumps(fits, indent=1, sort_keys=True, default=_json_default) + "\n")
    return fits


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(type(x))


