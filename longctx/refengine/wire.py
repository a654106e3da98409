"""The engine's own timestamps, taken at its socket.

A client on this machine checks its timing against the server's (bench/client_overhead.py). For
that check to be about the client and the wire only, the server's times are taken where its
bytes meet the socket, not where the application code happens to run:

- ``received``: when the first bytes of a request were read from the socket, before uvicorn
  parses the headers and calls the application (about 0.3 ms earlier than the handler's start on
  a 2-core machine);
- ``sent``: when a stream event's bytes are handed to the socket, after JSON encoding and the
  framework's send path (about 50 us later than when the event was ready).

Both are ``time.perf_counter()``, CLOCK_MONOTONIC on Linux: the clock of a client on the same
machine. An event cannot carry the time its own bytes are written unless that time is put in at
the moment of writing: the application encodes the event with the fixed-width number
``PLACEHOLDER`` under a key of ``STAMPED_KEYS``, and the transport writes the time over it, in
the same width (JSON allows the leading spaces), just before the bytes go to the socket. Only
``json.dumps`` with its default separators (``"key": value``) is matched, and a key in quotes
followed by ``": `` cannot occur inside a JSON string (its quotes are escaped there).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from uvicorn.protocols.http.h11_impl import H11Protocol

PLACEHOLDER = -1.0000000000000002  # json.dumps writes it in 19 characters
_PLACEHOLDER = b"-1.0000000000000002"
STAMPED_KEYS = (b'"sent_ts": ', b'"first_token_sent": ')
SCOPE_KEY = "longctx.wire"  # in the ASGI scope's "extensions"


@dataclass
class WireLog:
    """One request's socket times (perf_counter seconds)."""
    received: float
    sent: list[float] = field(default_factory=list)  # one per written event that carried a placeholder

    @property
    def first_sent(self) -> float | None:
        return self.sent[0] if self.sent else None


def placeholders(data: bytes) -> list[int]:
    """Where the placeholder numbers in data start (those under a key of STAMPED_KEYS)."""
    found = []
    for key in STAMPED_KEYS:
        i = data.find(key + _PLACEHOLDER)
        if i >= 0:
            found.append(i + len(key))
    return sorted(found)


def fill(data: bytes, at: list[int], t: float) -> bytes:
    """data with t written over the placeholders at `at`, in the same width."""
    text = (b"%19.9f" % t)[: len(_PLACEHOLDER)]  # up to 1e9 s of uptime at ns resolution, then shorter
    parts, last = [], 0
    for i in at:
        parts += [data[last:i], text]
        last = i + len(_PLACEHOLDER)
    parts.append(data[last:])
    return b"".join(parts)


def stamp(data: bytes, t: float) -> bytes | None:
    """data with t written over each placeholder, or None when data has none."""
    at = placeholders(data)
    return fill(data, at, t) if at else None


class _StampingTransport:
    """The connection's transport, stamping the bytes of the request being answered on their way out."""

    def __init__(self, transport: asyncio.Transport, protocol: "WireH11Protocol"):
        self._transport = transport
        self._protocol = protocol

    def write(self, data: bytes) -> None:
        log = self._protocol.wire
        if log is not None:
            data = bytes(data)
            at = placeholders(data)
            if at:  # the time is taken last, just before the bytes go out
                t = time.perf_counter()
                data = fill(data, at, t)
                log.sent.append(t)
        self._transport.write(data)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class WireH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with socket-side timestamps (pass as ``uvicorn.Config(http=...)``).

    Each request's ``WireLog`` is in ``scope["extensions"]["longctx.wire"]``; the application
    decides which events to stamp by writing ``PLACEHOLDER`` into them.
    """

    wire: WireLog | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_StampingTransport(transport, self))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        before = self.scope
        super().data_received(data)
        if self.scope is not before and self.scope is not None:  # this read began a request
            self.wire = WireLog(received=t)
            self.scope.setdefault("extensions", {})[SCOPE_KEY] = self.wire  # type: ignore[typeddict-item]


def request_log(scope: dict) -> WireLog | None:
    return (scope.get("extensions") or {}).get(SCOPE_KEY)
