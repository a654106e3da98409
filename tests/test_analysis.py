"""Fits recover known coefficients; aggregation keeps failures as rows."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from longctx.analysis.aggregate import aggregate
from longctx.analysis.fits import fit_all
from longctx.analysis.tables import medians
from longctx.core.fitting import Fit, fit_decode, fit_prefill, noise_floor

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


def test_a_pool_known_only_from_the_servers_log_reaches_results_and_the_extrapolation(tmp_path):
    """vLLM reports its KV pool only in its log ("CPU KV cache size: 8,192 tokens"): the adapter records
    tokens None from the server info and the log's figure beside it; both results.csv and the
    extrapolation length must use the log's."""
    line = "CPU KV cache size: 8,192 tokens"
    trials = [{"status": "ok", "trial": t, "ttft_s": 0.01 * L / 256, "tpot_s": 1e-3 + 1e-7 * L, "prompt_tokens": L}
              for L in (256,) for t in range(2)]
    files = []
    for L in (256, 512, 1024):
        path = tmp_path / "raw" / "v" / f"{L}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "configuration": "v", "engine": "vllm", "length": L, "status": "ok", "run_id": "r",
            "provenance": {"model": {"kv_bytes_per_token": 1024}, "args": {"max-model-len": 32768},
                           "kv_pool": {"tokens": None, "log": {"tokens": 8192, "line": line}}},
            "trials": [{**t, "ttft_s": 0.01 * L / 256, "tpot_s": 1e-3 + 1e-7 * L, "prompt_tokens": L} for t in trials]}))
        files.append(path)
    df = aggregate(files, tmp_path / "results.csv", tmp_path / "prov.json")
    assert (df["kv_pool_tokens"] == 8192).all()
    prov = json.loads((tmp_path / "prov.json").read_text())
    ex = fit_all(df, prov, None, {"bootstrap": 50})["configurations"]["v"]["extrapolation"]
    # the pool (8,192 tokens) is below vLLM's max-model-len (32,768): it is the longest request
    assert ex["length"] == 8192 and ex["why"] == "the KV pool's size" and ex["kv_pool_source"] == "the server's log"


def test_fit_all_needs_enough_lengths():
    df = pd.DataFrame({"configuration": "c", "length": [1, 2], "status": "ok", "ttft_s": [1.0, 2.0],
                       "tpot_s": [0.1, 0.2], "kv_bytes_per_token": 10})
    fits = fit_all(df)["configurations"]["c"]
    assert "prefill" not in fits and "decode" in fits


# --- intervals, regime changes, the study's figures -----------------------------------------------

from longctx.analysis.fits import PREDICTED, prediction_check  # noqa: E402
from longctx.core.fitting import LEVEL, regime_change_in  # noqa: E402
from longctx.report.diagnosis import diagnose  # noqa: E402
from longctx.report.figures import ANALYSIS_FIGURES, FIGURES  # noqa: E402


def _said(d: dict, name: str | None = None) -> list[str]:
    """Every sentence of a diagnosis: page one's, then each configuration's (or only name's), then the planner's."""
    return ([i["text"] for i in d["summary"]] if name is None else []) + [
        i["text"] for g in d["configurations"] if name in (None, g["name"]) for i in g["items"]] + (
        [i["text"] for i in d["planner"]] if name is None else [])


def test_known_coefficients_lie_in_their_intervals():
    a, b, c, t0, beta = 0.05, 2.0e-5, 1.0e-8, 1.5e-3, 2.0e-7
    rng = np.random.default_rng(3)
    p = fit_prefill(LENGTHS, (a + b * LENGTHS + c * LENGTHS**2) * (1 + 0.01 * rng.standard_normal(LENGTHS.size)), n_boot=500)
    d = fit_decode(LENGTHS, (t0 + beta * LENGTHS) * (1 + 0.01 * rng.standard_normal(LENGTHS.size)), 70272, n_boot=500)
    for fit, truth in ((p, {"a_s": a, "b_s_per_token": b, "c_s_per_token2": c, "crossover_tokens": b / c}),
                       (d, {"t0_s": t0, "beta_s_per_token": beta, "bw_eff_GBps": 70272 / beta / 1e9})):
        for key, value in truth.items():
            lo, hi = fit["ci"][key]
            assert lo <= value <= hi and hi - lo < 0.2 * value, (key, lo, value, hi)
    assert p["level"] == 0.95 and p["bootstrap"] == 500


