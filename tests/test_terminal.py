"""What a user is told when a run goes wrong (issue 34, items 2 to 4), each probe as the user meets it: a
server that fails every generation (HTTP 500), a full disk, a lost raw file, a server death, a run that
measured nothing. Each says its cause and its fix on the terminal, in one line; the report agrees with it.

The servers are real processes on loopback (the reference engine, a stdlib OpenAI server from
tests/openai_servers.py); the full disk is /dev/full, which fails every write with ENOSPC, as a full disk does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import yaml

from longctx.measure.process import free_port

from .conftest import CORES, ENV, ROOT, TINY, TINY_ARCH, copy_workflow
from .openai_servers import BROKEN, openai_server
from .test_report import pdftotext


def longctx(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "longctx.cli", *map(str, args)], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory):
    """The README's command on a config whose one configuration is an external server that answers its health
    path and fails every generation with HTTP 500 (the model described by model.architecture), and another where
    nothing listens yet; then (issue 47, item 1) both servers up and working, and the same command run again, and a
    third time. """
    tmp = tmp_path_factory.mktemp("broken")
    (tmp / "wf").mkdir()
    work = copy_workflow(tmp / "wf")
    gone_port = free_port()

    def readme_command(*extra, twin=False):  # the README's command on two cores (conftest.CORES); the first asks for the twin
        return subprocess.run([sys.executable, "-m", "snakemake", *CORES, "report/longctx.pdf",
                               *(["report/longctx.md"] if twin else []), "--configfile", "broken.yaml", *extra],
                              cwd=work, env=ENV, capture_output=True, text=True, timeout=600)

    with openai_server("no-health", tmp / "tok", broken=True) as (base, seen):
        # 9000: longer than the servers' context (max_model_len 8192), never sent: a length that stays missing
        config = {"lengths": [64, 128, 9000], "protocol": {"warmup": 0, "trials": 1, "output_tokens": 4, "token_id_range": [3, 300]},
                  "model": {"name": "tiny-mla", "architecture": TINY_ARCH},
                  "configurations": {"ext": {"engine": "external", "url": base, "api": "openai"},
                                     # and one where nothing listens: it never answers, so nothing of it is recorded
                                     "gone": {"engine": "external", "url": f"http://127.0.0.1:{gone_port}", "api": "openai"}}}
        (work / "broken.yaml").write_text(yaml.safe_dump(config))
        run = readme_command(twin=True)
    first = shutil.copytree(work / "report", tmp / "first-report")  # what the first run wrote
    shutil.copytree(work / "data" / "raw", first / "raw")
    ext_port = int(base.rsplit(":", 1)[1])
    with openai_server("no-health", tmp / "tok", port=ext_port), openai_server("no-health", tmp / "tok", port=gone_port):
        rerun = readme_command()
        third = readme_command()
        allowed = readme_command("--config", "allow_missing=True")
    return SimpleNamespace(work=work, run=run, seen=seen, rerun=rerun, third=third, allowed=allowed, first=first)


def test_a_server_error_is_said_as_one_with_its_body_not_as_a_prompt_it_refuses(broken_run):
    run, seen = broken_run.run, broken_run.seen
    assert seen, "the server was never asked"
    for n in (64, 128):
        reason = json.loads((broken_run.first / "raw" / "ext" / f"{n}.json").read_text())["reason"]
        assert "with a server error (HTTP 500: " in reason and BROKEN in reason, reason
        assert "takes no token-id prompt" not in reason and "model.tokenizer" not in reason, reason
    assert "with a server error (HTTP 500: " in run.stderr and BROKEN in run.stderr
    # each connection is retried (server.max_restarts): the second and third are counted, the first is not
    assert "ext: connecting to the external server at" in run.stderr and "(attempt 1 of" not in run.stderr
    assert "(attempt 3 of at most 3)" in run.stderr


def test_a_run_that_measured_nothing_exits_non_zero_after_writing_its_report(broken_run):
    run, report = broken_run.run, broken_run.first
    assert run.returncode == 1, run.stderr[-3000:]
    assert "longctx: nothing was measured: every length of ext, gone failed" in run.stderr
    assert (report / "longctx.pdf").stat().st_size > 0 and (report / "longctx.md").exists()
    text = " ".join(pdftotext(report / "longctx.pdf").split())
    assert "with a server error (HTTP 500: " in text


def test_the_same_command_run_again_measures_what_failed_for_a_reason_that_may_pass(broken_run):
    """Issue 47, items 1 and 2: a server error (HTTP 500) and a server not up yet may pass; once both servers work,
    the same command measures those lengths again and says what and why. The length longer than the servers'
    context stays missing, and is not sent again: every run exits 1 with one line naming it (the run that has
    nothing left to do too), unless allow_missing lets the partial report pass."""
    work, run, rerun, third = broken_run.work, broken_run.run, broken_run.rerun, broken_run.third
    assert run.returncode == 1
    for conf in ("ext", "gone"):
        for n in (64, 128):
            raw = json.loads((work / "data" / "raw" / conf / f"{n}.json").read_text())
            assert raw["status"] == "ok" and raw["remeasured"]["how"] == "by a rerun of the same command", (conf, n)
        raw = json.loads((work / "data" / "raw" / conf / "9000.json").read_text())
        assert raw["status"] == "failed" and raw["reason"].startswith("not sent: 9000 prompt and 4 output tokens exceed")
    out = rerun.stdout + rerun.stderr
    # (the broken server failed the prompt probe with HTTP 500 at every connection: the run said so, and it may pass)
    assert "ext: measuring again what the last run lost: L=64 (the external server at " in out
    assert "gone: measuring again what the last run lost: L=64 (" in out and "is not ready" in out
    assert "gone L=128: measuring it again, lost by the last run: the external server" in out
    missing = ("longctx: 2 configured length(s) have no successful measurement: ext L=9000 (not sent: 9000 prompt and 4 "
               "output tokens exceed the context length of 8192 tokens the server reports; fix: a server with a longer "
               "context, or a shorter `lengths`); gone L=9000 (not sent: ")
    assert rerun.returncode == 1 and missing in rerun.stderr and (work / "report" / "longctx.pdf").exists()
    assert "--config allow_missing=True counts a partial report as success" in rerun.stderr
    assert "Nothing to be done" in third.stdout + third.stderr and third.returncode == 1 and missing in third.stderr
    assert broken_run.allowed.returncode == 0, broken_run.allowed.stderr[-3000:]
    assert "Nothing to be done" in broken_run.allowed.stdout + broken_run.allowed.stderr  # the same report: no new version


def test_a_length_that_fails_the_same_way_every_run_is_given_up_after_three_and_makes_no_new_version(tmp_path):
    """Issue 54, items 2 and 3: a server that answers HTTP 503 to every 128-token prompt (tests/openai_servers.py,
    fail_lengths) and serves 64. The README's command run four times: runs 2 and 3 measure 128 again (a server error
    may pass) and lose it the same way, run 3 gives up (server.give_up_after_runs, 3), run 4 has nothing to do; each
    exits 1 and the last two name the length with "gave up after 3 runs". The report's versions: the first run's, and
    no other, since no later run measured anything new. Then the bench job forced (--forcerun bench_configuration)
    sends it again, its count started again."""
    work = copy_workflow(tmp_path)
    config = {"lengths": [64, 128], "protocol": {"warmup": 0, "trials": 1, "output_tokens": 4, "token_id_range": [3, 300]},
              "metronome": {"length": 32, "repeats": 1}, "model": {"name": "tiny-mla", "architecture": TINY_ARCH},
              "configurations": {"ext": {"engine": "external", "api": "openai", "url": "URL"}}}

    def command(*extra):  # the README's command on two cores (conftest.CORES)
        return subprocess.run([sys.executable, "-m", "snakemake", *CORES, "report/longctx.pdf", "--configfile",
                               "overloaded.yaml", *extra], cwd=work, env=ENV, capture_output=True, text=True, timeout=600)

    runs = []
    with openai_server("no-health", tmp_path / "tok", fail_lengths={128: 503}) as (base, seen):
        config["configurations"]["ext"]["url"] = base
        (work / "overloaded.yaml").write_text(yaml.safe_dump(config))
        for _ in range(4):  # a version is logged with its PDF (build_pdf): the PDF is the target every time
            runs.append(command())
            print(runs[-1].stderr[-1500:])
        sent = [len(r["prompt"]) for r in seen if isinstance(r.get("prompt"), list)].count(128)
        raw = json.loads((work / "data" / "raw" / "ext" / "128.json").read_text())
        log = json.loads((work / "report" / "versions" / "log.json").read_text())["versions"]
        forced = command("--forcerun", "bench_configuration")
        sent_forced = [len(r["prompt"]) for r in seen if isinstance(r.get("prompt"), list)].count(128) - sent
    assert [r.returncode for r in runs] == [1, 1, 1, 1], [r.stderr[-2000:] for r in runs]
    assert sent == 6, sent  # a run's prime (the sweep's longest length) and its one trial, three runs
    assert raw["status"] == "failed" and raw["lost_runs"] == 3 and raw["gave_up"] == 3, raw.get("reason")
    gave_up = re.compile(r"longctx: 1 configured length\(s\) have no successful measurement: ext L=128 \(gave up after 3 "
                         r"runs: .*HTTP 503.*; fix: what the server's log says of it; then `snakemake --forcerun "
                         r"bench_configuration` \(or a changed configuration\) sends it again\)")
    assert not gave_up.search(runs[1].stderr) and gave_up.search(runs[2].stderr) and gave_up.search(runs[3].stderr), \
        runs[2].stderr[-2000:]
    assert "Nothing to be done" in runs[3].stdout + runs[3].stderr
    assert [e["n"] for e in log] == [1], log
    # forced, the job sends it again: its count starts again (lost once)
    assert forced.returncode == 1 and sent_forced == 2, forced.stderr[-2000:]
    raw = json.loads((work / "data" / "raw" / "ext" / "128.json").read_text())
    assert raw["lost_runs"] == 1 and not raw.get("gave_up"), raw


def test_the_report_of_a_server_never_measured_says_what_the_config_said_of_it(broken_run):
    """An external server is remote unless its configuration says otherwise, and the config described its model:
    the report says neither 'on GPU' nor 'no architecture' of a server it never measured."""
    report = broken_run.first
    md = (report / "longctx.md").read_text()
    text = " ".join(pdftotext(report / "longctx.pdf").split()) + md
    assert "on GPU" not in text and "no architecture" not in text
    assert "external (OpenAI API), version not reported, on a remote machine (every configuration)" in text
    assert "tiny-mla, MLA, 96 KV bytes per token" in text


def test_a_full_disk_names_the_file_and_the_fix_in_one_line_and_leaves_no_temporary_file(tmp_path):
    """The aggregate stage's output on a full disk (/dev/full): one line on the terminal naming the file, the
    cause and what to do; the traceback in the stage's log; no .tmp left."""
    from longctx.core.errors import WriteError, write_atomic

    out = tmp_path / "out.json"
    (tmp_path / "out.json.tmp").symlink_to("/dev/full")
    with pytest.raises(WriteError) as err:
        write_atomic(out, "{}" * 10000)
    assert err.value.path == str(out) and err.value.errno == 28 and not os.path.lexists(tmp_path / "out.json.tmp")

    raw = tmp_path / "raw" / "page1"
    raw.mkdir(parents=True)
    (raw / "64.json").write_text("{")  # unreadable: a failed row, so that there is something to write
    (tmp_path / "results.csv.tmp").symlink_to("/dev/full")  # where the file is written before its rename
    log = tmp_path / "logs" / "aggregate.log"
    run = longctx("aggregate", "--out-csv", tmp_path / "results.csv", "--out-provenance", tmp_path / "p.json",
                  "--out-itl-depth", tmp_path / "d.csv", raw / "64.json", "--log", log)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    [line] = [ln for ln in lines if "cannot write" in ln]
    assert line.startswith(f"longctx aggregate: cannot write {tmp_path / 'results.csv'}: No space left on device; "
                           f"free space on the disk that holds {tmp_path} (df -h {tmp_path})"), line
    assert "cannot write" in log.read_text()


