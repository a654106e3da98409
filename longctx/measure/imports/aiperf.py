"""NVIDIA AIPerf's per-request export: `profile_export.jsonl`, read with the summary beside it.

`aiperf profile` writes into its artifacts directory (--output-artifact-dir) the per-record file
`profile_export.jsonl` (one JSON object a request: `metadata`, `metrics`, `error`) and the run's summary
`profile_export_aiperf.json` (the tool's own statistics, its version and its input configuration); with
--profile-export-prefix P they are `P.jsonl` and `P.json`. This reader takes the JSONL and reads the
summary from beside it when it is there (AIPerf writes no summary when every request failed).

What the fields mean, read in AIPerf 0.13.0 (the PyPI wheel; repository ai-dynamo/aiperf, src/aiperf/...):
- post_processors/record_export_jsonl_writer.py: each record's metrics are written in their *display*
  units as {"value": v, "unit": u} ("ms" for times; the raw values are nanoseconds of
  time.perf_counter_ns). Every unit is converted here by its name (ns, us, ms, sec).
- metrics/types/ttft_metric.py: time_to_first_token = first content response's perf_ns - the request's
  start_perf_ns. request_latency_metric.py: request_latency = the LAST CONTENT response - start (the
  closing usage-only chunk and [DONE] are not counted).
- metrics/types/inter_chunk_latency_metric.py: inter_chunk_latency = the gaps between successive content
  responses (SSE messages whose parsed data is not empty), so one gap per chunk, not per token. Each
  message is stamped with the perf_counter_ns of the network read that completed it
  (transports/sse_utils.py, AsyncSSEStreamReader): messages that arrive in one read share a time and
  their gaps are 0. This reader turns them into token_times_s (TTFT, then TTFT plus the running sum).
- metrics/types/inter_token_latency_metric.py: AIPerf's "inter_token_latency" is one number a request,
  (request_latency - TTFT) / (OSL - 1): what vLLM calls TPOT. Its summary's inter_token_latency is
  therefore given here as mean/median_tpot_s, and its inter_chunk_latency as mean/median_itl_s.
- records/inference_result_parser.py: input_sequence_length is AIPerf's own tokenizer (--tokenizer)
  encoding the prompt text taken from the request body it sent, and output_sequence_length its
  tokenizer encoding the returned text (output plus reasoning), unless --use-server-token-count, when
  both are the server's usage. metrics/types/usage_metrics.py: usage_prompt_tokens and
  usage_completion_tokens are the server's usage (the last chunk carrying one);
  usage_cache_metrics.py: usage_prompt_cache_read_tokens is the server's cached count
  (prompt_tokens_details.cached_tokens). The server's counts are preferred here where the record has them.
- common/models/record_models.py (MetricRecordMetadata): request_start_ns and request_end_ns are wall
  clock (time.time_ns); benchmark_phase is "warmup" or "profiling". A failed request has `error`
  (ErrorDetails: code, type, message) and, for metrics, only error_isl (its prompt's tokenizer count).
- exporters/metrics_json_exporter.py: the summary holds aiperf_version, input_config (the run's
  configuration as given: phases with their type, concurrency, rate; datasets with prompts.isl,
  prompts.cache_bust), and per metric {"unit", "avg", "p50", ..., "count"}, percentiles linear
  between ranks (numpy's default).
"""

from __future__ import annotations

import datetime as _dt
import json
import pathlib
from typing import Any

from .records import Request, Run

TOOL = "AIPerf"

_PER_SECOND = {"ns": 1e9, "us": 1e6, "ms": 1e3, "sec": 1.0, "s": 1.0}
# cache-bust targets that put a unique marker at token 0 of each conversation (config/dataset: CacheBustConfig)
_PREFIX_BUST = {"system_prefix", "first_turn_prefix"}


def _not_aiperf(path: pathlib.Path, why: str) -> ValueError:
    return ValueError(f"{path}: not a {TOOL} result file: {why} (expected AIPerf's per-record export, "
                      "profile_export.jsonl: one JSON object a line with 'metadata' and 'metrics')")