def test_intervals_cover_the_truth_at_their_stated_rate():
    """95% intervals, 300 independent synthetic data sets: each coefficient's interval holds the
    truth in 90-99% of them (the binomial spread around 95% with 300 draws is 1.3%)."""
    L = np.repeat(np.geomspace(256, 65536, 12).round(), 5)
    truth = {"a_s": 0.05, "b_s_per_token": 2e-5, "c_s_per_token2": 1e-8, "t0_s": 1.5e-3, "beta_s_per_token": 2e-7}
    hits = dict.fromkeys(truth, 0)
    n = 300
    for i in range(n):
        rng = np.random.default_rng(100 + i)
        noise = 1 + 0.02 * rng.standard_normal((2, L.size))
        p = fit_prefill(L, (0.05 + 2e-5 * L + 1e-8 * L**2) * noise[0], n_boot=300, seed=i)
        d = fit_decode(L, (1.5e-3 + 2e-7 * L) * noise[1], None, n_boot=300, seed=i)
        for key, value in truth.items():
            lo, hi = (p if key in p else d)["ci"][key]
            hits[key] += lo <= value <= hi
    coverage = {k: v / n for k, v in hits.items()}
    assert all(0.90 <= c <= 0.99 for c in coverage.values()), coverage


def _floored(rng, truth, abs_s=0.004, rel=0.02):
    """Times with a 4 ms absolute jitter over 2% relative noise (a short prompt's scheduling noise dominates its TTFT)."""
    return truth + rng.standard_normal(truth.size) * np.sqrt(abs_s**2 + (rel * truth) ** 2)


def test_an_absolute_noise_floor_is_found_only_where_the_replicates_show_one():
    L = np.repeat(np.geomspace(256, 65536, 9).round(), 4)
    truth = 0.01 + 2e-5 * L + 1e-8 * L**2
    X = np.column_stack([np.ones_like(L), L, L**2])
    floors = [noise_floor(X, _floored(np.random.default_rng(i), truth)) for i in range(100)]
    # the floor in s^2 is abs^2 / rel^2 = (0.004 / 0.02)^2 = 0.04; the grid finds it within a factor of 3 most times
    assert np.mean([0.04 / 3 <= f <= 0.04 * 3 for f in floors]) >= 0.8, floors
    relative = [noise_floor(X, truth * (1 + 0.02 * np.random.default_rng(i).standard_normal(L.size))) for i in range(200)]
    # purely relative noise: no floor but the test's 5% of false alarms (binomial spread about 1.5%)
    assert np.mean([f > 0 for f in relative]) <= 0.10, relative


def test_with_a_noise_floor_the_interval_at_the_longest_length_is_the_weighted_fits_own():
    """The bootstrap interval at 65,536 tokens against the width derived by hand for the weighted least-squares fit
    with the true noise (2 x 1.96 x sqrt(phi^T (X^T W X)^-1 phi), W = 1 / sd^2): the short lengths' jitter, 40% of
    their TTFT, must not widen the long lengths' interval (relative residuals pooled made it about 5x wider),
    and the intervals still cover the truth at their stated rate."""
    L = np.repeat(np.geomspace(256, 65536, 9).round(), 4)
    truth = 0.01 + 2e-5 * L + 1e-8 * L**2
    X = np.column_stack([np.ones_like(L), L, L**2])
    sd = np.sqrt(0.004**2 + (0.02 * truth) ** 2)
    phi = np.array([1.0, 65536.0, 65536.0**2])
    expected = 2 * 1.96 * np.sqrt(phi @ np.linalg.inv((X / sd[:, None] ** 2).T @ X) @ phi)
    widths, hits, n = [], 0, 200
    for i in range(n):
        f = Fit("prefill", L, _floored(np.random.default_rng(1000 + i), truth), n_boot=300, seed=i)
        lo, hi = f.curve_interval([65536])
        widths.append(hi[0] - lo[0])
        hits += lo[0] <= truth[-1] <= hi[0]
    assert 0.75 <= np.median(widths) / expected <= 1.25, (np.median(widths), expected)
    assert 0.90 <= hits / n <= 0.99, hits / n


def _piecewise(L, t0, beta, knee, factor):
    """A decode step whose per-token cost grows `factor` times beyond `knee` tokens (e.g. out of a cache)."""
    return t0 + beta * np.minimum(L, knee) + factor * beta * np.maximum(L - knee, 0)


def _regime_change(kind: str, lengths, y, tolerance: float, n_boot: int) -> dict | None:
    """The regime change as fits.json finds it (longctx.analysis.fits): regime_change_in over the prediction
    check's cuts of the rows (longctx.core.fitting.holdout)."""
    rows = pd.DataFrame({"length": lengths, PREDICTED[kind]: y})
    cuts = (prediction_check({kind: rows}, LEVEL, bool(n_boot)).get(kind) or {}).get("cuts", [])
    return regime_change_in(kind, cuts, tolerance)


