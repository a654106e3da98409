"""One length of the protocol: warm-up, trials, batches, the needle probe, and the ITL-depth request.

Each trial is a prompt of exactly L tokens (a prefix unique to it, the cache flushed before it),
streamed and timed (measure.stream); its counts checked against what was asked (measure.prompts);
with telemetry, its samples split into the prefill and the decode window. A length the server said
it cannot hold, a surprise, or the server's fault is the result's status and reason, never an
exception. Timeouts scale with the fits of the lengths measured so far (request_timeout).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from ..engines import ConfigurationSpec
from .needle import probe as needle_probe
from .progress import Progress, fitted
from .prompts import check_counts
from .rawfiles import may_pass
from .session import Session
from .stream import StreamRecord
from .sampling import Sampler, summarize

log = logging.getLogger("longctx.measure.protocol")
progress = logging.getLogger("longctx.progress")


class LengthRefused(Exception):
    """A length the server said, at start-up, that it cannot hold."""


def _spec_from_counters(before: dict | None, after: dict | None) -> dict:
    """Per-request acceptance from server-wide counters (vLLM): the deltas over one request."""
    if not before or not after:
        return {}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    drafts, proposed, accepted = d.get("drafts", 0), d.get("draft_tokens", 0), d.get("accepted_tokens", 0)
    if not drafts:
        return {}
    return {"spec_verify_ct": drafts, "spec_num_proposed_drafts": proposed, "spec_num_correct_drafts": accepted,
            "spec_accept_length": 1 + accepted / drafts, "spec_accept_rate": accepted / proposed if proposed else None,
            "spec_source": "metrics"}


def measure_length(session: "Session", spec: ConfigurationSpec, length: int, run_id: str,
                   timeout_s: float | None = None, tracker: Progress | None = None, stall_s: float | None = None) -> dict:
    """Warm-up and trials of one length; with the session's telemetry source, its samples over all
    of them and, per trial, their summaries over the prefill and the decode window. Each warm-up and
    trial done is told to tracker (a progress line); stall_s, each lone request's stall bound."""
    timeout_s = timeout_s or spec.protocol["request_timeout_s"]
    telemetry = session.source
    if telemetry is None:
        return _requests(session, spec, length, run_id, timeout_s, tracker, stall_s)
    with Sampler(telemetry, spec.telemetry["interval_s"]) as sampler:
        result = _requests(session, spec, length, run_id, timeout_s, tracker, stall_s, sampler)
    for t in result["trials"]:
        t["telemetry"] = {
            "prefill": summarize(sampler.samples, t.get("t_sent"), t.get("t_first_token"), telemetry.metrics),
            "decode": summarize(sampler.samples, t.get("t_first_token"), t.get("t_last_token"), telemetry.metrics),
        }
    result["telemetry"] = {"source": telemetry.kind, "description": telemetry.describe(),
                           "interval_s": spec.telemetry["interval_s"],
                           "samples": [[round(t, 6), s] for t, s in sampler.samples]}
    return result


def _predicted(history: list[tuple[int, float, float | None]], length: int) -> tuple[float, float]:
    """(TTFT, TPOT) at `length` from (length, TTFT, TPOT) of the trials measured so far: the fits of progress.fitted
    from three lengths on, as the progress lines' time left; before, the longest length's TTFT scaled quadratically
    and its TPOT linearly (TPOT 0 where none was measured)."""
    predicted = fitted(history, [length])
    if predicted is not None:
        return float(predicted[0][0]), float(predicted[1][0])
    longest = max(h[0] for h in history)
    ttft = max(h[1] for h in history if h[0] == longest) * (length / longest) ** 2
    tpots = [h[2] for h in history if h[2]]
    return ttft, max(tpots) * max(1.0, length / longest) if tpots else 0.0


