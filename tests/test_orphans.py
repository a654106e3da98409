"""No orphan (issue 16, item 1): whatever kills the bench, its server dies with it, and a server an
earlier run left behind is found by its pid file and stopped at the next start. Every check is by pid
on real processes: the reference engine started by a real `longctx bench`, real signals."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import psutil
import pytest
import yaml

from longctx.measure.process import ManagedServer, pid_file, reap_stray
from longctx.measure.rerun import clear_stale_locks
from longctx.measure.sweep import run_configuration

from .conftest import ENV, TINY, copy_workflow, share_the_machine, tiny_spec

# alone under -n (tests/conftest.py): a signal must land while the sweep runs
pytestmark = [pytest.mark.alone, pytest.mark.slow]


def gone(pid: int, within_s: float = 30) -> bool:
    """The process exited (a zombie waiting for a parent that is not us counts as exited)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def wait_for_server(log, within_s: float = 90) -> int:
    """The pid of the server a bench started, once it answers (its pid file and a measured trial)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            return json.loads(pid_file(log).read_text())["pid"]
        except (OSError, ValueError):
            time.sleep(0.2)
    raise AssertionError(f"no server pid file beside {log}")


def long_spec():
    spec = tiny_spec("page1", lengths=[64])
    return replace(spec, protocol={**spec.protocol, "warmup": 0, "trials": 2000, "output_tokens": 8})


def test_sigkill_of_the_bench_takes_its_server_with_it(tmp_path):
    log = tmp_path / "server.log"
    bench = subprocess.Popen([sys.executable, "-m", "longctx.cli", "bench", "--spec", long_spec().to_json(),
                              "--outdir", str(tmp_path / "raw"), "--server-log", str(log)],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        server = wait_for_server(log)
        assert psutil.Process(server).ppid() == bench.pid
        bench.kill()  # SIGKILL: no handler runs
        bench.wait(10)
        assert gone(server), f"server {server} outlived its bench"
    finally:
        if bench.poll() is None:
            bench.kill()
        reap_stray(pid_file(log), 5)  # a server this test failed on must not outlive it either


def test_a_server_runs_in_the_clients_session_in_a_process_group_of_its_own(tmp_path):
    """Its own group, by which it is stopped; the client's session, so the client's autogroup: in a session of its own,
    Linux (CONFIG_SCHED_AUTOGROUP) shares the CPUs between the server's session and the client's before their tasks,
    and vLLM's CPU build on 2 cores kept the client, runnable, off the CPUs for up to 1 s at a time (issue 32)."""
    server = ManagedServer([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "server.log")
    server.start()
    try:
        assert os.getpgid(server.pid) == server.pid != os.getpgid(0)
        assert os.getsid(server.pid) == os.getsid(0)
    finally:
        server.stop()
    assert gone(server.pid)


def test_a_server_left_behind_is_stopped_at_the_next_start(tmp_path):
    log = tmp_path / "server.log"
    # a server that ignores SIGTERM, in a session of its own, recorded as this configuration's
    stray = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "time.sleep(600)"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        time.sleep(0.3)
        created = psutil.Process(stray.pid).create_time()
        # a pid file whose process started later than the one there now is a reused pid: left alone
        pid_file(tmp_path / "other.log").write_text(json.dumps({"pid": other.pid, "create_time": time.time() + 60}))
        assert reap_stray(pid_file(tmp_path / "other.log")) is None and other.poll() is None
        pid_file(log).write_text(json.dumps({"pid": stray.pid, "create_time": created, "command": ["stray-server"]}))
        spec = tiny_spec("page1", lengths=[32])
        spec.protocol.update(warmup=0, trials=1, output_tokens=3)
        spec.server.update(stop_timeout_s=2)
        assert run_configuration(spec, tmp_path / "raw", log) == 0
        stray.wait(10)  # ours to reap: it was our child
        raw = json.loads((tmp_path / "raw" / "32.json").read_text())
        assert raw["provenance"]["stray_server"].startswith(f"stopped a server an earlier run left running (process group {stray.pid}")
        assert "stray-server" in raw["provenance"]["stray_server"]
        assert not pid_file(log).exists()  # this run's server stopped too
    finally:
        for p in (stray, other):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=["SIGHUP", "Ctrl-C"])
