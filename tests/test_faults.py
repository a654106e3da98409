"""Faults injected into real sweeps of the reference engine: each leaves a clear message naming the
configuration, length and log, keeps every measurement taken before it, and leaves no process."""

import http.server
import json
import os
import re
import signal
import socket
import threading

import pytest

import longctx.measure.protocol as protocol
import longctx.measure.session as lsession
from longctx.measure.rawfiles import lost
from longctx.measure.sweep import run_configuration
from longctx.measure.process import ManagedServer

from .conftest import tiny_spec


@pytest.fixture
def servers(monkeypatch):
    """Every ManagedServer the bench starts, in order (to inject faults into the real processes)."""
    started = []

    class Recorded(ManagedServer):
        def start(self):
            super().start()
            started.append(self)

    monkeypatch.setattr(lsession, "ManagedServer", Recorded)
    return started


def inject_at(monkeypatch, length: int, fault):
    """fault() the first time `length` is measured (a transient fault: the length measured again goes through)."""
    real = protocol.measure_length
    done = []

    def measure(session, spec, n, *rest):
        if n == length and not done:
            done.append(n)
            fault()
        return real(session, spec, n, *rest)

    monkeypatch.setattr(protocol, "measure_length", measure)


def sweep(tmp_path, lengths=(32, 64, 128), server: dict | None = None, **protocol):
    spec = tiny_spec("page1", lengths=list(lengths))
    spec.protocol.update({"warmup": 0, "trials": 1, "output_tokens": 3, **protocol})
    spec.server.update({"stop_timeout_s": 2, **(server or {})})
    failed = run_configuration(spec, tmp_path / "raw", tmp_path / "server.log", tmp_path / "partial")
    raws = {n: json.loads((tmp_path / "raw" / f"{n}.json").read_text()) for n in lengths}
    return failed, raws


