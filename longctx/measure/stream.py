"""One streamed request: every event time-stamped on arrival, parsed per API into a StreamRecord.

``stream_generate`` (blocking) and ``astream_generate`` (asyncio) POST a serialised body and feed
each read's bytes to one parser (``StreamParser``), so that a stream gives the same record either way:
events split on the SSE blank line, SGLang's cumulative counts and meta_info, or OpenAI's chunks (which
events are tokens: EVENT_RULES) checked against the server's usage. Bytes are read as the network hands
them over (no small fixed read buffer). With a client from measure.transport the times are the
socket's (measure.wire): the request's first byte written, each event's kernel receive stamp; with any
other httpx client, the moments around the httpx calls. ``StreamRecord.summary()`` gives TTFT, the
inter-token gaps (a chunk's gap divided among the tokens it carries) and the rates, or, for a stream whose
tokens did not arrive apart (``burst``: a buffer between the server and the client held them), TTFT alone and
why its decode was not measured.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

from .bodies import JSON_HEADERS
from .direct import body_decoder, read_direct
from .burst import burst
from .wire import AsyncWireStream, Stamped, WireStream

# SGLang 0.5.23's speculative fields in the final meta_info
SPEC_FIELDS = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts")


def normalize_spec_fields(meta: dict) -> dict:
    """SGLang 0.5.9 reported spec_accept_token_num / spec_draft_token_num; 0.5.23 names them
    spec_num_correct_drafts / spec_num_proposed_drafts and adds the rates. Fill in the new names."""
    meta = dict(meta)
    if "spec_num_correct_drafts" not in meta and "spec_accept_token_num" in meta:
        meta["spec_num_correct_drafts"] = meta["spec_accept_token_num"]
    if "spec_num_proposed_drafts" not in meta and "spec_draft_token_num" in meta:
        meta["spec_num_proposed_drafts"] = meta["spec_draft_token_num"]
    verify, done = meta.get("spec_verify_ct"), meta.get("completion_tokens")
    if meta.get("spec_accept_length") is None and verify and done is not None:
        meta["spec_accept_length"] = done / verify
    correct, proposed = meta.get("spec_num_correct_drafts"), meta.get("spec_num_proposed_drafts")
    if meta.get("spec_accept_rate") is None and proposed:
        meta["spec_accept_rate"] = correct / proposed
    return meta


@dataclass
class StreamRecord:
    t_sent: float = 0.0  # the request's first byte written (timed_client) or the httpx call made
    t_call: float = 0.0  # the httpx call made
    arrival_clock: str = "call"  # "kernel", "socket" (timed_client) or "call": where arrival times come from
    event_times: list[float] = field(default_factory=list)  # arrival of each token-carrying event
    event_seen: list[float] = field(default_factory=list)  # when httpx handed its bytes over
    event_tokens: list[int] = field(default_factory=list)  # tokens each of those events carried
    event_sent: list[float | None] = field(default_factory=list)  # the server's send time of each, where it says
    t_done: float | None = None
    meta: dict = field(default_factory=dict)  # the last meta_info seen
    http_status: int | None = None
    sized: bool = False  # the response came with a Content-Length: whole before its first byte was sent
    error: str | None = None
    tokens_estimated: bool = False  # OpenAI streams: the events counted did not match the server's count (or it gave none)
    event_text: list[bool] = field(default_factory=list)  # OpenAI streams: whether each counted event carried text
    # what was generated, where the stream says (a conversation's next turn carries it): SGLang's output_ids
    # (cumulative or, with incremental streaming, deltas) or the token_ids of OpenAI chunks; the text of OpenAI chunks
    output_ids: list[int] | None = None
    output_text: list[str] = field(default_factory=list)
    # a closed loop's hand-over: `ends` (a wire.Gate) is opened at [DONE], and arm[1]() called once the stream
    # has arm[0] tokens (the next request then built, connected and held on `ends`)
    ends: object | None = field(default=None, repr=False)
    arm: tuple | None = field(default=None, repr=False)
    wire: object | None = field(default=None, repr=False)  # the timed connection it is read from (set where `ends` is)

    @property
    def ok(self) -> bool:
        return self.error is None and self.t_done is not None and bool(self.event_times)

    def summary(self) -> dict:
        """TTFT, inter-token gaps (a chunk's gap divided among the tokens it carries), rates."""
        out: dict = {"status": "ok" if self.ok else "failed", "reason": self.error, "http_status": self.http_status,
                     "tokens_estimated": self.tokens_estimated}
        meta = normalize_spec_fields(self.meta)
        out.update(
            prompt_tokens=meta.get("prompt_tokens"),
            completion_tokens=meta.get("completion_tokens"),
            cached_tokens=meta.get("cached_tokens"),
            finish_reason=meta.get("finish_reason"),
            server_e2e_latency_s=meta.get("e2e_latency"),
            **{k: meta.get(k) for k in SPEC_FIELDS},
            server_timestamps=meta.get("timestamps"),
        )
        finish = meta.get("finish_reason")
        if out["status"] == "ok" and (finish.get("type") if isinstance(finish, dict) else finish) == "abort":
            # SGLang (and the reference engine) end a request they gave up on with finish_reason abort: its tokens
            # stop there, so it is not a measurement of what was asked
            message = finish.get("message") if isinstance(finish, dict) else None
            out.update(status="failed", reason=f"the server aborted the request: {message or 'no message'}")
        ts = meta.get("timestamps") or {}
        if "first_token_sent" in ts and "received" in ts:
            out["server_ttft_s"] = ts["first_token_sent"] - ts["received"]
        lags = [t - s for t, s in zip(self.event_times, self.event_sent) if s is not None]
        if lags:  # same-machine servers that stamp their events (CLOCK_MONOTONIC): the client's own delay
            out.update(recv_lag_mean_s=statistics.fmean(lags), recv_lag_median_s=statistics.median(lags),
                       recv_lag_max_s=max(lags), send_lag_s=ts["received"] - self.t_sent if "received" in ts else None)
        # the client's own costs: httpx's request set-up, and events waiting for httpx to hand them over
        out.update(arrival_clock=self.arrival_clock, send_setup_s=self.t_sent - self.t_call,
                   read_delay_mean_s=statistics.fmean(s - t for s, t in zip(self.event_seen, self.event_times))
                   if self.event_seen else None)
        if not self.event_times:
            return out
        t = self.event_times
        itl: list[float] = []
        for i in range(1, len(t)):
            n = self.event_tokens[i]
            itl += [(t[i] - t[i - 1]) / n] * n
        decode_tokens = sum(self.event_tokens[1:])
        decode_s = t[-1] - t[0]
        out.update(
            t_sent=self.t_sent,
            t_first_token=t[0],
            t_last_token=t[-1],
            ttft_s=t[0] - self.t_sent,
            e2e_s=(self.t_done or t[-1]) - self.t_sent,
            decode_s=decode_s,
            tpot_s=decode_s / decode_tokens if decode_tokens else None,
            decode_tok_s=decode_tokens / decode_s if decode_tokens and decode_s > 0 else None,
            itl_median_s=statistics.median(itl) if itl else None,
            # the largest wait between two events (a chunk of 3 tokens after 300 ms is a 300 ms wait, not three of 100)
            itl_max_s=max(t[i] - t[i - 1] for i in range(1, len(t))) if len(t) > 1 else None,
            itl_s=itl,
            burst=False,
            decode_unmeasured=None,
        )
        why = burst(t, self.event_tokens, self.sized)
        if why:  # TTFT stands (the first byte's arrival); the decode figures would be the buffer's, not the server's
            out.update(burst=True, decode_unmeasured=why, decode_s=None, tpot_s=None, decode_tok_s=None,
                       itl_median_s=None, itl_max_s=None, itl_s=None)
        return out


def _sglang_event(rec: "StreamRecord", obj: dict) -> int | None:
    """Cumulative completion tokens after an SGLang event (None: no token information)."""
    rec.meta = obj.get("meta_info", {})
    total = rec.meta.get("completion_tokens")
    ids = obj.get("output_ids")
    if isinstance(ids, list):  # the whole output so far (SGLang's default), or this event's tokens (incremental)
        if rec.output_ids is None or (total is not None and len(ids) == total):
            rec.output_ids = list(ids)
        else:
            rec.output_ids.extend(ids)
    return total


# Which OpenAI stream events are tokens (the prompt probe decides, from the server's own count):
# every event with a choice, empty text included; only those with text; every one but a final empty
# event that only carries the finish reason (llama.cpp-style servers).
EVENT_RULES = ("every", "text", "every-but-final")


def _openai_event(rec: "StreamRecord", obj: dict, seen: int, rule: str) -> int | None:
    """OpenAI chunks carry text, not counts: an event is one token by `rule`; usage corrects the total."""
    usage = obj.get("usage")
    if usage:
        rec.meta.update(prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    choices = obj.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    if choice.get("finish_reason"):
        rec.meta["finish_reason"] = {"type": choice["finish_reason"]}
    has_text = bool(choice.get("text") or choice.get("token_ids"))
    if choice.get("text"):
        rec.output_text.append(choice["text"])
    if isinstance(choice.get("token_ids"), list):
        if rec.output_ids is None:
            rec.output_ids = []
        rec.output_ids.extend(choice["token_ids"])
    if rule == "text" and not has_text:
        return None
    rec.event_text.append(has_text)
    return seen + 1


def _count_openai(rec: StreamRecord, seen: int, rule: str) -> None:
    """Tokens of an OpenAI stream: the events counted by `rule`, checked against the server's own
    completion count where it gave one. More tokens than events (chunks that carried several) gives
    the last event the rest; fewer drops the latest events; either way the counts are estimated."""
    if rule == "every-but-final" and rec.event_text and not rec.event_text[-1] and rec.meta.get("finish_reason"):
        for series in (rec.event_times, rec.event_seen, rec.event_tokens, rec.event_sent, rec.event_text):
            series.pop()
        seen -= 1
    reported = rec.meta.get("completion_tokens")
    if reported is None:
        return
    if reported > seen and rec.event_tokens:
        rec.event_tokens[-1] += reported - seen
        rec.tokens_estimated = True
    elif reported < seen:
        while rec.event_tokens and sum(rec.event_tokens) > max(reported, 1):  # event_text keeps every event seen
            for series in (rec.event_times, rec.event_seen, rec.event_tokens, rec.event_sent):
                series.pop()
        rec.tokens_estimated = True


class StreamParser:
    """One stream's bytes into its StreamRecord as they arrive, the same for the blocking and the
    asyncio loops: ``feed(raw, arrival, seen)`` for each piece read (its arrival time at the socket,
    and when the loop got it), split into SSE events at the blank line; [DONE], error events, SGLang's
    cumulative counts or OpenAI's chunks (``events`` the rule, EVENT_RULES); ``finish()`` at the
    stream's end (no [DONE] is an error; OpenAI counts checked against the server's)."""

    def __init__(self, rec: StreamRecord, api: str = "sglang", events: str = "every", deadline: float | None = None,
                 timeout_s: float | None = None):
        self.rec, self.api, self.events = rec, api, events
        self.deadline, self.timeout_s = deadline, timeout_s
        self.seen_tokens = 0
        self._buf = b""

    def feed(self, raw: bytes, now: float, seen: float) -> bool:
        """Take one read's bytes; False where the request is past its deadline (its error then set)."""
        rec = self.rec
        self._buf += raw
        while (cut := self._buf.find(b"\n\n")) >= 0:
            event, self._buf = self._buf[:cut], self._buf[cut + 2 :]
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    rec.t_done = now
                    if rec.ends is not None:
                        rec.ends.open()
                    continue
                obj = json.loads(data)
                if "error" in obj:
                    err = obj["error"]
                    rec.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                    continue
                total = _sglang_event(rec, obj) if self.api == "sglang" else _openai_event(rec, obj, self.seen_tokens, self.events)
                if total is not None and total > self.seen_tokens:
                    rec.event_times.append(now)
                    rec.event_seen.append(seen)
                    rec.event_tokens.append(total - self.seen_tokens)
                    rec.event_sent.append((obj.get("meta_info") or obj).get("sent_ts"))  # SGLang-style or top level
                    self.seen_tokens = total
                    if rec.arm is not None and total >= rec.arm[0]:
                        arm, rec.arm = rec.arm[1], None
                        arm()
        if self.deadline is not None and seen > self.deadline:
            rec.error = f"request exceeded its {self.timeout_s:.0f} s timeout"
            return False
        return True

    def finish(self) -> None:
        rec = self.rec
        if rec.t_done is None and rec.error is None:
            rec.error = "the stream ended without [DONE]"
        if self.api == "openai":
            _count_openai(rec, self.seen_tokens, self.events)


def _begin(rec: StreamRecord, timeout_s: float, api: str, events: str) -> tuple[StreamParser, httpx.Timeout]:
    rec.t_sent = rec.t_call = time.perf_counter()
    return StreamParser(rec, api, events, rec.t_sent + timeout_s, timeout_s), httpx.Timeout(timeout_s, connect=10.0)


def _opened(rec: StreamRecord, resp: httpx.Response):
    """The response's headers are in: its status, and the timed connection where there is one."""
    rec.http_status = resp.status_code
    rec.sized = "content-length" in resp.headers  # a stream held whole before it was sent (measure.burst)
    wire = resp.extensions.get("network_stream")
    if isinstance(wire, Stamped) and wire.request_sent is not None:
        rec.t_sent, rec.arrival_clock = wire.request_sent, wire.arrival_clock
        return wire
    return None


def _http_error(rec: StreamRecord, status: int, body: bytes) -> None:
    rec.error = f"HTTP {status}: {body.decode(errors='replace')[:500]}"


def _failure(exc: Exception, timeout_s: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out after {timeout_s:.0f} s ({type(exc).__name__})"
    if isinstance(exc, json.JSONDecodeError):
        return f"unparsable stream event: {exc}"
    return f"{type(exc).__name__}: {exc}"


def stream_generate(client: httpx.Client, url: str, body: bytes, timeout_s: float, api: str = "sglang",
                    events: str = "every", record: StreamRecord | None = None,
                    stall_s: float | None = None) -> StreamRecord:
    """POST a streaming request (SGLang /generate or OpenAI /v1/completions) and time every event;
    `events` says which OpenAI events are tokens (EVENT_RULES); `record` is filled where given. With stall_s
    (and a timed client's connection), once the first token is in, a wait of stall_s with no byte ends the
    request as stalled: a server that stopped mid-stream costs stall_s, not what is left of timeout_s."""
    rec = record if record is not None else StreamRecord()
    wire = None
    try:
        parser, timeout = _begin(rec, timeout_s, api, events)
        with client.stream("POST", url, content=body, headers=JSON_HEADERS, timeout=timeout) as resp:
            wire = _opened(rec, resp)
            if resp.status_code != 200:
                _http_error(rec, resp.status_code, resp.read())
                return rec
            for raw in resp.iter_raw():
                seen = time.perf_counter()
                if not parser.feed(raw, wire.read_at if wire is not None else seen, seen):
                    return rec
                if stall_s and rec.event_times and isinstance(wire, WireStream) and wire.stall_s is None:
                    wire.stall_s = stall_s
        parser.finish()
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        stalled = isinstance(exc, httpx.ReadTimeout) and isinstance(wire, WireStream) and wire.stall_s is not None
        rec.error = (f"the stream stalled: no byte for {stall_s:.3g} s after {sum(rec.event_tokens)} token(s) (the "
                     "stall bound, from the decode steps measured so far)" if stalled else _failure(exc, timeout_s))
    finally:
        if isinstance(wire, WireStream):
            wire.stall_s = None  # the connection may serve another request
    return rec


CANCELLED = "cancelled by the client"


DONE_MARK = b"data: [DONE]"


def _opening_at_done(gate) -> "Callable[[bytes], None]":
    """A timed connection's read hook that opens `gate` on the read that carries [DONE], as the read is made:
    in the event loop's reader callback, before the request's task parses it (that task may run an iteration
    or more later, behind the other streams' events)."""
    def on_read(data: bytes) -> None:
        if DONE_MARK in data:
            gate.open()
    return on_read



async def astream_generate(client: httpx.AsyncClient, url: str, body: bytes, timeout_s: float, api: str = "sglang",
                           events: str = "every", record: StreamRecord | None = None) -> StreamRecord:
    """stream_generate on asyncio (a client from async_timed_client times at the socket), filling
    `record` (a new StreamRecord if None) as events arrive: if the task is cancelled, the record keeps
    every event that arrived, its error is CANCELLED and t_done None, and the CancelledError goes on."""
    rec = record if record is not None else StreamRecord()
    try:
        parser, timeout = _begin(rec, timeout_s, api, events)
        async with client.stream("POST", url, content=body, headers=JSON_HEADERS, timeout=timeout) as resp:
            wire = _opened(rec, resp)
            if resp.status_code != 200:
                _http_error(rec, resp.status_code, await resp.aread())
                return rec
            if rec.ends is not None and isinstance(wire, AsyncWireStream):
                wire.on_read, rec.wire = _opening_at_done(rec.ends), wire
            if isinstance(wire, AsyncWireStream) and wire.head_clean and (body := body_decoder(resp.headers)):
                if not await read_direct(wire, body, parser, rec, timeout_s):
                    return rec
            else:
                async for raw in resp.aiter_raw():
                    seen = time.perf_counter()
                    if not parser.feed(raw, wire.read_at if wire is not None else seen, seen):
                        return rec
                    if rec.t_done is not None:  # (see direct.read_direct)
                        break
        parser.finish()
    except asyncio.CancelledError:
        rec.error, rec.t_done = CANCELLED, None
        raise
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = _failure(exc, timeout_s)
    return rec
