"""The scaling models' maths: non-negative fits on relative residuals (over an absolute noise floor where the
replicates show one: noise_floor) with a residual bootstrap.

Prefill: TTFT(L) = a + b L + c L^2 with a, b, c >= 0 (non-negative least squares on relative
residuals, so that short and long prompts weigh alike); b / c is the crossover length where the
attention (quadratic) work overtakes the linear work. Decode: seconds per decode step
t(L) = t0 + beta L; each step reads L x kv_bytes_per_token bytes of KV cache, so
kv_bytes_per_token / beta is the effective KV read bandwidth. Intervals: a residual bootstrap
(Fit; BasisFit is the same machinery over any given basis columns, as the prefix-cache cost model
of longctx.analysis.prefix_model uses), and the bootstrap's shared pieces: resamples, median_draws,
percentile_interval, reciprocal_interval. A regime change is a length from which the model fitted to the shorter
lengths stops fitting (holdout makes those fits, regime_change_in finds where they stop). Pure maths on arrays: the
sweep's timeout predictor and the analysis both use it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls
from scipy.special import chdtri, stdtrit


LEVEL = 0.95
MIN_DRAWS = 10  # usable bootstrap draws a percentile interval needs
KEPT_DRAWS = 100  # bootstrap draws of the coefficients a summary keeps (the what-if simulation's intervals)


def _scaled(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    return X / scale, scale


def _solve_weighted(Xs: np.ndarray, Y: np.ndarray, W: np.ndarray, signed: bool = False) -> np.ndarray:
    """Non-negative least squares of W * (Y - Xs beta) for every row of Y and W (B x n) at once:
    a batched QR solve, NNLS only for the rows whose unconstrained solution has a negative coefficient
    (none with `signed`: plain least squares, coefficients of either sign)."""
    A = Xs[None, :, :] * W[:, :, None]
    rhs = Y * W
    Q, R = np.linalg.qr(A)
    try:
        coef = np.linalg.solve(R, np.einsum("bij,bi->bj", Q, rhs)[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        coef = np.full((Y.shape[0], Xs.shape[1]), -1.0)
        if signed:
            return np.stack([np.linalg.lstsq(A[i], rhs[i], rcond=None)[0] for i in range(len(A))])
    if signed:
        return coef
    bad = ~np.isfinite(coef).all(axis=1) | (coef < 0).any(axis=1)
    for i in np.flatnonzero(bad):
        coef[i], _ = nnls(A[i], rhs[i])
    return coef


def noise_sd(values, floor_s2: float = 0.0) -> np.ndarray:
    """The noise model's shape: a time's noise sd is proportional to sqrt(floor_s2 + value^2), relative noise over an
    absolute floor (floor_s2 = floor variance / relative variance, in s^2; 0: purely relative noise)."""
    v = np.asarray(values, float)
    return np.sqrt(floor_s2 + v * v)


def noise_floor(X: np.ndarray, y: np.ndarray, level: float = LEVEL) -> float:
    """floor_s2 of noise_sd from the replicates (observations with the same design row), 0 unless they show it: each
    group's sample variance v (df degrees of freedom) is taken as s^2 (k + m^2) chi2_df / df about its mean m, k the
    floor; k = 0 (purely relative noise) against the k of the highest profile likelihood on a grid, adopted only where
    the likelihood ratio passes the chi-square test at `level` (one parameter more). A time with an absolute jitter (a
    short prompt's few milliseconds of scheduling) is noisier, relative to itself, than a long one, and the relative
    residuals of the short lengths must not set the interval at the long ones; a few noisy replicates must not make
    the long ones look quieter than they are either. 0 without two groups of replicates."""
    _, inverse, counts = np.unique(X, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    groups = [y[inverse == g] for g in np.flatnonzero(counts >= 2)]
    m = np.array([g.mean() for g in groups])
    v = np.array([g.var(ddof=1) for g in groups])
    df = np.array([len(g) - 1 for g in groups], float)
    keep = (m > 0) & (v > 0)
    m, v, df = m[keep], v[keep], df[keep]
    if len(np.unique(m)) < 2:
        return 0.0
    grid = np.concatenate([[0.0], (m.min() ** 2) * np.geomspace(1e-3, 1e4, 57)])
    shape = grid[:, None] + (m * m)[None, :]  # one row per floor on the grid
    s2 = (df * v / shape).sum(axis=1) / df.sum()
    ll = -0.5 * (df * np.log(s2[:, None] * shape)).sum(axis=1)  # the profile log likelihood of each
    best = int(np.argmax(ll))
    return float(grid[best]) if 2 * (ll[best] - ll[0]) > chdtri(1, 1 - level) else 0.0


def _nnls_weighted_batch(X: np.ndarray, Y: np.ndarray, floor_s2: float = 0.0, signed: bool = False) -> np.ndarray:
    """Non-negative coefficients minimising sum(((y - X beta) / noise_sd(m, floor_s2))^2) for every row y of Y
    (relative residuals where floor_s2 is 0): first with m = y, then with m the first fit's values (weights that do
    not follow the noise, which would bias the fit low). Columns are scaled for conditioning. With `signed`, the
    coefficients may take either sign (_solve_weighted)."""
    Xs, scale = _scaled(X)
    coef = _solve_weighted(Xs, Y, 1.0 / noise_sd(Y, floor_s2), signed)
    fitted = coef @ Xs.T
    fitted = np.where(fitted > 0, fitted, Y)
    return _solve_weighted(Xs, Y, 1.0 / noise_sd(fitted, floor_s2), signed) / scale


def _r2(y: np.ndarray, pred: np.ndarray) -> float | None:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None


def resamples(values, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """n_boot resamples of values (one per row), each drawn with replacement and of the same size."""
    v = np.asarray(values)
    return v[rng.integers(0, v.size, size=(n_boot, v.size))]


def median_draws(values, n_boot: int, rng: np.random.Generator) -> np.ndarray | None:
    """The bootstrap draws of the median of the finite values: the median of each of their n_boot resamples;
    None without resamples or with fewer than 2 finite values."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if not n_boot or v.size < 2:
        return None
    return np.median(resamples(v, n_boot, rng), axis=1)


