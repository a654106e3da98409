"""Reused context (config key prefix): the hit-rate axis and growing conversations, measured on the
sweep's own server after the load workloads.

- Hit-rate axis: per length L and hit rate h, the server's cache is flushed; one request (the warm-up,
  not a trial) sends the shared head of P = round(h L) tokens and decodes one token, so that the server
  holds the head's KV; then `trials` requests each send the head and L - P tokens of their own, which
  part from one another at their first token (so that no trial finds more than the head in the cache).
- Conversation: turn 0 sends turn_tokens tokens; each later turn sends the previous turn's prompt, what
  the server generated for it, and turn_tokens new ones, while prompt and output fit max_context; with
  control, the same conversation again, the cache flushed before every turn.

Every request's cached count, as the server reports it (SGLang's meta_info.cached_tokens, OpenAI's
usage.prompt_tokens_details.cached_tokens), is checked against the count it must be: the tokens the
prompt shares with what the cache holds, rounded down to the cache's page or block (the adapter's
cache_granularity), at most the prompt less one (one token is always computed, for the logits: SGLang's
and vLLM's rule). A count outside is a "mismatch" with both numbers kept; one the server does not give
is "unreported". Where the granularity is not known the count must lie within UNKNOWN_SPAN tokens below.
"""

from __future__ import annotations

import logging
from typing import Callable

from .stream import StreamRecord
from .points import measure_points
from .prompts import check_counts

log = logging.getLogger("longctx.measure.prefix")

UNKNOWN_SPAN = 256  # where the cache's granularity is not known: the largest page or block a server uses


def expected_range(shared_low: int, shared_high: int, prompt: int, granularity: int | None, cache: bool) -> tuple[int, int]:
    """The cached counts a prompt of `prompt` tokens may be given when it shares shared_low to shared_high
    tokens with what the cache holds: each rounded down to the granularity and capped at prompt - 1."""
    if not cache:
        return 0, 0
    cap = max(0, prompt - 1)
    low, high = min(shared_low, cap), min(shared_high, cap)
    if granularity is None:
        return (max(0, low - UNKNOWN_SPAN + 1) if low else 0), high
    return low // granularity * granularity, high // granularity * granularity


def cached_check(cached: int | None, low: int, high: int) -> str:
    if cached is None:
        return "unreported"
    return "ok" if low <= int(cached) <= high else "mismatch"


def points(prefix: dict) -> list[tuple]:
    """Every point, in the order measured: ("hit_rate", L, h), then ("conversation", cache)."""
    out: list[tuple] = [("hit_rate", L, float(h)) for L in prefix["lengths"] for h in prefix["hit_rates"]]
    conv = prefix["conversation"]
    if conv["max_context"]:
        out.append(("conversation", True))
        if conv["control"]:
            out.append(("conversation", False))
    return out


def point_key(point: dict) -> tuple:
    if point["kind"] == "hit_rate":
        return "hit_rate", point["length"], float(point["hit_rate"])
    return "conversation", bool(point["cache"])


def failed_point(item: tuple, reason: str) -> dict:
    if item[0] == "hit_rate":
        return {"kind": "hit_rate", "length": item[1], "hit_rate": item[2], "status": "failed", "reason": reason,
                "warm": None, "requests": []}
    return {"kind": "conversation", "cache": item[1], "status": "failed", "reason": reason, "turns": []}


def describe(point: dict) -> str:
    reqs = point.get("requests") if point["kind"] == "hit_rate" else point.get("turns")
    reqs = reqs or []
    what = (f"prefix L={point['length']} hit rate {point['hit_rate']:g}" if point["kind"] == "hit_rate"
            else f"conversation {'with the cache' if point['cache'] else 'flushed before every turn'}")
    line = f"{what}: {point['status']}"
    ttfts = sorted(r["ttft_s"] for r in reqs if r.get("status") == "ok" and r.get("ttft_s") is not None)
    if ttfts:
        line += f", median TTFT {ttfts[len(ttfts) // 2]:.3f} s"
    checks = [r.get("cached_check") for r in reqs]
    if checks:
        line += f", cached count {sum(c == 'ok' for c in checks)} of {len(checks)} as expected"
    return line + (f" ({point['reason'][:200]})" if point.get("reason") else "")


