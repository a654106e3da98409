"""vLLM's CPU build as a real third-party server for the tests (tests/test_thirdparty.py with a tiny random
Llama, tests/test_realmodel.py with a trained one): where its Python is (`make test` puts it in .venv-vllm
and points LONGCTX_VLLM_PYTHON at it), starting it as the workflow starts it, and reading its own
Prometheus record."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from longctx.engines import ConfigurationSpec, get_adapter

VLLM_PYTHON = os.environ.get("LONGCTX_VLLM_PYTHON")


def require_vllm() -> str:
    """The vLLM Python; skips the calling test module where there is none (an error where make test asks for it)."""
    if not (VLLM_PYTHON and Path(VLLM_PYTHON).exists()):
        if os.environ.get("LONGCTX_REQUIRE_ENGINE_PARSERS"):
            raise RuntimeError(f"LONGCTX_VLLM_PYTHON={VLLM_PYTHON!r} is not a Python with vLLM: run `make vllm`")
        pytest.skip("vLLM's CPU build is not installed here (make test installs it)", allow_module_level=True)
    return VLLM_PYTHON


def start_vllm(spec: ConfigurationSpec, log_dir: Path) -> dict:
    """vLLM started as the workflow starts it (the adapter's command line and environment, its API key where the spec
    names one) for `spec`, its log in
    log_dir/server.log; not yet waited for. The caller stops it (`server`: its process group)."""
    from longctx.measure.process import ManagedServer, free_port
    from longctx.measure.session import server_env

    adapter = get_adapter("vllm")
    port = free_port()
    log = log_dir / "server.log"
    command, env = adapter.with_api_key(adapter.launch_command(spec, "127.0.0.1", port, None), server_env(spec), spec.api_key())
    server = ManagedServer(command, log, env=env)
    server.start()
    return {"base": f"http://127.0.0.1:{port}", "port": port, "model": adapter.served_model(spec), "log": log, "server": server}


@contextlib.contextmanager
def serving(started: dict):
    """A vLLM from start_vllm, once it answers /health (up to 300 s): its base, model and log; stopped by its
    process group on leaving."""
    server = started.pop("server")
    try:
        server.wait_ready(started["base"], ("/health",), 300, port=started.pop("port"))
        yield started
    finally:
        server.stop()


TTFT_METRIC = "vllm:time_to_first_token_seconds"


def ttft_histogram(text: str) -> tuple[float, float]:
    """vLLM's TTFT histogram, summed over its label sets: (sum of seconds, count of requests)."""
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == TTFT_METRIC:
            for s in family.samples:
                if s.name == TTFT_METRIC + "_sum":
                    total += s.value
                elif s.name == TTFT_METRIC + "_count":
                    count += s.value
    return total, count


def counter(text: str, name: str) -> float:
    """A vLLM Prometheus counter, summed over its label sets."""
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name + "_total")