def test_regime_change_is_found_where_the_model_stops_fitting():
    L = np.repeat(2.0 ** np.arange(10, 17), 3)  # 1k .. 64k
    rng = np.random.default_rng(4)
    y = _piecewise(L, 2e-3, 2e-7, 16384, 3.0) * (1 + 0.01 * rng.standard_normal(L.size))
    rc = _regime_change("decode", L, y, tolerance=0.2, n_boot=300)
    assert rc["fitted_up_to"] == 16384 and rc["from_length"] == 32768 and rc["direction"] == "slower"
    assert rc["deviation"] == pytest.approx(_piecewise(32768, 2e-3, 2e-7, 16384, 3.0) / (2e-3 + 2e-7 * 32768) - 1, rel=0.1)
    # one model throughout: no regime change, for decode and for prefill
    assert _regime_change("decode", L, (2e-3 + 2e-7 * L) * (1 + 0.01 * rng.standard_normal(L.size)), 0.2, 300) is None
    ttft = (0.05 + 2e-5 * L + 1e-8 * L**2) * (1 + 0.01 * rng.standard_normal(L.size))
    assert _regime_change("prefill", L, ttft, 0.2, 300) is None


KIMI_ARCH = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64, "kv_lora_rank": 512,
             "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "intermediate_size": 18432,
             "torch_dtype": "bfloat16"}
# The study's own measurements (DESIGN.md: Kimi K2.6, TP8 SGLang on RTX PRO 6000): decode 144 ms per step
# at 5.5k tokens and 0.7 tok/s at 185k. Those two are the decode data; the prefill rows are an illustrative
# law (the study gives one prefill figure, 46 s at 60k, too few for a fit) about which nothing is asserted.
STUDY_DECODE = {5500: 0.144, 185_000: 1 / 0.7}  # s per step
STUDY_LENGTHS = [5500, 20000, 60000, 120000, 185000]


def _study(tmp_path):
    rows = []
    for L in STUDY_LENGTHS:
        for trial in range(3):
            step = STUDY_DECODE.get(L)
            if step is not None:
                step *= 1 + 0.001 * (trial - 1)  # a symmetric spread around the study's figure
            rows.append({"configuration": "triton-page1", "length": L, "trial": trial, "status": "ok", "reason": None, "concurrency": 1,
                         "ttft_s": 2.0 + 2e-4 * L + 1e-8 * L**2, "tpot_s": step, "decode_tok_s": 1 / step if step else None,
                         "kv_bytes_per_token": 70_272})
    prov = {"configurations": {"triton-page1": {
        "engine": "sglang", "args": {"tp-size": 8, "context-length": 200000, "mem-fraction-static": 0.94, "page-size": 1,
                                     "max-running-requests": 8},
        "model": {"name": "Kimi-K2.6", "architecture": KIMI_ARCH},
        "hardware": {"cpu": "x", "gpus": [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "driver": "580",
                                           "memory_total_bytes": int(95.0 * 2**30)} for i in range(8)]},
        "kv_pool": {"tokens": 240_000, "log": None}, "server_info": {}}}}
    return pd.DataFrame(rows), prov


