"""Model spec (KV bytes, attention FLOPs), the hardware table, and the roofline arithmetic."""

import json
import re

import numpy as np
import pytest

from longctx.specs import hardware
from longctx.engines import get_adapter
from longctx.specs.model import ModelSpecError, from_hf_config, model_spec
from longctx.analysis.roofline import attainable, bound, decode_points, ridge

# The fields of Kimi K2's config.json that the spec reads (DeepSeek-V3 layout).
KIMI = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168,
        "num_attention_heads": 64, "num_key_value_heads": 64, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
LLAMA3_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "torch_dtype": "bfloat16"}
LLAMA2_7B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "torch_dtype": "float16"}


def test_mla_kv_bytes_per_token_is_the_studys_70272_on_every_tp_rank(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(KIMI))
    spec = from_hf_config(tmp_path, tp_size=8)  # the directory holding config.json
    assert spec.attention == "mla"
    assert spec.kv_bytes_per_token() == 61 * 576 * 2 == 70_272  # per GPU: the latent is replicated
    assert spec.kv_bytes_per_token_all_ranks() == 8 * 70_272
    assert from_hf_config(KIMI, kv_cache_dtype="fp8_e4m3", tp_size=8).kv_bytes_per_token() == 35_136
    # decompressed, the same model would store K (nope + rope) and V of every head
    assert spec.mha_equivalent_kv_bytes_per_token() == 64 * (128 + 64 + 128) * 61 * 2


def test_mha_and_gqa_kv_bytes_split_kv_heads_over_tp_ranks():
    mha = from_hf_config(LLAMA2_7B)
    assert mha.attention == "mha" and mha.head_dim == 128
    assert mha.kv_bytes_per_token() == 2 * 32 * 128 * 32 * 2  # K and V, 32 heads, 32 layers, fp16
    gqa = from_hf_config(LLAMA3_8B)
    assert gqa.attention == "gqa" and gqa.kv_bytes_per_token() == 2 * 8 * 128 * 32 * 2 == 131_072
    assert from_hf_config(LLAMA3_8B, tp_size=2).kv_bytes_per_token() == 65_536
    assert from_hf_config(LLAMA3_8B, tp_size=16).kv_bytes_per_token() == 2 * 1 * 128 * 32 * 2  # a rank keeps one head
    assert from_hf_config(LLAMA3_8B, kv_cache_dtype="fp8").kv_bytes_per_token() == 65_536


def test_prefill_attention_flops_count_each_causal_pair_once():
    spec = from_hf_config(LLAMA3_8B)
    L = 7
    pairs = int(np.tril(np.ones((L, L))).sum())  # query i sees keys 0..i
    per_pair = 32 * (2 * 128 + 2 * 128) * 32  # QK^T and PV, every head, every layer
    assert spec.prefill_flops_per_pair() == per_pair
    assert spec.prefill_attention_flops(L) == pairs * per_pair == 28 * per_pair
    # MLA prefill in the decompressed form (engines) and in the absorbed one (the reference engine)
    kimi = from_hf_config(KIMI)
    assert kimi.prefill_flops_per_pair() == 64 * 2 * (128 + 64 + 128) * 61
    assert get_adapter("reference").model_spec({"architecture": KIMI}, {}).prefill_flops_per_pair() == kimi.decode_flops_per_kv_token()


def test_decode_flops_are_mlas_absorbed_form_and_split_over_tp_ranks():
    per_rank = from_hf_config(KIMI, tp_size=8)
    whole = 2 * 64 * (512 + 64 + 512) * 61
    assert per_rank.decode_flops_per_kv_token(per_rank=False) == whole
    assert per_rank.decode_flops_per_kv_token() == whole / 8  # 8 heads per rank, against the whole latent
    assert per_rank.decode_attention_flops(185_000, query_tokens=4) == 185_000 * 4 * whole / 8
    assert per_rank.decode_intensity() == pytest.approx(2 * 8 * 1088 / 1152)  # FLOP per KV byte on one GPU


