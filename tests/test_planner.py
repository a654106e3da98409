"""KV memory planner (SGLang's pool rule, shared with the reference engine) and the calibrate step.

The planner's figures are checked against SGLang's formula worked by hand (in the tests' comments)
and against what a real server allocated, never against longctx.specs.pool itself."""

import json
import sys

import pytest

from longctx import config as lcfg
from longctx.attention import microbench
from longctx.measure.calibration import plan as calibration_plan
from longctx.measure.calibration import run_device
from longctx.analysis.memory import memory_model, plan, plan_configuration, pool_tokens

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


def test_planner_follows_sglangs_own_formula_worked_by_hand():
    """SGLang's rule, from its source (0.5.9: python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py,
    ModelRunner.profile_max_num_token; 0.5.23 moved it to srt/mem_cache/kv_cache_configurator.py as
    slack = pre_model_load_memory * (1 - mem_fraction_static)):

        rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static)
        max_num_token = int(rest_memory * (1 << 30)) // cell_size

    with available = memory free after loading (M - weights), total = M, and for MLA
    cell_size = (kv_lora_rank + qk_rope_head_dim) * layers * dtype bytes. Every figure below is that
    arithmetic done by hand for the study's deployment (Kimi K2, RTX PRO 6000 at 95 GiB, f = 0.94) with
    a pool of 240,000 tokens as the server allocated it; none comes from longctx.specs.pool."""
    p = plan_configuration(sglang_entry(240_000), [0.9, 0.95], longest=185_000)
    mm = p["memory"]
    assert mm["cell_bytes"] == (512 + 64) * 61 * 2 == 70_272 and mm["memory_bytes"] == 95 * 2**30 == 102_005_473_280
    # weights backed out: M f - tokens x cell = 95,885,144,883.2 - 16,865,280,000
    assert mm["weights_bytes"] == 79_019_864_883
    assert p["check"] == "calibrated" and p["kv_bytes_per_token"]["all_ranks"] == 8 * 70_272
    rows = {r["mem_fraction_static"]: r for r in p["rows"]}
    assert set(rows) == {0.9, 0.94, 0.95} and rows[0.94]["configured"]
    # f = 0.94: (102,005,473,280 - 79,019,864,883) - 102,005,473,280 x 0.06 = 16,865,280,000 B -> 240,000 tokens
    assert rows[0.94]["pool_tokens"] == 240_000
    # f = 0.90: 22,985,608,397 - 10,200,547,328 = 12,785,061,069 B; // 70,272 = 181,936
    assert rows[0.9]["pool_tokens"] == 181_936
    # f = 0.95: 22,985,608,397 - 5,100,273,664 = 17,885,334,733 B; // 70,272 = 254,515
    assert rows[0.95]["pool_tokens"] == 254_515
    r = rows[0.94]
    assert r["kv_bytes"] == 240_000 * 70_272 == 16_865_280_000
    assert r["largest_context"] == 200_000  # the context length, below the pool
    assert r["concurrency_at_context_length"] == 1 and r["concurrency_at_longest"] == 1  # 240,000 // 200,000, // 185,000
    # SGLang's req-to-token table: int32, max-running-requests x (context-length + 4) = 8 x 200,004 x 4
    assert mm["req_to_token_bytes"] == 6_400_128
    assert p["req_to_token_tokens_equivalent"] == pytest.approx(91.0765, abs=1e-4)  # 6,400,128 / 70,272
    assert p["allocated"]["pool_tokens"] == 240_000 and p["allocated"]["source"] == "the server's info"


def test_planner_with_fp8_kv_and_a_token_cap():
    entry = sglang_entry(100_000, **{"kv-cache-dtype": "fp8_e4m3", "max-total-tokens": 100_000})
    mm = memory_model(entry)
    assert mm["cell_bytes"] == (512 + 64) * 61 * 1 == 35_136  # one byte per value
    assert mm["weights_bytes"] is None  # a capped pool says nothing about the weights
    p = plan_configuration(entry, [0.9], None)
    assert p["rows"] == [] and p["reason"].startswith("the pool cannot be modelled: the weights' memory is unknown")
    assert "weights_bytes" not in p["reason"]  # words, not key names
    assert "the pool it allocated holds 100,000 tokens" in p["reason"]
    mm.update(weights_bytes=74 * GiB)
    # (95 GiB - 74 GiB) - 95 GiB x 0.06 = 16,428,249,907 B; // 35,136 = 467,561, capped at 100,000
    assert pool_tokens(mm, 0.94) == 100_000 and pool_tokens(mm, 0.94, capped=False) == 467_561
    assert pool_tokens(mm, 0.5) == 0  # 47.5 GiB - 74 GiB: not one page left after the weights


