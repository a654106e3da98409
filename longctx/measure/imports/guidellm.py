"""GuideLLM's JSON report (`guidellm run ... --output kind=json,path=FILE`, or `guidellm benchmark`'s
benchmarks.json): one file per invocation, holding one benchmark per strategy it ran (one for
`--profile kind=synchronous`, several for a sweep or `--override profile.streams 1,2,4`); all benchmarks of a
file share one dataset, so each input length is its own invocation and its own file.

What its fields mean (GuideLLM 0.8.1 from PyPI, github.com/vllm-project/guidellm, src/guidellm/):
- every time is time.time(), the wall clock, in seconds since the epoch (backends/openai/http.py,
  _resolve_streaming): info.timings.request_start is re-stamped by an httpx trace hook when the request's
  headers start going out (after the connection is made); first_token_iteration / last_token_iteration are
  the arrivals of the first and last SSE line that carried text; request_end is after the stream's end;
  token_iterations counts the text-carrying lines (chunks), not tokens; each chunk's own arrival is not kept;
- per request (schemas/base/request_stats.py): time_to_first_token_ms = first_token_iteration -
  request_start; request_latency = request_end - request_start (s); inter_token_latency_ms = (last - first
  token iteration) / (output_tokens - 1), the decode time per token after the first (longctx's TPOT);
  time_per_output_token_ms = (last token iteration - request_start) / output_tokens, the first token
  included (not longctx's TPOT);
- prompt_tokens / output_tokens / cached_tokens (schemas/base/response.py compile_stats; backends/openai/
  request_handlers.py extract_metrics): with prefer_response_metrics (the default) the server's streamed
  usage (prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens) replaces GuideLLM's own
  counts, which are its dataset's configured lengths (data/finalizers/generative.py: the synthetic prompt's
  requested length, the requested max_tokens), and the file does not say which it holds; cached_tokens comes
  only from usage. An errored or cancelled request's output counts are dropped and output_tokens falls back
  to the number of text-carrying chunks;
- requests: successful (status completed), errored (info.error: the exception's text, e.g. httpx's
  HTTPStatusError; the server's error body is not kept), incomplete (status cancelled: in flight when a
  constraint such as max_duration ended the benchmark; error "Request was cancelled"); with --sample-size a
  random sample of each is kept (metrics.request_totals counts them all);
- summary (benchmark/schemas/metrics.py): metrics.<name>.successful is a distribution (mean, median,
  percentiles.p99, count ...); inter_token_latency_ms is weighted by output_tokens - 1 per request,
  time_per_output_token_ms by output_tokens; a median is the first value whose weighted CDF reaches 0.5
  (schemas/base/statistics.py), the lower of the two middle values for an even count;
- synthetic_text prompts (data/deserializers/synthetic.py) begin with "<iteration> <sample> m<turn> ", unique
  within a run, but a run's seed (default 42) makes the same prompts in every run: the first prompt of a
  longer run starts with the whole first prompt of a shorter one;
- metadata.guidellm_version is the tool's version (metadata.version, 2 here, is the report schema's).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from .records import Request, Run

TOOL = "GuideLLM"
STATUSES = ("successful", "errored", "incomplete")
# the file's metric -> (tool_summary's stem, scale to seconds)
SUMMARY = {"time_to_first_token_ms": ("ttft_s", 1e-3), "inter_token_latency_ms": ("itl_s", 1e-3),
           "time_per_output_token_ms": ("time_per_output_token_s", 1e-3), "request_latency": ("e2el_s", 1.0)}


def _refuse(path: Path, why: str) -> ValueError:
    return ValueError(f"{path}: not a {TOOL} result file: {why} (a GuideLLM JSON report, from `guidellm run "
                      "--output kind=json,path=FILE` or `guidellm benchmark`, has metadata.guidellm_version and "
                      "benchmarks[].requests.successful/errored/incomplete with info.timings per request)")


def _load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _refuse(path, f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        keys = ", ".join(sorted(doc)[:8]) if isinstance(doc, dict) else type(doc).__name__
        raise _refuse(path, f"no benchmarks list; it has {keys or 'nothing'}")
    for i, bench in enumerate(doc["benchmarks"]):
        reqs = bench.get("requests") if isinstance(bench, dict) else None
        if not isinstance(reqs, dict) or "successful" not in reqs:
            raise _refuse(path, f"benchmarks[{i}] has no requests.successful")
        for status in STATUSES:
            for r in reqs.get(status) or []:
                if not isinstance((r.get("info") or {}).get("timings"), dict):
                    raise _refuse(path, f"benchmarks[{i}].requests.{status} has a request without info.timings "
                                  "(an older GuideLLM report, which this reader does not read)")
    return doc


def _first_line(text: str | None) -> str | None:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()] if text else []
    return lines[0] if lines else None


def _stoppers(bench: dict) -> list[str]:
    """The constraints that stopped the benchmark's requests in flight (scheduler_state)."""
    ends = (bench.get("scheduler_state") or {}).get("end_processing_constraints") or {}
    return [name for name, c in ends.items() if str((c or {}).get("request_processing", "")).startswith("stop")]