def test_spec_from_config_takes_tp_and_kv_dtype_from_the_engine_flags():
    model = {"architecture": {k: KIMI[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "kv_lora_rank",
                                                     "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "torch_dtype")}}
    spec = get_adapter("sglang").model_spec(model, {"tp-size": 8, "kv-cache-dtype": "fp8_e5m2"})
    assert (spec.tp_size, spec.kv_cache_dtype, spec.kv_bytes_per_token()) == (8, "fp8_e5m2", 35_136)
    assert get_adapter("vllm").model_spec(model, {"tensor-parallel-size": 4}).tp_size == 4
    nested = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": KIMI, "vision_config": {}}
    assert from_hf_config(nested).kv_bytes_per_token() == 70_272
    with pytest.raises(ModelSpecError, match="does not exist"):
        model_spec({"hf_config": "/nonexistent/config.json", "architecture": {}})
    with pytest.raises(ModelSpecError, match="kv-cache-dtype: dtype 'int3'"):
        from_hf_config(KIMI, kv_cache_dtype="int3")


def test_verify_width_per_engine():
    assert get_adapter("reference").verify_width({}) == 1
    assert get_adapter("reference").verify_width({"speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": 4}) == 5
    assert get_adapter("sglang").verify_width({"speculative-algorithm": "EAGLE", "speculative-num-draft-tokens": 4}) == 4
    assert get_adapter("vllm").verify_width({"speculative-config": '{"method": "ngram", "num_speculative_tokens": 3}'}) == 4


def test_hardware_table_has_units_sources_and_dense_rates():
    table = hardware.load_table()
    names = {e["name"] for e in table}
    for required in ("RTX PRO 6000", "RTX 5090", "H100 SXM", "H200", "B200", "L40S", "A100 SXM4 80GB"):
        assert any(required in n for n in names), required
    for e in table:
        assert e["sources"] and all(re.fullmatch(r"https://[\w./:-]+", u) for u in e["sources"]), e["name"]  # \url-safe
        assert 100e9 < e["memory_bandwidth_si"] < 20e12 and e["memory_si"] > 16e9
        if "fp8_dense_si" in e:
            assert e["fp8_dense_si"] == pytest.approx(2 * e["bf16_dense_si"], rel=0.02)  # dense FP8: twice dense BF16
    pro = hardware.match("NVIDIA RTX PRO 6000 Blackwell Workstation Edition")
    assert (pro["memory_si"], pro["memory_bandwidth_si"], pro["bf16_dense_si"], pro["sms"], pro["arch"]) == \
        (96e9, 1792e9, 503.8e12, 188, "sm_120")
    assert hardware.match("nvidia  h200")["name"] == "NVIDIA H200 SXM"  # case and spacing ignored
    assert hardware.match("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition") is None  # other clocks
    assert hardware.match("NVIDIA H200 NVL") is None and hardware.match(None) is None


def test_bad_hardware_entries_are_refused(tmp_path):
    bad = tmp_path / "hw.yaml"
    bad.write_text("gpus:\n  - {name: X, nvml_names: [X], sources: [https://x], memory: {value: 1, unit: GB},\n"
                   "     memory_bandwidth: {value: 1, unit: furlongs}, bf16_dense: {value: 1, unit: TFLOP/s}}\n")
    with pytest.raises(hardware.HardwareTableError, match="unit 'furlongs'"):
        hardware.load_table(bad)
    bad.write_text("gpus:\n  - {name: X, nvml_names: [X], memory: {value: 1, unit: GB}}\n")
    with pytest.raises(hardware.HardwareTableError, match="X has no sources"):
        hardware.load_table(bad)


def test_ceilings_pick_the_device_the_server_computes_on():
    gpu = {"cpu": "Some CPU", "gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"}]}
    cal = {"devices": {"cpu": {"status": "ok", "name": "Some CPU", "copy_Bps": 2e10, "matmul_flops": 1e11},
                       "cuda": {"status": "failed", "reason": "no CUDA"}}}
    c = hardware.ceilings(get_adapter("sglang").compute_device({}), gpu, cal, "bfloat16")
    assert c["device"] == "gpu" and c["datasheet"]["bandwidth_Bps"] == 1792e9 and c["datasheet"]["flops"] == 503.8e12
    assert c["measured"] is None and c["measured_missing"] == "no CUDA"
    c = hardware.ceilings(get_adapter("reference").compute_device({"page-size": 1}), gpu, cal, "float32")  # the reference engine on the CPU
    assert c["device"] == "cpu" and c["datasheet"] is None and c["measured"]["bandwidth_Bps"] == 2e10
    c = hardware.ceilings(get_adapter("vllm").compute_device({}), {"gpus": [{"name": "NVIDIA Made-Up GPU"}]}, None, "bfloat16")
    assert "no datasheet entry for 'NVIDIA Made-Up GPU'" in c["datasheet_missing"]


def test_roofline_points_of_the_studys_decode():
    spec = from_hf_config(KIMI, tp_size=8)
    ceil = {"datasheet": {"flops": 503.8e12, "bandwidth_Bps": 1792e9}}
    assert ridge(503.8e12, 1792e9) == pytest.approx(281.1, rel=1e-3)
    assert attainable(15.1, 503.8e12, 1792e9) == pytest.approx(15.1 * 1792e9)
    assert attainable(1000, 503.8e12, 1792e9) == 503.8e12
    assert bound(spec.decode_intensity(), 503.8e12, 1792e9) == "memory"
    (p,) = decode_points(spec, 1, [(185_000, 1 / 0.7)], ceil)
    assert p["bytes"] == 185_000 * 70_272 and p["achieved_Bps"] == pytest.approx(p["bytes"] * 0.7)
    assert p["intensity"] == pytest.approx(spec.decode_intensity())
    assert p["fraction_of_datasheet"] == pytest.approx(p["achieved_Bps"] / 1792e9)  # memory roof: the bandwidth share
