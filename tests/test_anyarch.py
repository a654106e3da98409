"""Any architecture (issue 15, item 1): the model spec reads MHA, GQA and MLA from the field names of
the common families, fills in nothing for a model nobody described, says when it cannot describe a
model exactly, and model.kv_bytes_per_token overrides its KV figure in the fits and the planner.

Every expected figure is worked out here by hand from the published config.json, not by the code."""

import json

import numpy as np
import pandas as pd
import pytest

from longctx.analysis.fits import fit_file
from longctx.analysis.memory import plan_file, spec_of
from longctx.engines import get_adapter
from longctx.specs.model import ModelNotDescribed, ModelSpecError, from_hf_config, model_spec

# The fields of the published config.json files (huggingface.co/<repo>/blob/main/config.json)
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16", "rope_theta": 500000.0}
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "sliding_window": 131072, "use_sliding_window": False,
             "max_window_layers": 28, "torch_dtype": "bfloat16"}
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "sliding_window": None,
            "use_sliding_window": False, "torch_dtype": "bfloat16"}
MISTRAL_7B_V03 = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": None, "torch_dtype": "bfloat16"}
MISTRAL_7B_V01 = {**MISTRAL_7B_V03, "sliding_window": 4096}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
               "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"] * 12, "torch_dtype": "bfloat16"}


def test_gqa_families_give_their_published_kv_bytes_per_token():
    # K and V: 2 x kv_heads x head_dim values per layer, 2 bytes each in bf16
    assert from_hf_config(LLAMA3_8B).kv_bytes_per_token() == 2 * 8 * (4096 // 32) * 32 * 2 == 131_072
    qwen = from_hf_config(QWEN25_7B)  # use_sliding_window false: full attention on every layer
    assert (qwen.attention, qwen.head_dim, qwen.exact) == ("gqa", 128, True)
    assert qwen.kv_bytes_per_token() == 2 * 4 * 128 * 28 * 2 == 57_344
    assert from_hf_config(QWEN3_8B).kv_bytes_per_token() == 2 * 8 * 128 * 36 * 2 == 147_456
    mistral = from_hf_config(MISTRAL_7B_V03)
    assert mistral.exact and mistral.kv_bytes_per_token() == 131_072
    ds = from_hf_config(DEEPSEEK_V3)
    assert (ds.attention, ds.exact) == ("mla", True) and ds.kv_bytes_per_token() == (512 + 64) * 61 * 2 == 70_272
    # GPT-OSS's head_dim (64) is not hidden_size / heads (45): the config's own field is taken
    style = from_hf_config({**GPT_OSS_20B, "layer_types": ["full_attention"] * 24})
    assert style.exact and style.head_dim == 64 and style.kv_bytes_per_token() == 2 * 8 * 64 * 24 * 2 == 49_152
    assert style.decode_flops_per_kv_token() == 64 * 2 * (64 + 64) * 24


def test_a_missing_kv_head_count_takes_the_familys_own_default_only():
    no_kv = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"}
    llama = from_hf_config(no_kv)  # LlamaConfig: num_key_value_heads None -> num_attention_heads
    assert (llama.attention, llama.num_key_value_heads) == ("mha", 32)
    assert "num_attention_heads" in llama.field_sources["num_key_value_heads"]
    qwen = from_hf_config({k: v for k, v in QWEN25_7B.items() if k != "num_key_value_heads"})
    assert qwen.num_key_value_heads == 32  # Qwen2Config's default, not the 28 heads
    assert from_hf_config({**no_kv, "model_type": "mistral"}).num_key_value_heads == 8  # MistralConfig's
    with pytest.raises(ModelNotDescribed, match="model_type 'falcon_x' is not a family the spec knows"):
        from_hf_config({**no_kv, "model_type": "falcon_x"})
    with pytest.raises(ModelSpecError, match="num_key_value_heads not given and no model_type"):
        model_spec({"architecture": {k: v for k, v in no_kv.items() if k != "model_type"}})


def test_nothing_is_filled_in_for_a_model_nobody_described():
    for model in ({"name": "m"}, {"name": "m", "architecture": {}}, {"name": "m", "kv_bytes_per_token": 4096}):
        with pytest.raises(ModelNotDescribed, match="describes no model"):
            get_adapter("vllm").model_spec(model, {})


def test_models_the_spec_cannot_describe_exactly_say_why():
    gpt = from_hf_config(GPT_OSS_20B)
    assert not gpt.exact and "12 of 24 are sliding_attention (window 128 tokens)" in gpt.inexact_reason
    sliding = from_hf_config(MISTRAL_7B_V01)
    assert not sliding.exact and "sliding window of 4096 tokens" in sliding.inexact_reason
    unknown = from_hf_config({**LLAMA3_8B, "model_type": "phi3"})
    assert not unknown.exact and "model_type 'phi3' is not a family the spec knows" in unknown.inexact_reason


def test_the_issues_small_llama_is_gqa_from_model_architecture():
    arch = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "torch_dtype": "float32"}
    spec = get_adapter("external").model_spec({"architecture": arch}, {})
    assert (spec.attention, spec.head_dim) == ("gqa", 16)
    assert spec.kv_bytes_per_token() == 2 * 2 * 16 * 2 * 4 == 512
    over = get_adapter("external").model_spec({"architecture": arch, "kv_bytes_per_token": 4096}, {})
    assert over.kv_bytes_per_token() == 4096 and over.field_sources["kv_bytes_per_token"] == "model.kv_bytes_per_token"
    assert over.decode_intensity() == pytest.approx(4 * 2 * (16 + 16) * 2 / 4096)  # FLOPs per KV token / 4096 B


