"""Health probes against real HTTP servers on loopback: the first probe that answers 200 is used and
recorded, server.health_path replaces the probes, and a server that answers only errors, or nothing
that listens, fails within seconds with what each path answered (not after the start-up timeout)."""

import contextlib
import json
import time
from pathlib import Path

import pytest

from longctx import config as lcfg
from longctx.measure.process import free_port
from longctx.measure.sweep import run_configuration

from . import openai_servers as servers
from .conftest import tiny_spec

# shared under -n (tests/conftest.py): a failure must be seen within seconds, which the bounds hold with room on a busy
# machine: with two processes spinning on this 2-core machine beside them (twice what the other worker adds) the
# failures came after 0.2 s (bound 5 s), 5.3 and 5.1 s (bound 20 s) and 4.8 s (bound 60 s) (2026-12-07)


@contextlib.contextmanager
def openai_server(codes: dict[str, int], default: int = 404):
    """tests/openai_servers.py's server that takes token ids (one token per chunk, usage last), whose GET
    answers codes[path], else `default`. Yields its base URL and the requests per path."""
    import tempfile

    with tempfile.TemporaryDirectory() as tok, servers.openai_server("no-health", Path(tok), codes, default) as (base, seen):
        yield base, seen.hits


def external_sweep(tmp_path, url: str, **server):
    """One length of an external openai configuration, start-up timeout 300 s: (failed, raw, seconds)."""
    config = lcfg.validate({"lengths": [32], "protocol": {"warmup": 0, "trials": 1, "output_tokens": 3},
                            "model": {"random_weights": True}, "telemetry": {"enabled": False},
                            "server": {"startup_timeout_s": 300, **server},
                            "configurations": {"ext": {"engine": "external", "url": url, "api": "openai"}}})
    t0 = time.monotonic()
    failed = run_configuration(lcfg.configuration_spec(config, "ext"), tmp_path / "raw", tmp_path / "unused.log")
    return failed, json.loads((tmp_path / "raw" / "32.json").read_text()), time.monotonic() - t0


def test_no_health_but_models_answers_is_measured_on_v1_models(tmp_path):
    with openai_server({"/v1/models": 200}) as (base, hits):
        failed, raw, _ = external_sweep(tmp_path, base)
    assert failed == 0 and raw["status"] == "ok"
    assert raw["trials"][0]["prompt_tokens"] == 32 and raw["trials"][0]["completion_tokens"] == 3
    assert raw["provenance"]["health_path"] == "/v1/models"
    assert hits["/health"] >= 1 and hits["/health_generate"] >= 1  # tried in order, before /v1/models
    # the OpenAI API has no cache flush: none is sent, and the record says so (the report then does)
    assert raw["provenance"]["flush_path"] is None and hits.get("/flush_cache", 0) == 0


@pytest.mark.parametrize("codes, default", [({}, 404), ({"/v1/models": 500}, 404)])
def test_a_server_that_answers_only_errors_fails_within_seconds_naming_paths_and_codes(tmp_path, codes, default):
    with openai_server(codes, default) as (base, hits):
        failed, raw, seconds = external_sweep(tmp_path, base)
    print(f"answers only errors {codes or default}: failed after {seconds:.1f} s")
    assert failed == 1 and seconds < 20
    reason = raw["reason"]
    assert "not measured" in reason and base in reason and "configurations.ext.url" in reason
    assert "/health: HTTP 404" in reason and "/health_generate: HTTP 404" in reason
    assert f"/v1/models: HTTP {codes.get('/v1/models', 404)}" in reason
    assert "no answer" not in reason and "after 3 starts" not in reason  # it answered; no restarts of an external server
    if not codes:  # only "not here": at once, and said so
        assert "answers, but not on any health path" in reason and seconds < 5


def test_nothing_listening_fails_within_seconds_as_connection_refused(tmp_path):
    port = free_port()  # nothing binds it
    failed, raw, seconds = external_sweep(tmp_path, f"http://127.0.0.1:{port}")
    print(f"nothing listening: failed after {seconds:.1f} s")
    assert failed == 1 and seconds < 20
    reason = raw["reason"]
    assert f"no answer from http://127.0.0.1:{port}" in reason and "/health: connection refused" in reason
    assert "300 s" not in reason and "after 3 starts" not in reason


def test_server_health_path_alone_is_probed(tmp_path):
    with openai_server({"/v1/models": 200, "/health": 200, "/ready": 200}) as (base, hits):
        failed, raw, _ = external_sweep(tmp_path, base, health_path="/ready")
    assert failed == 0 and raw["provenance"]["health_path"] == "/ready"
    assert hits["/ready"] >= 1 and hits["/health"] == 0 and hits["/health_generate"] == 0


def test_a_managed_server_without_the_configured_health_path_fails_at_once(tmp_path):
    """The reference engine (started here) answers 404 on server.health_path: no wait for the
    start-up timeout and no restarts, the path and its status named, the server stopped."""
    spec = tiny_spec("page1", lengths=[32])
    spec.server.update(health_path="/nope", startup_timeout_s=300, stop_timeout_s=2)
    t0 = time.monotonic()
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 1
    seconds = time.monotonic() - t0
    print(f"managed, no such health path: failed after {seconds:.1f} s")
    reason = json.loads((tmp_path / "raw" / "32.json").read_text())["reason"]
    assert "answers, but not on any health path: /nope: " in reason and "HTTP 404" in reason and seconds < 60
    assert sum(line.startswith("$ ") for line in (tmp_path / "server.log").read_text().splitlines()) == 1  # one start


def test_a_managed_server_records_its_chosen_health_path(tmp_path):
    spec = tiny_spec("page1", lengths=[32])
    spec.protocol.update(warmup=0, trials=1, output_tokens=3)
    spec.server.update(health_path="/health_generate", stop_timeout_s=2)
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    prov = json.loads((tmp_path / "raw" / "32.json").read_text())["provenance"]
    assert prov["health_path"] == "/health_generate"
    assert prov["flush_path"] == "/flush_cache"  # SGLang's API, which the reference engine serves, flushes there


def test_a_start_up_timeout_under_a_second_is_said_as_it_was_given(tmp_path):
    """server.startup_timeout_s 0.5 and nothing listening: the reason says "within 0.5 s", not "within 0 s"."""
    port = free_port()
    failed, raw, _ = external_sweep(tmp_path, f"http://127.0.0.1:{port}", startup_timeout_s=0.5)
    assert failed == 1 and f"no answer from http://127.0.0.1:{port} within 0.5 s" in raw["reason"], raw["reason"]
