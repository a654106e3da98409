"""What a bench job asks of its machine (GPUs, memory, wall time), and how the workflow passes it on."""

import copy
import re

import pytest

from longctx import config as lcfg
from longctx.measure.resources import bench_resources, request_tokens

from .conftest import ROOT, TINY
from .conftest import snakemake

KIMI = ROOT / "config" / "examples" / "kimi-k2.6-rtx-pro-6000.yaml"


def sglang(**args) -> dict:
    return lcfg.validate({"lengths": [1000], "model": {"path": "/models/x"},
                          "configurations": {"c": {"engine": "sglang", "args": args}}})


@pytest.mark.parametrize("args, gpus", [
    ({}, 1),
    ({"tp-size": 8}, 8),
    ({"tp_size": 4, "pp-size": 2}, 8),  # underscores as dashes
    ({"tensor-parallel-size": 4, "dp-size": 2}, 8),  # aliases; data parallel replicas each take tp GPUs
    ({"tp-size": 8, "dp-size": 8, "enable-dp-attention": True}, 8),  # DP attention shares the TP ranks
    ({"tp-size": 16, "nnodes": 2}, 8),  # per node
])
def test_sglang_gpus_come_from_its_parallelism_flags(args, gpus):
    assert bench_resources(sglang(**args), "c")["gpu"] == gpus


def test_other_engines_gpus_and_the_per_configuration_override():
    arch = lcfg.load(TINY)["model"]["architecture"]  # the reference engine's model is described in full
    c = lcfg.validate({"lengths": [1000], "model": {"path": "/m", "architecture": arch}, "configurations": {
        "vllm": {"engine": "vllm", "args": {"tensor-parallel-size": 4, "pipeline-parallel-size": 2}},
        "vllm-cpu": {"engine": "vllm", "resources": {"gpus": 0}},
        "ref": {"engine": "reference"},
        "ref-cuda": {"engine": "reference", "args": {"device": "cuda:0"}},
        "ext": {"engine": "external", "url": "http://h:1", "api": "sglang"},
    }})
    assert {name: bench_resources(c, name)["gpu"] for name in c["configurations"]} == {
        "vllm": 8, "vllm-cpu": 0, "ref": 0, "ref-cuda": 1, "ext": 0}


def test_memory_and_time_scale_with_the_lengths():
    c = lcfg.load(TINY)
    # per length: 1 warm-up + 2 trials + 2 batches of 2 + the needle; then the ITL-against-depth request
    assert request_tokens(c) == ((64 + 128 + 256 + 512) * 8 + 300, 4 * (7 * 8 + 16) + 60)
    c["resources"] = {"mem_mb": {"base": 1000, "per_1k_tokens": 100},
                      "runtime_min": {"base": 10, "per_1m_prompt_tokens": 1000, "per_1k_output_tokens": 10}}
    small = bench_resources(c, "page1")
    assert small == {"gpu": 0, "mem_mb": 1000 + 52, "runtime": 10 + 8 + 4}  # ceil of 1051.2, 7.98, 3.48
    longer = copy.deepcopy(c)
    longer["lengths"] = [64, 128, 256, 512, 1024]
    big = bench_resources(longer, "page1")
    assert big["mem_mb"] == 1000 + 103 and big["runtime"] > small["runtime"]
    c["configurations"]["page1"]["resources"] = {"gpus": 2, "mem_mb": 500, "runtime_min": 7}
    assert bench_resources(c, "page1") == {"gpu": 2, "mem_mb": 500, "runtime": 7}


def test_what_a_job_asks_for_is_no_part_of_what_it_measures():
    c = lcfg.load(TINY)
    before = lcfg.configuration_spec(c, "page1")
    c["configurations"]["page1"]["resources"]["gpus"] = 4
    assert lcfg.configuration_spec(c, "page1") == before  # so changing it reruns nothing


def test_bad_resources_name_the_key():
    c = {"lengths": [64], "configurations": {"a": {"engine": "reference", "resources": {"gpu": 1}}}}
    with pytest.raises(lcfg.ConfigError, match=r"'configurations.a.resources.gpu' is unknown; allowed keys: gpus, mem_mb, runtime_min"):
        lcfg.validate(c)


def test_the_slurm_profile_gives_bench_jobs_their_resources_and_cpus():
    """A dry run through profiles/slurm (no cluster needed): the study's deployment asks for the 8
    GPUs of its tp-size, the memory and time of its config, and the profile's cores."""
    out = snakemake(ROOT, "-n", "--profile", "profiles/slurm", "report/longctx.pdf", "--configfile", str(KIMI))
    job = out.split("rule bench_configuration:")[1].split("\n[")[0]
    c = lcfg.load(KIMI)
    expected = bench_resources(c, "triton-page1")
    assert re.search(r"threads: 8\b", job)
    for key in ("gpu", "mem_mb", "runtime"):
        assert re.search(rf"\b{key}={expected[key]}\b", job), (key, job)
    assert expected == {"gpu": 8, "mem_mb": 256000, "runtime": expected["runtime"]} and expected["runtime"] > 60


def test_calibration_covers_every_device_of_this_machine_external_servers_included(tmp_path):
    import sys

    from longctx.engines import get_adapter
    from longctx.measure.calibration import calibrate, plan as calibration_plan

    arch = lcfg.load(TINY)["model"]["architecture"]
    ext = {"engine": "external", "url": "http://127.0.0.1:30000", "api": "openai"}
    c = lcfg.validate({"lengths": [1000], "model": {"path": "/m", "architecture": arch}, "configurations": {
        "ref": {"engine": "reference"},
        "ext-cpu": {**ext, "device": "cpu"},
        "ext-gpu": {**ext, "device": "gpu", "python": "/opt/torch-cuda/bin/python"},
        "ext-remote": ext,
        "ext-said-remote": {**ext, "device": "remote"},
        "sg": {"engine": "sglang"},
    }})
    p = calibration_plan(c)
    assert p["devices"]["cpu"]["configurations"] == ["ext-cpu", "ref"]
    assert p["devices"]["cpu"]["python"] == sys.executable  # an external server's: longctx's own, unless configured
    assert p["devices"]["cuda"]["configurations"] == ["ext-gpu", "sg"]
    assert p["devices"]["cuda"]["python"] == "/opt/torch-cuda/bin/python"
    assert set(p["remote"]) == {"ext-remote", "ext-said-remote"}
    assert p["remote"]["ext-remote"].startswith("configurations.ext-remote.device: remote (the default): its server computes on another machine")
    assert "(the default)" not in p["remote"]["ext-said-remote"]
    # a managed engine is calibrated with the Python that runs its server (SGLang: python3 unless configured)
    sg = lcfg.validate({**c, "configurations": {"sg": {"engine": "sglang"}}})
    spec = lcfg.configuration_spec(sg, "sg")
    assert calibration_plan(sg)["devices"]["cuda"]["python"] == get_adapter("sglang").launch_command(spec, "h", 1, None)[0]
    assert "remote" not in calibration_plan(sg)  # the plan (the rule's params) of a config without one is as it was
    # external servers hold their own GPUs: their bench jobs ask for none, whatever their device
    assert {name: bench_resources(c, name)["gpu"] for name in ("ext-cpu", "ext-gpu", "ext-remote", "sg")} == {
        "ext-cpu": 0, "ext-gpu": 0, "ext-remote": 0, "sg": 1}
    doc = calibrate({"enabled": True, "devices": {}, "remote": p["remote"]}, tmp_path / "calibration.json")
    assert doc["devices"] == {} and doc["remote"] == p["remote"]