def test_planner_matches_a_real_reference_server(tmp_path):
    """A reference engine started with a known memory budget: the planner's prediction against the
    pool the server reports (/server_info max_total_num_tokens) and the tensor it allocated
    (kv_cache_bytes), and both against SGLang's formula worked by hand from the tiny model's shapes."""
    import httpx

    from longctx.engines import get_adapter
    from longctx.measure.process import ManagedServer, free_port

    from .conftest import TINY_ARCH

    port, log = free_port(), tmp_path / "server.log"
    args = {"page-size": 16, "mem-fraction-static": 0.5, "memory-total-gb": 0.0625, "context-length": 2048}
    cmd = [sys.executable, "-m", "longctx.refengine", "--port", str(port), "--json-model-override-args", json.dumps(TINY_ARCH),
           *(w for k, v in args.items() for w in (f"--{k}", str(v)))]
    with ManagedServer(cmd, log) as server:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        info = httpx.get(f"http://127.0.0.1:{port}/server_info").json()
    adapter = get_adapter("reference")
    entry = {"engine": "reference", "args": args, "server_info": info, "model": {"name": "t", "architecture": TINY_ARCH},
             "kv_pool": {"tokens": adapter.pool_tokens(info), "log": adapter.kv_pool_from_log(log.read_text())}}
    p = plan({"configurations": {"r": entry}}, [0.3])["configurations"]["r"]
    # by hand: float32 weights of the tiny MLA model (h 64, 2 heads, nope 16, rope 16, latent 32, v 16,
    # MLP 128, 1 layer, vocab 258): embed + lm_head 2 x 258 x 64, final norm 64, and per layer the norms
    # 64 + 32 + 64, w_q 64 x 64, w_kv_a 64 x 48, w_uk 2 x 16 x 32, w_uv 2 x 32 x 16, w_o 32 x 64, MLP 3 x 64 x 128
    params = 2 * 258 * 64 + 64 + (64 + 32 + 64 + 64 * 64 + 64 * 48 + 2 * 16 * 32 + 2 * 32 * 16 + 32 * 64 + 3 * 64 * 128)
    assert info["weights_bytes"] == 4 * params == 276_352
    cell = (32 + 16) * 1 * 4  # latent + rope, 1 layer, float32
    assert p["memory"]["cell_bytes"] == cell == 192 and info["kv_bytes_per_token"] == cell
    # SGLang's formula: (2^26 - 276,352) - 2^26 x 0.5 = 33,278,080 B; // 192 = 173,323; down to 16: 173,312
    assert info["max_total_num_tokens"] == 173_312
    assert p["predicted_tokens_at_configured"] == 173_312 and p["check"] == "match"
    # the tensor the server allocated: the pool and the padding page 0, 192 bytes per token
    assert info["kv_cache_bytes"] == (173_312 + 16) * 192
    assert entry["kv_pool"]["log"]["tokens"] == 173_312
    # another fraction: 2^26 x 0.3 - 276,352 = 19,856,307 B; // 192 = 103,418; down to 16: 103,408
    assert [(r["mem_fraction_static"], r["pool_tokens"]) for r in p["rows"]] == [(0.3, 103_408), (0.5, 173_312)]
    # the server's own req-to-token table: int64, max-running-requests (8 by default) x context length
    assert p["memory"]["req_to_token_bytes"] == info["req_to_token_bytes"] == 8 * 2048 * 8


