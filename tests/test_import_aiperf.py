"""The AIPerf reader (longctx.measure.imports.aiperf) on files AIPerf 0.13.0 itself wrote.

The files under tests/data/imports/aiperf/ were made by `aiperf profile` against longctx's reference
engine (tests/data/imports/aiperf/README.md gives the commands). The truth here is read by hand from
those files (quoted below) or is AIPerf's own summary, profile_export_aiperf.json, which the reader
does not use to fill the requests.
"""

import json
import pathlib
import statistics

import pytest

from longctx.measure.imports import aiperf
from longctx.measure.imports.records import LACKS

DATA = pathlib.Path(__file__).parent / "data" / "imports" / "aiperf"
WITH_SUMMARY = ["isl64", "isl128", "isl256", "isl296sd8"]


def one(name):
    runs = aiperf.read(DATA / name / "profile_export.jsonl")
    assert len(runs) == 1
    return runs[0]


def test_first_request_read_by_hand():
    # isl64/profile_export.jsonl, line 1:
    #   "request_start_ns":1796172051278290088, "time_to_first_token":{"value":60.059976999999996,"unit":"ms"},
    #   "request_latency":{"value":140.101203,"unit":"ms"},
    #   "inter_chunk_latency":{"value":[15.652235,3.951901,2.683255,8.211897,17.755789,7.783809,24.00234],"unit":"ms"},
    #   "usage_prompt_tokens":64, "usage_completion_tokens":8, "input_sequence_length":64
    run = one("isl64")
    q = run.requests[0]
    assert q.ok and q.reason is None
    assert q.ttft_s == pytest.approx(0.060059977)
    assert q.e2e_s == pytest.approx(0.140101203)
    assert q.start_s == pytest.approx(1796172051.278290088)
    gaps = [15.652235, 3.951901, 2.683255, 8.211897, 17.755789, 7.783809, 24.00234]
    assert len(q.token_times_s) == 8 and q.itl_s is None and q.tpot_s is None
    assert q.token_times_s[0] == q.ttft_s
    assert [b - a for a, b in zip(q.token_times_s, q.token_times_s[1:])] == pytest.approx([g / 1e3 for g in gaps])
    assert q.token_times_s[-1] == pytest.approx(q.e2e_s)  # AIPerf's latency ends at the last content chunk
    assert (q.prompt_tokens, q.prompt_tokens_source) == (64, "server")
    assert (q.completion_tokens, q.completion_tokens_source) == (8, "server")
    assert q.cached_tokens is None
    assert run.tool == "AIPerf" and run.tool_version == "0.13.0"
    assert run.requested_input_tokens == 64 and run.concurrency == 1 and run.request_rate is None
    assert run.model == "refmla"
    assert run.started_at.startswith("2026-12-02T00:40:51")


@pytest.mark.parametrize("name", WITH_SUMMARY)
def test_against_aiperfs_own_summary(name):
    run = one(name)
    ok = [q for q in run.requests if q.ok]
    s = run.tool_summary
    assert s["completed"] == len(ok)
    assert s.get("failed", 0) == len(run.requests) - len(ok)
    assert statistics.median(q.ttft_s for q in ok) == pytest.approx(s["median_ttft_s"], rel=1e-9)
    assert statistics.mean(q.ttft_s for q in ok) == pytest.approx(s["mean_ttft_s"], rel=1e-9)
    assert statistics.median(q.e2e_s for q in ok) == pytest.approx(s["median_e2e_s"], rel=1e-9)
    # AIPerf's inter_token_latency is (latency - TTFT) / (OSL - 1) a request, vLLM's TPOT
    tpot = [(q.e2e_s - q.ttft_s) / (q.completion_tokens - 1) for q in ok]
    assert statistics.median(tpot) == pytest.approx(s["median_tpot_s"], rel=1e-9)
    # its inter_chunk_latency, every gap of every request, is the per-chunk ITL
    gaps = [b - a for q in ok for a, b in zip(q.token_times_s, q.token_times_s[1:])]
    assert statistics.median(gaps) == pytest.approx(s["median_itl_s"], rel=1e-6, abs=1e-12)
    assert statistics.mean(gaps) == pytest.approx(s["mean_itl_s"], rel=1e-6)
    assert sum(q.completion_tokens for q in ok) == s["total_output_tokens"]
    assert sum(q.prompt_tokens for q in ok) == s["total_input_tokens"]
    summary = json.loads((DATA / name / "profile_export_aiperf.json").read_text())
    assert summary["time_to_first_token"]["unit"] == "ms"
    assert s["median_ttft_s"] == pytest.approx(summary["time_to_first_token"]["p50"] / 1e3)


