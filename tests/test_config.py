"""The config schema: defaults, and errors that name the key and the allowed values."""

import subprocess
import sys

import pytest
import yaml

from longctx import config as lcfg

from .conftest import ROOT, snakemake


# the reference engine is built from the architecture the config gives (nothing is filled in)
REF_ARCH = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 2, "kv_lora_rank": 64,
            "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32}


def base():
    return {"lengths": [64], "model": {"architecture": dict(REF_ARCH)},
            "configurations": {"a": {"engine": "reference", "args": {"page-size": 1}}}}


def test_default_config_validates_with_defaults_filled_in():
    c = lcfg.load(ROOT / "config" / "longctx.yaml")
    assert set(c["configurations"]) == {"page1-scattered", "page1-twin", "page64", "page64-ngram"}
    args = {name: conf["args"] for name, conf in c["configurations"].items()}
    assert args["page1-scattered"]["page-size"] == 1 and args["page64"]["page-size"] == 64
    assert {k: v for k, v in args["page64"].items() if k != "page-size"} == {
        k: v for k, v in args["page1-scattered"].items() if k != "page-size"}  # they differ only in layout
    d = lcfg.validate(base())
    assert d["protocol"]["trials"] == 3 and d["server"]["host"] == "127.0.0.1" and d["server"]["allow_remote"] is False
    assert lcfg.validate({**base(), "server": {"host": "::1"}})["server"]["host"] == "::1"
    assert lcfg.validate({**base(), "server": {"host": "0.0.0.0", "allow_remote": True}})["server"]["allow_remote"]
    assert d["model"]["architecture"]["kv_lora_rank"] == 64
    # a real engine's model nobody described gets no architecture (it used to get the reference engine's MLA)
    ext = lcfg.validate({"lengths": [64], "model": {"name": "m"}, "configurations": {"x": {"engine": "external", "url": "http://h:1", "api": "openai"}}})
    assert ext["model"]["architecture"] == {} and ext["model"]["kv_bytes_per_token"] is None


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c.update(protocl={}), "'protocl' is unknown; allowed keys: ab, advise, allow_missing, analysis, calibration, configurations, kernels, lengths, load, metronome, model, prefix, protocol, report, resources, server, slo, telemetry"),
    (lambda c: c.update(protocol={"trails": 2}), "'protocol.trails' is unknown; allowed keys: concurrency, flush_cache, itl_depth, needle, output_tokens,"),
    (lambda c: c["configurations"]["a"].update(engine="sglangx"), "'configurations.a.engine': 'sglangx' is not allowed; allowed values: reference"),
    (lambda c: c["configurations"]["a"]["args"].update({"page-sise": 4}), "'configurations.a.args.page-sise' is not a reference flag; allowed keys: attention-backend,"),
    (lambda c: c["configurations"]["a"]["args"].update({"kv-alloc-order": "x"}), "allowed values: sequential, random"),
    (lambda c: c["configurations"]["a"]["args"].update({"port": 1}), "'configurations.a.args.port' is set by longctx itself"),
    (lambda c: c["configurations"]["a"].update(kernel="nope"), "'configurations.a.kernel': 'nope' is not a key of 'kernels'"),
    (lambda c: c.update(lengths=[128, 64]), "'lengths': must be strictly increasing"),
    (lambda c: c.update(report={"baseline": "b"}), "'report.baseline': 'b' is not a configuration; allowed values: a"),
    (lambda c: c.update(report={"plans": ["notes/x.md"]}), "'report.plans.0': 'notes/x.md' does not match"),
    (lambda c: c.update(protocol={"trials": 0}), "'protocol.trials': 0 is less than the minimum of 1"),
    (lambda c: c["model"].update(architecture={"torch_dtype": "int8"}) if "model" in c else c.update(model={"architecture": {"torch_dtype": "int8"}}),
     "'model.architecture.torch_dtype': 'int8' is not allowed; allowed values: float32, bfloat16, float16"),
    (lambda c: c.update(model={"hf_config": "/models/x/config.json"}), "'model.hf_config': configuration 'a' runs the reference engine"),
    (lambda c: c["model"].pop("architecture"), "'model.architecture': configuration 'a' runs the reference engine, an MLA model built from model.architecture, which must give num_hidden_layers, hidden_size,"),
    (lambda c: c["model"]["architecture"].update(num_key_value_heads=2), "(not num_key_value_heads: the engine does not build them)"),
    (lambda c: c["model"].pop("architecture"), "fields given: none; fields allowed: hidden_size, intermediate_size, kv_lora_rank,"),
    (lambda c: c["model"]["architecture"].update(sliding_windw=2), "'model.architecture.sliding_windw' is unknown"),
    (lambda c: c.update(analysis={"confidence": 1.5}), "'analysis.confidence': 1.5 is greater than or equal to the maximum of 1"),
    (lambda c: c.update(calibration={"dtype": "int8"}), "'calibration.dtype': 'int8' is not allowed; allowed values: None, float32"),
    (lambda c: c.update(server={"host": "0.0.0.0"}), "'server.host': '0.0.0.0' is not a loopback address, so the servers "
     "longctx starts would be reachable from the network; allowed values: 127.0.0.1, ::1, localhost, or set "
     "server.allow_remote: true"),
])
def test_bad_config_names_key_and_allowed_values(mutate, expected):
    c = base()
    mutate(c)
    with pytest.raises(lcfg.ConfigError) as err:
        lcfg.validate(c)
    assert expected in str(err.value)