def _summary_path(path: pathlib.Path) -> pathlib.Path:
    """The summary AIPerf writes beside the records (config/artifacts.py: profile_export_json_file)."""
    if path.name == "profile_export.jsonl":
        return path.with_name("profile_export_aiperf.json")
    return path.with_suffix(".json")


def _records(path: pathlib.Path) -> list[dict]:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and ("aiperf_version" in whole or "input_config" in whole):
        raise _not_aiperf(path, "this is AIPerf's run summary (profile_export_aiperf.json); "
                                "point at the profile_export.jsonl beside it")
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise _not_aiperf(path, f"line {n} is not JSON") from None
        if not (isinstance(rec, dict) and isinstance(rec.get("metadata"), dict)
                and isinstance(rec.get("metrics", {}), dict) and "request_start_ns" in rec["metadata"]):
            keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise _not_aiperf(path, f"line {n} has no metadata.request_start_ns and metrics (it has {keys})")
        records.append(rec)
    if not records:
        raise _not_aiperf(path, "it holds no records")
    return records


def _seconds(metric: Any) -> float | list[float] | None:
    """A time metric {"value", "unit"} in seconds (a list stays a list); None where absent."""
    if not isinstance(metric, dict) or metric.get("value") is None:
        return None
    unit = metric.get("unit")
    if unit not in _PER_SECOND:
        raise ValueError(f"unknown AIPerf time unit {unit!r}")
    value = metric["value"]
    if isinstance(value, list):
        return [v / _PER_SECOND[unit] for v in value]
    return value / _PER_SECOND[unit]


def _count(metric: Any) -> int | None:
    if not isinstance(metric, dict) or metric.get("value") is None:
        return None
    return int(metric["value"])


def _request(rec: dict, server_counts_flag: bool) -> Request:
    m = rec.get("metrics") or {}
    error = rec.get("error")
    reason = None
    if error:
        head = " ".join(str(x) for x in (error.get("code"), error.get("type")) if x is not None)
        reason = f"{head}: {error.get('message')}" if head else str(error.get("message"))
    ttft = _seconds(m.get("time_to_first_token"))
    gaps = _seconds(m.get("inter_chunk_latency"))
    token_times = None
    if ttft is not None and gaps is not None:
        token_times = [ttft]
        for g in gaps:
            token_times.append(token_times[-1] + g)
    elif ttft is not None and _count(m.get("output_sequence_length")) == 1:
        token_times = [ttft]  # one content chunk: no gaps to record
    prompt_source = completion_source = "server" if server_counts_flag else "tool"
    prompt = _count(m.get("usage_prompt_tokens"))
    if prompt is not None:
        prompt_source = "server"
    else:
        prompt = _count(m.get("input_sequence_length"))
        if prompt is None:
            # a failed request's prompt, always counted by AIPerf's tokenizer (inference_result_parser.py)
            prompt = _count(m.get("error_isl"))
            prompt_source = "tool"
    completion = _count(m.get("usage_completion_tokens"))
    if completion is not None:
        completion_source = "server"
    else:
        completion = _count(m.get("output_sequence_length"))
    tpot = None
    if token_times is None:
        tpot = _seconds(m.get("inter_token_latency"))
    return Request(
        ok=not error,
        reason=reason,
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_s=ttft,
        e2e_s=_seconds(m.get("request_latency")),
        token_times_s=token_times,
        tpot_s=tpot,
        start_s=rec["metadata"]["request_start_ns"] / 1e9,
        prompt_tokens_source=prompt_source,
        completion_tokens_source=completion_source,
        cached_tokens=_count(m.get("usage_prompt_cache_read_tokens")),
    )


def _stat(summary: dict, tag: str, stat: str) -> float | None:
    entry = summary.get(tag)
    if not isinstance(entry, dict) or entry.get(stat) is None:
        return None
    unit = entry.get("unit")
    return entry[stat] / _PER_SECOND[unit] if unit in _PER_SECOND else entry[stat]


