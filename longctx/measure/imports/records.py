"""What a benchmark tool's result file holds, in one shape for every format: runs of requests.

Each format's reader (longctx.measure.imports.<format>.read) turns one file into a list of Run, keeping
only what the file says: a value the file does not hold is None, never a guess, and what the format lacks
for longctx's analysis is said in Run.lacks. longctx.measure.imports then groups the requests into lengths
and writes the same raw files a measured configuration writes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# What a result file may lack that longctx's own measurement has; Run.lacks maps each one lacking to why.
LACKS = {
    "exact_prompt_lengths": "each request's prompt length as the server counted it",
    "token_times": "the arrival time of every token-carrying chunk",
    "cache_busting": "prompts that no prefix cache can serve (a unique prefix, a flushed cache)",
    "server_counts": "the server's own counts (usage: prompt, completion and cached tokens)",
}


@dataclass
class Request:
    """One request as the tool recorded it. Times are seconds; a field the file does not hold is None."""

    ok: bool  # False where the tool itself marked the request failed (an error, no output)
    reason: str | None = None  # the tool's error text for a failed request
    prompt_tokens: int | None = None  # as the tool counted them (prompt_tokens_source says by what)
    completion_tokens: int | None = None
    ttft_s: float | None = None  # request sent to first token (or first chunk) received
    e2e_s: float | None = None  # request sent to the response's end, as the tool measured it
    # the gaps between successive token-carrying chunks after the first, as recorded (vLLM's itls); a
    # reader with arrival times fills token_times_s instead
    itl_s: list[float] | None = None
    # each token-carrying chunk's arrival, seconds after the request was sent (the first is the TTFT)
    token_times_s: list[float] | None = None
    # the tool's own time per output token, only where the file has neither itl_s nor token_times_s
    tpot_s: float | None = None
    start_s: float | None = None  # when it was sent, seconds on the tool's clock (for order and overlap)
    # "tool": the tool's tokenizer or its dataset; "server": the server's usage; "tool or server": the tool keeps the
    # server's usage where the server gave one, its own count otherwise, and the file does not say which
    prompt_tokens_source: str = "tool"
    completion_tokens_source: str = "tool"
    cached_tokens: int | None = None  # the server's cached count, where the file holds it


@dataclass
class Run:
    """One run of the tool (one invocation, or one benchmark of a sweep): its settings and its requests."""

    tool: str  # "vllm bench serve", "sglang bench_serving", "AIPerf", "GuideLLM"
    tool_version: str | None  # as the file records it; None where it does not (version_source says so)
    version_source: str  # where the version was read ("the file's metadata.version"), or why there is none
    path: str  # the file
    record: int  # the run's place in the file (JSONL line, benchmark index), from 0
    label: str  # how the file names or describes the run ("random, input 1024, output 64, one at a time")
    requests: list[Request]
    requested_input_tokens: int | None = None  # the run's configured input length, where the file says
    concurrency: int | None = None  # the configured limit on requests in flight (1: one at a time); None: none set or not said
    request_rate: float | None = None  # the configured arrival rate (requests/s); None: as fast as allowed, or not said
    model: str | None = None  # the served model the file names
    started_at: str | None = None  # ISO 8601, where the file dates the run
    lacks: dict[str, str] = field(default_factory=dict)  # a key of LACKS -> why this format (or this file) lacks it
    # the tool's own summary figures for the run (seconds, tokens/s, counts), as the file holds them: the
    # tests check longctx's reading of the requests against them (keys such as median_ttft_s, mean_tpot_s)
    tool_summary: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # anything else the report should say about the run

    def to_dict(self) -> dict:
        return asdict(self)
