#!/usr/bin/env python
"""A stub SGLang /generate server that answers at once, to time a client against the server's own
socket-side times (issue 18, item 6: the load client must never be the bottleneck).

No model and no framework: one asyncio event loop over raw non-blocking sockets (``loop.add_reader``,
``sock.send``), so the server's own costs are a few tens of microseconds per event.

Start it as a process of its own and stop it by its pid::

    python bench/stub_sse_server.py --port 0 --interval-s 0.005 [--ttft-s 0] [--tokens N] [--host 127.0.0.1]

It prints one line once it accepts connections (``--port 0``: a free port, named in that line)::

    stub_sse_server listening on http://127.0.0.1:PORT pid PID

and exits on SIGTERM or SIGINT. From Python: ``with running(interval_s=0.005) as base: ...`` (this
file, loaded by path) starts it in its own process group, waits for that line, yields the base URL and
stops it by its pid.

Requests: ``POST /generate`` with SGLang's body (``input_ids`` or ``text``, ``sampling_params.max_new_tokens``,
``stream``; ``rid`` is echoed as ``meta_info.id``). It streams max_new_tokens token events (``--tokens``
overrides), the first ``ttft_s`` after the request was received and then one every ``interval_s``, on
an absolute schedule (event i is due at received + ttft_s + (i - 1) x interval_s, so a late event does
not delay the next). A body may set its own ``"stub": {"ttft_s": ..., "interval_s": ...}``. Then
``data: [DONE]``. ``GET /health`` and ``/health_generate`` answer 200. HTTP/1.1 keep-alive, chunked.

Every event is SGLang's shape, with the stamps (``time.perf_counter()``, CLOCK_MONOTONIC on Linux,
the clock of a client on this machine) in its ``meta_info``::

    {"text": "", "meta_info": {"id", "prompt_tokens", "completion_tokens" (cumulative), "cached_tokens": 0,
     "finish_reason" (null, then {"type": "length", "length": n} on the last), "e2e_latency" (last),
     "due_ts": when the event was due on the schedule,
     "sent_ts": read right before the send() that writes the event's bytes,
     "timestamps": {"clock": "CLOCK_MONOTONIC", "received", "scheduled" (= received: no queue),
                    "first_token_sent"}}}

``received`` is the kernel's receive timestamp (SO_TIMESTAMPNS) of the request's first bytes,
converted from CLOCK_REALTIME (peeked before they are read, so a request in several segments keeps
its first one's); where the kernel gives none, the time of that read. So, for a client on this machine:

- ``StreamRecord.summary()`` gives ``server_ttft_s`` (first_token_sent - received), ``send_lag_s``
  (received - the client's first byte written) and ``recv_lag_*`` (each event's arrival - sent_ts);
- ``longctx.measure.clientcheck.stream_errors(records)`` the TTFT error (client TTFT - server TTFT),
  per-token lag and gap error, and the client's read delay, as percentiles over many requests;
- ``sent_ts - due_ts`` is this server's own lateness (large: the machine, not the client, is saturated).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from longctx.measure.wire import read_clocks  # noqa: E402 (the client's own pairing of the two clocks)

_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@ll")
READY = "stub_sse_server listening on "


def kernel_time(ancillary) -> float | None:
    """A recvmsg's SO_TIMESTAMPNS stamp on perf_counter's clock, or None."""
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            now, now_real_ns = read_clocks()
            age = (now_real_ns - (sec * 1_000_000_000 + nsec)) * 1e-9
            return now - age if age >= 0 else None
    return None


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Stream:
    """One request's events on its connection's schedule."""

    def __init__(self, conn: "Conn", body: dict, received: float, opts: argparse.Namespace):
        self.conn, self.received = conn, received
        params = body.get("sampling_params") or {}
        stub = body.get("stub") or {}
        self.n = opts.tokens or int(params.get("max_new_tokens", 16))
        self.ttft_s = float(stub.get("ttft_s", opts.ttft_s))
        self.interval_s = float(stub.get("interval_s", opts.interval_s))
        prompt = body.get("input_ids")
        self.prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(body.get("text", "")).encode())
        self.rid = body.get("rid")
        self.first_sent: float | None = None
        self.i = 0
        self.timer: asyncio.TimerHandle | None = None

    def due(self, i: int) -> float:
        return self.received + self.ttft_s + (i - 1) * self.interval_s

    def schedule(self) -> None:
        self.i += 1
        loop = self.conn.loop
        self.timer = loop.call_at(loop.time() + (self.due(self.i) - time.perf_counter()), self.emit)

    def meta(self, sent: float) -> dict:
        last = self.i == self.n
        return {"id": self.rid, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.i, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": self.n} if last else None,
                "e2e_latency": sent - self.received if last else None,
                "due_ts": self.due(self.i), "sent_ts": sent,
                "timestamps": {"clock": "CLOCK_MONOTONIC", "received": self.received, "scheduled": self.received,
                               "first_token_sent": self.first_sent if self.first_sent is not None else sent}}

    def emit(self) -> None:
        self.timer = None
        if self.conn.closed:
            return
        sent = time.perf_counter()
        if self.first_sent is None:
            self.first_sent = sent
        data = chunk(b"data: " + json.dumps({"text": "", "meta_info": self.meta(sent)}).encode() + b"\n\n")
        if self.i == self.n:
            self.conn.send(data + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            self.conn.finished()
        else:
            self.conn.send(data)
            self.schedule()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Conn:
    """One client connection: requests read one at a time (HTTP/1.1 keep-alive, no pipelining)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, opts: argparse.Namespace):
        self.sock, self.loop, self.opts = sock, loop, opts
        self.buf = b""
        self.out = b""
        self.received: float | None = None  # the first bytes of the request being read
        self.stream: Stream | None = None
        self.closed = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stamping = False
        if _SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.stamping = True
            except OSError:
                pass
        loop.add_reader(sock.fileno(), self.readable)

    def readable(self) -> None:
        try:
            if self.received is None and not self.buf and self.stamping:
                # the stamp of the first segment: peek one byte (a read's stamp is its newest bytes')
                _, ancillary, _, _ = self.sock.recvmsg(1, 64, socket.MSG_PEEK)
                self.received = kernel_time(ancillary)
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.close()
        if not data:
            return self.close()
        if self.received is None and not self.buf:
            self.received = time.perf_counter()
        self.buf += data
        self.next_request()

    def next_request(self) -> None:
        if self.stream is not None or self.closed:
            return
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        lines = self.buf[:head_end].decode("latin-1").split("\r\n")
        method, path, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        if len(self.buf) < head_end + 4 + length:
            return
        body, self.buf = self.buf[head_end + 4 : head_end + 4 + length], self.buf[head_end + 4 + length :]
        received = self.received if self.received is not None else time.perf_counter()
        # the next request's first bytes: already here (pipelined), else stamped when they come
        self.received = time.perf_counter() if self.buf else None
        if method == "GET" and path in ("/health", "/health_generate"):
            self.respond(200, b"OK", "text/plain")
        elif method == "GET" and path in ("/server_info", "/get_server_info"):
            self.respond(200, json.dumps({"stub": True, "interval_s": self.opts.interval_s, "ttft_s": self.opts.ttft_s,
                                          "tokens": self.opts.tokens}).encode(), "application/json")
        elif method == "POST" and path == "/generate":
            try:
                req = json.loads(body)
            except ValueError as exc:
                return self.respond(400, json.dumps({"error": {"message": f"bad JSON: {exc}"}}).encode(), "application/json")
            stream = Stream(self, req, received, self.opts)
            if req.get("stream", False):
                self.stream = stream
                self.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                stream.schedule()
            else:  # the whole answer at once (no schedule)
                stream.i = stream.n
                self.respond(200, json.dumps({"text": "", "meta_info": stream.meta(time.perf_counter())}).encode(),
                             "application/json")
            return
        else:
            self.respond(404, b'{"detail": "Not Found"}', "application/json")
        self.next_request()

    def respond(self, code: int, body: bytes, ctype: str) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[code]
        self.send(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                  % (code, reason.encode(), ctype.encode(), len(body), body))

    def finished(self) -> None:
        self.stream = None
        self.next_request()

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        if self.out:  # the client is not reading fast enough: queued behind what waits
            self.out += data
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            return self.close()
        if n < len(data):
            self.out = data[n:]
            self.loop.add_writer(self.sock.fileno(), self.writable)

    def writable(self) -> None:
        try:
            n = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.close()
        self.out = self.out[n:]
        if not self.out:
            self.loop.remove_writer(self.sock.fileno())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.stream is not None:
            self.stream.cancel()
        self.loop.remove_reader(self.sock.fileno())
        if self.out:
            self.loop.remove_writer(self.sock.fileno())
        self.sock.close()


