"""Read SGLang's `python -m sglang.bench_serving --output-file FILE` results (JSONL, one run a line).

Read against SGLang 0.5.23's source (PyPI sglang==0.5.23, sglang/benchmark/serving.py, which
sglang/bench_serving.py re-exports; compared with 0.5.9's sglang/bench_serving.py): each run appends one
JSON object, `benchmark()`'s `result` dict (the run's settings, `server_info` as the server's
/server_info answered, and calculate_metrics' summary figures in ms), and with `--output-details` its
`result_details` lists, one entry a request: input_lens, output_lens, ttfts, itls, generated_texts,
errors (and cached_tokens with --cache-report). What those mean, from the source:

- Times are time.perf_counter() seconds from the post. ttfts: the first chunk that carries text (0.0, the
  unset value, where none did). A request's end (its latency) and its send time are not saved.
- itls (backends "sglang"/"sglang-native", async_request_sglang_generate): PER TOKEN, not per chunk: a
  chunk's gap after the previous chunk is divided evenly over the tokens it added (by
  meta_info.completion_tokens), so a chunk of k tokens is k equal entries. The OpenAI-route backends
  (async_request_openai_completions) append one gap per chunk.
- input_lens: 0.5.23 overwrites the dataset's length with the server's meta_info (or usage) prompt_tokens
  where a reply chunk carried one (_record_server_prompt_len); a request that got no reply keeps the
  dataset's; 0.5.9 always kept the dataset's. The random dataset's length is the asked-for length (less
  the tokenizer's special tokens), not a count of the prompt's text. total_input_tokens is always the
  dataset's lengths summed over the successful requests.
- output_lens: the server's meta_info.completion_tokens for the sglang backends (usage.completion_tokens,
  else the asked-for length, on the OpenAI routes); calculate_metrics writes 0 for a failed request.
- errors: "" for a success; "<HTTP reason>: <body>" for a non-200 reply, a traceback for an exception.
  A 200 reply whose stream held no text (SGLang's own server streams a validation error as a data event)
  is recorded as a success with ttft 0.0 and no text: read here as failed, for want of any output.
- request_rate is a float (json.dumps writes inf as Infinity) or "trace"; max_concurrency is null when
  unset. The file holds no date, no model field and no version of bench_serving; server_info.version is
  the server's version.
"""

from __future__ import annotations

import json
import math
import pathlib

from longctx.measure.imports.records import Request, Run

TOOL = "sglang bench_serving"

_SIGNATURE = ("backend", "dataset_name", "request_rate", "server_info", "completed", "median_ttft_ms", "mean_itl_ms")
_DETAILS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
_SGLANG_BACKENDS = ("sglang", "sglang-native")  # async_request_sglang_generate: /generate, per-token itls
_STATS = ("mean", "median", "std", "p90", "p95", "p99")
_LATENCIES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e_latency": "e2e"}
_COUNTS = {"completed": "completed", "total_input_tokens": "total_input_tokens",
           "total_output_tokens": "total_output_tokens",
           "total_output_tokens_retokenized": "total_output_tokens_retokenized",
           "max_concurrent_requests": "max_concurrent_requests"}
_RATES = {"duration": "duration_s", "request_throughput": "request_throughput_req_s",
          "input_throughput": "input_throughput_tok_s", "output_throughput": "output_throughput_tok_s",
          "total_throughput": "total_throughput_tok_s", "max_output_tokens_per_s": "max_output_throughput_tok_s",
          "concurrency": "mean_concurrency"}