def test_an_interrupted_workflow_leaves_no_server_and_the_same_command_resumes_it(tmp_path, sig):
    """A closed terminal (SIGHUP) or Ctrl-C (SIGINT) to snakemake's whole process group, after the
    first length was measured: no server is left (by pid), Ctrl-C exits 130, and the same command then runs to
    the end (no --unlock, no --rerun-incomplete), reusing the length measured before."""
    work = copy_workflow(tmp_path)
    config = yaml.safe_load(TINY.read_text())
    # 12 trials of 96 tokens: a length takes about a second here, so that the signal, sent once the first is kept,
    # finds the sweep at its second or third
    config.update(lengths=[64, 128, 256], protocol={**config["protocol"], "warmup": 0, "trials": 12, "output_tokens": 96,
                                                     "concurrency": [], "itl_depth": {"length": None}})
    config["configurations"] = {"page1": config["configurations"]["page1"]}
    (work / "int.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "snakemake", "--cores", "1", "data/raw/page1/256.json", "--configfile", "int.yaml"]
    console = open(tmp_path / "console.txt", "w")  # what the user's terminal shows
    # SIGINT and SIGHUP as at a user's terminal, even where the suite runs with them ignored (nohup, a shell's
    # background job): ignored signals are inherited, and snakemake and the bench would never see the signal
    snake = subprocess.Popen(command, cwd=work, env=ENV, stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)])
    log = work / "data" / "logs" / "server" / "page1.log"
    try:
        t0 = time.monotonic()
        server = wait_for_server(log, 240)
        t_server = time.monotonic() - t0
        locks = sorted((work / ".snakemake" / "locks").glob("*.lock"))
        assert locks and clear_stale_locks(work) is None and all(p.exists() for p in locks)  # held by a live run
        t_locks = time.monotonic() - t0
        deadline = time.monotonic() + 120
        while not (work / "data" / "partial" / "page1" / "64.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        t_seen = time.monotonic() - t0
        os.killpg(snake.pid, sig)  # at once, once the first length is kept
        when = f"server up {t_server:.2f} s, locks checked {t_locks:.2f} s, first length seen {t_seen:.2f} s"
        assert not (work / "data" / "partial" / "page1" / "256.json").exists(), f"the sweep ended before the signal ({when})"
        snake.wait(60)
        share_the_machine()  # the signal landed mid-sweep: what is left (the rerun) times nothing
        console.close()
        assert gone(server), f"server {server} outlived the workflow"
        said = (tmp_path / "console.txt").read_text()
        # on Ctrl-C the bench says, in one line, that the same command resumes (on SIGHUP nobody reads the terminal,
        # and Snakemake may be gone before the bench's line); no traceback of ours either way
        if sig == signal.SIGINT:
            assert "longctx bench: interrupted; the lengths measured so far are kept, and the same command resumes" in said, \
                f"{when}\n{said}"
            # and the run exits 130, the shell's convention for Ctrl-C, once Snakemake cancelled its jobs (issue 47, item 5)
            assert snake.returncode == 130, f"{when}\n{said}"
            assert said.strip().splitlines()[-1].startswith(
                "longctx: interrupted; the jobs were stopped, what they measured is kept, and the same command resumes "
                f"(Snakemake's log: {work / '.snakemake' / 'log'}/"), said
        assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
        assert list((work / ".snakemake" / "locks").glob("*.lock")) or sig == signal.SIGINT  # SIGHUP leaves the lock
        again = subprocess.run(command, cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads((work / "data" / "raw" / "page1" / "64.json").read_text()).get("resumed") is True
        assert json.loads((work / "data" / "raw" / "page1" / "256.json").read_text())["status"] == "ok"
    finally:
        if snake.poll() is None:
            os.killpg(snake.pid, signal.SIGKILL)
        reap_stray(pid_file(log), 5)
