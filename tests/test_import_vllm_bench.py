"""The vllm-bench reader against files vLLM's own `bench serve` wrote (tests/data/imports/vllm-bench/README.md
says how): each request as the file holds it, and longctx's reading of them against the summary vLLM itself
computed from the same requests (median TTFT; mean TPOT, which vLLM takes as (latency - ttft) / (output - 1))."""

import json
import statistics
from pathlib import Path

import pytest

from longctx.measure import imports
from longctx.measure.imports import vllm_bench

FILES = Path(__file__).resolve().parent / "data" / "imports" / "vllm-bench"


@pytest.mark.parametrize("length", [64, 128, 256, 512])
def test_each_request_is_read_as_the_file_holds_it_and_agrees_with_vllms_own_summary(length):
    path = FILES / f"vllm-bench-{length}.json"
    doc = json.loads(path.read_text())
    (run,) = vllm_bench.read(path)
    assert run.tool == "vllm bench serve" and run.concurrency == 1 and run.model == "refmla"
    assert [r.prompt_tokens for r in run.requests] == doc["input_lens"] == [length] * 3
    assert [r.ttft_s for r in run.requests] == doc["ttfts"]
    assert all(r.ok for r in run.requests) and doc["failed"] == 0
    trials = [imports.trial(r) for r in run.requests]
    # vLLM's own figures, computed by vLLM from these requests
    assert statistics.median(t["ttft_s"] for t in trials) == pytest.approx(doc["median_ttft_ms"] / 1e3, rel=1e-12)
    assert statistics.fmean(t["tpot_s"] for t in trials) == pytest.approx(doc["mean_tpot_ms"] / 1e3, rel=1e-9)
    assert run.tool_summary["median_ttft_s"] == doc["median_ttft_ms"] / 1e3
    assert run.tool_version is None and "does not record vLLM's version" in run.version_source


def test_requests_the_tool_marked_failed_stay_failed_with_its_words():
    doc = json.loads((FILES / "vllm-bench-2100.json").read_text())
    (run,) = vllm_bench.read(FILES / "vllm-bench-2100.json")
    # by hand from the file: 3 requests of 2,100 tokens, none completed, each "Bad Request" (the engine's context is 2,048)
    assert (doc["completed"], doc["failed"], doc["errors"]) == (0, 3, ["Bad Request"] * 3)
    assert [(r.ok, r.reason, r.prompt_tokens, r.ttft_s) for r in run.requests] == [(False, "Bad Request", 2100, None)] * 3


def test_a_file_saved_without_its_details_is_one_row_of_the_tools_medians(tmp_path):
    doc = json.loads((FILES / "vllm-bench-256.json").read_text())
    for key in vllm_bench.PER_REQUEST + ("generated_texts",):
        doc.pop(key, None)
    (tmp_path / "short.json").write_text(json.dumps(doc))
    (run,) = vllm_bench.read(tmp_path / "short.json")
    (req,) = run.requests
    assert req.ttft_s == doc["median_ttft_ms"] / 1e3 and req.tpot_s == doc["median_tpot_ms"] / 1e3
    assert req.prompt_tokens == 256 and "token_times" in run.lacks


def test_appended_runs_are_one_run_each_and_another_tools_file_is_refused(tmp_path):
    lines = [(FILES / f"vllm-bench-{n}.json").read_text().strip() for n in (64, 128)]
    (tmp_path / "both.json").write_text("\n".join(lines) + "\n")
    assert [r.record for r in vllm_bench.read(tmp_path / "both.json")] == [0, 1]
    (tmp_path / "guidellm.json").write_text(json.dumps({"benchmarks": [{"type_": "benchmark"}]}))
    with pytest.raises(ValueError, match="not a vllm bench serve result file.*this one has benchmarks"):
        vllm_bench.read(tmp_path / "guidellm.json")
