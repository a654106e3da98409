"""Scaling models fitted to the measurements, their confidence intervals, and the per-length
medians the report shows.

Prefill: TTFT(L) = a + b L + c L^2 with a, b, c >= 0 (non-negative least squares on relative
residuals, so that short and long prompts weigh alike); b / c is the crossover length where the
attention (quadratic) work overtakes the linear work. Decode: seconds per decode step
t(L) = t0 + beta L (per output token without speculative decoding; times the acceptance length
with it); each step reads L x kv_bytes_per_token bytes of KV cache, so kv_bytes_per_token / beta
is the effective KV read bandwidth. Intervals: a residual bootstrap (Fit). A regime change is a
length from which the model fitted to the shorter lengths stops fitting (regime_change).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from .formats import is_number


LEVEL = 0.95


def _scaled(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    return X / scale, scale


def _solve_weighted(Xs: np.ndarray, Y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Non-negative least squares of W * (Y - Xs beta) for every row of Y and W (B x n) at once:
    a batched QR solve, NNLS only for the rows whose unconstrained solution has a negative coefficient."""
    A = Xs[None, :, :] * W[:, :, None]
    rhs = Y * W
    Q, R = np.linalg.qr(A)
    try:
        coef = np.linalg.solve(R, np.einsum("bij,bi->bj", Q, rhs)[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        coef = np.full((Y.shape[0], Xs.shape[1]), -1.0)
    bad = ~np.isfinite(coef).all(axis=1) | (coef < 0).any(axis=1)
    for i in np.flatnonzero(bad):
        coef[i], _ = nnls(A[i], rhs[i])
    return coef


def _nnls_relative_batch(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the relative residuals sum(((y - X beta) / m)^2) for
    every row y of Y: first with m = y, then with m the first fit's values (weights that do not
    follow the noise, which would bias the fit low). Columns are scaled for conditioning."""
    Xs, scale = _scaled(X)
    coef = _solve_weighted(Xs, Y, 1.0 / Y)
    fitted = coef @ Xs.T
    fitted = np.where(fitted > 0, fitted, Y)
    return _solve_weighted(Xs, Y, 1.0 / fitted) / scale


def _nnls_relative(columns: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    return _nnls_relative_batch(np.column_stack(columns), np.asarray(y, float)[None, :])[0]


def _r2(y: np.ndarray, pred: np.ndarray) -> float | None:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None


class Fit:
    """A model linear in non-negative coefficients, fitted on relative residuals, with a residual
    bootstrap: y* = fit x (1 + e*), e* drawn with replacement from the relative residuals (centred,
    divided by sqrt(1 - h), h the leverage of the weighted design), refitted n_boot times; the
    intervals are the bootstrap percentiles. The relative noise is taken to be alike at every
    length, as the fit's weighting assumes. (At 95% the intervals cover known coefficients of
    synthetic data in about 94% of draws: tests/test_analysis.py.)"""

    KINDS = {"prefill": ("a_s", "b_s_per_token", "c_s_per_token2"), "decode": ("t0_s", "beta_s_per_token")}

    def __init__(self, kind: str, lengths, y, n_boot: int = 0, level: float = LEVEL, seed: int = 0):
        self.kind, self.names, self.level = kind, self.KINDS[kind], level
        L, y = np.asarray(lengths, float), np.asarray(y, float)
        keep = np.isfinite(y) & (y > 0)  # relative residuals need a positive time
        self.L, self.y = L[keep], y[keep]
        X = self.basis(self.L)
        self.coef = _nnls_relative(list(X.T), self.y)
        self.pred = X @ self.coef
        self.r2 = _r2(self.y, self.pred)
        self.draws: np.ndarray | None = None
        if n_boot and len(self.y) > len(self.names):
            rng = np.random.default_rng(seed)
            A = X / self.pred[:, None]
            h = np.einsum("ij,ji->i", A, np.linalg.pinv(A))
            rel = (self.y / self.pred - 1) / np.sqrt(np.clip(1 - h, 1e-6, None))
            rel -= rel.mean()
            Y = self.pred * (1 + rng.choice(rel, size=(n_boot, len(self.y))))
            Y = np.where(Y > 0, Y, self.pred)  # a time is positive
            self.draws = _nnls_relative_batch(X, Y)

    def basis(self, L) -> np.ndarray:
        L = np.asarray(L, float)
        return np.column_stack([L**k for k in range(len(self.names))])

    def predict(self, L) -> np.ndarray:
        return self.basis(L) @ self.coef

    def predict_draws(self, L) -> np.ndarray | None:
        return None if self.draws is None else self.draws @ self.basis(L).T

    def interval(self, values) -> list[float] | None:
        """The percentile interval of bootstrap values (one per draw; NaN draws are left out)."""
        if values is None:
            return None
        v = np.asarray(values, float)
        v = v[~np.isnan(v)]
        if v.size < 10:
            return None
        tail = (1 - self.level) / 2
        lo, hi = np.quantile(np.clip(v, -1e300, 1e300), [tail, 1 - tail])
        return [float(lo) if abs(lo) < 1e299 else None, float(hi) if abs(hi) < 1e299 else None]  # None: unbounded

    def curve_interval(self, L) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
        d = self.predict_draws(L)
        if d is None:
            return None, None
        tail = (1 - self.level) / 2
        return np.quantile(d, tail, axis=0), np.quantile(d, 1 - tail, axis=0)

    def summary(self) -> dict:
        out = {name: float(c) for name, c in zip(self.names, self.coef)}
        out.update(r2=self.r2, n=int(len(self.y)), level=self.level,
                   bootstrap=0 if self.draws is None else int(len(self.draws)),
                   ci={name: self.interval(self.draws[:, i]) if self.draws is not None else None for i, name in enumerate(self.names)})
        return out


def fit_prefill(lengths, ttft, n_boot: int = 0, level: float = LEVEL, seed: int = 0, _fit: list | None = None) -> dict:
    f = Fit("prefill", lengths, ttft, n_boot, level, seed)
    out = {"model": "ttft = a + b*L + c*L^2", **f.summary()}
    b, c = f.coef[1], f.coef[2]
    out["crossover_tokens"] = float(b / c) if c > 0 else None
    out["ci"]["crossover_tokens"] = None
    if f.draws is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            out["ci"]["crossover_tokens"] = f.interval(np.where(f.draws[:, 2] > 0, f.draws[:, 1] / f.draws[:, 2], np.inf))
    if _fit is not None:
        _fit.append(f)
    return out


def fit_decode(lengths, tpot, kv_bytes_per_token: float | None, n_boot: int = 0, level: float = LEVEL, seed: int = 0,
               _fit: list | None = None) -> dict:
    """Decode step time t(L) = t0 + beta L; kv_bytes_per_token / beta is the effective KV read bandwidth."""
    f = Fit("decode", lengths, tpot, n_boot, level, seed)
    beta = f.coef[1]
    bw = kv_bytes_per_token / beta if kv_bytes_per_token and beta > 0 else None
    out = {"model": "step = t0 + beta*L", **f.summary(), "kv_bytes_per_token": kv_bytes_per_token,
           "bw_eff_bytes_per_s": bw, "bw_eff_GBps": bw / 1e9 if bw else None}
    ci = out["ci"]["beta_s_per_token"]
    out["ci"]["bw_eff_GBps"] = None
    if ci and kv_bytes_per_token:  # a monotone map of beta: its interval maps over (reversed)
        out["ci"]["bw_eff_GBps"] = [kv_bytes_per_token / ci[1] / 1e9 if ci[1] else None,
                                    kv_bytes_per_token / ci[0] / 1e9 if ci[0] else None]
    if _fit is not None:
        _fit.append(f)
    return out


def single(df: pd.DataFrame) -> pd.DataFrame:
    """The single-request trials (concurrency 1): what the scaling models and the main tables use."""
    return df[df["concurrency"].fillna(1) == 1] if "concurrency" in df else df


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    df = single(df)
    return df[(df["status"] == "ok") & df["ttft_s"].notna()]


def concurrency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, length and concurrency: median TTFT and per-request decode rate, and the
    median of the batches' overall output rate."""
    if "concurrency" not in df:
        return pd.DataFrame()
    ok = df[(df["status"] == "ok") & df["ttft_s"].notna()]
    if not (ok["concurrency"] > 1).any():
        return pd.DataFrame()
    return ok.groupby(["configuration", "length", "concurrency"], sort=True).agg(
        requests=("status", "size"), ttft_s=("ttft_s", "median"), decode_tok_s=("decode_tok_s", "median"),
        batch_output_tok_s=("batch_output_tok_s", "median"),
    ).reset_index()


SETTINGS = {"bootstrap": 1000, "confidence": LEVEL, "seed": 0, "regime_tolerance": 0.2}


def step_seconds(df: pd.DataFrame) -> pd.Series:
    """Seconds per decode step: the time per output token times the tokens a step produces (the
    speculative acceptance length where there is one, else 1)."""
    tokens = df["spec_accept_length"].where(df["spec_accept_length"].notna(), 1.0) if "spec_accept_length" in df else 1.0
    return df["tpot_s"] * tokens


def _medians_by_length(L: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.unique(L)
    return lengths, np.array([np.median(y[L == x]) for x in lengths])


def regime_change(kind: str, lengths, y, tolerance: float, n_boot: int = 400, level: float = LEVEL, seed: int = 0) -> dict | None:
    """The first length from which the model fitted to the shorter lengths stops fitting: at that
    length and every longer one the median lies outside the fit's interval and more than
    `tolerance` (relative) away from its prediction, on the same side. None when the model holds."""
    L, y = np.asarray(lengths, float), np.asarray(y, float)
    distinct = np.unique(L)
    p = len(Fit.KINDS[kind])
    for k in range(p + 1, len(distinct)):
        inside = L <= distinct[k - 1]
        fit = Fit(kind, L[inside], y[inside], n_boot, level, seed)
        later, med = _medians_by_length(L[~inside], y[~inside])
        pred = fit.predict(later)
        dev = med / pred - 1
        lo, hi = fit.curve_interval(later)
        outside = np.ones(len(later), bool) if lo is None else (med < lo) | (med > hi)
        if (np.abs(dev) > tolerance).all() and outside.all() and (np.sign(dev) == np.sign(dev[0])).all():
            return {"fitted_up_to": int(distinct[k - 1]), "from_length": int(later[0]), "deviation": float(dev[0]),
                    "deviations": {int(x): float(d) for x, d in zip(later, dev)},
                    "direction": "slower" if dev[0] > 0 else "faster", "tolerance": tolerance}
    return None


def max_length(entry: dict) -> tuple[int | None, str | None]:
    """The longest request the deployment could serve: the KV pool's tokens, capped by the context length."""
    info = entry.get("server_info") or {}
    args = entry.get("args") or {}
    pool = (entry.get("kv_pool") or {}).get("tokens")
    ctx = args.get("context-length") or info.get("context_length") or args.get("max-model-len") or info.get("max_model_len")
    if pool and ctx and int(ctx) < int(pool):
        return int(ctx), "the context length, below the KV pool's size"
    if pool:
        return int(pool), "the KV pool's size"
    return (int(ctx), "the context length; the KV pool's size is unknown") if ctx else (None, None)


def _pct(x, ref):
    return 100.0 * x / ref if x is not None and ref else None


def _analyse_configuration(name: str, g: pd.DataFrame, entry: dict, calibration: dict | None, st: dict) -> dict:
    from . import hardware, roofline
    from .modelspec import verify_width
    from .planner import spec_of

    n_boot, level, seed = st["bootstrap"], st["confidence"], st["seed"]
    out: dict = {"lengths": sorted(int(x) for x in g["length"].unique())}
    spec = spec_of(entry) if entry else None
    engine, args = entry.get("engine"), entry.get("args") or {}
    kv = spec.kv_bytes_per_token() if spec else None
    if kv is None and "kv_bytes_per_token" in g and g["kv_bytes_per_token"].notna().any():
        kv = float(g["kv_bytes_per_token"].dropna().iloc[0])
    if spec:
        out["model_spec"] = spec.to_dict()
    fits: dict = {}
    if g["length"].nunique() >= 3:
        holder: list = []
        out["prefill"] = fit_prefill(g["length"], g["ttft_s"], n_boot, level, seed, _fit=holder)
        fits["prefill"] = holder[0]
        out["prefill"]["regime_change"] = regime_change("prefill", g["length"], g["ttft_s"], st["regime_tolerance"],
                                                        min(n_boot, 400), level, seed)
    d = g[g["step_s"].notna()]
    if d["length"].nunique() >= 2:
        holder = []
        out["decode"] = fit_decode(d["length"], d["step_s"], kv, n_boot, level, seed, _fit=holder)
        fits["decode"] = holder[0]
        out["decode"]["regime_change"] = regime_change("decode", d["length"], d["step_s"], st["regime_tolerance"],
                                                       min(n_boot, 400), level, seed)
    if out.get("decode"):
        out["decode"].update(bw_pct_datasheet=None, bw_pct_measured=None)
    if out.get("prefill"):
        out["prefill"].update(attention_flops=None, attention_pct_datasheet=None, attention_pct_measured=None)
    # each fitted curve with its bootstrap band, from half the shortest length measured to past the
    # longest request the deployment could serve: the plots' bands (longctx.bands) and the extrapolation
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
        return out
    dtype = spec.kv_cache_dtype if spec and spec.kv_cache_dtype in ("float32", "bfloat16", "float16") else "bfloat16"
    if spec and spec.weight_dtype == "float32":
        dtype = "float32"
    ceil = hardware.ceilings(engine, args, entry.get("hardware") or {}, calibration, dtype)
    out["ceilings"] = ceil
    dec = out.get("decode")
    if dec and dec.get("bw_eff_bytes_per_s"):
        bw, ci = dec["bw_eff_bytes_per_s"], (dec["ci"].get("bw_eff_GBps") or [None, None])
        for which in ("datasheet", "measured"):
            ref = (ceil.get(which) or {}).get("bandwidth_Bps")
            dec[f"bw_pct_{which}"] = _pct(bw, ref)
            dec["ci"][f"bw_pct_{which}"] = [_pct(x * 1e9, ref) if x is not None else None for x in ci] if ref else None
    pre = out.get("prefill")
    if pre and spec and pre["c_s_per_token2"] > 0:
        # attention FLOPs of a prompt: L(L+1)/2 pairs x per-pair FLOPs, so c L^2 buys per_pair/2 FLOP per L^2
        rate = spec.prefill_flops_per_pair() / 2 / pre["c_s_per_token2"]
        pre["attention_flops"] = rate
        c_ci = pre["ci"].get("c_s_per_token2")
        pre["ci"]["attention_flops"] = [spec.prefill_flops_per_pair() / 2 / c_ci[1] if c_ci[1] else None,
                                        spec.prefill_flops_per_pair() / 2 / c_ci[0] if c_ci[0] else None] if c_ci else None
        for which in ("datasheet", "measured"):
            pre[f"attention_pct_{which}"] = _pct(rate, (ceil.get(which) or {}).get("flops"))
    # extrapolation to the longest request the deployment could serve
    if lmax:
        ex: dict = {"length": lmax, "why": why, "beyond_measured": lmax > measured_max, "longest_measured": measured_max}
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
                ex["ci_decode_tok_s"] = [tokens_per_step / ci[1] if ci[1] else None,
                                         tokens_per_step / ci[0] if ci[0] else None] if ci else None
                ex["tokens_per_step"] = tokens_per_step
        out["extrapolation"] = ex
    # roofline points from the median step time per length
    if spec and len(d):
        q = verify_width(engine, args)
        steps = [(int(x), float(v)) for x, v in d.groupby("length")["step_s"].median().items()]
        out["roofline"] = {"query_tokens": q, "intensity": spec.decode_intensity(q),
                           "points": roofline.decode_points(spec, q, steps, ceil)}
        for which in ("datasheet", "measured"):
            c = ceil.get(which) or {}
            out["roofline"][f"ridge_{which}"] = roofline.ridge(c.get("flops"), c.get("bandwidth_Bps"))
            out["roofline"][f"bound_{which}"] = roofline.bound(spec.decode_intensity(q), c.get("flops"), c.get("bandwidth_Bps"))
    return out


def fit_all(df: pd.DataFrame, provenance: dict | None = None, calibration: dict | None = None,
            settings: dict | None = None) -> dict:
    """Per configuration: the fits with their intervals, regime changes, and (with the provenance)
    the model spec, the hardware's ceilings, bandwidth and FLOP rates against them, the
    extrapolation to the longest request the deployment could serve and the roofline points."""
    st = {**SETTINGS, **(settings or {})}
    out: dict = {"settings": st, "configurations": {}}
    ok = ok_rows(df).copy()
    ok["step_s"] = step_seconds(ok) if "tpot_s" in ok else np.nan
    entries = (provenance or {}).get("configurations", {})
    for name, g in ok.groupby("configuration", sort=True):
        out["configurations"][name] = _analyse_configuration(name, g, entries.get(name, {}), calibration, st)
    return out


def fit_file(results_csv: str | Path, out_json: str | Path, provenance_json: str | Path | None = None,
             calibration_json: str | Path | None = None, settings: dict | None = None,
             kernel_bench: list[str | Path] | None = None) -> dict:
    prov = json.loads(Path(provenance_json).read_text()) if provenance_json else None
    cal = json.loads(Path(calibration_json).read_text()) if calibration_json else None
    fits = fit_all(pd.read_csv(results_csv), prov, cal, settings)
    if cal is not None:
        fits["calibration"] = cal
    if kernel_bench:  # the native kernels timed alone (rule bench_kernel): points for the roofline
        from . import kernelbench

        records = kernelbench.load_records(kernel_bench)
        fits["kernels"] = {"records": records, "roofline": kernelbench.roofline_points(records),
                           "speedups": {k: sorted(kernelbench.speedups([r for r in records if r["kernel"] == k]).items())
                                        for k in sorted({r["kernel"] for r in records})},  # [length, x] pairs
                           "host_pool_huge_pages": kernelbench.huge_page_range(records)}
    Path(out_json).write_text(json.dumps(fits, indent=1, sort_keys=True, default=_json_default) + "\n")
    return fits


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(type(x))


def medians(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, length): medians over ok trials, and the trial counts."""
    df = single(df)
    counts = df.groupby(["configuration", "length"], sort=True).agg(
        trials=("status", "size"), ok=("status", lambda s: int((s == "ok").sum()))
    )
    cols = ["ttft_s", "tpot_s", "decode_tok_s", "e2e_s", "spec_accept_length", "spec_accept_rate",
            *(c for c in df.columns if c.startswith(("prefill_", "decode_")) and c.endswith("_mean"))]
    med = ok_rows(df).reindex(columns=["configuration", "length", *cols]).groupby(["configuration", "length"], sort=True)[cols].median()
    out = counts.join(med).reset_index()
    if "needle" in df:
        needle = df.groupby(["configuration", "length"])["needle"].first()
        out["needle"] = [needle.get((c, l)) for c, l in zip(out["configuration"], out["length"])]
    reasons = df[df["status"] != "ok"].groupby(["configuration", "length"])["reason"].first()
    out["reason"] = [reasons.get((c, l)) for c, l in zip(out["configuration"], out["length"])]
    return out


def prefill_curve(fit: dict, lengths) -> np.ndarray:
    L = np.asarray(lengths, float)
    return fit["a_s"] + fit["b_s_per_token"] * L + fit["c_s_per_token2"] * L**2


def decode_curve(fit: dict, lengths) -> np.ndarray:
    """Seconds per decode step (per output token without speculative decoding)."""
    return fit["t0_s"] + fit["beta_s_per_token"] * np.asarray(lengths, float)
