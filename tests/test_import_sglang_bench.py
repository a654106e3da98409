"""longctx.measure.imports.sglang_bench reads SGLang bench_serving's --output-file JSONL.

The committed file, tests/data/imports/sglang-bench/bench_serving.jsonl, is a sample: SGLang 0.5.23 does not
install beside the pinned torch (it requires torch==2.14.1, and sglang.bench_serving imports the server's
GPU stack), so tests/data/imports/sglang-bench/make_samples.py wrote its lines in the shape of
sglang==0.5.23's sglang/benchmark/serving.py (benchmark's `result` and `result_details`,
async_request_sglang_generate's timing, calculate_metrics' figures), timed against longctx's reference
engine; see that directory's README.md. The truths below are read by hand from the file.
"""

import json
import pathlib
import statistics

import pytest

from longctx.measure.imports import sglang_bench
from longctx.measure.imports.records import LACKS

FILE = pathlib.Path(__file__).parent / "data" / "imports" / "sglang-bench" / "bench_serving.jsonl"


@pytest.fixture(scope="module")
def runs():
    return sglang_bench.read(FILE)


def test_runs_and_settings(runs):
    assert sglang_bench.TOOL == "sglang bench_serving"
    assert [r.record for r in runs] == [0, 1, 2, 3]
    # "random_input_len": 64 / 128 / 256 with "random_range_ratio": 1.0; the fourth 400 with 0.5 (a range)
    assert [r.requested_input_tokens for r in runs] == [64, 128, 256, None]
    assert runs[0].label == "random, input 64, output 8, one at a time"
    assert any("[max(int(400 * 0.5), 1), 400]" in n for n in runs[3].notes)
    for r in runs:
        assert r.tool == "sglang bench_serving"
        assert r.concurrency == 1  # "max_concurrency": 1
        assert r.request_rate is None  # "request_rate": Infinity: as fast as allowed
        assert r.model == "refmla"  # server_info.model_path
        assert r.started_at is None  # the file holds no date
        # bench_serving writes no version; server_info's "version": "0.1.0" is the reference engine's
        assert r.tool_version is None
        assert "no version of its own" in r.version_source and "0.1.0 (longctx-refengine)" in r.version_source


def test_requests_read_by_hand(runs):
    first = runs[0].requests
    assert len(first) == 3 and all(q.ok for q in first)
    # line 1: "input_lens": [64, 64, 64], "output_lens": [8, 8, 8], "ttfts": [0.008153408001817297, ...]
    assert [q.prompt_tokens for q in first] == [64, 64, 64]
    assert [q.completion_tokens for q in first] == [8, 8, 8]
    assert first[0].ttft_s == 0.008153408001817297
    # "itls": [[4.437300231074914e-05, 0.00010610799654386938, ...], ...]: 7 per-token gaps after the first
    assert first[0].itl_s[:2] == [4.437300231074914e-05, 0.00010610799654386938]
    assert all(len(q.itl_s) == 7 for q in first)
    assert all(q.token_times_s is None and q.e2e_s is None and q.start_s is None for q in first)
    assert all(q.completion_tokens_source == "server" for q in first)  # meta_info.completion_tokens on /generate
    # line 3: input 256; line 4's successful requests: "input_lens": [368, 252, 221], "output_lens": [0, 6, 8]
    assert [q.prompt_tokens for q in runs[2].requests] == [256, 256, 256]
    assert [q.completion_tokens for q in runs[3].requests] == [None, 6, 8]
    assert len(runs[3].requests[1].itl_s) == 5


def test_failed_request_kept_with_its_reason(runs):
    failed = runs[3].requests[0]
    assert not failed.ok
    assert failed.reason == ('Bad Request: {"error":{"message":"The input (368 tokens) is longer than the '
                             'model\'s context length (300 tokens)."}}')
    assert failed.ttft_s is None and failed.itl_s is None and failed.completion_tokens is None
    assert failed.prompt_tokens == 368  # the dataset's length: no reply carried the server's
    assert [q.ok for q in runs[3].requests] == [False, True, True]


