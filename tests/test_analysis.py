"""Fits recover known coefficients; aggregation keeps failures as rows."""

import json

import numpy as np
import pandas as pd
import pytest

from longctx.aggregate import aggregate
from longctx.analysis import fit_all, fit_decode, fit_prefill, medians

LENGTHS = np.repeat(np.geomspace(256, 65536, 12).round(), 5)


def test_prefill_fit_recovers_known_coefficients_within_2_percent():
    a, b, c = 0.05, 2.0e-5, 1.0e-8
    rng = np.random.default_rng(0)
    ttft = (a + b * LENGTHS + c * LENGTHS**2) * (1 + 0.002 * rng.standard_normal(LENGTHS.size))
    fit = fit_prefill(LENGTHS, ttft)
    assert fit["a_s"] == pytest.approx(a, rel=0.02)
    assert fit["b_s_per_token"] == pytest.approx(b, rel=0.02)
    assert fit["c_s_per_token2"] == pytest.approx(c, rel=0.02)
    assert fit["crossover_tokens"] == pytest.approx(b / c, rel=0.04)
    assert fit["r2"] > 0.999


def test_prefill_fit_keeps_coefficients_non_negative():
    # a purely linear truth with noise must not produce a negative quadratic term
    rng = np.random.default_rng(1)
    ttft = (0.01 + 1e-5 * LENGTHS) * (1 + 0.01 * rng.standard_normal(LENGTHS.size))
    fit = fit_prefill(LENGTHS, ttft)
    assert min(fit["a_s"], fit["b_s_per_token"], fit["c_s_per_token2"]) >= 0
    assert fit["b_s_per_token"] == pytest.approx(1e-5, rel=0.05)


def test_decode_fit_recovers_step_time_and_bandwidth():
    t0, beta, kv = 1.5e-3, 2.0e-7, 70272
    rng = np.random.default_rng(2)
    tpot = (t0 + beta * LENGTHS) * (1 + 0.002 * rng.standard_normal(LENGTHS.size))
    fit = fit_decode(LENGTHS, tpot, kv)
    assert fit["t0_s"] == pytest.approx(t0, rel=0.02)
    assert fit["beta_s_per_token"] == pytest.approx(beta, rel=0.02)
    assert fit["bw_eff_GBps"] == pytest.approx(kv / beta / 1e9, rel=0.02)


def _raw(path, configuration, length, status="ok", trials=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "configuration": configuration, "engine": "reference", "length": length, "status": status,
        "reason": None if status == "ok" else "server died", "run_id": "r",
        "provenance": {"model": {"kv_bytes_per_token": 640}, "kv_pool": {"tokens": 4096}},
        "trials": list(trials), "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:00+00:00",
    }))
    return path


def test_aggregate_keeps_failed_and_unreadable_lengths_as_rows(tmp_path):
    trial = {"status": "ok", "ttft_s": 0.5, "tpot_s": 0.01, "decode_tok_s": 100.0, "e2e_s": 0.8, "prompt_tokens": 1024}
    files = [
        _raw(tmp_path / "raw/c/1024.json", "c", 1024, trials=[{**trial, "trial": 0}, {**trial, "trial": 1, "ttft_s": 0.7}]),
        _raw(tmp_path / "raw/c/2048.json", "c", 2048, status="failed"),
        tmp_path / "raw/c/4096.json",
    ]
    files[2].write_text("{not json")
    df = aggregate(files, tmp_path / "results.csv", tmp_path / "prov.json")
    assert list(df["length"]) == [1024, 1024, 2048, 4096]
    assert list(df["status"]) == ["ok", "ok", "failed", "failed"]
    assert "server died" in df.iloc[2]["reason"] and "unreadable raw file" in df.iloc[3]["reason"]
    back = pd.read_csv(tmp_path / "results.csv")
    med = medians(back)
    row = med[med["length"] == 1024].iloc[0]
    assert row["ttft_s"] == pytest.approx(0.6) and row["ok"] == 2 and row["trials"] == 2
    assert med[med["length"] == 2048].iloc[0]["ok"] == 0
    assert json.loads((tmp_path / "prov.json").read_text())["configurations"]["c"]["kv_pool"]["tokens"] == 4096


def test_fit_all_needs_enough_lengths():
    df = pd.DataFrame({"configuration": "c", "length": [1, 2], "status": "ok", "ttft_s": [1.0, 2.0],
                       "tpot_s": [0.1, 0.2], "kv_bytes_per_token": 10})
    fits = fit_all(df)["configurations"]["c"]
    assert "prefill" not in fits and "decode" in fits