def percentile_interval(values, level: float, unbounded: bool = False) -> list[float | None] | None:
    """The central `level` interval [low, high] of bootstrap draws (their percentiles); None without draws or with
    fewer than MIN_DRAWS usable ones. NaN draws are left out, and so are infinite ones, unless `unbounded`: then an
    infinite draw is a value beyond every bound (a quantity with no finite value in that draw, as the crossover
    b / c where c is 0), and an end it reaches is None."""
    if values is None:
        return None
    v = np.asarray(values, float)
    v = v[~np.isnan(v)] if unbounded else v[np.isfinite(v)]
    if v.size < MIN_DRAWS:
        return None
    tail = (1 - level) / 2
    if not unbounded:
        lo, hi = np.quantile(v, [tail, 1 - tail])
        return [float(lo), float(hi)]
    lo, hi = np.quantile(np.clip(v, -1e300, 1e300), [tail, 1 - tail])
    return [float(lo) if abs(lo) < 1e299 else None, float(hi) if abs(hi) < 1e299 else None]


def reciprocal_interval(k: float, ci, scale: float = 1.0) -> list[float | None] | None:
    """The interval of k / x / scale (k > 0) from x's interval ci = [low, high]: the map decreases, so the ends
    swap; an end of ci at 0 or None gives None (unbounded). None without ci."""
    if not ci:
        return None
    return [k / ci[1] / scale if ci[1] else None, k / ci[0] / scale if ci[0] else None]


