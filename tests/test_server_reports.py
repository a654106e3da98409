"""What a server says of itself, read where it says it (issue 31, item 2): an external server's log (config key
server_log) gives its KV pool, its KV cache's dtype and its weights' type, and a quantized model's engine is
held against no FLOP roof. The log lines are llama-cpp-python 0.3.36's own, copied from a run of its server on
SmolLM2-135M-Instruct's Q4_1 GGUF (the figures in them are llama.cpp's, none is longctx's); tests/test_realmodel.py
reads the same lines from a live server's log."""

from __future__ import annotations

import pytest

from longctx.analysis.fits import fit_all
from longctx.analysis.memory import plan_configuration
from longctx.analysis.tables import medians
from longctx.engines import get_adapter
from longctx.report.diagnosis import diagnose
from longctx.specs.model import as_reported

from .test_analysis import KIMI_ARCH, _said, _study

LLAMACPP_LOG = """\
print_info: file format = GGUF V3 (latest)
print_info: file type   = Q4_1
print_info: file size   = 92.10 MiB (5.74 BPW) 
llama_context: n_ctx                 = 8192
llama_kv_cache:        CPU KV buffer size =   180.00 MiB
llama_kv_cache: size =  180.00 MiB (  8192 cells,  30 layers,  1/1 seqs), K (f16):   90.00 MiB, V (f16):   90.00 MiB
"""
# SmolLM2-135M's config: 30 layers, 9 heads, 3 KV heads of 64 (its config.json, as the GGUF's metadata says)
SMOLLM2 = {"architecture": {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
                            "num_key_value_heads": 3, "head_dim": 64, "hidden_size": 576, "torch_dtype": "bfloat16"}}


def test_llamacpps_log_gives_its_pool_its_kv_dtype_and_its_weights_type():
    ext = get_adapter("external")
    pool = ext.kv_pool_from_log(LLAMACPP_LOG)
    assert pool["tokens"] == 8192 and pool["size_gb"] == pytest.approx(180 * 2**20 / 1e9)
    reports = ext.server_reports({}, LLAMACPP_LOG)
    assert reports["kv_cache_dtype"]["value"] == "float16" and "K (f16), V (f16)" in reports["kv_cache_dtype"]["source"]
    assert reports["weight_format"]["value"] == "Q4_1"
    spec = as_reported(ext.model_spec(SMOLLM2, {}), reports)
    # by hand: 2 (K, V) x 3 heads x 64 x 30 layers x 2 bytes (f16) = 23,040 = 180 MiB over 8,192 cells
    assert spec.kv_bytes_per_token() == 2 * 3 * 64 * 30 * 2 == 180 * 2**20 // 8192 == 23_040
    assert spec.kv_cache_dtype == "float16" and spec.field_sources["kv_cache_dtype"].startswith("the server's log")
    assert spec.weight_format == "Q4_1"


def test_a_quantized_kv_cache_is_sized_from_the_servers_own_figure():
    """q8_0 K and V (llama.cpp's --cache-type-k/v q8_0: 34 bytes per 32 values) are no dtype longctx prices: the KV
    bytes per token are the log's size over its cells, 95.62 MiB / 8,192 = 12,240 = 23,040 x 34 / 64."""
    log = LLAMACPP_LOG.replace("180.00 MiB (", "95.62 MiB (").replace("K (f16):   90.00", "K (q8_0):   47.81") \
        .replace("V (f16):   90.00", "V (q8_0):   47.81")
    reports = get_adapter("external").server_reports({}, log)
    assert "kv_cache_dtype" not in reports
    spec = as_reported(get_adapter("external").model_spec(SMOLLM2, {}), reports)
    assert spec.kv_bytes_per_token() == round(95.62 * 2**20 / 8192) == pytest.approx(23_040 * 34 / 64, rel=1e-3)
    assert "K (q8_0), V (q8_0)" in spec.field_sources["kv_bytes_per_token"]
    # a figure the config gives still wins over the server's
    given = as_reported(get_adapter("external").model_spec({**SMOLLM2, "kv_bytes_per_token": 11_111}, {}), reports)
    assert given.kv_bytes_per_token() == 11_111


def test_sglangs_pool_line_and_info_give_its_kv_dtype():
    ext = get_adapter("external")
    line = "KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 240000, K size: 4.10 GB, V size: 4.10 GB"
    assert ext.server_reports({}, line)["kv_cache_dtype"]["value"] == "float8_e4m3fn"
    assert ext.kv_pool_from_log(line)["tokens"] == 240_000
    assert as_reported(ext.model_spec(SMOLLM2, {}), ext.server_reports({}, line)).kv_cache_dtype == "fp8_e4m3"
    assert ext.server_reports({"kv_cache_dtype": "fp8_e5m2"}, "")["kv_cache_dtype"]["source"] == "the server's info (kv_cache_dtype)"
    assert ext.server_reports({"kv_cache_dtype": "auto"}, "") == {}


def test_without_its_log_an_external_servers_kv_dtype_and_pool_are_said_to_be_not_reported():
    ext = get_adapter("external")
    spec = ext.model_spec(SMOLLM2, {})
    assert spec.field_sources["kv_cache_dtype"].startswith("not reported by the server")
    entry = {"engine": "external", "args": {}, "model": SMOLLM2, "model_spec": spec.to_dict(), "server_info": {},
             "kv_pool": {"tokens": None, "log": None}, "hardware": {}}
    assert "did not report its pool" in plan_configuration(entry, [0.8], 1024)["reason"]
    entry["kv_pool"]["log"] = ext.kv_pool_from_log(LLAMACPP_LOG)
    out = plan_configuration(entry, [0.8], 1024)
    assert "did not report" not in out["reason"] and out["allocated"]


def test_no_bound_is_claimed_against_a_roof_quantized_weights_are_not_computed_in(tmp_path):
    """The study's decode (0.55% of the datasheet's bandwidth, latency-bound against a bf16 FLOP roof), with its
    weights FP8-quantized (a quantization_config in its config): no FLOP roof is compared and no class that needs
    one is claimed; the bandwidth share stays."""
    df, prov = _study(tmp_path)
    entry = prov["configurations"]["triton-page1"]
    plain = fit_all(df, prov, None, {"bootstrap": 100})["configurations"]["triton-page1"]
    assert plain["bounds"]["decode"]["class"] == "latency" and plain["ceilings"]["datasheet"]["flops"]
    entry["model"] = {**entry["model"], "architecture": {**KIMI_ARCH, "quantization_config": {"quant_method": "fp8"}}}
    fit = fit_all(df, prov, None, {"bootstrap": 100})["configurations"]["triton-page1"]
    assert fit["model_spec"]["weight_format"] == "fp8"
    assert not fit["ceilings"]["datasheet"].get("flops") and "the weights are fp8" in fit["ceilings"]["flops_withheld"]
    b = fit["bounds"]["decode"]
    assert b["class"] == "unknown" and "fp8" in b["why"]
    assert fit["decode"]["bw_pct_datasheet"] == pytest.approx(plain["decode"]["bw_pct_datasheet"])
    said = " ".join(_said(diagnose(medians(df), {"triton-page1": fit})))
    assert "latency-bound" not in said and "no FLOP roof is compared (the weights are fp8" in said