def test_tool_summary_agrees_with_the_requests(runs):
    for r in runs:
        ok = [q for q in r.requests if q.ok]
        s = r.tool_summary
        assert s["completed"] == len(ok)
        ttfts = [q.ttft_s for q in ok]
        assert s["median_ttft_s"] == pytest.approx(statistics.median(ttfts), rel=1e-12)
        assert s["mean_ttft_s"] == pytest.approx(statistics.fmean(ttfts), rel=1e-12)
        itls = [x for q in ok for x in q.itl_s]
        assert s["mean_itl_s"] == pytest.approx(statistics.fmean(itls), rel=1e-12)
        assert s["median_itl_s"] == pytest.approx(statistics.median(itls), rel=1e-12)
        assert s["total_output_tokens"] == sum(q.completion_tokens for q in ok)
        assert s["output_throughput_tok_s"] * s["duration_s"] == pytest.approx(s["total_output_tokens"], rel=1e-12)
        # total_input_tokens is the dataset's lengths over the successful requests (here equal to the server's)
        assert s["total_input_tokens"] == sum(q.prompt_tokens for q in ok)
    # by hand: line 1 "median_ttft_ms": 3.47050599521026; line 4 "completed": 2, "total_output_tokens": 14
    assert runs[0].tool_summary["median_ttft_s"] == pytest.approx(0.00347050599521026, rel=1e-12)
    assert runs[3].tool_summary["completed"] == 2 and runs[3].tool_summary["total_output_tokens"] == 14
    assert "median_tpot_s" in runs[0].tool_summary and "mean_e2e_s" in runs[0].tool_summary


def test_lacks(runs):
    for r in runs:
        assert set(r.lacks) <= set(LACKS)
        assert set(r.lacks) == {"exact_prompt_lengths", "token_times", "cache_busting", "server_counts"}
        assert "_record_server_prompt_len" in r.lacks["exact_prompt_lengths"]
        assert "divided evenly" in r.lacks["token_times"]


def _line(**change):
    obj = json.loads(FILE.read_text().splitlines()[0])
    obj.update(change)
    return obj


def test_a_success_without_text_is_read_as_failed(tmp_path):
    # SGLang's own server streams a validation error as a data event after a 200: bench_serving then records a
    # success with the unset ttft 0.0, empty text, and the asked-for output length
    obj = _line()
    obj["ttfts"][1], obj["itls"][1], obj["generated_texts"][1] = 0.0, [], ""
    path = tmp_path / "silent.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    (run,) = sglang_bench.read(path)
    q = run.requests[1]
    assert not q.ok and q.reason.startswith("no output") and q.ttft_s is None
    assert any("counted as successful returned no text" in n for n in run.notes)


def test_without_output_details_and_with_a_rate(tmp_path):
    obj = _line(request_rate=4.0, max_concurrency=None)
    for k in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        del obj[k]
    path = tmp_path / "summary.jsonl"
    path.write_text("\n" + json.dumps(obj) + "\n")
    (run,) = sglang_bench.read(path)
    assert run.requests == [] and run.request_rate == 4.0 and run.concurrency is None
    assert "--output-details" in run.lacks["token_times"]
    assert run.tool_summary["median_ttft_s"] == pytest.approx(0.00347050599521026, rel=1e-12)


@pytest.mark.parametrize("text, why", [
    # vLLM's `bench serve --save-result` writes one indented JSON object
    ('{\n  "date": "20260101-000000",\n  "backend": "vllm",\n  "completed": 3\n}\n', "line 1 is not one JSON object"),
    ('{"backend": "vllm", "model_id": "m", "completed": 3, "median_ttft_ms": 1.0}\n', "lacks dataset_name"),
    ("[1, 2]\n", "not a JSON object"),
    ("", "no JSON lines"),
])
def test_a_wrong_file_is_refused(tmp_path, text, why):
    path = tmp_path / "other.json"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        sglang_bench.read(path)
    assert str(e.value).startswith(f"{path}: not a sglang bench_serving result file: ")
    assert why in str(e.value) and "sglang.bench_serving --output-file" in str(e.value)