async def serve(opts: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    listener = socket.create_server((opts.host, opts.port), backlog=1024, reuse_port=False)
    listener.setblocking(False)
    conns: set[Conn] = set()

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            conns.add(Conn(sock, loop, opts))
            conns.difference_update([c for c in conns if c.closed])

    loop.add_reader(listener.fileno(), accept)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    host, port = listener.getsockname()[:2]
    print(f"{READY}http://{host}:{port} pid {os.getpid()}", flush=True)
    await stop
    loop.remove_reader(listener.fileno())
    listener.close()
    for c in list(conns):
        c.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port, printed in the ready line")
    p.add_argument("--interval-s", type=float, default=0.005, help="between a request's events (default 5 ms)")
    p.add_argument("--ttft-s", type=float, default=0.0, help="from receiving a request to its first event")
    p.add_argument("--tokens", type=int, default=None, help="events per request (default: its max_new_tokens)")
    return p.parse_args(argv)


@contextlib.contextmanager
def running(port: int = 0, interval_s: float = 0.005, ttft_s: float = 0.0, tokens: int | None = None,
            python: str = sys.executable, timeout_s: float = 30.0):
    """The stub server as a subprocess in its own process group, in this process's session (its autogroup, as
    longctx.measure.process.ManagedServer starts a server); yields its base URL; stopped by its pid."""
    cmd = [python, str(Path(__file__).resolve()), "--port", str(port), "--interval-s", str(interval_s),
           "--ttft-s", str(ttft_s)] + (["--tokens", str(tokens)] if tokens else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, process_group=0)
    try:
        deadline = time.monotonic() + timeout_s
        line = ""
        while not line.startswith(READY):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                raise RuntimeError(f"the stub server did not say it was ready within {timeout_s:.0f} s")
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the stub server exited before it was ready (exit code {proc.wait()})")
        yield line[len(READY):].split()[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
