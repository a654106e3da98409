"""GuideLLM's JSON report read as runs of requests (longctx.measure.imports.guidellm), on files GuideLLM 0.8.1
itself wrote against the reference engine (tests/data/imports/guidellm/README.md says how)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longctx.measure.imports import guidellm
from longctx.measure.imports.records import LACKS

DATA = Path(__file__).parent / "data" / "imports" / "guidellm"


def raw(name: str) -> dict:
    return json.loads((DATA / name).read_text())["benchmarks"][0]


def weighted_median(values: list[float], weights: list[float]) -> float:
    """GuideLLM's median (schemas/base/statistics.py): the first sorted value whose weighted CDF reaches 0.5."""
    pairs = sorted(zip(values, weights))
    total, acc = sum(weights), 0.0
    for v, w in pairs:
        acc += w
        if acc / total >= 0.5:
            return v
    raise AssertionError("empty")


@pytest.mark.parametrize("length", [64, 128, 256])
def test_lengths_read_by_hand(length):
    (run,) = guidellm.read(DATA / f"guidellm-{length}.json")
    assert run.tool == "GuideLLM" and run.tool_version == "0.8.1"
    assert run.version_source == "the file's metadata.guidellm_version"
    assert run.requested_input_tokens == length and run.concurrency == 1 and run.request_rate is None
    assert run.model == "refmla"
    assert run.label == f"synchronous (one at a time), synthetic_text, prompts of {length} tokens, 8 output tokens"
    assert len(run.requests) == 3 and all(q.ok for q in run.requests)
    assert all(q.prompt_tokens == length and q.completion_tokens == 8 for q in run.requests)
    starts = [q.start_s for q in run.requests]
    assert starts == sorted(starts)
    # from the file, by hand: the raw timings, not the tool's computed fields
    for q, r in zip(run.requests, sorted(raw(f"guidellm-{length}.json")["requests"]["successful"],
                                         key=lambda r: r["info"]["timings"]["request_start"])):
        t = r["info"]["timings"]
        assert q.start_s == t["request_start"]
        assert q.ttft_s == pytest.approx(t["first_token_iteration"] - t["request_start"], abs=1e-6)
        assert q.e2e_s == pytest.approx(t["request_end"] - t["request_start"], abs=1e-6)
        assert q.tpot_s == pytest.approx((t["last_token_iteration"] - t["first_token_iteration"]) / 7, abs=1e-6)
        assert t["token_iterations"] == 8


def test_values_quoted_from_the_files():
    (r64,) = guidellm.read(DATA / "guidellm-64.json")
    # guidellm-64.json, requests.successful[0]: request_start 1796172370.595014, first_token_iteration
    # 1796172370.7270038, time_to_first_token_ms 131.9897174835205, request_latency 0.150986909866333,
    # cached_tokens null (the engine reports cached tokens only where some were cached)
    first = r64.requests[0]
    assert first.start_s == 1796172370.595014
    assert first.ttft_s == pytest.approx(0.1319897174835205)
    assert first.e2e_s == pytest.approx(0.150986909866333)
    assert first.cached_tokens is None and first.prompt_tokens_source == "tool or server"
    # guidellm-128.json, the first request: "1 0 m0 Finish medical ..." as in the 64-token run (seed 42), so the
    # engine served its first 64 tokens from its cache: usage's cached_tokens 64
    (r128,) = guidellm.read(DATA / "guidellm-128.json")
    assert [q.cached_tokens for q in r128.requests] == [64, 7, 7]
    assert all(q.prompt_tokens_source == "server" for q in r128.requests)  # cached_tokens comes only from usage
    (r256,) = guidellm.read(DATA / "guidellm-256.json")
    assert r256.requests[0].cached_tokens == 128


@pytest.mark.parametrize("name", ["guidellm-64.json", "guidellm-128.json", "guidellm-256.json",
                                  "guidellm-errored.json", "guidellm-incomplete.json"])
def test_tool_summary_agrees_with_the_requests(name):
    (run,) = guidellm.read(DATA / name)
    ok = [q for q in run.requests if q.ok]
    s = run.tool_summary
    assert s["completed"] == len(ok) and s["failed"] + s["incomplete"] == len(run.requests) - len(ok)
    ttfts = [q.ttft_s for q in ok]
    assert s["median_ttft_s"] == pytest.approx(weighted_median(ttfts, [1] * len(ok)), rel=1e-9)
    assert s["mean_ttft_s"] == pytest.approx(sum(ttfts) / len(ttfts), rel=1e-9)
    # GuideLLM's ITL distribution weighs each request by its output tokens after the first
    w = [q.completion_tokens - 1 for q in ok]
    assert s["mean_itl_s"] == pytest.approx(sum(q.tpot_s * k for q, k in zip(ok, w)) / sum(w), rel=1e-9)
    assert s["median_itl_s"] == pytest.approx(weighted_median([q.tpot_s for q in ok], w), rel=1e-9)
    assert s["median_e2el_s"] == pytest.approx(weighted_median([q.e2e_s for q in ok], [1] * len(ok)), rel=1e-9)


