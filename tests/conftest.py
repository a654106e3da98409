from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from longctx import config as lcfg
from longctx.engines import ConfigurationSpec
from longctx.measure.process import ManagedServer, free_port

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "configs" / "tiny.yaml"
TINY_ARCH = lcfg.load(TINY)["model"]["architecture"]


WORKFLOW_FILES = ("Snakefile", "rules", "config", "kernels", "templates", "envs", "profiles")
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


# `make test` runs the suite on two pytest workers (pytest-xdist, -n 2). A module whose assertions rest on the timings it
# measures (a prediction against a measurement, two runs compared, a speedup) is marked `alone`: each of its tests, with
# the module's fixtures it sets up, holds the machine alone (an exclusive lock; the other worker waits between its own
# tests). Every other test shares the machine, two at a time: its assertions hold however slow the cores are.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: nothing to share the machine with
        yield
        return
    # the run's own directory, above each worker's basetemp (.../popen-gw0): the workers' locks, removed with it
    with machine(item.config._tmp_path_factory.getbasetemp().parent, alone=alone(item), test=item.nodeid):
        yield


def alone(item) -> bool:
    mark = item.get_closest_marker("alone")  # alone(False) on a test: shared, in a module marked alone
    return bool(mark and (mark.args or (True,))[0])


class _PerThread(threading.local):
    """A dict of each thread's own: under -n each worker is a process running one test at a time; tests/test_suite_lock.py
    plays the workers as threads of one process."""

    def __init__(self):
        self.d: dict = {}

    def get(self, key, default=None):
        return self.d.get(key, default)

    def update(self, **kw):
        self.d.update(kw)

    def clear(self):
        self.d.clear()

    def __getitem__(self, key):
        return self.d[key]

    def __bool__(self):
        return bool(self.d)


HELD = _PerThread()  # this worker's lock on the machine while a test runs, and whether it is held alone


def timeline(event: str, test: str | None = None) -> None:
    """One line of the suite's timeline (LONGCTX_SUITE_TIMELINE: a file; bench/suite_timeline.py reads it): when each
    worker waited for, took, shared and let go of the machine, so that the time the other worker stood waiting is
    measured, not guessed."""
    path = os.environ.get("LONGCTX_SUITE_TIMELINE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"t": time.time(), "worker": os.environ.get("PYTEST_XDIST_WORKER"), "event": event,
                                "test": test or HELD.get("test")}) + "\n")


@contextlib.contextmanager
def machine(run: Path, alone: bool, test: str | None = None):
    """The machine for one test among the run's workers: alone (exclusive) or shared. A test that asks for it alone
    holds the gate while it waits, so that no shared test starts past it (no worker waits forever for the other's
    stream of shared tests to end)."""
    with open(run / "machine.gate", "a") as gate, open(run / "machine.lock", "a") as lock:
        timeline("wait", test)
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        HELD.update(lock=lock, alone=alone, gate=run / "machine.gate", test=test)
        timeline("alone" if alone else "shared")
        try:
            yield
        finally:
            timeline("done")
            HELD.clear()
            fcntl.flock(lock, fcntl.LOCK_UN)


def share_the_machine() -> None:
    """A test marked alone whose measuring is done (what is left makes a report of what was measured): the other worker
    may run its tests beside the rest of it. Nothing where the suite runs in one process."""
    if HELD.get("alone"):
        fcntl.flock(HELD["lock"], fcntl.LOCK_SH)
        HELD.update(alone=False)
        timeline("shared")