# --- model.kv_bytes_per_token wins in fits.json and planner.json ------------------------------------
BW = 7.96e9  # bytes/s: the issue's CPU server read its KV cache at 7.96 GB/s with 4096 B per token
LENGTHS = [256, 512, 1024, 2048, 4096]


def _write(tmp_path, entry, csv_kv=4096):
    rows = [{"configuration": "c", "length": L, "trial": t, "status": "ok", "reason": None, "concurrency": 1,
             "ttft_s": 0.01 + 1e-5 * L + 1e-9 * L**2, "tpot_s": 1e-3 + L * 4096 / BW, "kv_bytes_per_token": csv_kv}
            for L in LENGTHS for t in range(3)]
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    base = {"engine": "external", "args": {}, "hardware": {}, "server_info": {}, "kv_pool": {"tokens": None}}
    (tmp_path / "provenance.json").write_text(json.dumps({"configurations": {"c": {**base, **entry}}}))
    fits = fit_file(tmp_path / "results.csv", tmp_path / "fits.json", tmp_path / "provenance.json", settings={"bootstrap": 50})
    plan = plan_file(tmp_path / "provenance.json", tmp_path / "results.csv", tmp_path / "planner.json", [0.5])
    assert json.loads((tmp_path / "fits.json").read_text())["configurations"]["c"]["decode"]["kv_bytes_per_token"] == (
        4096 if csv_kv else None)
    return fits["configurations"]["c"], plan["configurations"]["c"]


def test_kv_bytes_per_token_overrides_the_spec_in_fits_and_planner(tmp_path):
    arch = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "torch_dtype": "float32"}  # 512 B per token by the architecture
    model = {"name": "tiny", "architecture": arch, "kv_bytes_per_token": 4096}
    spec = get_adapter("external").model_spec(model, {})
    fit, plan = _write(tmp_path, {"model": model, "model_spec": spec.to_dict()})
    assert fit["decode"]["bw_eff_GBps"] == pytest.approx(7.96, rel=1e-3)
    assert fit["kv_bytes_source"] == "model.kv_bytes_per_token"
    assert fit["roofline"]["intensity"] == pytest.approx(512 / 4096)  # 4 heads x 2 x 32 x 2 layers FLOPs / 4096 B
    assert plan["memory"]["cell_bytes"] == 4096 and plan["kv_bytes_per_token"]["served"] == 4096
    assert plan["kv_bytes_per_token"]["fp8"] is None  # not derivable from an override