def _status(requests: list[dict]) -> tuple[str, str | None]:
    bad = [r for r in requests if r["status"] != "ok"]
    mismatched = [r for r in requests if r.get("cached_check") == "mismatch"]
    status = "ok" if requests and not bad else ("partial" if len(bad) < len(requests) else "failed")
    reasons = sorted({r["reason"] or "failed" for r in bad})
    words = [f"{sum((r['reason'] or 'failed') == why for r in bad)} of {len(requests)}: {why}" for why in reasons]
    if mismatched:  # measured all the same: the report names them with both numbers
        words.append(f"{len(mismatched)} of {len(requests)} cached counts not as expected")
    return status, "; ".join(words) or None


class PrefixRun:
    """The workloads of spec.prefix on the sweep's session (longctx.measure.session.Session); timeout(L, n)
    is the timeout of a request of L prompt and n output tokens, flush() empties the server's cache
    (an error in words, or None)."""

    def __init__(self, session, spec, run_id: str, timeout: Callable[[int, int], float], flush: Callable[[], str | None]):
        self.session, self.spec, self.cfg = session, spec, spec.prefix
        self.run_id, self.timeout, self.flush = run_id, timeout, flush
        facts = cache_facts(session, spec)  # a cache not known to be on or off is expected to cache: the check says
        self.cache, self.granularity = facts["cache"], facts["granularity"]

    @property
    def added(self) -> int:
        return self.session.prompter.plan.added_tokens

    def _send(self, prompt, length: int, output_tokens: int, record: StreamRecord | None = None) -> dict:
        """One request; with `record`, its generated ids asked for where the engine needs asking (a conversation)."""
        s = self.session
        body = s.prompter.body_of(prompt, output_tokens, extra=s.adapter.output_ids_request if record else None)
        summary = s.prompter.generate(s.client, s.base + s.api.generate_path, body, self.timeout(length, output_tokens),
                                      length, record=record)
        check_counts(summary, length, output_tokens)
        summary.pop("itl_s", None)
        return summary

    def _checked(self, summary: dict, low: int, high: int) -> dict:
        summary.update(expected_cached=high, expected_cached_low=low,
                       cached_check=cached_check(summary.get("cached_tokens"), low, high))
        return summary

    def hit_rate(self, length: int, h: float) -> dict:
        p = self.session.prompter
        n_prefix = round(h * length)
        key = f"{self.run_id}/{self.spec.name}/prefix/L{length}/h{h:g}"
        flush_error = self.flush()
        head = p.head(n_prefix, key + "/head")
        warm = None
        if n_prefix > self.added:  # the head, decoded for one token: the cache holds it after
            warm = self._send(head, n_prefix, 1)
            warm["flush_error"] = flush_error
        trials = []
        for j in range(self.cfg["trials"]):
            prompt = p.extend(head, length - n_prefix, f"{key}/trial{j}", lead=j + 1)
            summary = self._send(prompt, length, self.cfg["output_tokens"])
            # what the cache holds that this prompt shares: the head after the warm-up; without one, the
            # tokens the server adds to every prompt, once a trial has been served
            shared = n_prefix if warm is not None else (self.added if j else 0)
            low, high = expected_range(shared, shared, length, self.granularity, self.cache)
            trials.append(self._checked({**summary, "trial": j}, low, high))
        status, reason = _status(trials)
        if warm is not None and warm["status"] != "ok":
            status, reason = "failed", "; ".join(filter(None, [f"the warm-up request failed: {warm['reason']}", reason]))
        return {"kind": "hit_rate", "length": length, "hit_rate": h, "prefix_tokens": n_prefix,
                "expected_cached": trials[-1]["expected_cached"] if trials else None, "status": status, "reason": reason,
                "flush_error": flush_error, "warm": warm, "requests": trials}

    def conversation(self, cache: bool) -> dict:
        conv, p = self.cfg["conversation"], self.session.prompter
        k, m, limit = conv["turn_tokens"], conv["output_tokens"], conv["max_context"]
        key = f"{self.run_id}/{self.spec.name}/conversation/{'cache' if cache else 'control'}"
        prompt, tokens, turns = p.head(0, key), self.added, []
        carried = 0  # tokens of the conversation so far, as the server counted them, generated ones included
        low = high = 0
        generated = None
        while tokens + k + m <= limit:
            prompt = p.extend(prompt, k, f"{key}/turn{len(turns)}", lead=len(turns) + 1)
            length = tokens + k
            flush_error = None if cache else self.flush()
            rec = StreamRecord()
            summary = self._send(prompt, length, m, record=rec)
            lo, hi = expected_range(low, high, length, self.granularity, cache)
            turn = self._checked({**summary, "turn": len(turns), "previous_tokens": carried, "flush_error": flush_error,
                                  "generated": generated}, lo, hi)
            turns.append(turn)
            if summary["status"] != "ok":
                break
            # the next turn carries this one's prompt and what was generated for it; the cache holds the
            # prompt and the generated tokens less the last (never computed)
            out = summary.get("completion_tokens") or m
            prompt, generated = self._carry(prompt, rec, out, f"{key}/turn{len(turns) - 1}/output")
            carried = length + out
            if generated == "text":  # generated text, encoded with the rest, may not come to `out` tokens more
                carried = p.count(prompt)
            # exact where the ids were carried; else the cache matches the prompt (text: less a word at the seam,
            # where the generated text may merge with it) and, by chance, some of the rest
            low = length + {"ids": out - 1, "text": -2}.get(generated, 0)
            high = length + out - 1
            tokens = carried
        status, reason = _status(turns)
        if not turns:
            reason = (f"not sent: a turn of {k} tokens and {m} output tokens does not fit "
                      f"prefix.conversation.max_context ({limit})")
        return {"kind": "conversation", "cache": cache, "turn_tokens": k, "output_tokens": m, "max_context": limit,
                "status": status, "reason": reason, "turns": turns}

    def _carry(self, prompt, rec: StreamRecord, out: int, key: str):
        """prompt followed by what the server generated: its token ids where the stream gave them (exact),
        else its text for text prompts, else `out` tokens of ours in their place (the cache then matches
        the prompt and, by chance only, more)."""
        p = self.session.prompter
        if p.plan.prompt == "text":
            if rec.output_text:
                return prompt + "".join(rec.output_text), "text"
        elif rec.output_ids is not None and len(rec.output_ids) == out:
            return [*prompt, *rec.output_ids], "ids"
        return p.extend(prompt, out, key, lead=0), "substituted"

    def measure(self, item: tuple) -> dict:
        return self.hit_rate(item[1], item[2]) if item[0] == "hit_rate" else self.conversation(item[1])


def run_prefix(session, spec, run_id: str, timeout: Callable[[int, int], float], flush: Callable[[], str | None],
               keep: Callable[[list[dict]], None], kept: list[dict] | None = None, retries=None) -> list[dict]:
    """Every point of spec.prefix on the sweep's session; keep(points) after each (measure_points)."""
    runs: list[PrefixRun] = []

    def measure(item: tuple) -> dict:
        if not runs:  # once the server is up: its flags and what it reports say the cache and its granularity
            runs.append(PrefixRun(session, spec, run_id, timeout, flush))
        return runs[0].measure(item)

    return measure_points(session, spec.name, points(spec.prefix), point_key, measure, failed_point, describe, keep, kept,
                          retries)


def cache_facts(session, spec) -> dict:
    """What prefix.json says of the server's cache: whether it is on, the tokens it matches by."""
    info = session.prov.get("server_info") or {}
    on = session.adapter.prefix_cache(spec.args, info)
    return {"cache": True if on is None else bool(on), "cache_known": on is not None,
            "granularity": session.adapter.cache_granularity(spec, info)}
