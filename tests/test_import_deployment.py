"""A real deployment's results, imported: the study's Kimi K2.6 (MLA, 61 layers, 64 heads) on 8 x RTX PRO 6000
Blackwell, TP8 SGLang, measured by `vllm bench serve` at the study's 9 lengths (config/examples/kimi-k2.6-rtx-pro-6000.yaml).

The configuration states what the files cannot: the flags the server ran with (args, in server_engine's names)
or its tensor-parallel size (tp_size), and the GPUs by name (hardware). Every expected figure below is worked
out by hand from the model's dimensions, TP8 and the datasheet, not by the functions under test."""

import json
from pathlib import Path

import pytest

from longctx import config as lcfg
from longctx.core.errors import ConfigError
from longctx.measure import imports

from .conftest import ROOT
from .report_data import run_report_chain

GPU = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
LENGTHS = [1000, 5000, 10000, 20000, 40000, 80000, 120000, 160000, 185000]  # the study's 9 lengths, 1k to 185k
OUTPUT = 64  # output tokens per request
# The study's decode (DESIGN.md): 144 ms per step at 5.5k tokens, 0.7 tok/s at 185k; a step is t0 + beta L through both
BETA = (1 / 0.7 - 0.144) / (185_000 - 5_500)  # 7.15639e-6 s per token of context
T0 = 0.144 - 5_500 * BETA  # 0.10464 s
KV = (512 + 64) * 61 * 2  # the MLA latent (kv_lora_rank + rope) x 61 layers x 2 bytes (bf16) = 70,272 B per token, every rank
# each vllm bench serve file's own date (its local time, the zone unsaid): the last one is the report's date
DATES = {L: f"202603{15 + i // 5:02d}-{10 + i:02d}1500" for i, L in enumerate(LENGTHS)}
LAST = "2026-03-16 18:15"  # the last file's date, 185k: 20260316-181500


def bench_file(path: Path, length: int) -> None:
    """One `vllm bench serve --save-result --save-detailed --max-concurrency 1` file: 3 requests of `length`
    prompt tokens, each TTFT on an illustrative quadratic law, then 63 chunks one decode step apart."""
    n = 3
    step = [(T0 + BETA * length) * (1 + 0.001 * (i - 1)) for i in range(n)]  # a symmetric spread around the law
    ttft = [(2.0 + 2e-4 * length + 1e-8 * length**2) * (1 + 0.001 * (i - 1)) for i in range(n)]
    latency = [t + (OUTPUT - 1) * s for t, s in zip(ttft, step)]
    starts = [100.0 + sum(latency[:i]) for i in range(n)]
    path.write_text(json.dumps({
        "date": DATES[length], "backend": "sglang", "model_id": "moonshotai/Kimi-K2.6", "num_prompts": n,
        "request_rate": "inf", "max_concurrency": 1, "duration": sum(latency), "completed": n, "failed": 0,
        "total_input_tokens": n * length, "total_output_tokens": n * OUTPUT, "median_ttft_ms": sorted(ttft)[1] * 1e3,
        "input_lens": [length] * n, "output_lens": [OUTPUT] * n, "ttfts": ttft, "itls": [[s] * (OUTPUT - 1) for s in step],
        "latencies": latency, "start_times": starts, "errors": [""] * n}))