def request_timeout(proto: dict, history: list[tuple[int, float, float | None]], length: int) -> float:
    """Timeout for a request of `length` tokens: timeout_factor x its expected duration (_predicted), never less
    than request_timeout_s."""
    floor = proto["request_timeout_s"]
    if not history:
        return floor
    ttft, tpot = _predicted(history, length)
    return max(floor, proto["timeout_factor"] * (ttft + proto["output_tokens"] * tpot))


# A lone stream that goes this long without a byte once its first token is in has stalled (its server stopped, or
# a network path dropped it): STALL_STEPS tokens' decode time (TPOT as predicted at its length; a speculative step
# carries several tokens, a pause of the server's or a garbage collection is a few steps), never less than
# STALL_MIN_S. A buffer that holds a stream's events and hands them on in flushes makes longer gaps, but a stream
# whose flushes hold that many tokens is a burst (measure.burst), whose TPOT is not measured: behind such a buffer
# there is no TPOT to predict from, and no bound.
STALL_STEPS = 50
STALL_MIN_S = 5.0


def stall_timeout(history: list[tuple[int, float, float | None]], length: int, timeout_s: float) -> float | None:
    """The stall bound of a lone request of `length` tokens (STALL_STEPS, STALL_MIN_S), at most its timeout; None
    before any decode step was measured (the request's timeout is then the only bound)."""
    tpot = _predicted(history, length)[1] if history else 0.0
    return min(timeout_s, max(STALL_MIN_S, STALL_STEPS * tpot)) if tpot > 0 else None


def _gone_quiet(session: "Session", failure: str | None) -> bool:
    """Whether a request that failed so (a timeout, a stall, a lost connection) left a server that no longer answers
    its health path: then no further request is sent to it (the sweep replaces it)."""
    return may_pass(failure) and not session.healthy()


def one_request(session: "Session", spec: ConfigurationSpec, length: int, tag: str, timeout_s: float,
                stall_s: float | None = None, sampler: Sampler | None = None) -> dict | None:
    """One lone request of the protocol: a prompt of exactly `length` tokens with a prefix unique to `tag`, the cache
    flushed before it (protocol.flush_cache), streamed and timed, speculative acceptance from the server's counters
    where its stream has none, its counts checked (its status says what went wrong). None where the flush found the
    server gone quiet (nothing is sent to it). With a telemetry `sampler`, its phases are bracketed by samples of
    their own where the telemetry counts over intervals (Sampler.mark: just before it is sent, at its first token,
    after its last)."""
    proto = spec.protocol
    client, base, adapter, api, prompter = session.client, session.base, session.adapter, session.api, session.prompter
    body = prompter.body(length, tag, proto["output_tokens"])
    flush_error = session.flush(timeout_s) if proto["flush_cache"] else None
    if _gone_quiet(session, flush_error):
        return None
    counters = adapter.spec_counters(client, base)
    record = None
    if sampler is not None and sampler.marks:
        sampler.mark_now()
        record = StreamRecord(arm=(1, sampler.mark))
    summary = prompter.generate(client, base + api.generate_path, body, timeout_s, length, record=record,
                                stall_s=stall_s)
    if record is not None:
        sampler.mark_now()
    summary["timeout_s"] = timeout_s
    if counters is not None and summary["spec_verify_ct"] is None:
        summary.update(_spec_from_counters(counters, adapter.spec_counters(client, base)))
    summary["flush_error"] = flush_error
    check_counts(summary, length, proto["output_tokens"])
    return summary


