"""KV memory planner (SGLang's pool rule, shared with the reference engine) and the calibrate step."""

import json
import sys

import pytest

from longctx import config as lcfg
from longctx.attention import microbench
from longctx.measure.calibration import plan as calibration_plan
from longctx.measure.calibration import run_device
from longctx.analysis.memory import memory_model, plan, plan_configuration, pool_tokens
from longctx.specs.pool import PoolSizing

from .conftest import ROOT

GiB = 2**30
KIMI = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "intermediate_size": 18432, "torch_dtype": "bfloat16"}


def sglang_entry(tokens: int, fraction: float = 0.94, **args) -> dict:
    """A provenance entry as an SGLang TP8 deployment of Kimi K2 on RTX PRO 6000 leaves it."""
    return {"engine": "sglang", "model": {"architecture": KIMI},
            "args": {"tp-size": 8, "context-length": 200000, "mem-fraction-static": fraction, "max-running-requests": 8, **args},
            "hardware": {"gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "memory_total_bytes": 95 * GiB}]},
            "kv_pool": {"tokens": tokens}, "server_info": {}}


def test_planner_reproduces_the_studys_pool_and_predicts_other_fractions():
    # the pool the study's deployment would allocate with 74 GiB of weights per GPU (SGLang's rule)
    observed = PoolSizing(95 * GiB, 0.94, 74 * GiB, 70_272, 1, None).tokens()
    p = plan_configuration(sglang_entry(observed), [0.9, 0.95], longest=185_000)
    mm = p["memory"]
    assert mm["cell_bytes"] == 70_272 and mm["memory_bytes"] == 95 * GiB
    assert mm["weights_bytes"] == pytest.approx(74 * GiB, abs=70_272)  # backed out of the pool, to one token
    assert p["check"] == "calibrated" and p["kv_bytes_per_token"]["all_ranks"] == 8 * 70_272
    rows = {r["mem_fraction_static"]: r for r in p["rows"]}
    assert set(rows) == {0.9, 0.94, 0.95} and rows[0.94]["configured"] and rows[0.94]["pool_tokens"] == observed
    for f in (0.9, 0.95):  # the other fractions follow the same rule with the same weights
        assert rows[f]["pool_tokens"] == pytest.approx(PoolSizing(95 * GiB, f, 74 * GiB, 70_272, 1, None).tokens(), abs=1)
    assert rows[0.9]["pool_tokens"] < observed < rows[0.95]["pool_tokens"]
    r = rows[0.94]
    assert r["largest_context"] == min(observed, 200_000)
    assert r["concurrency_at_context_length"] == observed // 200_000 and r["concurrency_at_longest"] == observed // 185_000
    # SGLang's req-to-token table: int32, max-running-requests x (context-length + 4)
    assert mm["req_to_token_bytes"] == 8 * 200_004 * 4
    assert p["req_to_token_tokens_equivalent"] == pytest.approx(8 * 200_004 * 4 / 70_272)


def test_planner_with_fp8_kv_and_a_token_cap():
    entry = sglang_entry(100_000, **{"kv-cache-dtype": "fp8_e4m3", "max-total-tokens": 100_000})
    mm = memory_model(entry)
    assert mm["cell_bytes"] == 35_136
    assert mm["weights_bytes"] is None  # a capped pool says nothing about the weights
    p = plan_configuration(entry, [0.9], None)
    assert p["rows"] == [] and "unknown weights_bytes" in p["reason"]
    mm.update(weights_bytes=74 * GiB)
    assert pool_tokens(mm, 0.94) == 100_000 and pool_tokens(mm, 0.94, capped=False) > 100_000
    assert pool_tokens(mm, 0.5) == 0  # not one page left after the weights


def test_planner_reference_engine_matches_what_the_server_allocated():
    info = {"memory_total_bytes": 8 * GiB, "weights_bytes": 3_000_000, "kv_bytes_per_token": 640, "page_size": 16,
            "max_total_tokens": None, "context_length": 40960, "mem_fraction_static": 0.5, "max_running_requests": 4,
            "req_to_token_bytes": 4 * 40960 * 8}
    tokens = PoolSizing(8 * GiB, 0.5, 3_000_000, 640, 16, None).tokens()
    doc = plan({"configurations": {"r": {"engine": "reference", "args": {"page-size": 16}, "server_info": info,
                                         "kv_pool": {"tokens": tokens}, "model": {"architecture": {}}}}}, [0.3])
    p = doc["configurations"]["r"]
    assert p["check"] == "match" and p["predicted_tokens_at_configured"] == tokens
    assert p["memory"]["req_to_token_bytes"] == 4 * 40960 * 8  # the server's own int64 table
    assert [r["mem_fraction_static"] for r in p["rows"]] == [0.3, 0.5]


def test_calibration_plan_measures_each_device_kind_with_the_engines_python():
    c = lcfg.load(ROOT / "config" / "longctx.yaml")
    p = calibration_plan(c)
    assert list(p["devices"]) == ["cpu"] and p["devices"]["cpu"]["dtype"] == "float32"
    assert p["devices"]["cpu"]["configurations"] == sorted(c["configurations"])
    assert p["devices"]["cpu"]["copy_mib"] == 256 and p["devices"]["cpu"]["threads"] >= 1
    kimi = lcfg.load(ROOT / "config" / "examples" / "kimi-k2.6-rtx-pro-6000.yaml")
    g = calibration_plan(kimi)["devices"]["cuda"]
    # one of the engines' own Pythons (the configurations' `python:`), not longctx's
    assert g["python"] in {c["python"] for c in kimi["configurations"].values()} and g["python"].startswith("/opt/sglang")
    assert (g["dtype"], g["matmul_size"]) == ("bfloat16", 8192)
    off = calibration_plan({**c, "calibration": {**c["calibration"], "enabled": False}})
    assert off == {"enabled": False, "devices": {}}


def test_calibrate_measures_this_cpu_with_the_engines_python(tmp_path):
    from longctx.cli import main

    plan_ = {"enabled": True, "devices": {"cpu": {"python": sys.executable, "dtype": "float32", "copy_mib": 8,
                                                  "matmul_size": 128, "repeats": 2, "threads": 1, "configurations": ["a"]}}}
    assert main(["calibrate", "--plan", json.dumps(plan_), "--out", str(tmp_path / "c.json")]) == 0
    cpu = json.loads((tmp_path / "c.json").read_text())["devices"]["cpu"]
    assert cpu["status"] == "ok" and cpu["threads"] == 1 and cpu["copy_bytes"] == 8 * 2**20 and cpu["configurations"] == ["a"]
    for key in ("copy_Bps", "read_Bps"):
        assert 1e8 < cpu[key] < 1e12 and cpu[key] >= cpu[key + "_median"]  # the best repeat is the ceiling
    assert cpu["matmul_flops"] == pytest.approx(2 * 128**3 / min(cpu["seconds"]["matmul"]))


def test_calibration_reports_what_it_cannot_measure():
    p = {"python": "/nonexistent/python", "dtype": "float32", "copy_mib": 1, "matmul_size": 16, "repeats": 1, "threads": 1,
         "configurations": ["a"]}
    missing = run_device("cpu", p)
    assert missing["status"] == "failed" and "nonexistent" in missing["reason"]
    with pytest.raises(RuntimeError, match="sees no CUDA device"):  # this machine has no GPU
        microbench.measure("cuda", 1, 16, "float32", 1)
    with pytest.raises(ValueError, match="dtype 'int8'"):
        microbench.measure("cpu", 1, 16, "int8", 1)