def test_workflow_stops_on_a_bad_config_with_the_message(tmp_path):
    """Issue 47, item 5: the workflow says a config error in its one line, exit status 1, and no traceback (not
    Snakemake's "ConfigError in file rules/common.smk" with a fragment of one); a line per problem where the
    schema finds several."""
    bad = base()
    bad["protocol"] = {"warmpu": 1}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("longctx: config error: config key 'protocol.warmpu' is unknown; allowed keys: "), out
    assert [ln for ln in out.splitlines() if "warmpu" in ln] == [last], out
    assert "Traceback" not in out and "File " not in out and "common.smk" not in out and "ConfigError" not in out, out
    with pytest.raises(lcfg.ConfigError) as err:
        lcfg.validate({"protocol": {"warmpu": 1}})
    assert lcfg.config_error_lines(err.value).splitlines() == [
        "longctx: config error: config key '(top level)': 'lengths' is a required property",
        "longctx: config error: config key '(top level)': 'configurations' is a required property",
        "longctx: config error: config key 'protocol.warmpu' is unknown; allowed keys: " + ", ".join(
            sorted(yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())["properties"]["protocol"]["properties"]))]


def test_a_native_kernel_needs_the_native_attention_backend():
    raw = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
    raw["configurations"]["page16"]["args"].pop("attention-backend")
    with pytest.raises(lcfg.ConfigError, match=r"'configurations.page16.args.attention-backend': 'torch' does not run "
                                               r"kernel 'paged_mla_decode_twin' of kind 'native'; allowed values: native"):
        lcfg.validate(raw)


def external(**conf) -> dict:
    return {"lengths": [64], "model": {"name": "m"},
            "configurations": {"x": {"engine": "external", "url": "http://127.0.0.1:8080", "api": "openai", **conf}}}


def test_an_external_server_says_where_it_computes():
    with pytest.raises(lcfg.ConfigError, match=r"'configurations.x.device': 'tpu' is not allowed; allowed values: cpu, gpu, remote"):
        lcfg.validate(external(device="tpu"))
    c = base()
    c["configurations"]["a"]["device"] = "cpu"
    with pytest.raises(lcfg.ConfigError, match=r"'configurations.a.device' is for external servers; a reference server's device "
                                               r"comes from its flags"):
        lcfg.validate(c)
    from longctx.engines import get_adapter

    adapter = get_adapter("external")
    for device, expected in ((None, "remote"), ("remote", "remote"), ("cpu", "cpu"), ("gpu", "gpu")):
        conf = {"device": device} if device else {}
        assert adapter.device(lcfg.configuration_spec(lcfg.validate(external(**conf)), "x")) == expected