def test_an_even_count_takes_the_lower_middle():
    # guidellm-errored.json: two successful TTFTs, 91.536 and 114.006 ms; GuideLLM's median is 91.536 ms
    (run,) = guidellm.read(DATA / "guidellm-errored.json")
    assert run.tool_summary["median_ttft_s"] == pytest.approx(0.09153628349304199)
    assert sorted(q.ttft_s for q in run.requests if q.ok) == pytest.approx([0.09153628349304199, 0.11400604248046875])


def test_errored_request_is_kept_with_the_tools_error():
    (run,) = guidellm.read(DATA / "guidellm-errored.json")
    assert run.requested_input_tokens is None  # prompts of 2040 ± 16 tokens: a distribution, not one length
    assert run.label == "synchronous (one at a time), synthetic_text, prompts of 2040 ± 16 (2020-2060) tokens, 8 output tokens"
    failed = [q for q in run.requests if not q.ok]
    assert len(failed) == 1
    (q,) = failed
    # requests.errored[0]: prompt_tokens 2053 (GuideLLM's own: the engine answered 400, no usage), error
    # "HTTPStatusError(\"Client error '400 Bad Request' for url ..."; it was sent first, so it is first here
    assert run.requests[0] is q
    assert q.prompt_tokens == 2053 and q.prompt_tokens_source == "tool" and q.completion_tokens is None
    assert q.reason.startswith("HTTPStatusError(\"Client error '400 Bad Request' for url")
    assert q.ttft_s is None and q.e2e_s is None
    assert [r.prompt_tokens for r in run.requests if r.ok] == [2032, 2028]


def test_incomplete_request_is_a_failed_row_with_why():
    (run,) = guidellm.read(DATA / "guidellm-incomplete.json")
    assert [q.ok for q in run.requests] == [True, False]
    done, cut = run.requests
    assert done.completion_tokens == 500 and done.e2e_s == pytest.approx(2.092440605163574)
    # requests.incomplete[0]: status cancelled, error "Request was cancelled", token_iterations 200; the run
    # stopped at --constraint kind=max_duration,seconds=2.5
    assert cut.reason == ("incomplete: GuideLLM cancelled it in flight when the benchmark stopped at its "
                          "max_duration limit, after 200 text chunks (Request was cancelled)")
    assert cut.prompt_tokens == 512 and cut.prompt_tokens_source == "tool" and cut.completion_tokens is None
    assert run.tool_summary["incomplete"] == 1 and run.tool_summary["completed"] == 1


def test_lacks():
    for name in ("guidellm-64.json", "guidellm-errored.json"):
        (run,) = guidellm.read(DATA / name)
        assert set(run.lacks) <= set(LACKS)
        assert {"token_times", "cache_busting", "exact_prompt_lengths"} <= set(run.lacks)
        assert "server_counts" not in run.lacks  # some requests carry the engine's cached_tokens
        assert "seed" in run.lacks["cache_busting"]
    (r128,) = guidellm.read(DATA / "guidellm-128.json")
    assert "exact_prompt_lengths" not in r128.lacks  # every request's usage came (each has cached_tokens)


def test_started_at_is_the_benchmarks_wall_clock_start():
    # guidellm-64.json, benchmarks[0].start_time 1796172370.595014 (time.time(), UTC)
    (run,) = guidellm.read(DATA / "guidellm-64.json")
    assert run.started_at == "2026-12-02T00:46:10.595014+00:00"


def test_wrong_files_are_refused(tmp_path):
    vllm = Path(__file__).parent / "data" / "imports" / "vllm-bench" / "vllm-bench-64.json"
    with pytest.raises(ValueError, match="not a GuideLLM result file.*no benchmarks list"):
        guidellm.read(vllm)
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a GuideLLM result file: not JSON"):
        guidellm.read(bad)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"benchmarks": [{"requests": {"successful": [{"start_time": 1.0, "first_token_time": 1.1}]}}]}))
    with pytest.raises(ValueError, match="without info.timings"):
        guidellm.read(old)