def test_the_studys_decode_measurements_give_the_bandwidth_worked_out_by_hand(tmp_path):
    """From the study's two decode figures alone, by hand (none of these numbers comes from longctx):
    the step-time line t0 + beta L through them has
        beta = (1/0.7 - 0.144) s / (185,000 - 5,500) tokens = 1.2845714 / 179,500 = 7.15639e-6 s per token
        t0 = 0.144 - 5,500 x beta = 0.10464 s
    so the KV cache streams at 70,272 B / beta = 9.8195 GB/s (Kimi K2: (512 + 64) x 61 layers x 2 B per
    token), 0.548% of the RTX PRO 6000 datasheet's 1,792 GB/s; at 185k a step reads 185,000 x 70,272 B =
    13.0 GB in 1/0.7 s, 9.100 GB/s achieved; at the 200k context length a step takes t0 + 200,000 beta =
    1.53592 s, 0.65108 tok/s."""
    df, prov = _study(tmp_path)
    fit = fit_all(df, prov, None, {"bootstrap": 200})["configurations"]["triton-page1"]
    d = fit["decode"]
    assert fit["model_spec"]["kv_bytes_per_token"] == (512 + 64) * 61 * 2 == 70_272
    assert d["beta_s_per_token"] == pytest.approx(7.15639e-6, rel=2e-3) and d["t0_s"] == pytest.approx(0.10464, rel=5e-3)
    assert d["bw_eff_GBps"] == pytest.approx(9.8195, rel=2e-3)
    assert d["bw_pct_datasheet"] == pytest.approx(0.548, rel=3e-3)
    assert fit["ceilings"]["datasheet"]["name"].startswith("NVIDIA RTX PRO 6000")
    assert fit["ceilings"]["datasheet"]["bandwidth_Bps"] == 1792e9  # NVIDIA's datasheet, longctx/specs/hardware.yaml
    roof = fit["roofline"]
    # MLA absorbed decode: 64 heads / 8 ranks x 2 x (512 + 64 + 512) x 61 layers = 1,061,888 FLOP per KV token,
    # over 70,272 B: 15.11 FLOP per byte, far below the ridge of 503.8 TFLOP/s / 1,792 GB/s = 281
    assert roof["intensity"] == pytest.approx(1_061_888 / 70_272, rel=1e-9) == pytest.approx(15.1111, rel=1e-5)
    assert roof["bound_datasheet"] == "memory" and roof["ridge_datasheet"] == pytest.approx(503.8e12 / 1792e9)
    assert [p["length"] for p in roof["points"]] == [5500, 185_000]
    assert roof["points"][-1]["achieved_Bps"] == pytest.approx(9.1002e9, rel=1e-4)
    ex = fit["extrapolation"]
    assert ex["length"] == 200_000 and ex["why"] == "the context length, below the KV pool's size"
    assert ex["kv_pool_tokens"] == 240_000
    assert ex["step_s"] == pytest.approx(1.53592, rel=2e-3) and ex["decode_tok_s"] == pytest.approx(0.65108, rel=2e-3)
    d = diagnose(medians(df), {"triton-page1": fit})
    text = " ".join(_said(d))
    assert "Decode at 185,000 tokens runs at 0.7 tok/s" in text
    # at 0.55% of the bandwidth roof the KV reads are on neither roof: latency-bound, not "bound by the KV reads"
    assert fit["bounds"]["decode"]["class"] == "latency"
    assert re.search(r"run at 9.82 GB/s[^,;:]* or faster", text) and "0.55% of the datasheet's 1,792 GB/s" in text and "decode is latency-bound" in text
    assert "the bandwidth roof is the one that applies" in text  # the roofline's words, from the same decision
    assert "bandwidth-bound" not in text and "memory-bound" not in text and "bound by the KV reads" not in text
    assert all(i["figure"] in FIGURES + ANALYSIS_FIGURES for g in d["configurations"] for i in g["items"] if i["figure"])


def test_diagnosis_names_the_fixed_step_work_when_the_kv_cache_is_a_small_share():
    L = np.repeat([1024, 2048, 4096, 8192], 3).astype(float)
    df = pd.DataFrame({"configuration": "c", "length": L, "status": "ok", "reason": None, "concurrency": 1, "trial": 0,
                       "ttft_s": 0.01 + 1e-6 * L, "tpot_s": 0.02 + 1e-8 * L, "decode_tok_s": 1 / (0.02 + 1e-8 * L),
                       "kv_bytes_per_token": 640})
    fits = fit_all(df)["configurations"]
    (sentence,) = [i for g in diagnose(medians(df), fits)["configurations"] for i in g["items"] if i["figure"] == "step_time"]
    # beta 1e-8 s per token at 8,192 tokens: 81.92 us of a 20.08 ms step, 0.41%
    assert fits["c"]["bounds"]["decode"]["class"] == "fixed"
    assert "bound by the length-independent work of each step (t0 = 20 ms): the KV reads are 0.41% of the step" in sentence["text"]


