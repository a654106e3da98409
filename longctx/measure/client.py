"""Streaming HTTP client: one timed request, every stream event time-stamped on arrival.

The request body is serialised before the clock starts; bytes are read as the network hands
them over (no small fixed read buffer), and events are split on the SSE blank line.

With a client from ``timed_client()`` the times are taken at the socket, not where the code that
parses the stream happens to run: a request starts when its first byte is written, and an event
arrives when the kernel received its bytes (Linux's receive timestamp, SO_TIMESTAMPNS), so that
neither httpx's request set-up (about 0.5 ms on a busy 2-core machine), nor its HTTP parsing,
nor the client being scheduled late counts. Any other httpx.Client works too, timed around the
httpx calls.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import time
from dataclasses import dataclass, field

import httpcore
import httpx


# SGLang 0.5.23's speculative fields in the final meta_info
SPEC_FIELDS = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts")


def sglang_body(prompt: list[int] | str, max_new_tokens: int, rid: str | None = None, stream: bool = True) -> bytes:
    """/generate with a token-id prompt (input_ids) or a text one (text)."""
    body = {
        "input_ids" if isinstance(prompt, list) else "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0},
        "stream": stream,
    }
    if rid:
        body["rid"] = rid
    return json.dumps(body).encode()


def openai_body(prompt: list[int] | str, max_new_tokens: int, model: str, stream: bool = True) -> bytes:
    """/v1/completions with a token-id or text prompt; usage in the last chunk where the server honours
    stream_options (vLLM, SGLang, llama.cpp)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def request_body(api: str, prompt: list[int] | str, max_new_tokens: int, model: str, stream: bool = True) -> bytes:
    if api == "sglang":
        return sglang_body(prompt, max_new_tokens, stream=stream)
    return openai_body(prompt, max_new_tokens, model, stream=stream)


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


# Linux's SO_TIMESTAMPNS (the asm-generic value, x86 and arm alike); Python's socket module does not name it
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@ll")  # SCM_TIMESTAMPNS: struct timespec, CLOCK_REALTIME
_CMSG_BYTES = 64


def read_clocks(tries: int = 5) -> tuple[float, int]:
    """perf_counter and the wall clock (ns) read together: the wall clock between two perf_counter
    reads, the closest pair of a few, so that a preemption between the reads does not shift one."""
    best = None
    for _ in range(tries):
        a, real, b = time.perf_counter(), time.time_ns(), time.perf_counter()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) / 2, real)
        if b - a < 2e-6:
            break
    return best[1], best[2]


class WireStream(httpcore.NetworkStream):
    """A connection's socket that notes when a request's first byte was written (``request_sent``)
    and when the bytes of the latest read arrived (``read_at``), both on time.perf_counter's clock.

    Arrival is the kernel's receive timestamp of the newest bytes in the read where the socket
    gives one (``arrival_clock == "kernel"``), converted from CLOCK_REALTIME by how long ago it
    was; otherwise the moment the read returned ("socket"). Even a timestamping socket gets no
    stamp on some packets: Linux turns receive timestamps on lazily (a deferred static key) when
    the first socket asks after none did, so the packets of the next few milliseconds carry none;
    ``read_stamped`` says whether the latest read had one.
    """

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner
        self._sock = inner.get_extra_info("socket")
        self.arrival_clock = "socket"
        if _SO_TIMESTAMPNS is not None and type(self._sock) is socket.socket:  # not through TLS
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.arrival_clock = "kernel"
            except OSError:
                pass
        self.request_sent: float | None = None
        self.read_at: float | None = None
        self.read_stamped = False
        self._last_stamp = 0.0
        self._after_read = True  # HTTP/1.1 without pipelining: the first write after a read starts a request

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer and self._after_read:
            self.request_sent = time.perf_counter()
            self._after_read = False
            self._last_stamp = 0.0
        self._inner.write(buffer, timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self.arrival_clock != "kernel":
            data = self._inner.read(max_bytes, timeout)
            self.read_at = time.perf_counter()
        else:
            try:
                self._sock.settimeout(timeout)
                # The timestamp is that of the newest bytes read: read one stream event at a time
                # (up to its blank line), so that events waiting together keep their own where the
                # kernel kept them apart (it may merge waiting bytes and keep the newest time).
                waiting = self._sock.recv(max_bytes, socket.MSG_PEEK)
                cut = waiting.find(b"\n\n")
                data, ancillary, _, _ = self._sock.recvmsg(cut + 2 if cut >= 0 else max_bytes, _CMSG_BYTES)
            except socket.timeout as exc:
                raise httpcore.ReadTimeout(str(exc)) from exc
            except OSError as exc:
                raise httpcore.ReadError(str(exc)) from exc
            self.read_at = time.perf_counter()
            self.read_stamped = False
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                    sec, nsec = _TIMESPEC.unpack_from(payload)
                    now, now_real_ns = read_clocks()
                    age = (now_real_ns - (sec * 1_000_000_000 + nsec)) * 1e-9
                    if age >= 0:  # else the wall clock was stepped: keep the read's own time
                        # never before the request, nor before the previous read's bytes: bytes the kernel
                        # kept together share one stamp, which each read converts with its own clock pair
                        self.read_at = max(now - age, self.request_sent or 0.0, self._last_stamp)
                        self.read_stamped = True
                        self._last_stamp = self.read_at
        self._after_read = True
        return data

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> "WireStream":
        return WireStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _WireBackend(httpcore.SyncBackend):
    def connect_tcp(self, *args, **kwargs) -> WireStream:
        return WireStream(super().connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args, **kwargs) -> WireStream:
        return WireStream(super().connect_unix_socket(*args, **kwargs))


class WireTransport(httpx.HTTPTransport):
    """httpx's transport over connections that are WireStreams."""

    def __init__(self, limits: httpx.Limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)):
        super().__init__(limits=limits)
        # httpx 0.28 builds its httpcore pool here and takes no network backend: the same pool with ours
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_WireBackend(),
        )