def test_a_record_of_the_old_mla_default_yields_to_the_given_figure(tmp_path):
    # the issue's provenance: the reference engine's MLA default (640 B) recorded, 4096 given
    mla = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
           "qk_nope_head_dim": 32, "v_head_dim": 32, "torch_dtype": "float32"}
    stored = {k: v for k, v in model_spec({"architecture": mla}).to_dict().items()
              if k not in ("kv_bytes_override", "exact", "inexact_reason", "field_sources", "model_type")}
    assert stored["kv_bytes_per_token"] == (64 + 16) * 2 * 4 == 640
    entry = {"engine": "external", "model": {"name": "m", "kv_bytes_per_token": 4096}, "model_spec": stored}
    assert spec_of(entry).kv_bytes_per_token() == 4096
    fit, plan = _write(tmp_path, entry)
    assert fit["decode"]["bw_eff_GBps"] == pytest.approx(7.96, rel=1e-3) and plan["memory"]["cell_bytes"] == 4096


def test_an_undescribed_or_inexact_model_leaves_out_what_needs_the_architecture(tmp_path):
    fit, plan = _write(tmp_path, {"model": {"name": "m", "kv_bytes_per_token": 4096}, "model_spec": None,
                                  "model_spec_absent": "the config describes no model"})
    assert fit["decode"]["bw_eff_GBps"] == pytest.approx(7.96, rel=1e-3)  # the given figure alone
    assert "roofline" not in fit and fit["prefill"]["attention_flops"] is None
    assert fit["model_spec_absent"] == "the config describes no model" and plan["memory"]["cell_bytes"] == 4096
    inexact = from_hf_config(MISTRAL_7B_V01)
    fit, plan = _write(tmp_path, {"model": {"name": "m"}, "model_spec": inexact.to_dict()}, csv_kv=None)
    assert "sliding window of 4096 tokens" in fit["model_spec_absent"] and "roofline" not in fit
    assert fit["decode"]["bw_eff_GBps"] is None and "sliding window" in fit["kv_bytes_source"]
    assert plan["memory"]["cell_bytes"] is None and "sliding window" in plan["reason"]
    assert np.isfinite(fit["decode"]["beta_s_per_token"])


# --- the report names what the spec cannot describe (issue 15, items 1 and 4) -----------------------
def test_the_report_names_a_model_the_spec_cannot_describe_and_one_nobody_described(tmp_path):
    """Two stock OpenAI servers on the CPU: Mistral 7B v0.1 (a sliding window the spec does not model,
    no KV figure given) and a model described only by model.kv_bytes_per_token. The PDF names each as
    what it is, with the reason, and prints no architecture's figures as exact."""
    import re
    import subprocess

    from .report_data import external_server, run_report_chain

    data = tmp_path / "data"
    sliding = external_server(data, "mistral", {"name": "mistral-7b-v0.1", "architecture": MISTRAL_7B_V01}, 131_072)
    bare = external_server(data, "bare", {"name": "bare", "kv_bytes_per_token": 4096}, 4096)
    config = {**sliding, "configurations": {**sliding["configurations"], **bare["configurations"]}}
    paths = run_report_chain(data, tmp_path / "report", config)
    pdf = " ".join(subprocess.run(["pdftotext", "-layout", str(paths["pdf"]), "-"], capture_output=True, text=True,
                                  check=True).stdout.replace("\u2019", "'").split())
    model = pdf[re.search(r"[A-Z] Model as served ", pdf).start():re.search(r"[A-Z] Hardware and software ", pdf).start()]
    bare_part, sliding_part = model[model.index(" bare bare: "):model.index(" mistral mistral-7b-v0.1: ")], model[model.index(" mistral mistral-7b-v0.1: "):]
    assert ("mistral-7b-v0.1: GQA (grouped-query attention), not described exactly: a sliding window of 4096 tokens; the "
            "spec models full attention over the whole context; the figures that need the architecture (attention FLOPs, "
            "intensity, roofline) are left out") in sliding_part
    assert "KV bytes per token (the analysis) unknown a sliding window of 4096 tokens" in sliding_part  # never guessed
    assert "KV heads (num_key_value_heads) 8 model.architecture" in sliding_part  # the fields as read, with their sources
    assert "bare: no architecture: the config describes no model" in bare_part
    assert "KV bytes per token (the analysis) 4,096 model.kv_bytes_per_token" in bare_part
    for part in (bare_part, sliding_part):
        assert "decode attention FLOPs per KV token" not in part  # needs an exact architecture
    assert ("model bare: bare, no architecture, 4,096 KV bytes per token; mistral: mistral-7b-v0.1, GQA not described "
            "exactly, KV bytes per token unknown") in pdf
    assert "MLA" not in pdf and "SGLang's sizing rule" not in pdf