def test_the_studys_report_renders_with_datasheet_ceilings_and_sources(tmp_path):
    """The report path a GPU deployment takes (datasheet ceilings, TP8, sources), through real
    figures and a real latexmk build; the CPU path is the workflow test's."""
    import subprocess

    from longctx.analysis.aggregate import COLUMNS
    from longctx.analysis.fits import fit_file
    from longctx.report.figures.analysis import plot_analysis
    from longctx.analysis.memory import plan_file
    from longctx.report.figures.measured import plot_all
    from longctx.report.context import ReportInputs
    from longctx.report.latex import build_pdf, render_report

    from .conftest import ROOT

    df, prov = _study(tmp_path)
    pd.DataFrame(df, columns=COLUMNS).to_csv(tmp_path / "results.csv", index=False)
    entry = prov["configurations"]["triton-page1"]
    entry["hardware"].update(usable_cpus=2, logical_cpus=2, memory_total_bytes=2**34, os="Linux", host="gpu-node")
    entry.update(protocol={"warmup": 1, "trials": 3, "output_tokens": 64, "flush_cache": True}, spec_hash="x",
                 last_finished_at="2026-01-01T00:00:00+00:00")
    entry["model"]["kv_bytes_per_token"] = 70_272
    (tmp_path / "prov.json").write_text(json.dumps(prov))
    fit_file(tmp_path / "results.csv", tmp_path / "fits.json", tmp_path / "prov.json", None, {"bootstrap": 100})
    plan_file(tmp_path / "prov.json", tmp_path / "results.csv", tmp_path / "planner.json", [0.9])
    report = tmp_path / "report"
    style = ROOT / "templates" / "plot.mplstyle"
    plot_all(tmp_path / "results.csv", tmp_path / "fits.json", style, report / "figures")
    plot_analysis(tmp_path / "results.csv", tmp_path / "fits.json", tmp_path / "planner.json", style, report / "figures")
    render_report(ROOT / "templates" / "longctx.tex.j2", report / "longctx.tex", report / "version.json",
                  ReportInputs(tmp_path / "results.csv", tmp_path / "fits.json", tmp_path / "prov.json", planner=tmp_path / "planner.json"))
    build_pdf(report / "longctx.tex", report / "longctx.pdf", tmp_path / "prov.json", report / "version.json")
    text = subprocess.run(["pdftotext", "-layout", str(report / "longctx.pdf"), "-"], capture_output=True, text=True,
                          check=True).stdout
    flat = " ".join(text.split()).replace("\u2019", "'")  # LaTeX sets ' as a right quote
    assert re.search(r"0\.55% of the datasheet's 1,792 GB/s \(NVIDIA RTX PRO 6000 Blackwell Workstation Edition\)", flat)
    assert re.search(r"decode is latency-bound, on neither roof \(bound by one needs at least 50% of it\)\. \(Figure \d+\)", flat)
    assert "Sources: NVIDIA RTX PRO 6000 Blackwell Workstation Edition: https://www.nvidia.com/en-us/products/" in flat
    assert "professional-desktop-gpus/rtx-pro-6000/" in text  # \url breaks the line, not the address
    # the model as served (appendix): MLA, bf16 KV cache, 8 ranks, the study's 70,272 bytes per token
    assert "Kimi-K2.6: MLA (multi-head latent attention), described exactly by model.architecture" in flat
    assert re.search(r"KV cache dtype\s+bfloat16", text) and re.search(r"tensor-parallel ranks\s+8\s", text)
    assert re.search(r"KV bytes per token \(the analysis\)\s+70,272\s+model\.kv_bytes_per_token", text)


# --- partial lengths: fewer successful trials than configured -------------------------------------

def _trials(name: str, L: int, ok: int, failed: int, step: float, ttft: float, concurrency: int = 1) -> list[dict]:
    """ok trials at exactly (ttft, step), then failed ones, of one configuration and length."""
    rows = [{"configuration": name, "length": L, "concurrency": concurrency, "trial": t, "status": "ok", "reason": None,
             "ttft_s": ttft, "tpot_s": step, "decode_tok_s": 1 / step, "kv_bytes_per_token": 1000} for t in range(ok)]
    return rows + [{"configuration": name, "length": L, "concurrency": concurrency, "trial": ok + t, "status": "failed",
                    "reason": "connection reset", "kv_bytes_per_token": 1000} for t in range(failed)]


def _protocol(**trials) -> dict:
    return {"configurations": {n: {"engine": "reference", "protocol": {"trials": k}} for n, k in trials.items()}}


def test_partial_lengths_are_those_with_fewer_ok_trials_than_the_protocol():
    from longctx.analysis.tables import configured_trials, partial_lengths

    rows = (_trials("c", 1000, 3, 0, 1e-3, 0.1) + _trials("c", 2000, 1, 2, 1e-3, 0.2)  # partial: 1 of 3
            + _trials("c", 4000, 0, 3, 1e-3, 0.4)  # failed, not partial
            + _trials("c", 8000, 3, 1, 1e-3, 0.8)  # a fourth, failed trial: still 3 of 3
            + _trials("c", 8000, 1, 3, 1e-3, 0.8, concurrency=2))  # batched requests do not count
    df = pd.DataFrame(rows)
    assert partial_lengths(df, _protocol(c=3)) == {"c": {2000: {"ok": 1, "trials": 3, "configured": 3}}}
    med = medians(df, _protocol(c=3)).set_index("length")
    assert med["partial"].to_dict() == {1000: False, 2000: True, 4000: False, 8000: False}
    assert med["configured"].tolist() == [3] * 4 and med.loc[2000, "ok"] == 1
    # a protocol of 5 trials makes every measured length partial
    assert set(partial_lengths(df, _protocol(c=5))["c"]) == {1000, 2000, 8000}
    # no protocol recorded: the most trials any length has (8,000 tokens: 4), which its one failure makes partial too
    assert configured_trials(df) == {"c": 4} and set(partial_lengths(df)["c"]) == {1000, 2000, 8000}