def timed_client(**kwargs) -> httpx.Client:
    """An httpx.Client whose streams stream_generate times at the socket (see the module's note)."""
    return httpx.Client(transport=WireTransport(), **kwargs)


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
    error: str | None = None
    tokens_estimated: bool = False  # OpenAI streams: the events counted did not match the server's count (or it gave none)
    event_text: list[bool] = field(default_factory=list)  # OpenAI streams: whether each counted event carried text

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
            itl_max_s=max(itl) if itl else None,
            itl_s=itl,
        )
        return out


def _sglang_event(rec: "StreamRecord", obj: dict) -> int | None:
    """Cumulative completion tokens after an SGLang event (None: no token information)."""
    rec.meta = obj.get("meta_info", {})
    return rec.meta.get("completion_tokens")


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


def stream_generate(client: httpx.Client, url: str, body: bytes, timeout_s: float, api: str = "sglang",
                    events: str = "every") -> StreamRecord:
    """POST a streaming request (SGLang /generate or OpenAI /v1/completions) and time every event;
    `events` says which OpenAI events are tokens (EVENT_RULES)."""
    rec = StreamRecord()
    seen_tokens = 0
    buf = b""
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    try:
        rec.t_sent = rec.t_call = time.perf_counter()
        deadline = rec.t_sent + timeout_s
        with client.stream("POST", url, content=body, headers={"Content-Type": "application/json"}, timeout=timeout) as resp:
            rec.http_status = resp.status_code
            wire = resp.extensions.get("network_stream")
            if isinstance(wire, WireStream) and wire.request_sent is not None:
                rec.t_sent, rec.arrival_clock = wire.request_sent, wire.arrival_clock
            else:
                wire = None
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {resp.read().decode(errors='replace')[:500]}"
                return rec
            for raw in resp.iter_raw():
                seen = time.perf_counter()
                now = wire.read_at if wire is not None else seen
                buf += raw
                while (cut := buf.find(b"\n\n")) >= 0:
                    event, buf = buf[:cut], buf[cut + 2 :]
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            rec.t_done = now
                            continue
                        obj = json.loads(data)
                        if "error" in obj:
                            err = obj["error"]
                            rec.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                            continue
                        total = _sglang_event(rec, obj) if api == "sglang" else _openai_event(rec, obj, seen_tokens, events)
                        if total is not None and total > seen_tokens:
                            rec.event_times.append(now)
                            rec.event_seen.append(seen)
                            rec.event_tokens.append(total - seen_tokens)
                            rec.event_sent.append((obj.get("meta_info") or obj).get("sent_ts"))  # SGLang-style or top level
                            seen_tokens = total
                if seen > deadline:
                    rec.error = f"request exceeded its {timeout_s:.0f} s timeout"
                    return rec
        if rec.t_done is None and rec.error is None:
            rec.error = "the stream ended without [DONE]"
        if api == "openai":
            _count_openai(rec, seen_tokens, events)
    except httpx.TimeoutException as exc:
        rec.error = f"timed out after {timeout_s:.0f} s ({type(exc).__name__})"
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    except json.JSONDecodeError as exc:
        rec.error = f"unparsable stream event: {exc}"
    return rec