def test_a_path_that_cannot_be_written_is_named_with_what_to_do():
    """Permission bits do not hold for root (the CI's user), so the error the stage meets is built here:
    the line names the file, the cause and the command that fixes it."""
    import argparse
    import errno

    from longctx.cli import _write_failure

    args = argparse.Namespace(out="report/longctx.tex", version_out="report/version.json", template="t.j2")
    line = _write_failure(PermissionError(errno.EACCES, "Permission denied", "report/longctx.tex"), args)
    where = os.path.abspath("report")
    assert line == (f"cannot write report/longctx.tex: Permission denied; make {where} writable for this user "
                    f"(ls -ld {where}; chmod u+w {where}), then run the same command again")
    # a write error that names no file (ENOSPC comes from write(), not open()) names what the stage writes
    line = _write_failure(OSError(errno.ENOSPC, "No space left on device"), args)
    assert line.startswith("cannot write report/longctx.tex or report/version.json: No space left on device; free space")


def test_a_recovered_raw_file_is_said_on_the_terminal(tmp_path):
    raw = tmp_path / "raw" / "page1"
    kept = tmp_path / "partial" / "page1"
    for d in (raw, kept):
        d.mkdir(parents=True)
    good = {"format": "longctx.raw/1", "configuration": "page1", "engine": "reference", "length": 64, "status": "failed",
            "reason": "refused", "trials": []}
    (raw / "64.json").write_text(json.dumps(good)[:30])
    (kept / "64.json").write_text(json.dumps(good))
    (raw / "128.json").write_text("{")
    run = longctx("aggregate", "--out-csv", tmp_path / "r.csv", "--out-provenance", tmp_path / "p.json",
                  "--out-itl-depth", tmp_path / "d.csv", "--partial-dir", tmp_path / "partial", raw / "64.json",
                  raw / "128.json", "--log", tmp_path / "a.log")
    assert run.returncode == 0, run.stderr
    assert f"longctx aggregate: {raw / '64.json'} is unreadable (" in run.stderr
    assert f"recovered from its intact copy {kept / '64.json'}" in run.stderr
    assert f"longctx aggregate: {raw / '128.json'} is unreadable (" in run.stderr
    assert "length 128 of page1 is reported as failed" in run.stderr