@pytest.fixture
def study(tmp_path, monkeypatch):
    """The study's config (config/examples) with its configurations replaced by one imported from the bench files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench").mkdir()
    for L in LENGTHS:
        bench_file(tmp_path / "bench" / f"kimi-{L}.json", L)

    def config(**conf) -> dict:
        raw = lcfg.read(ROOT / "config" / "examples" / "kimi-k2.6-rtx-pro-6000.yaml")
        raw["configurations"] = {"study": {
            "engine": "imported", "format": "vllm-bench", "files": ["bench/kimi-*.json"], "tool_version": "0.32.0",
            "device": "gpu", "hardware": {"gpu": GPU, "count": 8}, **conf}}
        return raw

    return config


SGLANG_FLAGS = {"tensor-parallel-size": 8, "context-length": 200000, "mem-fraction-static": 0.94, "max-running-requests": 8,
                "page-size": 1, "attention-backend": "triton"}


def test_the_studys_imported_runs_analyse_per_gpu_at_tp8_and_report_their_own_date(study, tmp_path):
    config = lcfg.validate(study(server_engine="sglang", args=SGLANG_FLAGS, kv_pool_tokens=240_000))
    data = tmp_path / "data"
    spec = lcfg.configuration_spec(config, "study")
    assert imports.import_configuration(spec, data / "raw" / "study") == LENGTHS
    raw = json.loads((data / "raw" / "study" / "185000.json").read_text())
    assert raw["provenance"]["args"] == SGLANG_FLAGS and raw["provenance"]["imported"]["server_engine"] == "sglang"
    assert raw["finished_at"] == "2026-03-16T18:15:00+00:00"  # the file's date, its zone unsaid, read as UTC
    paths = run_report_chain(data, tmp_path / "report", config)  # aggregate, fit, plan, plot, render, pdf, markdown

    fit = json.loads((data / "fits.json").read_text())["configurations"]["study"]
    # by hand: 64 heads over 8 ranks = 8 heads per GPU; MLA absorbed decode, per KV token, per GPU:
    # 8 x 2 x (512 + 64 + 512) x 61 layers = 1,061,888 FLOP, over the 70,272 B every rank reads: 15.111 FLOP/B
    # (one GPU doing all 64 heads would be 8,495,104 FLOP, 120.9 FLOP/B)
    flops = 64 // 8 * 2 * (512 + 64 + 512) * 61
    assert flops == 1_061_888 and fit["model_spec"]["tp_size"] == 8
    assert fit["model_spec"]["decode_flops_per_kv_token"] == flops and fit["model_spec"]["kv_bytes_per_token"] == KV == 70_272
    assert fit["roofline"]["intensity"] == pytest.approx(flops / KV, rel=1e-12) == pytest.approx(15.1111, rel=1e-5)
    # the KV reads stream at KV / beta = 9.8195 GB/s (0.548% of the datasheet's 1,792 GB/s), and the attention FLOPs with
    # them at flops / beta = 1.4838e11 FLOP/s: 0.02945% of the datasheet's 503.8 TFLOP/s per GPU (TP1's 0.2356% eight-fold)
    d = fit["bounds"]["decode"]
    assert fit["decode"]["beta_s_per_token"] == pytest.approx(BETA, rel=1e-3)
    assert d["bandwidth"]["pct"]["datasheet"] == pytest.approx(100 * KV / BETA / 1792e9, rel=1e-3) == pytest.approx(0.548, rel=2e-3)
    assert d["compute"]["pct"]["datasheet"] == pytest.approx(100 * flops / BETA / 503.8e12, rel=1e-3)
    assert d["compute"]["pct"]["datasheet"] == pytest.approx(0.02945, rel=1e-3)

    # the pool: 96 GB per GPU (the datasheet: no NVML reading of that machine), 240,000 tokens x 70,272 B at the
    # configured 0.94; SGLang's rule backs the weights out: W = 96e9 x 0.94 - 240,000 x 70,272 = 73,374,720,000 B, and
    # at 0.85 the pool holds (96e9 x 0.85 - W) // 70,272 = 8,225,280,000 // 70,272 = 117,049 tokens: 0.94 grows it by
    # 96e9 x 0.09 / 70,272 = 122,951 tokens (8.64 GB)
    memory = 96 * 10**9
    weights = memory * 94 // 100 - 240_000 * KV
    at_085 = (memory * 85 // 100 - weights) // KV
    assert (weights, at_085) == (73_374_720_000, 117_049)
    from longctx.analysis.memory import plan_file

    plan = plan_file(data / "provenance.json", data / "results.csv", tmp_path / "planner.json", [0.85, 0.94])
    entry = plan["configurations"]["study"]
    assert entry["memory"]["memory_bytes"] == memory and entry["memory"]["memory_source"].startswith(f"the datasheet: {GPU}")
    assert {r["mem_fraction_static"]: r["pool_tokens"] for r in entry["rows"]} == {0.85: 117_049, 0.94: 240_000}
    assert entry["check"] == "calibrated" and entry["kv_bytes_per_token"]["tp_size"] == 8
    # req-to-token table: 8 requests x (200,000 + 4) x 4 B
    assert entry["memory"]["req_to_token_bytes"] == 8 * 200_004 * 4

    # the report: the runs' own date, the flags as given, no 1970
    md = paths["md"].read_text()
    assert f"| measured | {LAST} UTC" in md and "1970" not in md
    prov = json.loads((data / "provenance.json").read_text())["configurations"]["study"]
    assert prov["imported"]["notes"][-1].startswith("vllm bench serve dates its runs in its machine's local time")
    assert paths["pdf"].stat().st_size > 0


def test_tp_size_alone_or_vllm_flags_give_the_same_heads_per_gpu(study, tmp_path):
    """tp_size without flags, and vLLM's flags (whose pool the planner does not model: said, not a crash)."""
    from longctx.analysis.memory import plan

    for name, conf in (("tp", {"tp_size": 8}),
                       ("vllm", {"server_engine": "vllm", "args": {"tensor-parallel-size": 8, "max-model-len": 200000,
                                                                   "gpu-memory-utilization": 0.9}, "kv_pool_tokens": 240_000})):
        spec = lcfg.configuration_spec(lcfg.validate(study(**conf)), "study")
        imports.import_configuration(spec, tmp_path / name)
        prov = json.loads((tmp_path / name / "1000.json").read_text())["provenance"]
        assert prov["model_spec"]["tp_size"] == 8 and prov["model_spec"]["decode_flops_per_kv_token"] == 1_061_888, name
        entry = plan({"configurations": {"study": {**prov, "engine": "imported"}}}, [0.85, 0.94])["configurations"]["study"]
        assert entry["rows"] == [] and entry["memory"]["memory_bytes"] == 96 * 10**9
        if name == "vllm":
            assert entry["memory"]["context_length"] == 200_000  # vLLM's --max-model-len, read by vLLM's adapter
            assert "does not model (it has no mem-fraction-static)" in entry["reason"]
    assert prov["model_spec"]["field_sources"]["tp_size"] == "the engine's tensor-parallel flag"