def alone_again() -> None:
    """A test holding the machine shared, about to measure: it holds the machine alone from here. A test marked alone
    that shared it (share_the_machine) while it made a report, and measures again; or a module fixture that measures,
    set up by whichever of its tests comes first, one that shares the machine because its own body times nothing
    (measuring()). Its shared lock is let go first, then the gate taken as machine() takes it, so that two workers
    doing this at once wait for each other's test and never for each other's lock. Nothing where the suite runs in one
    process, or for a test that holds the machine alone already."""
    if not HELD or HELD.get("alone"):
        return
    fcntl.flock(HELD["lock"], fcntl.LOCK_UN)
    timeline("wait")
    with open(HELD["gate"], "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(HELD["lock"], fcntl.LOCK_EX)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
    HELD.update(alone=True)
    timeline("alone")


@contextlib.contextmanager
def measuring():
    """What a module fixture measures: held alone (alone_again) whichever test sets it up, then the machine shared for
    the rest (share_the_machine), so that the tests that only read what it measured may be marked alone(False) and run
    beside the other worker's tests."""
    alone_again()
    yield
    share_the_machine()


def pytest_collection_modifyitems(config, items):
    """Under -n (make test: --dist loadfile, each module's tests on one worker, so that its module fixtures, a server or
    a whole workflow run, are set up once): the modules with a test that holds the machine alone go first, FIRST of
    them first (one to each worker, their long start-ups beside each other); then the rest two at a time: first
    BETWEEN, whose tests are short, while the other worker ends its last tests held alone; then the longest
    (LONGEST_SHARED), so that the run does not end on one of them while the other worker has nothing left to do.
    A test held alone among those that share waits for the other worker's test to end, its own worker idle: in a
    timeline of 2026-12-08, tests/test_prompts.py's, behind tests/test_faults.py's tests of 10 s each, waited 52 s."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        holds_alone = {_module(item) for item in items if alone(item)}

        def order(item) -> tuple:
            name = _module(item)
            first = FIRST.index(name) if name in FIRST else len(FIRST)
            shared = ((0, BETWEEN.index(name)) if name in BETWEEN else
                      (1, LONGEST_SHARED.index(name)) if name in LONGEST_SHARED else (2, 0))
            return (name not in holds_alone, first, shared)

        items.sort(key=order)  # stable: each module's own order kept


# the modules held alone whose set-ups share the machine longest (model conversions, vLLM's and llama.cpp's start-ups,
# a vLLM that fails to start: 40 to 60 s each; bench/suite_timeline.py, 2026-12-07): at the run's start, one on each
# worker, they share it with each other, where later the other worker waited for them to end (55 s and 43 s)
FIRST = ("test_realmodel", "test_thirdparty")

# shared modules of short tests (5 s and less each; 106 s in all in a timeline of 2026-12-08), the first handed out once
# a worker has no module with a test held alone left: the other worker's last tests held alone each wait for the test
# it runs to end, and there it had started tests/test_workflow.py, whose first test (the tiny workflow, 82 s) held the
# last test of tests/test_telemetry.py waiting 82 s
BETWEEN = ("test_health", "test_engines", "test_prediction", "test_load_report", "test_analysis", "test_refengine",
           "test_config")

# the modules without timings of their own that take longest (make test's --durations, 2026-12-06: 100 to 130 s each);
# the other shared modules take 30 s and less
LONGEST_SHARED = ("test_workflow", "test_terminal", "test_slurm", "test_faults")


def _module(item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""


def bench_script(name: str):
    """bench/<name>.py as a module (the bench scripts are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_workflow(dest: Path) -> Path:
    """The workflow's own files in a fresh directory, so a test run starts with no data/."""
    for name in WORKFLOW_FILES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, dest / name)
    return dest


# The suite's whole-workflow runs take two cores: a bench job, the calibration and a kernel's benchmark claim every core
# Snakemake is given (threads: workflow.cores), so each still runs alone, and the stages after them (aggregation, fits,
# the figures, the report) run two at a time: a report's stages took 20 s so and 33 s on one core (issue 54: the suite
# under 20 minutes). What is measured is the same as with the README's --cores 1; only the order of the rest differs.
CORES = ("--cores", "2")


def snakemake(cwd, *args, check=True, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{out[-6000:]}")
    return out


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory):
    """tests/configs/tiny.yaml run locally through the whole workflow, once per run (the workflow tests read it; the
    SLURM test compares its own run with it; the secrets test greps it). Under -n the first worker to ask runs it in the
    run's own directory while the other waits, and each takes a copy of its own (its tests run the workflow again in
    it): a session fixture is otherwise made once per worker, and in three of the four clean clones of 2026-12-07
    tests/test_secrets.py's worker made its own, 45-52 s of the machine near the run's end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _tiny_run(tmp_path_factory.mktemp("wf"))
    run = tmp_path_factory.getbasetemp().parent  # the run's own directory, above each worker's basetemp
    done, once = run / "tiny-workflow.json", run / "tiny-workflow"
    with open(run / "tiny-workflow.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held by the worker running it
        try:
            if not done.exists():
                shutil.rmtree(once, ignore_errors=True)  # what a run that failed left
                _tiny_run(once)
                done.write_text(json.dumps({"console": TINY_RUN["console"],
                                            "command_lines": sorted(TINY_RUN["command_lines"])}))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    kept = json.loads(done.read_text())
    TINY_RUN.update(console=kept["console"], command_lines=set(kept["command_lines"]))
    work = tmp_path_factory.mktemp("wf")
    shutil.copytree(once, work, symlinks=True, dirs_exist_ok=True)  # the files' times kept: nothing is out of date
    return work


def _tiny_run(work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    copy_workflow(work)
    shutil.copy(TINY, work / "tiny.yaml")
    with CommandLines() as seen:  # every process's command line while it runs (tests/test_secrets.py reads them)
        TINY_RUN["console"] = snakemake(work, *CORES, "--configfile", "tiny.yaml")  # the PDF and its twin
    TINY_RUN["command_lines"] = seen
    return work


TINY_RUN: dict = {}  # the tiny workflow's console output and the command lines seen while it ran


class CommandLines(set):
    """The command lines of every process this test process started (its descendants: the workflow, its jobs, their
    servers; nothing longctx starts leaves the tree), sampled every 0.2 s while the block runs. Not the machine's every
    process: under -n the other worker's tests run beside it, and theirs are not this run's."""

    def __enter__(self) -> "CommandLines":
        import psutil

        self._done = threading.Event()

        def watch():
            while not self._done.is_set():
                for proc in psutil.Process().children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        self.add(" ".join(proc.cmdline()))
                time.sleep(0.2)

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


@contextlib.contextmanager
def serve_generate(handler):
    """A test's own server on loopback (uvicorn in a thread) whose POST /generate is handler; yields its base URL."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Route

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/generate", handler, methods=["POST"])]),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def tiny_spec(configuration: str = "page1", **overrides) -> ConfigurationSpec:
    # kernel_build None: the engine's default, kernels/reference in this checkout
    return replace(lcfg.configuration_spec(lcfg.load(TINY), configuration), **{"kernel_build": None, **overrides})


def refengine_command(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "longctx.refengine", "--port", str(port),
            "--json-model-override-args", json.dumps(TINY_ARCH), "--context-length", "2048",
            "--max-total-tokens", "4096", *extra]


@pytest.fixture(scope="module")
def ref_server(tmp_path_factory):
    """A real reference engine on loopback (tiny model), stopped by its process group."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = ManagedServer(refengine_command(port, "--page-size", "4", "--kv-alloc-order", "random", "--enable-metrics"), log)
    server.start()
    try:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        yield {"base": f"http://127.0.0.1:{port}", "server": server, "log": log}
    finally:
        server.stop()