class BasisFit:
    """A model linear in non-negative coefficients over given basis columns (X: one row per
    observation, one column per coefficient, `names` naming them), weighted by a noise model: each
    time's noise sd proportional to noise_sd(fit, floor_s2), relative noise over an absolute floor
    estimated from the replicates (noise_floor; 0, purely relative residuals, without them). Intervals
    by a residual bootstrap: y* = fit + sd x e*, e* drawn with replacement from the standardised
    residuals (centred, divided by sqrt(1 - h), h the leverage of the weighted design), refitted
    n_boot times; the intervals are the bootstrap percentiles. (At 95% the intervals cover known
    coefficients of synthetic data in about 94% of draws, with relative noise and with a floor:
    tests/test_analysis.py.) A subclass maps its own inputs to the columns (`design`); here they are
    the columns themselves. `signed` lifts the sign constraint (the prediction check's fits: prediction_interval)."""

    def __init__(self, names, X, y, n_boot: int = 0, level: float = LEVEL, seed: int = 0, signed: bool = False):
        self.names, self.level, self.signed = tuple(names), level, signed
        X, y = np.asarray(X, float).reshape(len(np.asarray(y)), -1), np.asarray(y, float)
        # the noise model needs a positive time
        self.kept = np.isfinite(y) & (y > 0) & np.isfinite(X).all(axis=1)
        self.X, self.y = X[self.kept], y[self.kept]
        X = self.X
        self.floor_s2 = noise_floor(X, self.y) if len(self.y) else 0.0
        self.coef = _nnls_weighted_batch(X, self.y[None, :], self.floor_s2, signed)[0]
        self.pred = X @ self.coef
        self.r2 = _r2(self.y, self.pred)
        self.draws: np.ndarray | None = None
        if n_boot and len(self.y) > len(self.names):
            rng = np.random.default_rng(seed)
            sd = self.fitted_sd()
            e = self.standardised() / np.sqrt(np.clip(1 - self.leverage(), 1e-6, None))
            e -= e.mean()
            Y = self.pred + sd * rng.choice(e, size=(n_boot, len(self.y)))
            Y = np.where(Y > 0, Y, self.pred)  # a time is positive
            self.draws = _nnls_weighted_batch(X, Y, self.floor_s2, signed)

    def sd(self, values) -> np.ndarray:
        """The noise model's sd shape at fitted values (relative to the fit where floor_s2 is 0)."""
        pred = np.where(np.asarray(values, float) > 0, values, 1e-300)
        return noise_sd(pred, self.floor_s2)

    def fitted_sd(self) -> np.ndarray:
        """The noise model's sd at the observations: at the fitted values, or at the observed ones where a fit
        whose coefficients may take either sign (`signed`) goes to 0 or below (as the fit's own weights do)."""
        return self.sd(np.where(self.pred > 0, self.pred, self.y))

    def standardised(self) -> np.ndarray:
        """The residuals over the noise model's sd (the relative residuals where floor_s2 is 0)."""
        return (self.y - self.pred) / self.fitted_sd()

    def noise_scale(self) -> float:
        """The spread of the standardised residuals (root mean square over the degrees of freedom): the relative
        noise, where the noise model has no floor."""
        e = self.standardised()
        return float(np.sqrt((e**2).sum() / max(1, len(e) - len(self.names))))

    def weighted_design(self) -> np.ndarray:
        return self.X / self.fitted_sd()[:, None]

    def leverage(self) -> np.ndarray:
        A = self.weighted_design()
        return np.einsum("ij,ji->i", A, np.linalg.pinv(A))

    def design(self, *inputs) -> np.ndarray:
        """The basis columns of inputs (here: the columns themselves)."""
        return np.asarray(inputs[0], float)

    def predict(self, *inputs) -> np.ndarray:
        return self.design(*inputs) @ self.coef

    def predict_draws(self, *inputs) -> np.ndarray | None:
        return None if self.draws is None else self.draws @ self.design(*inputs).T

    def interval(self, values) -> list[float | None] | None:
        """The percentile interval of bootstrap values (one per draw) at the fit's level: percentile_interval, an
        infinite draw unbounded (None: that end is unbounded)."""
        return percentile_interval(values, self.level, unbounded=True)

    def curve_interval(self, *inputs) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
        d = self.predict_draws(*inputs)
        if d is None:
            return None, None
        tail = (1 - self.level) / 2
        return np.quantile(d, tail, axis=0), np.quantile(d, 1 - tail, axis=0)

    def summary(self) -> dict:
        out = {name: float(c) for name, c in zip(self.names, self.coef)}
        s = self.noise_scale() if len(self.y) else None
        # the noise model: relative noise s over an absolute floor s x sqrt(floor_s2) seconds (0: none shown)
        out["noise"] = {"relative": s, "floor_s": s * float(np.sqrt(self.floor_s2)) if s is not None else None}
        out.update(r2=self.r2, n=int(len(self.y)), level=self.level,
                   bootstrap=0 if self.draws is None else int(len(self.draws)),
                   draws=None if self.draws is None else self.draws[:KEPT_DRAWS].tolist(),
                   ci={name: self.interval(self.draws[:, i]) if self.draws is not None else None for i, name in enumerate(self.names)})
        return out


