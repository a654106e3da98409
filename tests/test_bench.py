"""The bench stage against a real reference engine: files, provenance, failures, no orphans."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from longctx.measure.sweep import run_configuration

from .conftest import tiny_spec

# alone under -n (tests/conftest.py): its batches must overlap and its timeouts must not fire
pytestmark = pytest.mark.alone


def _group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_bench_measures_every_length_and_records_provenance(tmp_path):
    spec = tiny_spec("page1", lengths=[32, 100])
    spec.protocol.update(warmup=1, trials=2, output_tokens=5)
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    for length in (32, 100):
        raw = json.loads((tmp_path / "raw" / f"{length}.json").read_text())
        assert raw["status"] == "ok" and raw["length"] == length
        assert len(raw["trials"]) == 2 and len(raw["warmup"]) == 1
        for t in raw["trials"]:
            assert t["prompt_tokens"] == length and t["completion_tokens"] == 5
            assert t["ttft_s"] > 0 and len(t["itl_s"]) == 4
        prov = raw["provenance"]
        assert prov["server_info"]["max_total_num_tokens"] == prov["kv_pool"]["tokens"] == 4096
        assert prov["kv_pool"]["log"]["tokens"] == 4096
        assert prov["server_info"]["page_size"] == 1 and prov["engine_version"]
        assert prov["model"]["kv_bytes_per_token"] == (32 + 16) * 1 * 4  # tiny.yaml: (kv_lora_rank + rope) x layers x fp32
        assert prov["packages"]["torch"] and prov["hardware"]["logical_cpus"] >= 1
        assert prov["protocol"]["trials"] == 2 and raw["started_at"] <= raw["finished_at"]
    assert _group_gone(prov["server_pid"])


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_a_server_that_cannot_start_gives_failed_rows_naming_its_log(tmp_path):
    spec = tiny_spec("page1", lengths=[32, 64])
    spec.args["mem-fraction-static"] = 1e-9  # no room for the weights: the engine exits
    spec.server["max_restarts"] = 0  # one start (tests/test_faults.py tries the restarts)
    log = tmp_path / "server.log"
    assert run_configuration(spec, tmp_path / "raw", log) == 2
    for length in (32, 64):
        raw = json.loads((tmp_path / "raw" / f"{length}.json").read_text())
        assert raw["status"] == "failed"
        assert "exited during start-up" in raw["reason"] and str(log) in raw["reason"]
        assert "Please try to increase --mem-fraction-static" in raw["reason"]  # the log's tail travels with it


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_a_wrong_prompt_length_is_a_failed_trial(tmp_path, monkeypatch):
    from longctx.measure.prompts import Prompter

    real = Prompter.prompt  # the sweep's prompts one token longer than asked; the probe's as they are
    monkeypatch.setattr(Prompter, "prompt", lambda self, length, key: real(self, length + 1, key))
    spec = tiny_spec("page1", lengths=[40])
    spec.protocol.update(warmup=0, trials=1, output_tokens=3)
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 1
    raw = json.loads((tmp_path / "raw" / "40.json").read_text())
    assert raw["status"] == "failed"
    assert "counted 41 prompt tokens, expected 40" in raw["trials"][0]["reason"]


def test_spec_of_a_configuration_is_self_contained():
    spec = tiny_spec("page16")
    assert spec.name == "page16" and spec.args["page-size"] == 16
    assert spec.lengths == [64, 128, 256, 512] and spec.protocol["trials"] == 2
    assert "configurations" not in spec.to_dict()  # nothing of the other configurations


@pytest.mark.alone(False)  # nothing timed: it shares the machine
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_sweep_leaves_no_server_behind(tmp_path, sig):
    """Ctrl-C (SIGINT) or Snakemake's cancel (SIGTERM) mid-sweep: the server's process group goes too."""
    spec = tiny_spec("page1", lengths=[1000, 2000])
    spec.protocol.update(warmup=0, trials=100, output_tokens=500)
    err = tmp_path / "bench.err"
    with open(err, "w") as stderr:
        # SIGINT as at a terminal even where this runs with it ignored (a shell's background job)
        bench = subprocess.Popen([sys.executable, "-m", "longctx", "bench", "--spec", spec.to_json(),
                                  "--outdir", str(tmp_path / "raw"), "--server-log", str(tmp_path / "server.log")],
                                 stderr=stderr, start_new_session=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"server up in .* \(pid (\d+),", err.read_text())):
            assert bench.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        server_pid = int(m[1])
        time.sleep(1.0)  # mid-request
        bench.send_signal(sig)
        assert bench.wait(30) != 0
        assert _group_gone(server_pid), f"server group {server_pid} survived {sig!r}"
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_an_unexpected_error_at_one_length_keeps_the_others(tmp_path, monkeypatch):
    import longctx.measure.protocol as bench

    real = bench.measure_length

    def flaky(session, spec, length, *rest):
        if length == 48:
            raise RuntimeError("surprise")
        return real(session, spec, length, *rest)

    monkeypatch.setattr(bench, "measure_length", flaky)
    spec = tiny_spec("page1", lengths=[32, 48, 64])
    spec.protocol.update(warmup=0, trials=1, output_tokens=3)
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 1
    statuses = {n: json.loads((tmp_path / "raw" / f"{n}.json").read_text())["status"] for n in (32, 48, 64)}
    assert statuses == {32: "ok", 48: "failed", 64: "ok"}
    assert "RuntimeError: surprise" in json.loads((tmp_path / "raw" / "48.json").read_text())["reason"]


def test_request_timeouts_follow_the_expected_duration():
    from longctx.measure.protocol import request_timeout

    proto = {"request_timeout_s": 10.0, "timeout_factor": 4, "output_tokens": 100}
    assert request_timeout(proto, [], 200_000) == 10.0
    # one length measured: TTFT scaled quadratically, decode linearly
    one = [(10_000, 2.0, 0.01)]
    assert request_timeout(proto, one, 20_000) == pytest.approx(4 * (2.0 * 4 + 100 * 0.01 * 2))
    # three lengths on known curves: the fits (TTFT a + bL + cL^2, decode step t0 + beta L) predict the next one
    a, b, c, t0, beta = 0.5, 1e-4, 1e-9, 0.01, 1e-7
    hist = [(L, a + b * L + c * L * L, t0 + beta * L) for L in (10_000, 20_000, 40_000) for _ in range(2)]
    expected = a + b * 200_000 + c * 200_000**2 + 100 * (t0 + beta * 200_000)
    assert request_timeout(proto, hist, 200_000) == pytest.approx(4 * expected, rel=0.01)
    assert request_timeout({**proto, "request_timeout_s": 1e6}, hist, 200_000) == 1e6  # never below the floor


def test_a_sweep_records_the_timeout_it_used(tmp_path):
    spec = tiny_spec("page1", lengths=[32, 64, 128, 256])
    spec.protocol.update(warmup=0, trials=1, output_tokens=3, request_timeout_s=0.5, timeout_factor=1000)
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    timeouts = [json.loads((tmp_path / "raw" / f"{n}.json").read_text())["trials"][0]["timeout_s"] for n in (32, 64, 128, 256)]
    assert timeouts[0] == 0.5  # nothing measured yet: the configured timeout
    assert all(t > 0.5 for t in timeouts[1:])  # then 1000 x the duration predicted from the shorter lengths


def test_concurrent_batches_overlap_on_the_reference_engine(tmp_path):
    spec = tiny_spec("page1", lengths=[200])
    spec.protocol.update(warmup=0, trials=2, output_tokens=30, concurrency=[3])
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    raw = json.loads((tmp_path / "raw" / "200.json").read_text())
    assert len(raw["trials"]) == 2 and [b["concurrency"] for b in raw["batches"]] == [3, 3]
    for batch in raw["batches"]:
        reqs = batch["requests"]
        assert [r["status"] for r in reqs] == ["ok"] * 3 and [r["request"] for r in reqs] == [0, 1, 2]
        assert max(r["t_sent"] for r in reqs) < min(r["t_last_token"] for r in reqs)  # they overlapped
        assert [r["completion_tokens"] for r in reqs] == [30] * 3
        assert batch["aggregate"]["output_tok_s"] > 0 and batch["aggregate"]["ttft_max_s"] == max(r["ttft_s"] for r in reqs)


def test_a_batchs_output_rate_is_the_pace_of_a_server_that_keeps_time(tmp_path, monkeypatch):
    """The batch's output rate against a clock longctx does not read: a test server (tests/openai_servers.py)
    that serves each request on its own thread and sleeps PACE before each of its tokens. Three requests of
    N = 40 tokens sent together cannot end before N x PACE after the first was sent, so the rate is at most
    3 N / (N PACE) = 3 / PACE = 120 tok/s at PACE = 25 ms, whatever longctx's clock says; loopback HTTP,
    the prompt and the server's sleeps overrunning may add up to 40% to the 1 s span (the tolerance), so
    at least 120 / 1.4 = 85.7 tok/s."""
    from longctx import config as lcfg

    from . import openai_servers

    pace, n = 0.025, 40
    monkeypatch.setattr(openai_servers, "DECODE_S", pace)  # the server reads it before every token
    with openai_servers.openai_server("no-health", tmp_path / "tok") as (base, seen):
        config = lcfg.validate({
            "lengths": [64], "model": {"name": "bpe", "tokenizer": str(tmp_path / "tok" / "no-health")},
            "protocol": {"warmup": 0, "trials": 2, "output_tokens": n, "concurrency": [3], "token_id_range": [3, 300]},
            "telemetry": {"enabled": False}, "server": {"startup_timeout_s": 30},
            "configurations": {"ext": {"engine": "external", "url": base, "api": "openai"}}})
        assert run_configuration(lcfg.configuration_spec(config, "ext"), tmp_path / "raw", tmp_path / "x.log") == 0
    assert sum(1 for r in seen if r["max_tokens"] == n) == 2 + 2 * 3  # two single trials, two batches of three
    raw = json.loads((tmp_path / "raw" / "64.json").read_text())
    assert [b["concurrency"] for b in raw["batches"]] == [3, 3]
    for batch in raw["batches"]:
        reqs = batch["requests"]
        assert [r["status"] for r in reqs] == ["ok"] * 3 and [r["completion_tokens"] for r in reqs] == [n] * 3
        rate = batch["aggregate"]["output_tok_s"]
        print(f"batch {batch['batch']}: {rate:.1f} tok/s; the server's pace allows at most {3 / pace:.0f}")
        assert 3 / pace / 1.4 <= rate <= 3 / pace