@pytest.mark.parametrize("conf, message", [
    ({"args": {"tp-size": 8}}, r"configurations.study.server_engine' is required with args: .*allowed values: sglang, vllm"),
    ({"server_engine": "trtllm", "args": {"tp-size": 8}},
     r"configurations.study.server_engine': 'trtllm' is not allowed; allowed values: sglang, vllm"),
    ({"server_engine": "sglang", "args": {"tp-size": 8}, "tp_size": 4},
     r"configurations.study.tp_size': 4 disagrees with args.tp-size \(8\); allowed values: 8"),
    ({"server_engine": "sglang", "args": {"tp-size": "eight"}},
     r"configurations.study.args.tp-size': 'eight' is not allowed; allowed values: a whole number"),
    ({"tp_size": 0}, r"configurations.study.tp_size'"),
])
def test_a_bad_key_of_an_imported_deployment_names_the_key_and_the_allowed_values(study, conf, message):
    with pytest.raises(ConfigError, match=message):
        lcfg.validate(study(**conf))


def test_tp_size_and_server_engine_are_for_imported_results_only(study):
    raw = study()
    raw["configurations"] = {"sg": {"engine": "sglang", "tp_size": 8, "args": {"tp-size": 8}}}
    with pytest.raises(ConfigError, match=r"configurations.sg.tp_size' is for imported results"):
        lcfg.validate(raw)