def test_the_device_key_changes_the_spec_only_of_configurations_that_set_it():
    from longctx.core.hashing import digest
    from longctx.engines import ConfigurationSpec

    plain = lcfg.configuration_spec(lcfg.validate(external()), "x")
    assert "device" not in plain.to_dict() and "device" not in plain.to_json()
    # the keys of every spec before `device` existed: its spec_hash, resume key and bench params are as they were (and
    # `metronome`, which came later with a new file every bench job writes, so that every bench job reruns anyway; the
    # resume key leaves it out: measure.rawfiles.resume_key)
    assert sorted(plain.to_dict()) == sorted(
        ["name", "engine", "lengths", "protocol", "server", "telemetry", "model", "kernel", "kernel_build", "description",
         "args", "extra_args", "env", "python", "command", "url", "api", "startup_timeout_s", "metronome"])
    assert ConfigurationSpec.from_dict(plain.to_dict()) == plain
    cpu = lcfg.configuration_spec(lcfg.validate(external(device="cpu")), "x")
    assert cpu.to_dict()["device"] == "cpu" and ConfigurationSpec.from_json(cpu.to_json()) == cpu
    assert digest(cpu.to_dict()) != digest(plain.to_dict())


def test_a_length_beyond_the_context_length_is_refused_before_any_server_starts():
    """SGLang refuses prompt + max_new_tokens above its context length (tokenizer_manager's total-token
    check) and vLLM above max-model-len: so does the config, naming the key, the limit and the flag."""
    config = lcfg.load(ROOT / "tests" / "configs" / "tiny.yaml")
    config["lengths"] = [64, 2017]  # 2017 + 32 = 2049 > 2048
    config["protocol"]["output_tokens"] = 32
    with pytest.raises(lcfg.ConfigError, match=r"config key 'lengths': 2017 prompt tokens and 32 output tokens do not fit "
                                                r"configuration 'page1''s context length of 2048 \(configurations\.page1\.args\."
                                                r"context-length\); allowed: prompts of at most 2016 tokens"):
        lcfg.validate(config)
    config["lengths"] = [64, 2016]
    lcfg.validate(config)  # exactly full: allowed
    config["protocol"]["itl_depth"] = {"length": 2000, "output_tokens": 60}
    with pytest.raises(lcfg.ConfigError, match=r"'protocol.itl_depth.length': 2000 prompt tokens and 60 output"):
        lcfg.validate(config)
    vllm = {"lengths": [4080], "model": {"path": "/m"},
            "configurations": {"v": {"engine": "vllm", "args": {"max-model-len": 4096}}}}
    with pytest.raises(lcfg.ConfigError, match=r"context length of 4096 \(configurations\.v\.args\.max-model-len\)"):
        lcfg.validate(vllm)


def test_a_yaml_error_names_the_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lengths: [64, 128\nmodel: {name: x}\n")
    with pytest.raises(lcfg.ConfigError, match=rf"config file {bad} is not valid YAML, line 2, column 6: "):
        lcfg.load(bad)
    run = subprocess.run([sys.executable, "-m", "longctx.cli", "check-config", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2 and "line 2, column 6" in run.stderr and "Traceback" not in run.stderr


def test_snakemake_s_own_yaml_error_names_the_file_and_line(tmp_path):
    """The documented command (docs/configuration.md) with a broken --configfile: Snakemake reads that file
    before our Snakefile and, left alone, says only "Config file is not valid JSON or YAML";
    longctx.snakemake_hook (a .pth file that `make setup` installs) makes it name the file, the line and
    the column, as PyYAML marks them."""
    bad = tmp_path / "my.yaml"
    bad.write_text("lengths: [64, 128\nmodel: {name: x}\n")
    out = snakemake(tmp_path, "-n", "-s", str(ROOT / "Snakefile"), "--configfile", str(bad), check=False)
    assert f"config file {bad} is not valid YAML, line 2, column 6: " in out, out
    assert "Traceback" not in out and "snakemake_hook" not in out, out  # the message, not our wrapper's frame
    assert not (tmp_path / ".snakemake").exists()  # refused before anything was written