def gone(server) -> bool:
    try:
        os.killpg(server.pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_length_lost_to_a_server_death_is_measured_again_on_the_restarted_server(tmp_path, monkeypatch, servers):
    """Issue 34: SIGKILL of the server during a length: its trials are lost, the server is restarted, and the length
    is measured again on the new one (once, within server.max_restarts); the report names the death and the
    remeasurement, and counts no lost trial as succeeded."""
    inject_at(monkeypatch, 64, lambda: os.killpg(servers[-1].pid, signal.SIGKILL))
    failed, raws = sweep(tmp_path)
    assert failed == 0
    assert [raws[n]["status"] for n in (32, 64, 128)] == ["ok", "ok", "ok"]
    again = raws[64]["remeasured"]
    assert again["how"] == "again on the restarted server"
    assert "the server died while measuring length 64" in again["why"] and str(tmp_path / "server.log") in again["why"]
    # the dead server's flush failed and nothing more was sent to it (issue 47): no trial of it counted as succeeded
    assert again["first_attempt"]["status"] == "failed" and again["first_attempt"]["trials"] == []
    assert len(servers) == 2 and raws[128]["provenance"]["starts"] == 2
    assert all(gone(s) for s in servers)
    assert not lost(tmp_path / "raw", tmp_path / "partial", ["32", "64", "128"])  # nothing left for a rerun
    # the report's failures name the death and the remeasurement, not the transport errors of the requests it cut off
    import pandas as pd

    from longctx.analysis.aggregate import aggregate
    from longctx.report.context import failure_rows

    aggregate(sorted((tmp_path / "raw").glob("*.json")), tmp_path / "r.csv", tmp_path / "p.json")
    df = pd.read_csv(tmp_path / "r.csv")
    [row] = failure_rows(df)
    assert row["length"] == 64 and row["lost"] == "none: measured again"
    assert row["reason"].startswith("measured again on the restarted server, after the server died while measuring "
                                    "length 64 (exit code -9)") and "Error" not in row["reason"], row
    assert (df[df["length"] == 64]["status"] == "ok").all()  # the remeasured trials, none of the lost ones


def test_a_length_lost_with_no_restart_left_is_measured_by_the_same_command_run_again(tmp_path, monkeypatch, servers):
    """Issue 34: with no restart left the length stays lost in this run (a failed raw file with the death's reason),
    and the workflow finds it lost (rawfiles.lost): the bench rule's input becomes a new note,
    data/partial/<configuration>/retry-1.json, so that Snakemake reruns the job; the same sweep run again measures
    that length, and only it: the others are reused; after it the input is the same note (no third run)."""
    from longctx.measure.rawfiles import retry_input, write_retry_note

    names = ["32", "64", "128", "load", "prefix"]
    partial = tmp_path / "partial"

    inject_at(monkeypatch, 128, lambda: os.killpg(servers[-1].pid, signal.SIGKILL))
    no_restart = {"max_restarts": 0}
    failed, raws = sweep(tmp_path, server=no_restart)
    assert failed == 1 and raws[128]["status"] == "failed" and "the server died while measuring length 128" in raws[128]["reason"]
    assert [raws[n]["status"] for n in (32, 64)] == ["ok", "ok"] and "remeasured" not in raws[128]
    # the length, and the workloads after it, which no server was left to measure
    found = lost(tmp_path / "raw", partial, names)
    assert list(found) == ["128", "load", "prefix"] and "the server could not be (re)started" in found["load"]
    [note] = retry_input(tmp_path / "raw", partial, names)
    assert note.startswith(str(partial / "retry-")) and not os.path.exists(note)
    said = write_retry_note(note, tmp_path / "raw", names)  # what rule note_retry does, and says
    # read again once the note is written (a cluster's job step reads the workflow again): the same note
    assert retry_input(tmp_path / "raw", partial, names) == [note]
    assert said.startswith("raw: measuring again what the last run lost: L=128 (the server died while measuring")
    # the death's line is one line, with the server log's path; the log's tail is in this process's log, not in it
    assert "\n" not in raws[128]["reason"] and f"server log: {tmp_path / 'server.log'}" in raws[128]["reason"]
    # the report agrees with itself: the diagnosis, the failures section and the flags take one cause for the length
    # (the death, not the transport errors of the requests it cut off), and no failed trial is counted as succeeded
    import pandas as pd

    from longctx.analysis.aggregate import aggregate
    from longctx.analysis.tables import medians
    from longctx.report.context import failure_rows
    from longctx.report.diagnosis import diagnose
    from longctx.report.wording import trial_flags

    aggregate(sorted((tmp_path / "raw").glob("*.json")), tmp_path / "r.csv", tmp_path / "p.json")
    df = pd.read_csv(tmp_path / "r.csv")
    [row] = failure_rows(df)
    died = row["reason"]
    assert died.startswith("the server died while measuring length 128 (exit code -9); server log: "), died
    said = " ".join(s["text"] for g in diagnose(medians(df), {})["configurations"] for s in g["items"])
    assert f"at 128 tokens: {died.rstrip('.')}" in said and "Error" not in said, said
    bad, ok = df[df["status"] != "ok"], int((df["status"] == "ok").sum())
    assert len(bad) and all(f" of {ok} trials" in f for f in trial_flags(df))
    assert trial_flags(bad) == [], bad.to_dict("records")  # flags count trials that succeeded only
    first_runs = {n: raws[n]["run_id"] for n in (32, 64)}
    failed, raws = sweep(tmp_path, server=no_restart)
    assert failed == 0 and raws[128]["status"] == "ok" and raws[128]["remeasured"]["how"] == "by a rerun of the same command"
    assert {n: raws[n]["run_id"] for n in (32, 64)} == first_runs and raws[32].get("resumed")
    # the rerun lost nothing: the input is the note it ran for, unchanged, so a third run has nothing to do
    assert lost(tmp_path / "raw", partial, names) == {} and retry_input(tmp_path / "raw", partial, names) == [note]


def test_a_hung_server_is_replaced_and_the_length_measured_again(tmp_path, monkeypatch, servers):
    inject_at(monkeypatch, 64, lambda: os.killpg(servers[-1].pid, signal.SIGSTOP))
    monkeypatch.setattr(lsession, "HEALTH_TIMEOUT_S", 1.0)  # the health probe that finds it hung: 1 s, not 10
    # one request per length (no cache flush, no batch): each a request timeout to wait out at the hung length
    failed, raws = sweep(tmp_path, request_timeout_s=2, timeout_factor=1, flush_cache=False, concurrency=[])
    assert [raws[n]["status"] for n in (32, 64, 128)] == ["ok", "ok", "ok"]
    first = raws[64]["remeasured"]["first_attempt"]
    assert "timed out" in first["trials"][0]["reason"]
    assert "the server stopped answering /health while measuring length 64" in raws[64]["remeasured"]["why"]
    assert len(servers) == 2 and all(gone(s) for s in servers)  # the stopped one was killed


def test_a_server_stopped_mid_stream_costs_its_stall_bound_not_the_request_timeout(tmp_path, monkeypatch, servers):
    """Issue 47, item 3: the server SIGSTOPped after a trial's third token. The open stream is ended by its stall bound
    (no byte for 1 s here), the server found not answering, and nothing more is sent to it: no second trial, no
    batch; the length is measured again on a new server. Before, the stream waited out its 60 s request timeout and
    the next trial another 60 s."""
    import time

    from longctx.measure import prompts
    from longctx.measure.stream import StreamRecord

    monkeypatch.setattr(lsession, "HEALTH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(protocol, "STALL_MIN_S", 1.0, raising=False)  # (raising: the test runs, and fails, before it)
    real, stopped = prompts.Prompter.generate, []

    def generate(self, client, url, body, timeout_s, length, record=None, stall_s=None):
        if length == 128 and stall_s and not stopped:  # a trial (the prime before the sweep has no stall bound)
            record = StreamRecord()
            record.arm = (3, lambda: (stopped.append(time.monotonic()), os.killpg(servers[-1].pid, signal.SIGSTOP)))
        return real(self, client, url, body, timeout_s, length, record=record, stall_s=stall_s)

    monkeypatch.setattr(prompts.Prompter, "generate", generate)
    failed, raws = sweep(tmp_path, request_timeout_s=60, timeout_factor=1, output_tokens=32, trials=2, concurrency=[2])
    assert failed == 0 and [raws[n]["status"] for n in (32, 64, 128)] == ["ok", "ok", "ok"]
    first = raws[128]["remeasured"]["first_attempt"]
    [trial] = first["trials"]  # the second was not sent to the stopped server, nor the batch
    said = re.fullmatch(r"the stream stalled: no byte for 1 s after (\d+) token\(s\) \(the stall bound, from the decode "
                        r"steps measured so far\)", trial["reason"])
    assert said and 3 <= int(said.group(1)) < 32, trial["reason"]  # (tokens already on their way arrive after the stop)
    assert "the server stopped answering /health while measuring length 128" in raws[128]["remeasured"]["why"]
    started_again = raws[128]["provenance"]["primed"][-1]  # the new server's first request
    assert len(servers) == 2 and all(gone(s) for s in servers)
    # from the stop to the end of the length: 1 s stall, 1 s health check, the restart and the length again
    finished = time.monotonic()
    assert finished - stopped[0] < 30, finished - stopped[0]
    assert started_again["start"] == 2


def taken_ports_first(monkeypatch, *taken: int) -> None:
    """free_port answers the taken ports first, as when another job took each between choice and bind."""
    ports = iter(taken)
    real_free_port = lsession.free_port
    monkeypatch.setattr(lsession, "free_port", lambda host: next(ports, None) or real_free_port(host))


def test_port_in_use_is_retried_on_another_port(tmp_path, monkeypatch, servers, caplog):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    taken_ports_first(monkeypatch, taken)
    try:
        failed, raws = sweep(tmp_path, lengths=(32,))
    finally:
        busy.close()
    assert failed == 0 and len(servers) == 2
    assert raws[32]["provenance"]["starts"] == 1  # a taken port is not a restart
    assert "address already in use" in (tmp_path / "server.log").read_text().lower()
    assert f"could not bind port {taken}: another process has it" in caplog.text
    assert all(gone(s) for s in servers)


def test_another_server_answering_on_the_chosen_port_is_not_measured(tmp_path, monkeypatch, servers, caplog):
    """Another job's server took the port first and answers /health before ours binds: the answer
    comes from a process outside our server's tree, so ours goes to another port."""
    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = other.server_address[1]
    taken_ports_first(monkeypatch, taken)
    try:
        failed, raws = sweep(tmp_path, lengths=(32,))
    finally:
        other.shutdown()
        other.server_close()
    assert failed == 0 and len(servers) == 2 and raws[32]["provenance"]["starts"] == 1
    assert f"port {taken} is answered by another process (pid {os.getpid()})" in caplog.text
    assert not raws[32]["provenance"]["base_url"].endswith(f":{taken}")
    assert raws[32]["trials"][0]["prompt_tokens"] == 32  # measured on our own server
    assert all(gone(s) for s in servers)


def test_a_server_that_never_starts_names_its_log_for_every_length(tmp_path, monkeypatch, servers):
    spec = tiny_spec("page1", lengths=[32, 64])
    spec.args["mem-fraction-static"] = 1e-9
    spec.server["max_restarts"] = 1
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 2
    reason = json.loads((tmp_path / "raw" / "64.json").read_text())["reason"]
    assert "could not be (re)started after 2 starts" in reason and str(tmp_path / "server.log") in reason
    assert len(servers) == 2 and all(gone(s) for s in servers)


def test_a_refused_top_length_is_a_failed_row_and_the_rest_stands(tmp_path):
    failed, raws = sweep(tmp_path, lengths=(32, 64, 3000))  # the tiny config's context is 2048
    assert failed == 1 and raws[64]["status"] == "ok"
    # the server reports its context length at start-up (/server_info): the length is not sent to be refused
    assert raws[3000]["reason"] == ("not sent: 3000 prompt and 3 output tokens exceed the context length of 2048 tokens "
                                    "the server reports") and raws[3000]["trials"] == []


def test_an_interrupted_sweep_resumes_without_measuring_again(tmp_path, monkeypatch, servers):
    def interrupt():
        raise KeyboardInterrupt

    real = protocol.measure_length
    inject_at(monkeypatch, 128, interrupt)
    with pytest.raises(KeyboardInterrupt):
        sweep(tmp_path)
    first_run = json.loads((tmp_path / "partial" / "64.json").read_text())["run_id"]
    assert not (tmp_path / "partial" / "128.json").exists() and gone(servers[0])
    monkeypatch.setattr(protocol, "measure_length", real)
    failed, raws = sweep(tmp_path)
    assert failed == 0
    assert raws[32]["resumed"] and raws[64]["resumed"] and raws[64]["run_id"] == first_run
    assert "resumed" not in raws[128] and raws[128]["run_id"] != first_run
    # a different protocol is a different measurement: nothing is reused
    _, again = sweep(tmp_path, output_tokens=4)
    assert not any(r.get("resumed") for r in again.values())


def test_a_truncated_raw_file_is_recovered_from_its_intact_copy_and_said(tmp_path):
    from longctx.analysis.aggregate import aggregate

    failed, raws = sweep(tmp_path, lengths=(32, 64))
    assert failed == 0
    path = tmp_path / "raw" / "64.json"
    path.write_text(path.read_text()[:200])  # a disk that filled up, a copy cut short
    files = [tmp_path / "raw" / "32.json", path]
    partial = tmp_path / "all-partial"  # as the workflow keeps them: data/partial/<configuration>/
    partial.mkdir()
    (tmp_path / "partial").rename(partial / "raw")  # the raw files' directory names the configuration here
    df = aggregate(files, tmp_path / "r.csv", tmp_path / "p.json", partial_dir=partial)
    assert set(df.loc[df["length"] == 64, "status"]) == {"ok"}  # a trial and a batch of two, as measured
    recovered = json.loads((tmp_path / "p.json").read_text())["configurations"]["page1"]["recovered"]
    assert recovered == [{"length": 64, "from": str(partial / "raw" / "64.json"),
                          "because": recovered[0]["because"]}] and "JSONDecodeError" in recovered[0]["because"]
    (partial / "raw" / "64.json").write_text("{")  # both cut: one failed row naming both
    df = aggregate(files, tmp_path / "r.csv", tmp_path / "p.json", partial_dir=partial)
    reason = df.loc[df["length"] == 64, "reason"].item()
    assert df.loc[df["length"] == 64, "status"].item() == "failed" and str(path) in reason and "its copy" in reason


def test_a_truncated_raw_file_with_no_intact_copy_is_measured_again_by_the_same_command(tmp_path):
    """Issue 47, item 1: a raw file cut short, and its copy too: the workflow finds the length lost (the bench rule's
    input becomes a new note), and the bench run again measures it, says why, and reuses the other length."""
    from longctx.measure.rawfiles import retry_input, write_retry_note

    failed, raws = sweep(tmp_path, lengths=(32, 64))
    assert failed == 0
    for where in ("raw", "partial"):  # a disk that filled up
        path = tmp_path / where / "64.json"
        path.write_text(path.read_text()[:200])
    names = ["32", "64"]
    found = lost(tmp_path / "raw", tmp_path / "partial", names)
    assert list(found) == ["64"] and found["64"].startswith(f"its raw file {tmp_path / 'raw' / '64.json'} cannot be "
                                                           "read (JSONDecodeError: ") and "no intact copy" in found["64"]
    [note] = retry_input(tmp_path / "raw", tmp_path / "partial", names)
    write_retry_note(note, tmp_path / "raw", names)
    failed, again = sweep(tmp_path, lengths=(32, 64))
    assert failed == 0 and again[64]["status"] == "ok" and again[64]["run_id"] != raws[64]["run_id"]
    assert again[64]["remeasured"] == {"why": found["64"], "how": "by a rerun of the same command"}
    assert again[32]["resumed"] and again[32]["run_id"] == raws[32]["run_id"]
    assert lost(tmp_path / "raw", tmp_path / "partial", names) == {}


def test_a_note_is_read_once_and_an_adaptive_sweeps_replayed_failures_are_not_lost(tmp_path):
    """rawfiles.lost on files written by hand: a length that timed out is lost, unless an adaptive sweep replays it
    (its kept trials, failed ones too: measuring it again would replay the same failure at every run); a length the
    sweep never reached (its `fault`) is lost either way. The note's reasons are told to one bench run only."""
    from longctx.measure.rawfiles import retry_input, retry_reasons, write_retry_note

    raw, partial = tmp_path / "raw", tmp_path / "partial"
    raw.mkdir()
    partial.mkdir()
    (raw / "64.json").write_text(json.dumps({"status": "failed", "reason": "timed out after 60 s (ReadTimeout)"}))
    assert lost(raw, partial, ["64"]) == {"64": "timed out after 60 s (ReadTimeout)"}
    assert lost(raw, partial, ["64", "sweep"]) == {}
    died = "the server could not be (re)started after 3 starts"
    (raw / "64.json").write_text(json.dumps({"status": "failed", "reason": f"not measured: {died}", "fault": died}))
    assert lost(raw, partial, ["64", "sweep"]) == {"64": died}
    [note] = retry_input(raw, partial, ["64"])
    write_retry_note(note, raw, ["64"])
    assert retry_reasons(partial) == {"64": died} and retry_reasons(partial) == {}


def test_an_output_directory_that_cannot_be_written_is_said_before_any_server_starts(tmp_path):
    """A directory that cannot be made (a file where a directory should be: what a read-only or full disk
    gives even root) fails the bench at once, by the CLI's message, with no server started and no traceback."""
    import subprocess
    import sys

    (tmp_path / "file").write_text("")
    spec = tiny_spec("page1", lengths=[32])
    run = subprocess.run([sys.executable, "-m", "longctx.cli", "bench", "--spec", spec.to_json(), "--outdir",
                          str(tmp_path / "file" / "raw"), "--server-log", str(tmp_path / "server.log")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"longctx bench: cannot write to {tmp_path / 'file' / 'raw'} (" in run.stderr and "nothing was started" in run.stderr
    assert not (tmp_path / "server.log").exists()
    if os.geteuid() != 0:  # permission bits hold only for other users than root
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(Exception, match="cannot write to"):
            run_configuration(spec, tmp_path / "ro", tmp_path / "server.log")


def test_the_prime_never_costs_a_length_that_would_have_measured_without_it(tmp_path):
    """Issue 54, item 1: an OpenAI server that dies on any prompt over 3,000 tokens (tests/openai_servers.py,
    `dies_over`; no context length or KV pool foresees it), lengths 1,000 and 2,000 and an ITL-depth request of 4,000.
    The prime goes at the sweep's longest length, 2,000, not the ITL-depth request's 4,000: both lengths are measured,
    and the ITL-depth request, sent last, is lost with its reason. Before, the prime at 4,000 killed the server
    before the first length and both lengths were lost, the fault put on length 1,000."""
    from longctx import config as lcfg

    from .openai_servers import openai_server

    with openai_server("no-health", tmp_path / "tok", dies_over=3000) as (base, seen):
        config = lcfg.validate({
            "lengths": [1000, 2000], "model": {"name": "bpe", "tokenizer": str(tmp_path / "tok" / "no-health")},
            "protocol": {"warmup": 0, "trials": 1, "output_tokens": 4, "token_id_range": [3, 300],
                         "itl_depth": {"length": 4000, "output_tokens": 2}},
            "telemetry": {"enabled": False}, "server": {"startup_timeout_s": 5, "max_restarts": 1},
            "configurations": {"ext": {"engine": "external", "url": base, "api": "openai", "load": False, "prefix": False}}})
        failed = run_configuration(lcfg.configuration_spec(config, "ext"), tmp_path / "raw", tmp_path / "x.log")
    raws = {n: json.loads((tmp_path / "raw" / f"{n}.json").read_text()) for n in (1000, 2000)}
    assert [raws[n]["status"] for n in (1000, 2000)] == ["ok", "ok"], {n: raws[n].get("reason") for n in raws}
    (primed,) = raws[1000]["provenance"]["primed"]
    assert (primed["length"], primed["status"]) == (2000, "ok"), primed
    depth = json.loads((tmp_path / "raw" / "itl_depth.json").read_text())
    assert depth.get("status") == "failed" and depth.get("reason"), depth
    assert failed == 0  # (the count of lengths that failed: the ITL-depth request is not one)


def test_a_prime_that_failed_is_said_once_and_not_sent_again_at_a_restart(tmp_path, monkeypatch, servers, caplog):
    """Issue 54, item 1: the prime (the first request at the sweep's longest length, 96; the metronome's are 128 tokens)
    fails; the sweep goes on and measures every length; the server killed while measuring 64 is started again, and
    its new server is not primed again: provenance says the prime was skipped and why."""
    import logging

    from longctx.measure import prompts

    real, primes = prompts.Prompter.generate, []

    def generate(self, client, url, body, timeout_s, length, record=None, stall_s=None):
        if length == 96 and not primes:  # the prime: the first request at 96, before any length
            primes.append(length)
            return {"status": "failed", "reason": "HTTP 500: injected"}
        return real(self, client, url, body, timeout_s, length, record=record, stall_s=stall_s)

    monkeypatch.setattr(prompts.Prompter, "generate", generate)
    inject_at(monkeypatch, 64, lambda: os.killpg(servers[-1].pid, signal.SIGKILL))
    with caplog.at_level(logging.INFO, logger="longctx.progress"):
        failed, raws = sweep(tmp_path, lengths=(32, 64, 96))
    assert failed == 0 and [raws[n]["status"] for n in (32, 64, 96)] == ["ok", "ok", "ok"]
    assert primes == [96] and len(servers) == 2
    first, again = raws[96]["provenance"]["primed"]
    assert (first["start"], first["status"], first["reason"]) == (1, "failed", "HTTP 500: injected"), first
    assert again["start"] == 2 and again["status"] == "skipped" and \
        again["reason"] == "the prime failed at start 1 (HTTP 500: injected): not sent again", again
    said = [r.getMessage() for r in caplog.records if "the prime" in r.getMessage()]
    assert len(said) == 1 and "failed: HTTP 500: injected; it is not sent again" in said[0], said


def test_a_load_point_lost_to_a_server_death_is_measured_again_by_the_same_command(tmp_path, monkeypatch, servers):
    """Issue 54, item 6: the server SIGKILLed as the load stage's closed loop starts. The point fails with the
    server's fault, the stage goes on; the workflow's reading of the run (lost) has the load workload measured
    again, and the job run again measures that point on a new server and reuses every point and length that
    succeeded. Before, a workload a death cut short kept its failed point and was never measured again."""
    from longctx.measure import loadrun

    real, killed = loadrun.run_point, []

    async def run_point(ctx, kind, length, level, *rest):
        if kind == "closed" and not killed:
            killed.append(level)
            os.killpg(servers[-1].pid, signal.SIGKILL)
        return await real(ctx, kind, length, level, *rest)

    monkeypatch.setattr(loadrun, "run_point", run_point)
    spec = tiny_spec("page1", lengths=[32, 64], prefix=None)
    spec.load.update({"lengths": [64], "closed": {**spec.load["closed"], "concurrency": [1, 2]}, "open": {**spec.load["open"], "rates": []},
                      "interference": {**spec.load["interference"], "lengths": []}, "wake": {**spec.load["wake"], "idle_s": []},
                      "metrics": {**spec.load["metrics"], "enabled": False}})
    spec.protocol.update({"warmup": 0, "trials": 1, "output_tokens": 3, "itl_depth": {"length": None, "output_tokens": 2}})
    spec.server.update({"stop_timeout_s": 2})
    names = ["32", "64", "load"]

    def run():
        run_configuration(spec, tmp_path / "raw", tmp_path / "server.log", tmp_path / "partial")
        return json.loads((tmp_path / "raw" / "load.json").read_text())["workloads"]

    first = run()
    assert [(p["concurrency"], p["status"]) for p in first] == [(1, "failed"), (2, "ok")], first
    assert "the server died" in first[0]["fault"] and str(tmp_path / "server.log") in first[0]["fault"]
    found = lost(tmp_path / "raw", tmp_path / "partial", names)
    assert list(found) == ["load"] and found["load"].startswith("closed point: the server died"), found
    again = run()
    assert [(p["concurrency"], p["status"], bool(p.get("resumed"))) for p in again] == [(1, "ok", False), (2, "ok", True)], again
    assert lost(tmp_path / "raw", tmp_path / "partial", names) == {}


def test_a_load_point_lost_the_same_way_every_run_is_given_up_after_three_and_a_forced_run_tries_it_again(
        tmp_path, monkeypatch, servers):
    """Issue 54, items 2 and 6: the server SIGKILLed whenever the closed loop of 1 starts, run after run, each run
    started by the note of what the last lost (rawfiles.write_retry_note, rule note_retry's). The point is measured
    again by runs 2 and 3 and counted (lost_runs 1, 2, 3); run 3 gives up on it (server.give_up_after_runs, 3): the
    workflow's reading of the run no longer has the workload measured again, and a run started by another note keeps
    the point as it was, without sending it. A run without a note (--forcerun) sends it again, its count started
    again. Before, a point lost to a death was measured again at every run, forever."""
    from longctx.measure import loadrun
    from longctx.measure.rawfiles import write_retry_note

    real, killed = loadrun.run_point, []

    async def run_point(ctx, kind, length, level, *rest):
        if kind == "closed" and level == 1:
            killed.append(level)
            os.killpg(servers[-1].pid, signal.SIGKILL)
        return await real(ctx, kind, length, level, *rest)

    monkeypatch.setattr(loadrun, "run_point", run_point)
    spec = tiny_spec("page1", lengths=[32], prefix=None)
    spec.load.update({"lengths": [64], "closed": {**spec.load["closed"], "concurrency": [1, 2]}, "open": {**spec.load["open"], "rates": []},
                      "interference": {**spec.load["interference"], "lengths": []}, "wake": {**spec.load["wake"], "idle_s": []},
                      "metrics": {**spec.load["metrics"], "enabled": False}})
    spec.protocol.update({"warmup": 0, "trials": 1, "output_tokens": 3, "itl_depth": {"length": None, "output_tokens": 2}})
    spec.server.update({"stop_timeout_s": 2})
    raw, partial, names = tmp_path / "raw", tmp_path / "partial", ["32", "load"]

    def run(note: bool = True) -> dict:
        if note:  # as the workflow reruns the job: the note of what the last run lost
            write_retry_note(partial / "retry-x.json", raw, names)
        run_configuration(spec, raw, tmp_path / "server.log", partial)
        return json.loads((raw / "load.json").read_text())["workloads"][0]

    counts = [run(note=False)["lost_runs"]]
    counts += [run()["lost_runs"] for _ in range(2)]
    given_up = json.loads((raw / "load.json").read_text())["workloads"][0]
    assert counts == [1, 2, 3] and len(killed) == 3, (counts, killed)
    assert given_up["gave_up"] == 3 and given_up["reason"].startswith("gave up after 3 runs: the server died"), given_up
    assert lost(raw, partial, names) == {}  # the same command does not send it again
    # the job rerun by a note of another loss (as the workflow writes one): the point stands as it was, not sent
    (partial / "retry-y.json").write_text(json.dumps({"lost": {"32": "the server died during L=32"}}))
    kept = run(note=False)
    assert kept["gave_up"] == 3 and kept["resumed"] and len(killed) == 3, kept
    forced = run(note=False)  # the job run again without a note: the point is sent again, counted from one
    assert len(killed) == 4 and forced["lost_runs"] == 1 and not forced.get("gave_up"), forced


def test_a_server_never_reached_is_given_up_on_after_three_runs_for_every_file_it_cost(tmp_path):
    """Issue 54, item 2: an external server where nothing listens, run after run (each started by the note of what
    the last lost). Every file the run expects is written as not measured with the fault, which may pass, and counted
    as a length the server failed is: the third run gives up on the lengths, the ITL-depth request and the load
    workloads alike, and the same command no longer measures any of them. Before, a server that never came up was
    waited for at every run, forever."""
    from longctx import config as lcfg
    from longctx.measure.process import free_port
    from longctx.measure.rawfiles import write_retry_note

    from .conftest import TINY_ARCH

    config = lcfg.validate({
        "lengths": [32, 64], "protocol": {"warmup": 0, "trials": 1, "output_tokens": 3,
                                          "itl_depth": {"length": 64, "output_tokens": 2}},
        "load": {"lengths": [32], "closed": {"concurrency": [1], "requests": 1}, "open": {"rates": []},
                 "interference": {"lengths": []}, "wake": {"idle_s": []}, "metrics": {"enabled": False}},
        "server": {"startup_timeout_s": 0.5, "max_restarts": 0},
        "model": {"name": "tiny-mla", "architecture": TINY_ARCH},
        "configurations": {"ext": {"engine": "external", "api": "openai", "url": f"http://127.0.0.1:{free_port()}",
                                   "prefix": False}}})
    spec = lcfg.configuration_spec(config, "ext")
    raw, partial, names = tmp_path / "raw", tmp_path / "partial", ["32", "64", "itl_depth", "load"]

    def run() -> dict[str, dict]:
        if (raw / "32.json").exists():  # as the workflow reruns the job: the note of what the last run lost, and
            write_retry_note(partial / "retry-x.json", raw, names)  # the job's outputs removed
            for f in raw.iterdir():
                f.unlink()
        run_configuration(spec, raw, tmp_path / "server.log", partial)
        return {n: json.loads((raw / f"{n}.json").read_text()) for n in names}

    first = run()
    assert set(lost(raw, partial, names)) == set(names), first
    assert all(d["lost_runs"] == 1 and not d.get("gave_up") for d in first.values()), first
    run()
    third = run()
    assert {n: (d["lost_runs"], d["gave_up"]) for n, d in third.items()} == {n: (3, 3) for n in names}, third
    assert third["64"]["reason"].startswith("gave up after 3 runs: not measured: "), third["64"]["reason"]
    assert lost(raw, partial, names) == {}  # nothing is measured again by the same command


def test_a_start_up_failures_cause_is_the_first_tracebacks_last_line_and_a_missing_file_will_not_pass():
    """process.root_cause on the shapes server logs take (the real vLLM case: tests/test_thirdparty.py): a chained
    exception (its cause printed first), lines behind a logger's prefix, no traceback at all (a C++ server's log:
    None, the last line stands)."""
    from longctx.measure.process import root_cause, will_not_pass

    chained = "\n".join([
        "INFO 12-06 07:00:00 [core.py:90] loading",
        "Traceback (most recent call last):",
        '  File "/x/loader.py", line 3, in load', "    raise FileNotFoundError(path)",
        "FileNotFoundError: /models/m/model.safetensors",
        "", "The above exception was the direct cause of the following exception:", "",
        "Traceback (most recent call last):", '  File "/x/server.py", line 9, in main',
        "RuntimeError: the model could not be loaded"])
    assert root_cause(chained) == "FileNotFoundError: /models/m/model.safetensors"
    prefixed = "\n".join([
        "(EngineCore_DP0 pid=41) ERROR 12-06 07:00:01 [core.py:708] EngineCore failed to start.",
        "(EngineCore_DP0 pid=41) Traceback (most recent call last):",
        '(EngineCore_DP0 pid=41)   File "/v/core.py", line 699, in run_engine_core',
        "(EngineCore_DP0 pid=41) RuntimeError: Cannot find any model weights with `/m`",
        "Traceback (most recent call last):",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    assert root_cause(prefixed) == "RuntimeError: Cannot find any model weights with `/m`"
    assert root_cause("llama_model_load: error loading model\nmain: exiting due to model loading error") is None
    assert will_not_pass("RuntimeError: Cannot find any model weights with `/m`")
    assert will_not_pass("FileNotFoundError: /models/m/model.safetensors")
    assert not will_not_pass("torch.OutOfMemoryError: CUDA out of memory") and not will_not_pass(None)