def _refuse(path: pathlib.Path, why: str) -> ValueError:
    return ValueError(f"{path}: not a {TOOL} result file: {why} (expected JSON lines as "
                      f"`python -m sglang.bench_serving --output-file FILE` appends them, each with "
                      f"{', '.join(_SIGNATURE)})")


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _summary(obj: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, short in _LATENCIES.items():
        for stat in _STATS:
            v = _number(obj.get(f"{stat}_{name}_ms"))
            if v is not None:
                out[f"{stat}_{short}_s"] = v / 1000.0
    for key, name in {**_COUNTS, **_RATES}.items():
        v = _number(obj.get(key))
        if v is not None:
            out[name] = v
    return out


def _requests(path: pathlib.Path, line: int, obj: dict, sglang_route: bool) -> list[Request]:
    lists = {k: obj[k] for k in _DETAILS}
    n = len(lists["errors"])
    if any(not isinstance(v, list) or len(v) != n for v in lists.values()):
        raise _refuse(path, f"line {line + 1}: its per-request lists ({', '.join(_DETAILS)}) differ in length")
    cached = obj.get("cached_tokens") if isinstance(obj.get("cached_tokens"), list) else None
    out = []
    for i in range(n):
        error = lists["errors"][i]
        ttft = lists["ttfts"][i]
        text = lists["generated_texts"][i]
        common = dict(prompt_tokens=lists["input_lens"][i], completion_tokens_source="server" if sglang_route else "tool")
        if error:
            out.append(Request(ok=False, reason=str(error), **common))
            continue
        if not ttft and not text:
            out.append(Request(ok=False, reason="no output: bench_serving recorded a success, but no chunk carried "
                               "text (its ttft is the unset 0.0, its text empty)", **common))
            continue
        out.append(Request(
            ok=True, completion_tokens=lists["output_lens"][i], ttft_s=float(ttft),
            itl_s=[float(x) for x in lists["itls"][i]],
            cached_tokens=cached[i] if cached is not None and len(cached) == n else None, **common))
    return out


def _lacks(obj: dict, sglang_route: bool, has_details: bool) -> dict[str, str]:
    completions = ("output_lens is the server's completion count on /generate" if sglang_route else
                   "output_lens is the server's usage.completion_tokens where a chunk carried it, else the asked-for length")
    lacks = {
        "exact_prompt_lengths": (
            "bench_serving's input_lens is the server's meta_info/usage prompt_tokens where a reply carried one "
            "(SGLang 0.5.23's _record_server_prompt_len) and the dataset's asked-for length otherwise (always, "
            "in 0.5.9); the file records neither bench_serving's version nor which a request got"),
        "cache_busting": (
            "bench_serving gives its prompts no unique prefix, and the file does not say whether the server's "
            "cache was flushed before the run (--flush-cache)"),
        "server_counts": (
            f"bench_serving saves no usage record: {completions}, input_lens may or may not be the server's prompt "
            "count, and cached tokens are saved only with --cache-report" if "cached_tokens" not in obj else
            f"bench_serving saves no usage record: {completions}, and input_lens may or may not be the server's"),
    }
    if not has_details:
        lacks["token_times"] = "the file was written without --output-details: it holds no per-request times"
    elif sglang_route:
        lacks["token_times"] = (
            "bench_serving's sglang client saves per-token itls, each chunk's gap divided evenly over the tokens "
            "it added, and no chunk's arrival time, so a chunk of several tokens cannot be told from several chunks")
    return lacks


def _run(path: pathlib.Path, record: int, line: int, obj: dict) -> Run:
    backend = obj.get("backend")
    sglang_route = backend in _SGLANG_BACKENDS
    has_details = all(k in obj for k in _DETAILS)
    notes: list[str] = [f"backend {backend!r}"]
    requests = _requests(path, line, obj, sglang_route) if has_details else []
    if not has_details:
        notes.append("written without --output-details: the run's summary only, no requests")
    else:
        notes.append("no request's end-to-end latency or send time is saved (only the summary's e2e figures)")
        if sglang_route:
            notes.append("itl_s is per token (a chunk's gap split evenly over its tokens), not per chunk")
        silent = sum(1 for r in requests if not r.ok and r.reason and r.reason.startswith("no output"))
        if silent:
            notes.append(f"{silent} request(s) bench_serving counted as successful returned no text: kept as failed")
    rate = obj.get("request_rate")
    request_rate = None
    if rate == "trace":
        notes.append("requests were sent at a trace's timestamps (request_rate 'trace')")
    elif _number(rate) is not None and math.isfinite(rate) and rate > 0:
        request_rate = float(rate)
    concurrency = obj.get("max_concurrency") if isinstance(obj.get("max_concurrency"), int) else None
    dataset = str(obj.get("dataset_name"))
    requested = None
    label = dataset
    if dataset.startswith("random"):
        length, out_len, ratio = obj.get("random_input_len"), obj.get("random_output_len"), obj.get("random_range_ratio")
        if _number(ratio) == 1.0:
            requested = length
            label = f"{dataset}, input {length}, output {out_len}"
        else:
            label = f"{dataset}, input <= {length}, output <= {out_len}"
            notes.append(f"random_range_ratio {ratio}: each request's input length was drawn uniformly from "
                         f"[max(int({length} * {ratio}), 1), {length}] (and its output length likewise)")
    label += ", one at a time" if concurrency == 1 else (f", concurrency {concurrency}" if concurrency else "")
    if request_rate is not None:
        label += f", {request_rate:g} requests/s"
    if obj.get("tag"):
        label += f" ({obj['tag']})"
    info = obj.get("server_info") if isinstance(obj.get("server_info"), dict) else {}
    model = info.get("served_model_name") or info.get("model_path")
    server_version = info.get("version")
    why = "bench_serving writes no version of its own"
    if server_version is not None:
        engine = f" ({info['engine']})" if info.get("engine") else ""
        why += f"; server_info.version, {server_version}{engine}, is the server's"
    return Run(tool=TOOL, tool_version=None, version_source=why, path=str(path), record=record, label=label,
               requests=requests, requested_input_tokens=requested, concurrency=concurrency,
               request_rate=request_rate, model=str(model) if model else None, started_at=None,
               lacks=_lacks(obj, sglang_route, has_details), tool_summary=_summary(obj), notes=notes)


def read(path: pathlib.Path) -> list[Run]:
    path = pathlib.Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise _refuse(path, "it is not text") from None
    runs = []
    for line, raw in enumerate(text.splitlines()):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            raise _refuse(path, f"line {line + 1} is not one JSON object") from None
        if not isinstance(obj, dict):
            raise _refuse(path, f"line {line + 1} is not a JSON object")
        missing = [k for k in _SIGNATURE if k not in obj]
        if missing:
            raise _refuse(path, f"line {line + 1} lacks {', '.join(missing)}")
        runs.append(_run(path, len(runs), line, obj))
    if not runs:
        raise _refuse(path, "it holds no JSON lines")
    return runs