class Fit(BasisFit):
    """The scaling models in the prompt length L: prefill a + b L + c L^2, decode t0 + beta L (BasisFit
    over the powers of L)."""

    KINDS = {"prefill": ("a_s", "b_s_per_token", "c_s_per_token2"), "decode": ("t0_s", "beta_s_per_token")}

    def __init__(self, kind: str, lengths, y, n_boot: int = 0, level: float = LEVEL, seed: int = 0, signed: bool = False):
        self.kind = kind
        L = np.asarray(lengths, float)
        super().__init__(self.KINDS[kind], self.basis(L), y, n_boot, level, seed, signed)
        self.L = L[self.kept]

    def basis(self, L) -> np.ndarray:
        L = np.asarray(L, float)
        return np.column_stack([L**k for k in range(len(self.KINDS[self.kind]))])

    def design(self, L) -> np.ndarray:
        return self.basis(L)


def prefill_summary(f: Fit) -> dict:
    """fits.json's prefill entry of a prefill Fit: coefficients, intervals and the crossover b / c."""
    out = {"model": "ttft = a + b*L + c*L^2", **f.summary()}
    b, c = f.coef[1], f.coef[2]
    out["crossover_tokens"] = float(b / c) if c > 0 else None
    out["ci"]["crossover_tokens"] = None
    if f.draws is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            out["ci"]["crossover_tokens"] = f.interval(np.where(f.draws[:, 2] > 0, f.draws[:, 1] / f.draws[:, 2], np.inf))
    return out


def fit_prefill(lengths, ttft, n_boot: int = 0, level: float = LEVEL, seed: int = 0) -> dict:
    return prefill_summary(Fit("prefill", lengths, ttft, n_boot, level, seed))


def decode_summary(f: Fit, kv_bytes_per_token: float | None) -> dict:
    """fits.json's decode entry of a decode Fit (step time t(L) = t0 + beta L): coefficients,
    intervals and the effective KV read bandwidth kv_bytes_per_token / beta."""
    beta = f.coef[1]
    bw = kv_bytes_per_token / beta if kv_bytes_per_token and beta > 0 else None
    out = {"model": "step = t0 + beta*L", **f.summary(), "kv_bytes_per_token": kv_bytes_per_token,
           "bw_eff_bytes_per_s": bw, "bw_eff_GBps": bw / 1e9 if bw else None}
    # a monotone map of beta: its interval maps over (reversed)
    out["ci"]["bw_eff_GBps"] = reciprocal_interval(kv_bytes_per_token, out["ci"]["beta_s_per_token"], 1e9) if kv_bytes_per_token else None
    return out


def fit_decode(lengths, tpot, kv_bytes_per_token: float | None, n_boot: int = 0, level: float = LEVEL, seed: int = 0) -> dict:
    return decode_summary(Fit("decode", lengths, tpot, n_boot, level, seed), kv_bytes_per_token)


