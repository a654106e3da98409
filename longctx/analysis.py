"""Scaling models fitted to the measurements, and the per-length medians the report shows.

Prefill: TTFT(L) = a + b L + c L^2 with a, b, c >= 0 (non-negative least squares on relative
residuals, so that short and long prompts weigh alike). Decode: time per output token
t(L) = t0 + beta L; each decode step reads L x kv_bytes_per_token bytes of KV cache, so
kv_bytes_per_token / beta is the effective KV read bandwidth.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls


def _nnls_relative(columns: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising sum(((y - X beta) / y)^2); columns are scaled for conditioning."""
    X = np.column_stack(columns)
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    w = 1.0 / y
    coef, _ = nnls((X / scale) * w[:, None], y * w)
    return coef / scale


def _r2(y: np.ndarray, pred: np.ndarray) -> float | None:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None


def fit_prefill(lengths, ttft) -> dict:
    L, y = np.asarray(lengths, float), np.asarray(ttft, float)
    a, b, c = _nnls_relative([np.ones_like(L), L, L**2], y)
    pred = a + b * L + c * L**2
    return {
        "model": "ttft = a + b*L + c*L^2",
        "a_s": a, "b_s_per_token": b, "c_s_per_token2": c,
        "r2": _r2(y, pred), "n": int(len(y)),
        "crossover_tokens": b / c if c > 0 else None,
    }


def fit_decode(lengths, tpot, kv_bytes_per_token: float | None) -> dict:
    L, y = np.asarray(lengths, float), np.asarray(tpot, float)
    t0, beta = _nnls_relative([np.ones_like(L), L], y)
    pred = t0 + beta * L
    bw = kv_bytes_per_token / beta if kv_bytes_per_token and beta > 0 else None
    return {
        "model": "tpot = t0 + beta*L",
        "t0_s": t0, "beta_s_per_token": beta,
        "r2": _r2(y, pred), "n": int(len(y)),
        "kv_bytes_per_token": kv_bytes_per_token,
        "bw_eff_bytes_per_s": bw,
        "bw_eff_GBps": bw / 1e9 if bw else None,
    }


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


def fit_all(df: pd.DataFrame) -> dict:
    out: dict = {"configurations": {}}
    for name, g in ok_rows(df).groupby("configuration", sort=True):
        entry: dict = {"lengths": sorted(int(x) for x in g["length"].unique())}
        if g["length"].nunique() >= 3:
            entry["prefill"] = fit_prefill(g["length"], g["ttft_s"])
        d = g[g["tpot_s"].notna()]
        if d["length"].nunique() >= 2:
            kv = d["kv_bytes_per_token"].dropna()
            entry["decode"] = fit_decode(d["length"], d["tpot_s"], float(kv.iloc[0]) if len(kv) else None)
        out["configurations"][name] = entry
    return out


def fit_file(results_csv: str | Path, out_json: str | Path) -> dict:
    fits = fit_all(pd.read_csv(results_csv))
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
    return fit["t0_s"] + fit["beta_s_per_token"] * np.asarray(lengths, float)


def is_number(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))