def _knee(name: str = "c", partial_factor: float = 1.5) -> list[dict]:
    """Exact laws (TTFT 0.01 + 1e-6 L + 1e-10 L^2, step 1e-3 + 1e-7 L) at 1k..16k, 3 of 3 trials each; at
    32k one surviving trial of 3, partial_factor times slower than the laws."""
    rows = []
    for L in (1000, 2000, 4000, 8000, 16000, 32000):
        f, ok = (partial_factor, 1) if L == 32000 else (1.0, 3)
        rows += _trials(name, L, ok, 3 - ok, (1e-3 + 1e-7 * L) * f, (0.01 + 1e-6 * L + 1e-10 * L * L) * f)
    return rows


def test_a_partial_length_is_left_out_of_the_fits_and_regime_detection_unless_configured():
    df = pd.DataFrame(_knee())
    out = fit_all(df, _protocol(c=3), None, {"bootstrap": 50})
    assert out["settings"]["partial_lengths"] == "exclude"
    c = out["configurations"]["c"]
    # the fits stand on the five full lengths: the laws exactly, and no regime change at 32k
    assert c["decode"]["beta_s_per_token"] == pytest.approx(1e-7, rel=1e-6) and c["decode"]["t0_s"] == pytest.approx(1e-3, rel=1e-6)
    assert c["prefill"]["c_s_per_token2"] == pytest.approx(1e-10, rel=1e-5)
    assert c["decode"]["regime_change"] is None and c["prefill"]["regime_change"] is None
    assert not c["decode"]["on_partial_lengths"] and not c["prefill"]["on_partial_lengths"]
    assert c["partial_lengths"] == {"mode": "exclude", "lengths": [
        {"length": 32000, "ok": 1, "trials": 3, "configured": 3, "fitted": {"prefill": False, "decode": False},
         "regime_detection": {"prefill": False, "decode": False}}]}
    # include: the one slow trial at 32k is fitted, and starts a regime 50% slower than the shorter lengths predict
    c = fit_all(df, _protocol(c=3), None, {"bootstrap": 50, "partial_lengths": "include"})["configurations"]["c"]
    assert c["decode"]["beta_s_per_token"] > 1.1e-7
    rc = c["decode"]["regime_change"]
    assert rc["from_length"] == 32000 and rc["fitted_up_to"] == 16000 and rc["deviation"] == pytest.approx(0.5, rel=1e-3)
    assert c["partial_lengths"]["lengths"][0]["fitted"] == {"prefill": True, "decode": True}
    with pytest.raises(ValueError, match="partial_lengths"):
        fit_all(df, _protocol(c=3), None, {"bootstrap": 0, "partial_lengths": "drop"})


def test_a_fit_stands_on_partial_lengths_only_where_too_few_others_remain_and_says_so():
    rows = [r for r in _knee() if r["length"] in (1000, 2000, 32000)]  # two full lengths and a partial one
    c = fit_all(pd.DataFrame(rows), _protocol(c=3), None, {"bootstrap": 0})["configurations"]["c"]
    # decode needs two lengths: the full ones suffice; prefill needs three: it takes the partial one, and says so
    assert not c["decode"]["on_partial_lengths"] and c["decode"]["beta_s_per_token"] == pytest.approx(1e-7, rel=1e-6)
    assert c["prefill"]["on_partial_lengths"]
    assert c["partial_lengths"]["lengths"][0]["fitted"] == {"prefill": True, "decode": False}
    assert c["partial_lengths"]["lengths"][0]["regime_detection"] == {"prefill": False, "decode": False}