def _medians_by_length(L: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.unique(L)
    return lengths, np.array([np.median(y[L == x]) for x in lengths])


# the variance of the median of n normal values over sigma^2 / n (exact for 1 to 5, then pi / 2)
MEDIAN_VARIANCE_FACTOR = {1: 1.0, 2: 1.0, 3: 1.3474, 4: 1.3729, 5: 1.4362}


def median_sd(sd: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The sd of the median of n values each of sd `sd` (normal noise)."""
    n = np.asarray(n, int)
    factor = np.array([MEDIAN_VARIANCE_FACTOR.get(int(k), np.pi / 2) for k in n.ravel()]).reshape(n.shape)
    return np.asarray(sd, float) * np.sqrt(factor / np.maximum(n, 1))


def prediction_interval(fit: "BasisFit", inputs, n: np.ndarray) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Where the median of n new trials at `inputs` should fall, at the fit's level: the textbook prediction interval
    of weighted least squares, pred +- t(dof) sqrt(phi' Cov phi + the median's own variance), Cov = s^2 (A'A)^-1 with
    A the design weighted by the noise model and s the residuals' spread (noise_scale), the median's variance that
    of n values with the noise model's sd there (median_sd). It holds its level for a fit whose coefficients may take
    either sign (BasisFit's `signed`): on a non-negative fit, a coefficient held at 0 (one the shorter lengths barely
    resolve) leaves the interval too wide (98% at 5% noise, 100% at 30%; tests/test_prediction.py), and the
    bootstrap's percentiles understate an extrapolation's spread (90% at 2% noise). None without a residual degree of
    freedom."""
    dof = len(fit.y) - len(fit.names)
    if dof < 1:
        return None, None
    phi = fit.design(inputs)
    pred = phi @ fit.coef
    s = fit.noise_scale()
    A = fit.weighted_design()
    scale = np.abs(A).max(axis=0)
    scale = np.where(scale > 0, scale, 1.0)  # columns of 1, L and L^2 differ by 1e9: scaled for the inverse
    cov = np.linalg.pinv((A / scale).T @ (A / scale))
    curve_var = s * s * np.einsum("ij,jk,ik->i", phi / scale, cov, phi / scale)
    median_var = median_sd(s * fit.sd(pred), n) ** 2
    half = float(stdtrit(dof, 0.5 + fit.level / 2)) * np.sqrt(curve_var + median_var)
    return pred - half, pred + half


def holdout(kind: str, lengths, y, level: float = LEVEL, min_lengths: int | None = None,
            intervals: bool = True) -> list[dict]:
    """The model fitted to the lengths up to each cut, set against every longer length: for each cut from
    min_lengths fitted lengths (default: as many as the model has coefficients) to all but the last, the
    fit's prediction of each longer length's median, its prediction interval there (prediction_interval: the
    curve's interval and the held-out median's own noise; none unless `intervals`), the
    median measured, and the relative deviation (measured / predicted - 1). The prediction is the report's model
    (the non-negative fit); the interval is that of the model's least squares with coefficients of either sign,
    the only one that holds the level it states (prediction_interval), its low end at 0 at least. Where the two
    fits differ (a coefficient held at 0), the prediction may fall outside the interval: the shorter lengths then
    argue against the model's form."""
    L, y = np.asarray(lengths, float), np.asarray(y, float)
    distinct = np.unique(L)
    out = []
    for k in range(min_lengths or len(Fit.KINDS[kind]), len(distinct)):
        inside = L <= distinct[k - 1]
        fit = Fit(kind, L[inside], y[inside], level=level)
        later, med = _medians_by_length(L[~inside], y[~inside])
        pred = fit.predict(later)
        counts = np.array([int(np.sum(np.isfinite(y[L == x]))) for x in later])
        lo, hi = None, None
        if intervals:
            lo, hi = prediction_interval(Fit(kind, L[inside], y[inside], level=level, signed=True), later, counts)
            lo = None if lo is None else np.maximum(lo, 0.0)  # a time is not negative
        out.append({"fitted_up_to": int(distinct[k - 1]), "lengths_fitted": k, "predictions": [
            {"length": int(x), "measured": float(m), "predicted": float(q), "deviation": float(m / q - 1) if q > 0 else None,
             "lo": None if lo is None else float(lo[i]), "hi": None if hi is None else float(hi[i]),
             "inside": None if lo is None else bool(lo[i] <= m <= hi[i])}
            for i, (x, m, q) in enumerate(zip(later, med, pred))]})
    return out


def regime_change_in(kind: str, cuts: list[dict], tolerance: float) -> dict | None:
    """The first length from which the model fitted to the shorter lengths stops fitting, over cuts holdout made:
    at that length and every longer one the median lies outside the fit's interval and more than `tolerance`
    (relative) away from its prediction, on the same side. None when the model holds. A cut fitted to no more
    lengths than the model has coefficients (a fit without a residual) is passed over. The prediction check
    (longctx.analysis.fits.prediction_check) and the regime detection walk the same cuts."""
    for cut in cuts:
        if cut["lengths_fitted"] <= len(Fit.KINDS[kind]):
            continue
        rows = cut["predictions"]
        dev = np.array([r["deviation"] if r["deviation"] is not None else np.nan for r in rows])
        outside = all(r["inside"] is not True for r in rows)
        if (np.abs(dev) > tolerance).all() and outside and (np.sign(dev) == np.sign(dev[0])).all():
            return {"fitted_up_to": cut["fitted_up_to"], "from_length": rows[0]["length"], "deviation": float(dev[0]),
                    "deviations": {r["length"]: float(d) for r, d in zip(rows, dev)},
                    "direction": "slower" if dev[0] > 0 else "faster", "tolerance": tolerance}
    return None


def prefill_curve(fit: dict, lengths) -> np.ndarray:
    L = np.asarray(lengths, float)
    return fit["a_s"] + fit["b_s_per_token"] * L + fit["c_s_per_token2"] * L**2


def decode_curve(fit: dict, lengths) -> np.ndarray:
    """Seconds per decode step (per output token without speculative decoding)."""
    return fit["t0_s"] + fit["beta_s_per_token"] * np.asarray(lengths, float)