def test_lacks_and_what_is_there():
    run = one("isl64")
    assert set(run.lacks) <= set(LACKS)
    assert "exact_prompt_lengths" not in run.lacks and "token_times" not in run.lacks
    assert "no --cache-bust" in run.lacks["cache_busting"]
    assert "cached count" in run.lacks["server_counts"]
    # the 128 run: its prompts begin with the 64 run's (the same --random-seed picks the same corpus
    # offsets), so the engine's prefix cache served 64 tokens of each: usage_prompt_cache_read_tokens 64
    run = one("isl128")
    assert [q.cached_tokens for q in run.requests] == [64, 64, 64]
    assert "server_counts" not in run.lacks
    short = [d["payloads"][0]["prompt"] for d in json.loads((DATA / "isl64" / "inputs.json").read_text())["data"]]
    long = [d["payloads"][0]["prompt"] for d in json.loads((DATA / "isl128" / "inputs.json").read_text())["data"]]
    assert all(b.startswith(a) for a, b in zip(short, long))
    assert [q.cached_tokens for q in one("isl256").requests] == [128, 128, 128]


def test_failed_requests_kept_with_the_tools_reason():
    # isl296sd8/profile_export.jsonl, line 2: "metrics":{"error_isl":{"value":301,"unit":"tokens"}},
    #   "error":{"code":400,"type":"Bad Request","message":"{\"error\":{\"message\":\"The input (301 tokens)
    #   is longer than the model's context length (300 tokens).\"}}"}
    run = one("isl296sd8")
    assert [q.ok for q in run.requests] == [True, False, False, True]
    bad = run.requests[1]
    assert bad.reason.startswith("400 Bad Request: ")
    assert "The input (301 tokens) is longer than the model's context length (300 tokens)." in bad.reason
    assert (bad.prompt_tokens, bad.prompt_tokens_source) == (301, "tool")
    assert bad.ttft_s is None and bad.token_times_s is None
    assert [q.prompt_tokens for q in run.requests] == [295, 301, 301, 296]
    assert [q.completion_tokens for q in run.requests if q.ok] == [5, 4]
    assert run.requested_input_tokens == 296
    assert any("stddev 8" in n for n in run.notes)


def test_all_failed_run_without_summary():
    # every request of the 400-token run failed; AIPerf then wrote no profile_export_aiperf.json
    assert not (DATA / "isl400" / "profile_export_aiperf.json").exists()
    run = one("isl400")
    assert len(run.requests) == 3 and not any(q.ok for q in run.requests)
    assert all("The input (400 tokens) is longer" in q.reason for q in run.requests)
    assert [q.prompt_tokens for q in run.requests] == [400, 400, 400]
    assert run.tool_version is None and "absent" in run.version_source
    assert run.tool_summary == {} and run.concurrency is None and run.requested_input_tokens is None
    assert any("no AIPerf summary" in n for n in run.notes)
    assert "does not say" in run.lacks["cache_busting"]


def test_wrong_files_refused(tmp_path):
    with pytest.raises(ValueError, match="not a AIPerf result file: this is AIPerf's run summary"):
        aiperf.read(DATA / "isl64" / "profile_export_aiperf.json")
    other = tmp_path / "vllm.jsonl"
    other.write_text(json.dumps({"date": "20260101", "ttfts": [0.1], "itls": [[0.01]]}) + "\n")
    with pytest.raises(ValueError, match=r"vllm\.jsonl: not a AIPerf result file: line 1 .*profile_export\.jsonl"):
        aiperf.read(other)
    empty = tmp_path / "profile_export.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no records"):
        aiperf.read(empty)


def test_units_by_name_and_warmup_left_out(tmp_path):
    meta = {"request_start_ns": 10**18, "request_end_ns": 10**18 + 2 * 10**9, "benchmark_phase": "profiling"}
    rec = {"metadata": meta, "metrics": {
        "time_to_first_token": {"value": 500_000_000, "unit": "ns"},
        "request_latency": {"value": 2.0, "unit": "sec"},
        "inter_chunk_latency": {"value": [1500.0], "unit": "ms"},
        "input_sequence_length": {"value": 10, "unit": "tokens"},
        "output_sequence_length": {"value": 2, "unit": "tokens"}}}
    warm = {"metadata": {**meta, "benchmark_phase": "warmup"}, "metrics": rec["metrics"]}
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(warm) + "\n" + json.dumps(rec) + "\n")
    (run,) = aiperf.read(path)
    (q,) = run.requests
    assert q.ttft_s == 0.5 and q.e2e_s == 2.0 and q.token_times_s == [0.5, 2.0]
    assert (q.prompt_tokens, q.prompt_tokens_source) == (10, "tool")
    assert "exact_prompt_lengths" in run.lacks and "server_counts" in run.lacks
    assert any("1 warmup record" in n for n in run.notes)
