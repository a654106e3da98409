"""vLLM, a server nobody here wrote: its own parser checks our command lines, and the whole
workflow (every stage, real Snakemake, real TeX) measures it on the CPU with a tiny random Llama
made here (nothing is downloaded). Needs vLLM's CPU build: `make test` puts it in .venv-vllm and
points LONGCTX_VLLM_PYTHON at it."""

import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from longctx import config as lcfg
from longctx.engines import get_adapter

from .conftest import ROOT, copy_workflow
from .test_workflow import snakemake

VLLM_PYTHON = os.environ.get("LONGCTX_VLLM_PYTHON")
if not (VLLM_PYTHON and Path(VLLM_PYTHON).exists()):
    if os.environ.get("LONGCTX_REQUIRE_ENGINE_PARSERS"):
        raise RuntimeError(f"LONGCTX_VLLM_PYTHON={VLLM_PYTHON!r} is not a Python with vLLM: run `make vllm`")
    pytest.skip("vLLM's CPU build is not installed here (make test installs it)", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.thirdparty]


def vllm_config(model_dir: str, **args) -> dict:
    return lcfg.validate({
        "lengths": [64, 256, 512],
        "protocol": {"warmup": 1, "trials": 2, "output_tokens": 8, "request_timeout_s": 120, "token_id_range": [3, 1024]},
        "server": {"startup_timeout_s": 300},
        "model": {"name": "tiny-llama", "path": model_dir, "kv_bytes_per_token": 2 * 2 * 64 * 2 * 2, "random_weights": True},
        "configurations": {"vllm-cpu": {
            "engine": "vllm", "python": VLLM_PYTHON,
            "args": {"max-model-len": 2048, "dtype": "bfloat16", **args},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
        }},
    })


def test_vllm_own_parser_checks_our_command_lines():
    adapter = get_adapter("vllm")
    config = vllm_config("/models/m", **{"gpu-memory-utilization": 0.9, "max-num-seqs": 8, "block-size": 16,
                                         "tensor-parallel-size": 8, "speculative-config": {"method": "ngram", "num_speculative_tokens": 4}})
    config["configurations"]["vllm-cpu"]["args"]["max-model-len"] = "200k"
    spec = lcfg.configuration_spec(config, "vllm-cpu")
    assert adapter.installed_version(spec) == "0.32.0"
    assert adapter.preflight(spec, adapter.launch_command(spec, "127.0.0.1", 8000, None)) is None
    spec.args["block-size"] = "sixteen"
    problem = adapter.preflight(spec, adapter.launch_command(spec, "127.0.0.1", 8000, None))
    assert problem and "argument --block-size: invalid int value: 'sixteen'" in problem


@pytest.fixture(scope="module")
def vllm_workflow(tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-wf")
    subprocess.run([VLLM_PYTHON, str(ROOT / "tests" / "thirdparty" / "make_tiny_llama.py"), str(work / "model")],
                   check=True, capture_output=True, timeout=300)
    copy_workflow(work)
    config = vllm_config(str(work / "model"))
    (work / "vllm.yaml").write_text(yaml.safe_dump(config))
    snakemake(work, "--cores", "1", "report/longctx.pdf", "--configfile", "vllm.yaml")
    return work


def test_every_stage_runs_against_vllm(vllm_workflow):
    df = pd.read_csv(vllm_workflow / "data" / "results.csv")
    assert len(df) == 3 * 2 and (df["status"] == "ok").all(), df[["length", "status", "reason"]]
    assert (df["prompt_tokens"] == df["length"]).all() and (df["completion_tokens"] == 8).all()
    raw = json.loads((vllm_workflow / "data" / "raw" / "vllm-cpu" / "512.json").read_text())
    prov = raw["provenance"]
    assert prov["api"] == "openai" and prov["engine_version"] == "0.32.0"
    assert prov["kv_pool"]["log"]["tokens"] > 0  # vLLM's "CPU KV cache size: N tokens"
    assert prov["server_info"]["data"][0]["max_model_len"] == 2048
    text = subprocess.run(["pdftotext", "-layout", str(vllm_workflow / "report" / "longctx.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"vllm-cpu\s+512\s", text)
    # the server and its engine-core processes are gone
    pid = prov["server_pid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_vllms_benchmark_client_runs_beside_ours_against_the_reference_engine(tmp_path):
    """bench/client_overhead.py with vLLM's own benchmark client: its prompts (text, made with our
    one-character tokenizer) are exactly the length asked for, and each of its requests is matched
    with the engine's record of it."""
    from .test_clientcheck import run_bench

    stdout, rows = run_bench(tmp_path, "--vllm-python", VLLM_PYTHON, "--guidellm", "")
    theirs = rows[("vllm bench serve", 300)]
    assert theirs["requests"] == 2 and theirs["prompt_tokens"] == [300]
    assert theirs["ttft_error_s_median"] > 0 and theirs["lag_s_median"] > 0
    assert "skipped vllm" not in stdout