def _request(r: dict, status: str, prefer_response: bool, stoppers: list[str]) -> Request:
    info, t = r["info"], r["info"]["timings"]
    start = t.get("request_start")
    if status == "successful":
        cached = r.get("cached_tokens")
        # usage replaced GuideLLM's own counts where the server streamed it; cached_tokens is only in usage
        prompt_src = ("server" if cached is not None else "tool or server") if prefer_response else "tool"
        out_metrics = r.get("output_metrics") or {}
        output_src = ("tool or server" if prefer_response else "tool") if out_metrics.get("total_tokens") is not None \
            else "tool"  # no count at all: GuideLLM's fallback, the number of text-carrying chunks
        itl = r.get("inter_token_latency_ms")
        return Request(
            ok=True, prompt_tokens=r.get("prompt_tokens"), completion_tokens=r.get("output_tokens"),
            ttft_s=r["time_to_first_token_ms"] / 1e3 if r.get("time_to_first_token_ms") is not None else None,
            e2e_s=r.get("request_latency"), tpot_s=itl / 1e3 if itl is not None else None, start_s=start,
            prompt_tokens_source=prompt_src, completion_tokens_source=output_src, cached_tokens=cached)
    error = _first_line(info.get("error"))
    if status == "errored":
        reason = error or f"GuideLLM marked it errored (status {info.get('status')}) without an error text"
    else:
        by = f" at its {', '.join(stoppers)} limit" if stoppers else ""
        reason = (f"incomplete: GuideLLM cancelled it in flight when the benchmark stopped{by}, after "
                  f"{t.get('token_iterations') or 0} text chunks ({error or info.get('status')})")
    # a failed request's prompt count is GuideLLM's own (no usage came); its output count is dropped
    return Request(ok=False, reason=reason, prompt_tokens=r.get("prompt_tokens"), start_s=start,
                   prompt_tokens_source="tool", completion_tokens_source="tool")


def _summary(bench: dict) -> dict[str, float]:
    metrics = bench.get("metrics") or {}
    out: dict[str, float] = {}
    for key, (stem, scale) in SUMMARY.items():
        dist = (metrics.get(key) or {}).get("successful") or {}
        if not dist.get("count"):
            continue
        out[f"mean_{stem}"] = dist["mean"] * scale
        out[f"median_{stem}"] = dist["median"] * scale
        p99 = (dist.get("percentiles") or {}).get("p99")
        if p99 is not None:
            out[f"p99_{stem}"] = p99 * scale
    totals = metrics.get("request_totals") or {}
    for key, name in (("successful", "completed"), ("errored", "failed"), ("incomplete", "incomplete")):
        if isinstance(totals.get(key), (int, float)):
            out[name] = float(totals[key])
    for key, name in (("output_tokens_per_second", "output_throughput_tok_s"),
                      ("requests_per_second", "request_throughput_per_s")):
        dist = (metrics.get(key) or {}).get("successful") or {}
        if dist.get("count"):
            out[name] = float(dist["mean"])
    if isinstance(bench.get("duration"), (int, float)):
        out["duration_s"] = float(bench["duration"])
    return out


def _data_spec(doc: dict) -> list[dict]:
    return [d for d in ((doc.get("config") or {}).get("spec") or {}).get("data") or [] if isinstance(d, dict)]


def _fixed_prompt_length(data: list[dict]) -> int | None:
    """The one configured prompt length of a synthetic dataset without a spread, else None."""
    if len(data) != 1 or data[0].get("kind") != "synthetic_text" or not data[0].get("prompt_tokens"):
        return None
    d = data[0]
    n = d["prompt_tokens"]
    if d.get("prompt_tokens_stdev") or any(d.get(k) not in (None, n) for k in ("prompt_tokens_min", "prompt_tokens_max")):
        return None
    return int(n)


