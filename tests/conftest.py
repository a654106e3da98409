from __future__ import annotations

import contextlib
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
    """tests/configs/tiny.yaml run locally through the whole workflow, once per session (the
    workflow tests read it; the SLURM test compares its own run with it)."""
    work = copy_workflow(tmp_path_factory.mktemp("wf"))
    shutil.copy(TINY, work / "tiny.yaml")
    with CommandLines() as seen:  # every process's command line while it runs (tests/test_secrets.py reads them)
        TINY_RUN["console"] = snakemake(work, *CORES, "--configfile", "tiny.yaml")  # the PDF and its twin
    TINY_RUN["command_lines"] = seen
    return work


TINY_RUN: dict = {}  # the tiny workflow's console output and the command lines seen while it ran


class CommandLines(set):
    """The command lines of every process on this machine, sampled every 0.2 s while the block runs."""

    def __enter__(self) -> "CommandLines":
        import psutil

        self._done = threading.Event()

        def watch():
            while not self._done.is_set():
                for proc in psutil.process_iter(["cmdline"]):
                    self.add(" ".join(proc.info["cmdline"] or []))
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
