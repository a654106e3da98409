"""vLLM's `vllm bench serve --save-result [--save-detailed]` result file: one JSON object per run (several,
one per line, with --append-result).

What its fields mean (vLLM 0.32: vllm/benchmarks/serve.py, benchmark() and main(); the OpenAI request
functions in vllm/benchmarks/lib/endpoint_request_func.py):
- per request (only with --save-detailed): input_lens, output_lens, ttfts, itls, latencies, start_times,
  errors; a request failed where its error is not empty (or no chunk came: ttft 0 and no latency);
- ttft: time.perf_counter() from just before the POST to the first chunk carrying `choices` (its text may
  be empty); itls: the gap before each later such chunk, per chunk, not per token; latency: the
  request's start to the last such chunk (the stream's end is not timed); start_times: perf_counter at
  the request's start, on the client's own monotonic clock;
- input_lens: the dataset's prompt length, replaced by the server's usage.prompt_tokens where the server
  streamed usage; output_lens: the server's usage.completion_tokens where streamed, else the tool's
  tokenizer's count of the generated text (or 1 when no tokenizer is kept); the file does not say which;
- summary: median_ttft_ms, mean_tpot_ms ... (TPOT = (latency - ttft) / (output_len - 1) per request with
  more than one output token), completed, failed, request_rate ("inf"), max_concurrency (null: no limit);
- no version of vLLM is recorded (date, backend, model_id, tokenizer_id and --metadata KEY=VALUE are).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .records import Request, Run

TOOL = "vllm bench serve"
PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")
SUMMARY = {  # the file's key -> tool_summary's (milliseconds -> seconds where _ms)
    "median_ttft_ms": "median_ttft_s", "mean_ttft_ms": "mean_ttft_s", "p99_ttft_ms": "p99_ttft_s",
    "median_tpot_ms": "median_tpot_s", "mean_tpot_ms": "mean_tpot_s",
    "median_itl_ms": "median_itl_s", "mean_itl_ms": "mean_itl_s",
    "median_e2el_ms": "median_e2el_s", "mean_e2el_ms": "mean_e2el_s",
    "completed": "completed", "failed": "failed", "output_throughput": "output_throughput_tok_s",
    "request_throughput": "request_throughput_per_s", "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens", "duration": "duration_s",
}


def _documents(path: Path) -> list[dict]:
    text = path.read_text()
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:  # --append-result: one object per line
        try:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a {TOOL} result file: not JSON ({exc})") from None
    for doc in docs:
        if not isinstance(doc, dict) or not {"completed", "duration"} <= set(doc) or not ("median_ttft_ms" in doc or "ttfts" in doc):
            keys = ", ".join(sorted(doc)[:8]) if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"{path}: not a {TOOL} result file: a run of `vllm bench serve --save-result` has "
                             f"completed, duration and median_ttft_ms (and, with --save-detailed, ttfts, itls, input_lens); "
                             f"this one has {keys}")
    return docs


def _summary(doc: dict) -> dict[str, float]:
    out = {}
    for key, name in SUMMARY.items():
        value = doc.get(key)
        if isinstance(value, (int, float)):
            out[name] = value / 1e3 if key.endswith("_ms") else float(value)
    return out


def _requests(doc: dict) -> list[Request]:
    n = len(doc["ttfts"])
    col = {k: doc.get(k) or [None] * n for k in PER_REQUEST}
    out = []
    for i in range(n):
        error = col["errors"][i] or None
        ttft, latency, itl = col["ttfts"][i], col["latencies"][i], col["itls"][i]
        failed = bool(error) or not ttft  # vLLM's failed requests keep ttft 0.0 (RequestFuncOutput's default)
        out.append(Request(
            ok=not failed,
            reason=(error.strip().splitlines()[-1] if error else "no chunk received (the tool marked it failed)") if failed else None,
            prompt_tokens=col["input_lens"][i],
            completion_tokens=col["output_lens"][i] if not failed else None,
            ttft_s=ttft if not failed else None,
            e2e_s=latency if not failed else None,
            itl_s=list(itl) if not failed and itl is not None else None,
            start_s=col["start_times"][i],
            prompt_tokens_source="tool or server",
            completion_tokens_source="tool or server",
        ))
    return out


def _from_summary(doc: dict) -> list[Request]:
    """A file saved without --save-detailed: one request standing for the run, the tool's medians."""
    done = doc.get("completed") or 0
    if not done or doc.get("median_ttft_ms") is None:
        return [Request(ok=False, reason=f"the tool completed none of {doc.get('num_prompts')} requests")]
    tpot = doc.get("median_tpot_ms")
    return [Request(ok=True, prompt_tokens=round(doc["total_input_tokens"] / done),
                    completion_tokens=round(doc["total_output_tokens"] / done), ttft_s=doc["median_ttft_ms"] / 1e3,
                    tpot_s=tpot / 1e3 if tpot else None,
                    e2e_s=doc["median_e2el_ms"] / 1e3 if doc.get("median_e2el_ms") else None)]


def read(path: Path) -> list[Run]:
    path = Path(path)
    runs = []
    for i, doc in enumerate(_documents(path)):
        detailed = "ttfts" in doc
        requests = _requests(doc) if detailed else _from_summary(doc)
        lens = [r.prompt_tokens for r in requests if r.prompt_tokens]
        rate = doc.get("request_rate")
        lacks = {
            "exact_prompt_lengths": "vllm bench serve records the server's usage.prompt_tokens where the server streamed "
                                    "usage, else its dataset's count, and its file does not say which",
            "cache_busting": "vllm bench serve neither flushes the server's cache nor makes each prompt's start unique "
                             "(its random prompts may share a --random-prefix-len prefix)",
            "server_counts": "no cached-token count and no server-side timing are saved",
        }
        if not detailed:
            lacks["token_times"] = "saved without --save-detailed: no per-request times, only the tool's medians"
            lacks["exact_prompt_lengths"] = "saved without --save-detailed: only the mean prompt length of the run"
        notes = ["each gap (itls) is per streamed chunk; a chunk may carry several tokens"]
        if not detailed:
            notes.append("one row per run: the tool's median TTFT and TPOT, not per-request figures")
        label = ", ".join(filter(None, [
            str(doc.get("label")) if doc.get("label") else None, doc.get("backend"),
            f"prompts of {statistics.median(lens):.0f} tokens" if lens else None,
            "one at a time" if doc.get("max_concurrency") == 1 else
            (f"at most {doc['max_concurrency']} at once" if doc.get("max_concurrency") else None),
            f"{rate} requests/s" if rate not in (None, "inf") else None]))
        date = doc.get("date")
        started = f"{date[0:4]}-{date[4:6]}-{date[6:8]}T{date[9:11]}:{date[11:13]}:{date[13:15]}" if date and len(date) == 15 else None
        runs.append(Run(
            tool=TOOL, tool_version=doc.get("vllm_version") or doc.get("version"),
            version_source="the file's metadata" if (doc.get("vllm_version") or doc.get("version")) else
            "vllm bench serve does not record vLLM's version (--metadata version=... would)",
            path=str(path), record=i, label=label, requests=requests,
            requested_input_tokens=None, concurrency=doc.get("max_concurrency"),
            request_rate=None if rate in (None, "inf") else float(rate), model=doc.get("model_id"),
            started_at=started, lacks=lacks, tool_summary=_summary(doc), notes=notes))
    return runs