def _data_words(data: list[dict]) -> str | None:
    if len(data) != 1:
        return f"{len(data)} datasets" if data else None
    d = data[0]
    if d.get("kind") != "synthetic_text":
        return str(d.get("kind") or "a dataset")
    spread = f" ± {d['prompt_tokens_stdev']}" if d.get("prompt_tokens_stdev") else ""
    bounds = (f" ({d.get('prompt_tokens_min')}-{d.get('prompt_tokens_max')})"
              if d.get("prompt_tokens_min") is not None or d.get("prompt_tokens_max") is not None else "")
    output = f", {d['output_tokens']} output tokens" if d.get("output_tokens") else ""
    return f"synthetic_text, prompts of {d.get('prompt_tokens')}{spread}{bounds} tokens{output}"


def _strategy_words(strategy: dict) -> str:
    kind = strategy.get("type_") or "?"
    if kind == "synchronous":
        return "synchronous (one at a time)"
    if kind == "concurrent":
        return f"concurrent ({strategy.get('streams')} streams)"
    if strategy.get("rate") is not None:
        return f"{kind} ({strategy['rate']} requests/s)"
    return kind


def read(path: Path) -> list[Run]:
    path = Path(path)
    doc = _load(path)
    meta = doc.get("metadata") or {}
    version = meta.get("guidellm_version")
    data = _data_spec(doc)
    synthetic = any(d.get("kind") == "synthetic_text" for d in data)
    runs = []
    for i, bench in enumerate(doc["benchmarks"]):
        config = bench.get("config") or {}
        strategy = config.get("strategy") or {}
        prefer_response = config.get("prefer_response_metrics", True) is not False
        stoppers = _stoppers(bench)
        requests = [_request(r, status, prefer_response, stoppers)
                    for status in STATUSES for r in bench["requests"].get(status) or []]
        requests.sort(key=lambda q: (q.start_s is None, q.start_s or 0.0))  # the file lists them by status
        totals = (bench.get("metrics") or {}).get("request_totals") or {}
        notes = ["GuideLLM's times are the wall clock (time.time()); its TTFT starts when the request's headers "
                 "begin to go out, after the connection is made",
                 "per request only the first and last token-carrying chunk are timed: tpot_s is GuideLLM's "
                 "inter_token_latency_ms, (last - first) / (output_tokens - 1)"]
        kept = {s: len(bench["requests"].get(s) or []) for s in STATUSES}
        if any(isinstance(totals.get(s), int) and totals[s] > kept[s] for s in STATUSES):
            notes.append("the file keeps a sample of the requests (--sample-size): "
                         + ", ".join(f"{kept[s]} of {totals.get(s)} {s}" for s in STATUSES))
        lacks = {"token_times": "GuideLLM keeps per request only the first and last text-carrying chunk's arrival "
                                "and the number of chunks (info.timings.token_iterations), not each chunk's time"}
        if any(q.prompt_tokens_source != "server" for q in requests):
            lacks["exact_prompt_lengths"] = (
                "GuideLLM's prompt count is the server's streamed usage.prompt_tokens where the server sent usage "
                "(prefer_response_metrics), else its dataset's configured length, and the file does not say which; "
                "an errored or cancelled request's count is always its own" if prefer_response else
                "prefer_response_metrics is off: the prompt counts are GuideLLM's dataset's, not the server's")
        lacks["cache_busting"] = (
            "GuideLLM's synthetic prompts begin with a per-sample counter, unique within a run, but its seed (default "
            "42) makes the same prompts in every run, and it does not flush the server's cache" if synthetic else
            "GuideLLM neither makes each prompt's start unique nor flushes the server's cache")
        if not any(q.cached_tokens is not None for q in requests):
            lacks["server_counts"] = ("no request has a cached-token count: GuideLLM keeps usage's "
                                      "prompt_tokens_details.cached_tokens only where the server sent one")
        started = bench.get("start_time")
        runs.append(Run(
            tool=TOOL, tool_version=version,
            version_source="the file's metadata.guidellm_version" if version else
            "the file's metadata has no guidellm_version",
            path=str(path), record=i,
            label=", ".join(filter(None, [_strategy_words(strategy), _data_words(data)])),
            requests=requests, requested_input_tokens=_fixed_prompt_length(data),
            concurrency=strategy.get("streams") if strategy.get("type_") == "concurrent" else strategy.get("max_concurrency"),
            request_rate=float(strategy["rate"]) if strategy.get("rate") is not None else None,
            model=(config.get("backend") or {}).get("model")
            or (((doc.get("config") or {}).get("spec") or {}).get("backend") or {}).get("model"),
            started_at=datetime.fromtimestamp(started, timezone.utc).isoformat() if isinstance(started, (int, float)) else None,
            lacks=lacks, tool_summary=_summary(bench), notes=notes))
    return runs