def _requests(session: "Session", spec: ConfigurationSpec, length: int, run_id: str, timeout_s: float,
              tracker: Progress | None, stall_s: float | None = None, sampler: Sampler | None = None) -> dict:
    proto = spec.protocol
    name = spec.name
    warmup, trials = [], []
    total = proto["warmup"] + proto["trials"]
    quiet = False  # the server stopped answering: nothing more is sent to it
    for i in range(total):
        is_warmup = i < proto["warmup"]
        summary = one_request(session, spec, length, f"{run_id}/{name}/{length}/{i}", timeout_s, stall_s, sampler)
        if summary is None:
            quiet = True
            break
        if is_warmup:
            summary.pop("itl_s", None)
            warmup.append(summary)
        else:
            summary["trial"] = len(trials)
            trials.append(summary)
        if tracker is not None:
            tracker.request(is_warmup, len(warmup) if is_warmup else len(trials),
                            proto["warmup"] if is_warmup else proto["trials"], summary)
        if summary["status"] != "ok" and _gone_quiet(session, summary.get("reason")):
            quiet = True
            break
    batches = [] if quiet else [_batch(session, spec, length, run_id, timeout_s, c, b)
                                for c in proto["concurrency"] for b in range(proto["trials"])]
    every = trials + [r for batch in batches for r in batch["requests"]]
    ok = [t for t in every if t["status"] == "ok"]
    status = "ok" if len(ok) == len(every) and not quiet else ("partial" if ok else "failed")
    reasons = sorted({t["reason"] for t in every if t["status"] != "ok"})
    failed_warmups = [w for w in warmup if w["status"] != "ok"]
    if failed_warmups:  # said beside the trials' reasons: a length measured after a failed warm-up is not cold-start clean
        reasons.append(f"{len(failed_warmups)} of {len(warmup)} warm-up request(s) failed: {failed_warmups[0]['reason']}")
    if quiet and not reasons:
        reasons.append(f"the server stopped answering before trial {len(trials) + 1} of {proto['trials']}")
    return {
        "status": status,
        "reason": "; ".join(reasons) or None,
        "quiet": quiet,
        "warmup_failed": len(failed_warmups),
        "warmup": warmup,
        "trials": trials,
        "batches": batches,
    }


def _needle(session: "Session", spec: ConfigurationSpec, length: int, timeout_s: float) -> dict | None:
    cfg = spec.protocol["needle"]
    if not cfg["enabled"]:
        return None
    result = needle_probe(session.client, session.base, session.api.kind, session.adapter.served_model(spec), length, cfg,
                          timeout_s, session.random_weights)
    log.info("%s L=%d needle: %s", spec.name, length, result["status"])
    return result


def _batch(session: "Session", spec: ConfigurationSpec, length: int, run_id: str, timeout_s: float,
           concurrency: int, index: int) -> dict:
    """`concurrency` requests of `length` tokens sent together: each one's figures, and the batch's
    output rate (all output tokens over the span from the first send to the last token)."""
    proto, api, name, client, base = spec.protocol, session.api, spec.name, session.client, session.base
    bodies = [session.prompter.body(length, f"{run_id}/{name}/{length}/c{concurrency}/{index}/{j}", proto["output_tokens"])
              for j in range(concurrency)]
    if proto["flush_cache"]:
        session.flush(timeout_s)
    start = threading.Barrier(concurrency)

    def one(body: bytes) -> dict:
        start.wait()
        return session.prompter.generate(client, base + api.generate_path, body, timeout_s, length)

    with ThreadPoolExecutor(concurrency) as pool:
        requests = [check_counts(s, length, proto["output_tokens"]) for s in pool.map(one, bodies)]
    for j, r in enumerate(requests):
        r.update(concurrency=concurrency, batch=index, request=j, timeout_s=timeout_s)
    ok = [r for r in requests if r["status"] == "ok"]
    aggregate = {"ok": len(ok), "requests": concurrency}
    if ok:
        span = max(r["t_last_token"] for r in ok) - min(r["t_sent"] for r in ok)
        aggregate.update(output_tok_s=sum(r["completion_tokens"] for r in ok) / span if span > 0 else None,
                         ttft_max_s=max(r["ttft_s"] for r in ok))
        for r in requests:
            r["batch_output_tok_s"] = aggregate["output_tok_s"]
    log.info("%s L=%d %d at once, batch %d: %d ok, %s tok/s overall", name, length, concurrency, index + 1, len(ok),
             f"{aggregate.get('output_tok_s') or float('nan'):.1f}")
    return {"concurrency": concurrency, "batch": index, "requests": requests, "aggregate": aggregate}