def test_a_server_without_sglangs_rule_gives_its_allocated_pool_and_says_why_no_table():
    """vLLM: its pool is in its log only ("CPU KV cache size: N tokens"), its sizing rule not SGLang's."""
    line = "CPU KV cache size: 1,048,576 tokens"
    entry = {"engine": "vllm", "args": {"max-model-len": 2048, "gpu-memory-utilization": 0.9},
             "model": {"name": "m", "architecture": {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
                                                     "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 128}},
             "server_info": {"data": [{"max_model_len": 2048}]}, "hardware": {"gpus": []},
             "kv_pool": {"tokens": None, "log": {"tokens": 1_048_576, "line": line}}}
    p = plan_configuration(entry, [0.9], longest=512)
    mm = p["memory"]
    assert mm["observed_tokens"] == 1_048_576 and mm["observed_source"] == "the server's log" and mm["observed_line"] == line
    assert mm["cell_bytes"] == 2 * 2 * 64 * 2 * 2 == 1024 and mm["context_length"] == 2048  # vLLM's max-model-len
    assert p["rows"] == [] and mm["sizing_rule"] is None and mm["req_to_token_bytes"] is None
    assert "vLLM sizes its KV pool by a rule the planner does not model" in p["reason"] and "SGLang" not in p["reason"]
    assert "holds 1,048,576 tokens (from the server's log), 1 GiB at 1,024 bytes per token" in p["reason"]
    a = p["allocated"]
    assert a["kv_bytes"] == 2**30 and a["largest_context"] == 2048
    assert a["concurrency_at_context_length"] == 512 and a["concurrency_at_longest"] == 2048  # 2^20 / 2^11, / 2^9


LLAMA_TINY = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "hidden_size": 128}


def vllm_entry(budget: dict | None, logged: int, max_model_len: int = 2048, arch: dict = LLAMA_TINY) -> dict:
    """A provenance entry as longctx records a vLLM server: its pool from its log line alone, its budget as configured."""
    return {"engine": "vllm", "args": {"max-model-len": max_model_len}, "model": {"name": "m", "architecture": arch},
            "server_info": {"data": [{"max_model_len": max_model_len}]}, "hardware": {"gpus": []},
            "kv_pool": {"tokens": None, "log": {"tokens": logged, "line": f"CPU KV cache size: {logged:,} tokens"}, "budget": budget}}


def test_vllms_pool_follows_its_own_rule_worked_by_hand():
    """vLLM's rule, from its source (0.32: vllm/v1/core/kv_cache_utils.py, get_kv_cache_config_from_groups
    and update_kv_cache_capacity; the budget from VLLM_CPU_KVCACHE_SPACE in GiB, vllm/platforms/cpu.py):

        num_blocks = available_memory // bytes_per_block      # block_size x bytes per token over all layers
        logged     = int(num_blocks / cdiv(max_model_len, block_size) * max_model_len)

    Every figure below is that arithmetic done by hand; none comes from longctx."""
    cpu = {"bytes": 2**30, "source": "VLLM_CPU_KVCACHE_SPACE", "block_size": 128, "block_source": "vLLM's CPU default"}
    p = plan_configuration(vllm_entry(cpu, 1_048_576), [0.9], longest=512)
    # 2 x 2 KV heads x 64 x 2 layers x 2 bytes = 1,024 B per token; a block of 128 tokens: 131,072 B
    # 1,073,741,824 // 131,072 = 8,192 blocks = 1,048,576 tokens; logged: 8,192 / cdiv(2,048, 128) = 512.0, x 2,048 = 1,048,576
    b = p["budget_rule"]
    assert (b["blocks"], b["pool_tokens"], b["logged_tokens"]) == (8_192, 1_048_576, 1_048_576)
    assert p["predicted_tokens_at_configured"] == 1_048_576 and p["check"] == "match" and p["rows"] == []
    assert ("vLLM sizes its KV pool from a memory budget, 1 GiB (VLLM_CPU_KVCACHE_SPACE), in blocks of 128 tokens (vLLM's CPU "
            "default): 1,073,741,824 bytes over 128 x 1,024 bytes per block give 8,192 whole blocks, 1,048,576 tokens") in p["reason"]
    assert p["reason"].endswith("1 GiB at 1,024 bytes per token, as its rule predicts")
    # max-model-len 2,000, not a multiple of the block: cdiv(2,000, 128) = 16 blocks a request; 8,192 / 16 = 512.0, x 2,000 = 1,024,000
    p = plan_configuration(vllm_entry(cpu, 1_024_000, max_model_len=2000), [0.9], longest=None)
    assert (p["budget_rule"]["pool_tokens"], p["predicted_tokens_at_configured"], p["check"]) == (1_048_576, 1_024_000, "match")
    assert "1,048,576 tokens (1,024,000 as it counts them at its context length)" in p["reason"]
    # a GPU worker given --kv-cache-memory-bytes 3G (3 x 10^9 B) and --block-size 16, a Llama-3-8B-like model:
    # 2 x 8 KV heads x 128 x 32 layers x 2 bytes = 131,072 B per token, 2,097,152 B a block;
    # 3,000,000,000 // 2,097,152 = 1,430 blocks (1,430.51), 22,880 tokens; cdiv(8,192, 16) = 512; 1,430 / 512 x 8,192 = 22,880
    llama8b = {**LLAMA_TINY, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
               "hidden_size": 4096}
    gpu = {"bytes": 3_000_000_000, "source": "--kv-cache-memory-bytes", "block_size": 16, "block_source": "--block-size"}
    p = plan_configuration(vllm_entry(gpu, 22_880, max_model_len=8192, arch=llama8b), [0.9], longest=None)
    assert p["memory"]["cell_bytes"] == 131_072
    assert (p["budget_rule"]["blocks"], p["predicted_tokens_at_configured"], p["check"]) == (1_430, 22_880, "match")
    # a pool that is not the rule's is said to be so
    p = plan_configuration(vllm_entry(cpu, 1_000_000), [0.9], longest=None)
    assert p["check"] == "mismatch" and p["reason"].endswith("not the 1,048,576 its rule predicts")
    # no budget recorded (vLLM profiled its memory): nothing predicted, as before
    p = plan_configuration(vllm_entry(None, 1_048_576), [0.9], longest=None)
    assert "budget_rule" not in p and "check" not in p and "by a rule the planner does not model" in p["reason"]
    # a budget without a block size (a GPU whose attention backend picks it): the budget said, no prediction
    p = plan_configuration(vllm_entry({**gpu, "block_size": None, "block_source": "vLLM's attention backend chooses it"}, 22_880,
                                      max_model_len=8192, arch=llama8b), [0.9], longest=None)
    assert "check" not in p and "in blocks of a size not known here (vLLM's attention backend chooses it)" in p["reason"]


def test_vllm_adapter_reads_its_budget_as_vllm_does(tmp_path, monkeypatch):
    """The adapter's kv_budget against vLLM 0.32's own reading: on its CPU build (here: VLLM_TARGET_DEVICE=cpu,
    vLLM's platform rule) VLLM_CPU_KVCACHE_SPACE in GiB wins over --kv-cache-memory-bytes (cpu.py sets
    kv_cache_memory_bytes from it after the flags); the flag takes k = 10^3 and K = 2^10 (human_readable_int);
    the block is --block-size, else 128 on the CPU, forced to 16 for MLA without AMX; on a GPU no default."""
    from longctx.engines import get_adapter

    for var in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_TARGET_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    a = get_adapter("vllm")

    def spec(env: dict, arch: dict = LLAMA_TINY, **args):
        conf = {"engine": "vllm", "python": sys.executable, "args": {"max-model-len": 2048, **args}, "env": env}
        return lcfg.configuration_spec(lcfg.validate({"lengths": [64], "model": {"name": "m", "path": str(tmp_path), "architecture": arch},
                                                      "configurations": {"v": conf}}), "v")

    cpu = {"VLLM_TARGET_DEVICE": "cpu"}
    assert a.kv_budget(spec({**cpu, "VLLM_CPU_KVCACHE_SPACE": "1"})) == {
        "bytes": 2**30, "source": "VLLM_CPU_KVCACHE_SPACE", "block_size": 128, "block_source": "vLLM's CPU default"}
    both = a.kv_budget(spec({**cpu, "VLLM_CPU_KVCACHE_SPACE": "2"}, **{"kv-cache-memory-bytes": "1G", "block-size": 64}))
    assert (both["bytes"], both["source"], both["block_size"]) == (2 * 2**30, "VLLM_CPU_KVCACHE_SPACE", 64)
    flag = a.kv_budget(spec({**cpu, "VLLM_CPU_KVCACHE_SPACE": ""}, **{"kv-cache-memory-bytes": "1G"}))  # empty: vLLM ignores it
    assert (flag["bytes"], flag["source"]) == (2**30, "--kv-cache-memory-bytes")
    assert a.kv_budget(spec(cpu)) is None  # neither: vLLM sizes it from gpu-memory-utilization at start-up
    assert a.kv_budget(spec({**cpu, "VLLM_CPU_KVCACHE_SPACE": "0.5"})) is None  # vLLM's int() refuses it
    mla = {"model_type": "deepseek_v3", "num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 64, "kv_lora_rank": 32,
           "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}
    amx = "amx_tile" in open("/proc/cpuinfo").read()
    assert a.kv_budget(spec({**cpu, "VLLM_CPU_KVCACHE_SPACE": "1"}, arch=mla, **{"block-size": 64}))["block_size"] == (None if amx else 16)
    # not the CPU build (sys.executable has no vLLM): the variable means nothing, the flag is per GPU
    gpu = a.kv_budget(spec({"VLLM_CPU_KVCACHE_SPACE": "1"}, **{"kv-cache-memory-bytes": "3k"}))
    assert (gpu["bytes"], gpu["block_size"], gpu["block_source"]) == (3000, None, "vLLM's attention backend chooses it")
    assert a.kv_budget(spec({}, **{"kv-cache-memory-bytes": "2K", "block-size": 16}))["bytes"] == 2048
    assert a.kv_budget(spec({"VLLM_CPU_KVCACHE_SPACE": "1"})) is None
    assert get_adapter("reference").kv_budget(spec({})) is None  # SGLang's rule: no budget


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