def test_the_exit_verdict_names_each_missing_length_with_its_fix_and_allow_missing_passes(tmp_path):
    """Issue 47, item 2, on a results.csv written by hand: a length with one trial that succeeded is measured; every
    length with none is named once, with its reason, and the fix where the reason will not pass by itself."""
    import pandas as pd

    from longctx.analysis.aggregate import run_verdict

    refused = "not sent: 9000 prompt and 4 output tokens exceed the context length of 8192 tokens the server reports"
    rows = [("a", 64, "ok", None), ("a", 64, "ok", None), ("a", 128, "ok", None), ("a", 128, "failed", "timed out"),
            ("b", 64, "failed", "timed out after 600 s (ReadTimeout)"), ("b", 64, "failed", "timed out after 600 s (ReadTimeout)"),
            ("b", 9000, "failed", refused), ("b", 128, "failed", "HTTP 401: Unauthorized")]
    csv = tmp_path / "results.csv"
    pd.DataFrame(rows, columns=["configuration", "length", "status", "reason"]).to_csv(csv, index=False)
    said = run_verdict(csv)
    assert said.startswith("3 configured length(s) have no successful measurement: b L=64 (timed out after 600 s "
                           "(ReadTimeout)), L=128 (HTTP 401: Unauthorized; fix: the key, configurations.b.api_key_env), "
                           f"L=9000 ({refused}; fix: a server with a longer context, or a shorter `lengths`). "), said
    assert " a L=" not in said and run_verdict(csv, allow_missing=True) is None
    pd.DataFrame(rows[4:], columns=["configuration", "length", "status", "reason"]).to_csv(csv, index=False)
    assert run_verdict(csv, allow_missing=True).startswith("nothing was measured: every length of b failed")
    assert run_verdict(tmp_path / "absent.csv") is None
    # a length its server's death lost is named by the death, not by the transport error it caused
    died = "the server died while measuring length 64 (exit code -9); server log: data/logs/server/c.log"
    pd.DataFrame([("a", 64, "ok", None, None), ("c", 64, "failed", "RemoteProtocolError: Server disconnected", died)],
                 columns=["configuration", "length", "status", "reason", "length_fault"]).to_csv(csv, index=False)
    assert "c L=64 (the server died while measuring length 64 (exit code -9)). " in run_verdict(csv)