def test_the_diagnosis_does_not_set_a_partial_lengths_one_trial_against_the_fit():
    df = pd.DataFrame(_knee())
    for mode in ("exclude", "include"):
        fits = fit_all(df, _protocol(c=3), None, {"bootstrap": 50, "partial_lengths": mode})["configurations"]
        texts = _said(diagnose(medians(df, _protocol(c=3)), fits), "c")
        # what bounds decode and how long prefill takes: at 16k, the longest length measured in full
        assert any(t.startswith("Decode at 16,000 tokens runs at") for t in texts), texts
        assert any(t.startswith("Prefill of 16,000 tokens takes") for t in texts), texts
        assert not any("ecode at 32,000" in t or "refill of 32,000" in t for t in texts)
        said = [t for t in texts if "fewer successful trials than configured" in t]
        if mode == "exclude":
            assert said == ["1 length was measured by fewer successful trials than configured (32,000 tokens: measured "
                            "by 1 of 3 trials); it is left out of the fits and of the regime detection."]
            assert not any("slower than the fit" in t for t in texts)
        else:
            assert said[0].endswith("; the prefill and decode fits include it.")
            [regime] = [t for t in texts if "stops following its model" in t and "decode step" in t]
            assert "at 32,000 tokens (measured by 1 of 3 trials) it is 50% slower" in regime


# --- what bounds each phase (longctx.analysis.bounds), from the study's shape ------------------------

STUDY9 = [5500, 10_000, 20_000, 40_000, 60_000, 90_000, 120_000, 150_000, 185_000]


def _decode_case(step, lengths=STUDY9, noise=0.002, name="triton-page1"):
    """The study's deployment (Kimi K2.6 on 8 RTX PRO 6000, 70,272 KV bytes per token) with decode steps
    step(L) at 9 lengths to 185k, 3 trials each with a small symmetric spread; prefill as in _study."""
    df, prov = _study(Path("."))
    rows = []
    for L in lengths:
        for trial in range(3):
            s = step(L) * (1 + noise * (trial - 1))
            rows.append({"configuration": name, "length": L, "trial": trial, "status": "ok", "reason": None, "concurrency": 1,
                         "ttft_s": 2.0 + 2e-4 * L + 1e-8 * L**2, "tpot_s": s, "decode_tok_s": 1 / s, "kv_bytes_per_token": 70_272})
    return pd.DataFrame(rows), prov


def test_the_studys_decode_at_9_lengths_is_latency_bound_under_1_percent_of_the_roof():
    """The study's line through its two figures (beta = 7.15639e-6 s per token, t0 = 0.10464 s, worked out by
    hand above), measured at 9 lengths: decode falls to 0.7 tok/s at 185k, the KV reads are 93% of the step
    (7.15639e-6 x 185,000 / (1/0.7) = 0.9267) yet reach 70,272 / 7.15639e-6 = 9.82 GB/s, 0.548% of 1,792 GB/s:
    latency-bound, not bandwidth-bound."""
    df, prov = _decode_case(lambda L: 0.10464 + 7.15639e-6 * L)
    fit = fit_all(df, prov, None, {"bootstrap": 200})["configurations"]["triton-page1"]
    b = fit["bounds"]["decode"]
    assert b["class"] == "latency" and b["basis"] == "fit" and b["length"] == 185_000
    assert b["share"] == pytest.approx(0.9267, rel=5e-3)
    assert b["bandwidth"]["pct"]["datasheet"] == pytest.approx(0.548, rel=5e-3) and b["bandwidth"]["pct"]["datasheet"] < 1
    assert b["roof"]["roof"] == "bandwidth"  # intensity 15.1 FLOP/B, below the ridge of 281: the bandwidth roof applies
    d = diagnose(medians(df), {"triton-page1": fit})
    text = " ".join(_said(d))
    assert "decode is latency-bound, on neither roof" in text and "0.55% of the datasheet's 1,792 GB/s" in text
    assert "bandwidth-bound" not in text and "bound by the KV reads" not in text
    assert "Decode: the rate falls from 6.94 tok/s at 5,500 tokens to 0.7 tok/s at 185,000" in d["summary"][1]["text"]
    assert "latency-bound (on neither roof) in triton-page1" in d["summary"][1]["text"]


def test_a_kernel_at_80_percent_of_the_roof_is_bandwidth_bound():
    """beta such that 70,272 B per token stream at 80% of 1,792 GB/s: 70,272 / (0.8 x 1,792e9) = 4.90179e-8 s
    per token; t0 = 2 ms, so at 185k the KV reads are 9.068 / 11.068 = 82% of the step."""
    beta = 70_272 / (0.8 * 1792e9)
    df, prov = _decode_case(lambda L: 0.002 + beta * L)
    fit = fit_all(df, prov, None, {"bootstrap": 200})["configurations"]["triton-page1"]
    b = fit["bounds"]["decode"]
    assert b["class"] == "bandwidth" and b["bandwidth"]["pct"]["datasheet"] == pytest.approx(80, rel=5e-3)
    assert b["share"] == pytest.approx(beta * 185_000 / (0.002 + beta * 185_000), rel=5e-3)
    text = " ".join(_said(diagnose(medians(df), {"triton-page1": fit})))
    assert "decode is bandwidth-bound (at least 50% of every known bandwidth roof)" in text and "decode is latency-bound" not in text
    # the same kernel at a threshold of 90%: no longer bound by the roof it does not reach
    fit = fit_all(df, prov, None, {"bootstrap": 200, "bounds": {"roof_share": 0.9}})["configurations"]["triton-page1"]
    assert fit["bounds"]["decode"]["class"] == "latency"