def measure_itl_depth(session: "Session", spec: ConfigurationSpec, run_id: str, history: list) -> dict:
    """One request of itl_depth.length prompt tokens decoding output_tokens: the gap before each
    token against the KV depth it was decoded at (prompt + tokens before it)."""
    depth = spec.protocol["itl_depth"]
    length, n = depth["length"], depth["output_tokens"]
    timeout = request_timeout({**spec.protocol, "output_tokens": n}, history, length)
    body = session.prompter.body(length, f"{run_id}/{spec.name}/itl-depth", n)
    s = session.prompter.generate(session.client, session.base + session.api.generate_path, body, timeout, length)
    itl = s.pop("itl_s", None) or []
    check_counts(s, length, n)
    return {"kind": "itl_depth", "length": length, "output_tokens": n, **s,
            "itl_s": itl, "depth": [length + 1 + i for i in range(len(itl))]}


def samples(length: int, result: dict) -> list[tuple[int, float, float | None]]:
    """(length, TTFT, TPOT) of a length's successful trials."""
    return [(length, t["ttft_s"], t.get("tpot_s")) for t in result["trials"] if t["status"] == "ok"]


def length_line(result: dict) -> str:
    """A measured length in one line: its status, trials that succeeded, median TTFT and decode rate."""
    ok = [t for t in result.get("trials") or [] if t["status"] == "ok"]
    line = f"{result['status']}, {len(ok)} of {len(result.get('trials') or [])} trials"
    if ok:
        ttft = sorted(t["ttft_s"] for t in ok)[len(ok) // 2]
        rates = sorted(t["decode_tok_s"] for t in ok if t.get("decode_tok_s"))
        line += f", TTFT {ttft:.3f} s" + (f", decode {rates[len(rates) // 2]:.1f} tok/s" if rates else "")
        held = sum(1 for t in ok if t.get("burst"))
        if held:  # longctx.measure.burst
            line += f", decode not measured in {held} of them: their tokens did not arrive apart"
    return line + (f" ({result['reason'][:200]})" if result.get("reason") and result["status"] != "ok" else "")


def measure_at(session: "Session", spec: ConfigurationSpec, length: int, run_id: str, history: list,
               tracker: Progress, needle: bool = True) -> dict:
    """One length's warm-up and trials (measure_length) and its needle probe, with the server brought up first;
    a refused length, a surprise or the server's fault is the result's status and reason, never an exception.
    The successful trials join history."""
    name = spec.name
    session.up()
    tracker.needle = needle and spec.protocol["needle"]["enabled"] and not session.random_weights
    timeout_s = request_timeout(spec.protocol, history, length)
    too_long = session.refuses(length, spec.protocol["output_tokens"])
    try:
        if too_long:  # nothing is sent: the server would refuse it, or evict to serve it
            raise LengthRefused(too_long)
        result = measure_length(session, spec, length, run_id, timeout_s, tracker,
                                stall_timeout(history, length, timeout_s))
        result["needle"] = _needle(session, spec, length, timeout_s) if needle else None
        history += samples(length, result)
    except LengthRefused as exc:
        progress.error("%s L=%d: %s", name, length, exc)
        result = {"status": "failed", "reason": str(exc), "warmup": [], "trials": []}
    except Exception as exc:  # a bug or a surprise must not cost the lengths already measured
        log.exception("%s L=%d: measurement failed", name, length)
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "warmup": [], "trials": []}
    quiet = result.pop("quiet", False)  # the health check that found it so is not asked twice
    if result["status"] != "ok" and not too_long and (quiet or not session.healthy()):
        reason = session.fault(f"while measuring length {length}", "the next length")
        # the fault is what the report names for the length, not the transport errors it caused
        result.update(status="failed", fault=reason, reason="; ".join(filter(None, [reason, result.get("reason")])))
        progress.error("%s L=%d: %s", name, length, reason)
    return result