def test_a_second_run_while_another_holds_the_lock_names_it_and_says_to_wait(tmp_path):
    """Issue 47, item 5: a run started while another snakemake run in the directory holds the lock on its files
    ends with one line that names that run (pid, command line, how long it has run, its log) and says to wait for
    it, not Snakemake's stock text, which says to --unlock; the holder's lock stands. A dry run, which locks
    nothing, is not refused. The holder is a real snakemake run whose one job (sleep) writes the report's path."""
    work = copy_workflow(tmp_path)
    shutil.copy(TINY, work / "tiny.yaml")
    (work / "hold.smk").write_text('rule hold:\n    output: "report/longctx.pdf"\n    shell: "sleep 60"\n')
    holder = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", "hold.smk", "--cores", "1"], cwd=work, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list((work / ".snakemake" / "locks").glob("*.lock")) and time.monotonic() < deadline:
            assert holder.poll() is None, "the holding run ended"
            time.sleep(0.1)
        locks = sorted((work / ".snakemake" / "locks").glob("*.lock"))
        assert locks
        args = ["report/longctx.pdf", "--configfile", "tiny.yaml"]
        run = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=work, env=ENV,
                             capture_output=True, text=True, timeout=120)
        out = run.stdout + run.stderr
        assert run.returncode == 1, out
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith(f"longctx: the files this run would write in {work} are locked by another snakemake run, "
                               f"pid {holder.pid}, running for "), out
        assert ": python -m snakemake -s hold.smk --cores 1 (its log: .snakemake/log/" in last, last
        assert last.endswith("; wait for it to finish, then run this command again (not --unlock: that run is alive, "
                             "and both would write the same files)"), last
        assert "the --unlock argument" not in out and "LockException" not in out, out  # Snakemake's stock words
        assert holder.poll() is None and all(p.exists() for p in locks)  # the holder and its lock stand
        dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", *args], cwd=work, env=ENV, capture_output=True,
                             text=True, timeout=120)
        assert dry.returncode == 0 and "longctx: the files" not in dry.stdout + dry.stderr, dry.stderr[-3000:]
    finally:
        os.killpg(holder.pid, signal.SIGTERM)
        holder.wait(30)


