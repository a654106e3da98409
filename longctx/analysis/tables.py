"""Tables of the measurements: the single-request rows, medians per length, concurrency, step time."""

from __future__ import annotations

import pandas as pd


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


def step_seconds(df: pd.DataFrame) -> pd.Series:
    """Seconds per decode step: the time per output token times the tokens a step produces (the
    speculative acceptance length where there is one, else 1)."""
    tokens = df["spec_accept_length"].where(df["spec_accept_length"].notna(), 1.0) if "spec_accept_length" in df else 1.0
    return df["tpot_s"] * tokens


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
