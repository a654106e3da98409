"""A streamed response's body read from the timed connection itself (measure.wire), past httpx and h11: HTTP/1.1's
chunked or Content-Length framing decoded as the bytes arrive, each read handed to the stream's parser
(measure.stream.StreamParser) with its arrival stamp."""

from __future__ import annotations

import time

import httpcore
import httpx

from .wire import AsyncWireStream


class ChunkedBody:
    """HTTP/1.1's chunked transfer coding, decoded as its bytes arrive (``feed`` returns the payload so far;
    ``done`` once the last chunk came; trailers are not read)."""

    def __init__(self) -> None:
        self._buf, self._left, self._crlf, self.done = b"", 0, False, False

    def feed(self, data: bytes) -> bytes:
        buf, i, out = self._buf + data, 0, []
        while not self.done:
            if self._left:
                part = buf[i : i + self._left]
                out.append(part)
                self._left -= len(part)
                i += len(part)
                if self._left:
                    break
                self._crlf = True
            if self._crlf:  # the CRLF after a chunk's data
                if len(buf) - i < 2:
                    break
                i, self._crlf = i + 2, False
            nl = buf.find(b"\r\n", i)
            if nl < 0:
                break
            size = int(buf[i:nl].split(b";", 1)[0], 16)
            i = nl + 2
            if size == 0:
                self.done = True
            self._left = size
        self._buf = buf[i:]
        return b"".join(out)


class LengthBody:
    """A body of Content-Length bytes (None: to the connection's close)."""

    def __init__(self, length: int | None) -> None:
        self.left, self.done = length, length == 0

    def feed(self, data: bytes) -> bytes:
        if self.left is None:
            return data
        data = data[: self.left]
        self.left -= len(data)
        self.done = self.left == 0
        return data


def body_decoder(headers: httpx.Headers) -> "ChunkedBody | LengthBody | None":
    """How the response's body is framed (None: an encoding this reader leaves to httpx, a compressed one)."""
    if headers.get("content-encoding", "identity").lower() != "identity":
        return None
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return ChunkedBody()
    length = headers.get("content-length")
    return LengthBody(int(length) if length and length.isdigit() else None)


async def read_direct(wire: AsyncWireStream, body, parser, rec, timeout_s: float) -> bool:
    """The body read from the timed connection itself, past httpx and h11 (whose per-read costs, about half of
    this client's time per event, make 64 streams' events wait in the event loop); only where the head was read
    alone (``wire.head_clean``: httpx holds none of the body). The connection is closed afterwards, not reused
    (httpx did not see its body). Stops at [DONE]: the request is over for its user, and a server busy elsewhere
    (vLLM's API server rendering its /metrics) may end the HTTP response much later; a closed loop must not wait
    for that before it sends the next request. False where the request went past its deadline."""
    while not body.done:
        try:
            raw = await wire.read(1 << 16, timeout=timeout_s)
        except httpcore.TimeoutException as exc:
            raise httpx.ReadTimeout(str(exc)) from exc
        except httpcore.NetworkError as exc:
            raise httpx.ReadError(str(exc)) from exc
        seen = time.perf_counter()
        if not raw:
            if isinstance(body, ChunkedBody) or body.left:
                raise httpx.RemoteProtocolError("the server closed the connection before the response's end")
            break
        if not parser.feed(body.feed(raw), wire.read_at, seen):
            return False
        if rec.t_done is not None:
            break
    return True