def test_flat_decode_times_say_the_fit_found_no_length_dependence():
    """The same step (50 ms, 1% noise) at every length: beta is clamped to 0 or its interval reaches 0, R^2 is
    near 0; the diagnosis says there is no measurable length dependence, and states no share of the step."""
    rng = np.random.default_rng(7)
    noise = iter(1 + 0.01 * rng.standard_normal(27))
    df, prov = _decode_case(lambda L: 0.05 * next(noise), noise=0.0)
    fit = fit_all(df, prov, None, {"bootstrap": 200})["configurations"]["triton-page1"]
    b = fit["bounds"]["decode"]
    assert b["class"] == "flat" and b["share"] is None and b["bandwidth"] is None
    assert fit["quality"]["decode"]["coefficients"]["beta_s_per_token"] in ("zero", "spans zero")
    d = diagnose(medians(df), {"triton-page1": fit})
    text = " ".join(_said(d))
    assert "the fit finds no measurable dependence on the length" in text
    assert "0% of the step" not in text and "KV reads are" not in text and "bound by the length-independent work" not in text
    assert "flat (no measurable length dependence) in triton-page1" in d["summary"][1]["text"]
    # nor is a fit without length dependence extrapolated as if it had some: R^2 near 0 fails the gate
    assert not fit["quality"]["decode"]["usable"] and "decode at" not in " ".join(
        i["text"] for g in d["configurations"] for i in g["items"] if i["figure"] == "extrapolation")


def test_a_fit_that_fails_the_gate_is_named_and_its_claims_withheld():
    """A decode series whose noise (30%) swamps its slope: R^2 under 0.8; the diagnosis names the fit with its
    R^2, gives no bandwidth or share from it and no decode extrapolation, and the medians bound the KV reads."""
    rng = np.random.default_rng(11)
    noise = iter(1 + 0.3 * rng.standard_normal(27))
    df, prov = _decode_case(lambda L: (0.10464 + 7.15639e-7 * L) * abs(next(noise)), noise=0.0)
    fit = fit_all(df, prov, None, {"bootstrap": 200})["configurations"]["triton-page1"]
    q = fit["quality"]["decode"]
    assert not q["usable"] and q["r2"] < 0.8 and q["problems"][0].startswith(f"R² is {q['r2']:.2f}, below the 0.8 required")
    b = fit["bounds"]["decode"]
    assert b["basis"] in ("medians", None) and b["bandwidth"] is None and b["share"] is None
    d = diagnose(medians(df), {"triton-page1": fit})
    text = " ".join(_said(d, "triton-page1"))
    assert f"The decode step fit is not used for shares, bandwidths, crossovers or extrapolations: R² is {q['r2']:.2f}" in text
    [extrapolated] = [i["text"] for g in d["configurations"] for i in g["items"] if i["figure"] == "extrapolation"]
    assert "a prefill of" in extrapolated and "decode at" not in extrapolated  # the prefill fit passes; decode's does not


def test_the_same_engine_at_another_setting_is_evidence_for_the_layout():
    """Two configurations of one engine, model and device that differ only in page-size, one's KV reads
    costing 3x the other's per token: the evidence names the setting and the ratio, intervals apart."""
    df1, prov = _decode_case(lambda L: 0.02 + 3e-6 * L, name="page1")
    df2, _ = _decode_case(lambda L: 0.02 + 1e-6 * L, name="page64")
    entry = prov["configurations"].pop("triton-page1")
    prov["configurations"] = {"page1": entry, "page64": {**entry, "args": {**entry["args"], "page-size": 64}}}
    fits = fit_all(pd.concat([df1, df2]), prov, None, {"bootstrap": 200})["configurations"]
    [ev] = [e for e in fits["page1"]["bounds"]["decode"]["evidence"] if e["kind"] == "settings"]
    assert ev["other"] == "page64" and ev["differ"] == {"page-size": [1, 64]} and ev["separated"]
    assert ev["beta_ratio"] == pytest.approx(3.0, rel=1e-2)
    text = " ".join(_said(diagnose(medians(pd.concat([df1, df2])), fits), "page1"))
    assert "its KV reads cost 3.00x page64's per token (page-size 1 instead of 64; the intervals do not overlap)" in text