def _tool_summary(summary: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for tag, name in (("time_to_first_token", "ttft"), ("request_latency", "e2e"),
                      ("inter_token_latency", "tpot"), ("inter_chunk_latency", "itl")):
        for stat, prefix in (("avg", "mean"), ("p50", "median"), ("p99", "p99")):
            v = _stat(summary, tag, stat)
            if v is not None:
                out[f"{prefix}_{name}_s"] = v
    for tag, key in (("request_count", "completed"), ("error_request_count", "failed"),
                     ("output_token_throughput", "output_throughput_tok_s"),
                     ("input_token_throughput", "input_throughput_tok_s"),
                     ("request_throughput", "request_throughput_rps"),
                     ("benchmark_duration", "duration_s"),
                     ("total_isl", "total_input_tokens"), ("total_osl", "total_output_tokens")):
        v = _stat(summary, tag, "avg")
        if v is not None:
            out[key] = v
    for tag, key in (("input_sequence_length", "mean_input_tokens"),
                     ("output_sequence_length", "mean_output_tokens")):
        v = _stat(summary, tag, "avg")
        if v is not None:
            out[key] = v
    return out


def _profiling_phase(config: dict, index: int) -> dict:
    phases = [p for p in config.get("phases") or [] if isinstance(p, dict) and p.get("kind", "profiling") != "warmup"]
    return phases[index] if index < len(phases) else {}


def _label(config: dict, phase: dict) -> str:
    parts = []
    for ds in config.get("datasets") or []:
        prompts = ds.get("prompts") or {}
        isl, osl = prompts.get("isl") or {}, prompts.get("osl") or {}
        bits = [str(ds.get("type") or "dataset")]
        if isl.get("mean") is not None:
            bits.append(f"input {isl['mean']:g}" + (f"±{isl['stddev']:g}" if isl.get("stddev") else ""))
        if osl.get("mean") is not None:
            bits.append(f"output {osl['mean']:g}")
        parts.append(", ".join(bits))
    kind = phase.get("type")
    if kind == "concurrency":
        parts.append("one at a time" if phase.get("concurrency") == 1 else f"concurrency {phase.get('concurrency')}")
    elif kind:
        parts.append(f"{kind} {phase.get('rate')}/s" if phase.get("rate") is not None else str(kind))
    return "; ".join(parts)


def _cache_bust_target(config: dict) -> str | None:
    for ds in config.get("datasets") or []:
        for where in (ds.get("prompts") or {}, ds):
            cb = where.get("cache_bust") if isinstance(where, dict) else None
            target = cb.get("target") if isinstance(cb, dict) else cb
            if target and target != "none":
                return str(target)
    return None


def read(path: pathlib.Path) -> list[Run]:
    path = pathlib.Path(path)
    records = _records(path)
    spath = _summary_path(path)
    summary: dict | None = None
    if spath.is_file():
        try:
            summary = json.loads(spath.read_text(encoding="utf-8"))
        except ValueError:
            summary = None
        if not isinstance(summary, dict):
            summary = None
    config = (summary or {}).get("input_config") or {}
    endpoint = config.get("endpoint") or {}
    server_counts_flag = bool(endpoint.get("use_server_token_count"))

    warmup = [r for r in records if r["metadata"].get("benchmark_phase") == "warmup"]
    by_phase: dict[int, list[dict]] = {}
    for r in records:
        if r["metadata"].get("benchmark_phase") == "warmup":
            continue
        by_phase.setdefault(r["metadata"].get("profiling_index") or 0, []).append(r)

    runs = []
    for index, recs in sorted(by_phase.items()):
        recs.sort(key=lambda r: r["metadata"]["request_start_ns"])
        requests = [_request(r, server_counts_flag) for r in recs]
        ok = [q for q in requests if q.ok]
        phase = _profiling_phase(config, index)
        notes: list[str] = []
        lacks: dict[str, str] = {}

        if summary is None:
            notes.append(f"no AIPerf summary beside the records ({spath.name}): the run's settings and "
                         "AIPerf's own figures are not known (AIPerf writes none when every request failed)")
        if warmup:
            notes.append(f"{len(warmup)} warmup record(s) left out (benchmark_phase 'warmup')")
        gaps = [b - a for q in ok if q.token_times_s for a, b in zip(q.token_times_s, q.token_times_s[1:])]
        zeros = sum(1 for g in gaps if g == 0)
        if zeros:
            notes.append(f"{zeros} of {len(gaps)} chunk gaps are 0: AIPerf stamps each SSE message with the "
                         "time of the network read that completed it, so messages read together share a time")
        if len(by_phase) > 1:
            notes.append(f"profiling phase {index} of {len(by_phase)} in the file; the summary's figures "
                         "are for all phases together")

        if ok and any(q.prompt_tokens_source != "server" for q in ok):
            lacks["exact_prompt_lengths"] = (
                "AIPerf's input_sequence_length is its own tokenizer (--tokenizer) encoding the prompt text "
                "it sent; the server's usage_prompt_tokens is not in every record")
        if ok and any(q.token_times_s is None for q in ok):
            lacks["token_times"] = (
                "records without inter_chunk_latency (not streamed, or AIPerf had fewer than two content "
                "chunks): only AIPerf's per-request average inter_token_latency is kept")
        target = _cache_bust_target(config)
        if target not in _PREFIX_BUST:
            if summary is None:
                bust = "unless --cache-bust put one there, which without the summary the file does not say"
            elif target:
                bust = f"(--cache-bust {target} puts no unique marker at the prompt's start)"
            else:
                bust = "(no --cache-bust)"
            why = ("AIPerf's synthetic prompts are windows of its text corpus at seeded random offsets, with no "
                   f"unique prefix {bust}; with one --random-seed a longer run's prompts begin with a shorter "
                   "run's (dataset/generator/prompt.py)")
            if endpoint.get("reset_kv_cache"):
                why += "; --reset-kv-cache flushes the cache once before the run, not between requests"
            lacks["cache_busting"] = why
        if ok and any(q.prompt_tokens_source != "server" or q.completion_tokens_source != "server" for q in ok):
            lacks["server_counts"] = ("the server's usage (usage_prompt_tokens, usage_completion_tokens) is "
                                      "not in every record: the server sent none or AIPerf did not ask")
        elif ok and all(q.cached_tokens is None for q in ok):
            lacks["server_counts"] = (
                "the server's usage gives prompt and completion tokens but no record has a cached count "
                "(usage_prompt_cache_read_tokens): the server reported none (SGLang reports "
                "prompt_tokens_details.cached_tokens only with --enable-cache-report and when some "
                "were cached)")

        requested = None
        for ds in config.get("datasets") or []:
            mean = ((ds.get("prompts") or {}).get("isl") or {}).get("mean")
            stddev = ((ds.get("prompts") or {}).get("isl") or {}).get("stddev") or 0
            if mean is not None:
                requested = int(mean)
                if stddev:
                    notes.append(f"input lengths drawn around {mean:g} with stddev {stddev:g}")
        models = [m.get("name") for m in (config.get("models") or {}).get("items") or [] if isinstance(m, dict)]
        rate = phase.get("rate")
        start_ns = recs[0]["metadata"]["request_start_ns"]
        runs.append(Run(
            tool=TOOL,
            tool_version=(summary or {}).get("aiperf_version"),
            version_source=(f"the summary's aiperf_version ({spath.name})" if (summary or {}).get("aiperf_version")
                            else f"no version: the records do not hold one and {spath.name} is "
                                 + ("absent" if summary is None else "without aiperf_version")),
            path=str(path),
            record=len(runs),
            label=_label(config, phase) if config else f"{len(recs)} requests (no summary)",
            requests=requests,
            requested_input_tokens=requested,
            concurrency=phase.get("concurrency") if isinstance(phase.get("concurrency"), int) else None,
            request_rate=float(rate) if isinstance(rate, (int, float)) else None,
            model=models[0] if len(models) == 1 else None,
            started_at=_dt.datetime.fromtimestamp(start_ns / 1e9, _dt.timezone.utc).isoformat(),
            lacks=lacks,
            tool_summary=_tool_summary(summary) if summary else {},
            notes=notes,
        ))
    return runs