def test_a_server_listening_beyond_loopback_is_said_on_the_terminal(tmp_path):
    """Issue 47, item 5: a server longctx starts on an address other than loopback (server.host 0.0.0.0, with
    server.allow_remote) is named on the terminal when it comes up, in the bench's own lines (those that reach the
    terminal when the workflow runs it with --log), with whether it asks for a key."""
    from dataclasses import replace

    from .conftest import tiny_spec

    spec = tiny_spec(lengths=[64])
    spec = replace(spec, server={**spec.server, "host": "0.0.0.0", "allow_remote": True},
                   protocol={**spec.protocol, "warmup": 0, "trials": 1, "output_tokens": 2, "concurrency": [],
                             "itl_depth": {"length": None}}, load=None, prefix=None)
    run = longctx("bench", "--spec", spec.to_json(), "--outdir", tmp_path / "raw", "--server-log", tmp_path / "server.log",
                  "--log", tmp_path / "bench.log")
    assert run.returncode == 0, run.stderr
    said = [ln for ln in run.stderr.splitlines() if "reachable from the network" in ln]
    assert len(said) == 1, run.stderr
    assert re.fullmatch(r"longctx bench: page1: the server listens on 0\.0\.0\.0 \(every address of this machine\), port "
                        r"\d+: reachable from the network while it runs \(server\.allow_remote: true\); with no API key, "
                        r"whoever reaches it can send it requests", said[0]), said[0]
