"""Kernel-timestamped connections: when a request's first byte was written and when each read's bytes arrived.

A timed connection notes the moment a request's first byte goes to the socket (``request_sent``) and
the arrival of the bytes of its latest read (``read_at``), both on time.perf_counter's clock. Arrival
is Linux's receive timestamp (SO_TIMESTAMPNS) of the newest bytes where the socket gives one, so that
neither httpx's request set-up (about 0.5 ms on a busy 2-core machine), nor its HTTP parsing, nor the
client being scheduled late counts; reads go one stream event at a time (a peek to the SSE blank line),
so that events waiting together keep their own stamps.

``WireStream`` is the blocking connection (httpcore's sync backend underneath), ``AsyncWireStream`` the
asyncio one (its own non-blocking socket, read as soon as the event loop sees it readable), TLS
connections are timed at their reads. ``SEND_AT`` holds an asyncio request's first byte until its
scheduled time (an open loop's arrivals) or until a ``Gate`` opens (a closed loop's next request). The
transports and pools that use them are in measure.transport; what is read from them, in measure.stream.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import sys
import time

import httpcore

from .handover import HELD_CLOSED, SEND_AT, Gate, hold, wake

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


class Stamped:
    """What a timed connection notes (see WireStream), and the kernel stamp of a read made into
    ``read_at``; shared by the blocking and the asyncio streams."""

    def _start_stamps(self, sock) -> None:
        self._sock = sock
        self.arrival_clock = "socket"
        if _SO_TIMESTAMPNS is not None and type(sock) is socket.socket:  # not through TLS
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.arrival_clock = "kernel"
            except OSError:
                pass
        self.request_sent: float | None = None
        self.read_at: float | None = None
        self.read_stamped = False
        self._last_stamp = 0.0
        self._after_read = True  # HTTP/1.1 without pipelining: the first write after a read starts a request
        self.on_read = None  # called with each read's bytes, as it is made (set for one response: a new request clears it)
        # the response's head is read alone (_read_event cuts at its blank line): `head_clean` says that the last
        # read ended exactly at the head's end, so httpx holds none of the body, which may then be read directly
        self._head_pending, self._head_tail, self.head_clean = False, b"", False

    def _writing(self, buffer: bytes) -> None:
        """Called right before a write's first byte goes to the socket."""
        if buffer and self._after_read:
            self.request_sent = time.perf_counter()
            self._after_read = False
            self._last_stamp = 0.0
            self.on_read = None
            self._head_pending, self._head_tail, self.head_clean = True, b"", False

    def _stamp(self, ancillary) -> None:
        """A read just returned (with the ancillary data of recvmsg, or None where it was a plain read)."""
        self.read_at = time.perf_counter()
        self.read_stamped = False
        for level, kind, payload in ancillary or ():
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

    def _read_event(self, max_bytes: int) -> tuple[bytes, list]:
        """One recvmsg: the timestamp is that of the newest bytes read, so read one stream event at a
        time (up to its blank line), and events waiting together keep their own where the kernel kept
        them apart (it may merge waiting bytes and keep the newest time)."""
        waiting = self._sock.recv(max_bytes, socket.MSG_PEEK)
        self.head_clean = False
        if self._head_pending and not self._head_tail and not waiting.startswith(b"HTTP/"):
            self._head_pending = False  # not an HTTP response's head
        if self._head_pending:  # the response's head alone, to its blank line (which may span two reads)
            end = (self._head_tail + waiting).find(b"\r\n\r\n")
            cut = end + 4 - len(self._head_tail) if end >= 0 else -1
        else:
            cut = waiting.find(b"\n\n")
            if cut >= 0:
                cut += 2
                if waiting.startswith(b"\r\n", cut):  # the chunk's own end (chunked encoding): not a read of its own
                    cut += 2
        data, ancillary, _, _ = self._sock.recvmsg(cut if cut >= 0 else max_bytes, _CMSG_BYTES)
        if self._head_pending:
            if cut >= 0 and len(data) == cut:
                self._head_pending, self.head_clean = False, True
            else:
                self._head_tail = (self._head_tail + data)[-3:]
        return data, ancillary


class WireStream(Stamped, httpcore.NetworkStream):
    """A connection's socket that notes when a request's first byte was written (``request_sent``)
    and when the bytes of the latest read arrived (``read_at``), both on time.perf_counter's clock.

    Arrival is the kernel's receive timestamp of the newest bytes in the read where the socket
    gives one (``arrival_clock == "kernel"``), converted from CLOCK_REALTIME by how long ago it
    was; otherwise the moment the read returned ("socket"). Even a timestamping socket gets no
    stamp on some packets: Linux turns receive timestamps on lazily (a deferred static key) when
    the first socket asks after none did, so the packets of the next few milliseconds carry none;
    ``read_stamped`` says whether the latest read had one.
    """

    # the most a read may wait while set (a stream's stall bound, measure.stream), whatever the request's read timeout
    stall_s: float | None = None

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner
        self._start_stamps(inner.get_extra_info("socket"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._writing(buffer)
        self._inner.write(buffer, timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self.stall_s is not None:
            timeout = self.stall_s if timeout is None else min(timeout, self.stall_s)
        if self.arrival_clock != "kernel":
            data = self._inner.read(max_bytes, timeout)
            self._stamp(None)
            return data
        try:
            self._sock.settimeout(timeout)
            data, ancillary = self._read_event(max_bytes)
        except socket.timeout as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc
        self._stamp(ancillary)
        return data

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> "WireStream":
        return WireStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)



def _readable(sock: socket.socket) -> bool:
    """Whether a read would return at once (bytes waiting, or the peer closed); a closed socket is."""
    if sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    return bool(poll.poll(0))


class AsyncWireStream(Stamped, httpcore.AsyncNetworkStream):
    """WireStream on asyncio: the connection's own non-blocking socket, read when the event loop says
    it is readable (``loop.add_reader``; asyncio has no ``sock_recvmsg``) with the same peek to the blank
    line, the same recvmsg and kernel stamp; written directly (the first byte's time is
    ``request_sent``), waiting for writability only where the socket's buffer is full."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._start_stamps(sock)
        self._held: list | None = None  # a request held by a Gate (Gate.hold)

    async def _ready(self, add, remove, deadline: float | None, timeout_exc: type[Exception]) -> None:
        fut = self._loop.create_future()
        fd = self._sock.fileno()
        add(fd, wake, fut)
        timer = None
        if deadline is not None:
            timer = self._loop.call_at(deadline, wake, fut, timeout_exc("timed out"))
        try:
            await fut
        finally:
            remove(fd)
            if timer is not None:
                timer.cancel()

    def _read_now(self, max_bytes: int) -> bytes:
        """One read (an event, with its kernel stamp where the socket gives them), stamped at once."""
        if self.arrival_clock == "kernel":
            data, ancillary = self._read_event(max_bytes)
        else:
            data, ancillary = self._sock.recv(max_bytes), None
        self._stamp(ancillary)
        if self.on_read is not None:
            self.on_read(data)
        return data

    def _on_readable(self, fut: asyncio.Future, max_bytes: int) -> None:
        """The loop's reader callback: the read is made here, as soon as the loop sees the socket readable,
        not when the waiting task next runs. With many streams the loop takes an iteration or two to run
        that task (64 streams in lockstep: 10 ms an iteration here), and an event read after the next one
        arrived carries the newer one's stamp (the kernel merges waiting segments)."""
        if fut.done():
            return
        try:
            fut.set_result(self._read_now(max_bytes))
        except (BlockingIOError, InterruptedError):
            return  # not readable after all: the reader stays registered
        except OSError as exc:
            fut.set_exception(httpcore.ReadError(str(exc)))

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held is not None:
            await self._send_held()
        try:
            return self._read_now(max_bytes)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc
        fut = self._loop.create_future()
        fd = self._sock.fileno()
        self._loop.add_reader(fd, self._on_readable, fut, max_bytes)
        timer = None
        if timeout is not None:
            timer = self._loop.call_later(timeout, wake, fut, httpcore.ReadTimeout("timed out"))
        try:
            return await fut
        finally:
            self._loop.remove_reader(fd)
            if timer is not None:
                timer.cancel()

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer and self._after_read and self._held is None:
            until = SEND_AT.get()
            if isinstance(until, Gate):
                self._held = [until, bytearray(buffer), None]  # its gate, the request's bytes, an error met at release
                if until.hold(self):
                    return
                self._held = None
            else:
                await hold(until)
        elif self._held is not None:  # written when the gate opens (_release), or by read()
            self._held[1] += buffer
            return
        self._writing(buffer)
        await self._send_all(memoryview(buffer), timeout)

    async def _send_all(self, view: memoryview, timeout: float | None) -> None:
        deadline = None if timeout is None else self._loop.time() + timeout
        while view:
            try:
                view = view[self._sock.send(view):]
            except (BlockingIOError, InterruptedError):
                await self._ready(self._loop.add_writer, self._loop.remove_writer, deadline, httpcore.WriteTimeout)
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc

    def _release(self) -> None:
        """A Gate opened: the held request is written now, in one send (its first byte's time is request_sent);
        what the socket did not take is left for read() to send. A connection that the server closed while the
        request was held (or that has bytes to read before any request) is not written: read() raises HELD_CLOSED."""
        held = self._held
        if _readable(self._sock):
            held[2] = HELD_CLOSED
            return
        data = bytes(held[1])  # (a copy: the request's task may append its body meanwhile, from the loop's thread)
        self._writing(data)
        try:
            del held[1][: self._sock.send(data)]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            held[2] = str(exc)

    async def _send_held(self) -> None:
        """Before a read: the held request's gate waited for, and what its release did not write, written."""
        gate, _, _ = self._held
        await gate.wait()
        _, rest, error = self._held
        self._held = None
        if error is not None:
            raise httpcore.WriteError(error)
        if rest:
            self._writing(bytes(rest[:1]))  # (a no-op where the release wrote the first bytes)
            await self._send_all(memoryview(bytes(rest)), None)

    async def aclose(self) -> None:
        self._sock.close()

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.AsyncNetworkStream:
        """TLS through anyio's stream over this socket; timed at its reads, as WireStream is through TLS."""
        import anyio.abc
        import anyio.streams.tls

        try:
            with anyio.fail_after(timeout):
                plain = await anyio.abc.SocketStream.from_socket(self._sock)
                tls = await anyio.streams.tls.TLSStream.wrap(plain, ssl_context=ssl_context, hostname=server_hostname,
                                                             standard_compatible=False)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout("TLS handshake timed out") from exc
        except (OSError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise httpcore.ConnectError(f"TLS: {type(exc).__name__}: {exc}") from exc
        return _AsyncTLSWire(tls)

    def get_extra_info(self, info: str):
        sock = self._sock
        if info == "socket":
            return sock
        if info in ("client_addr", "server_addr"):
            try:
                return sock.getsockname() if info == "client_addr" else sock.getpeername()
            except OSError:
                return None
        if info == "is_readable":  # the pool asks whether an idle connection was closed by the server
            return _readable(sock)
        return None


class _AsyncTLSWire(Stamped, httpcore.AsyncNetworkStream):
    """An asyncio TLS connection (an anyio TLS stream), timed at its reads ("socket": no kernel stamps
    through TLS) and writes."""

    def __init__(self, tls):
        import anyio

        self._tls, self._anyio = tls, anyio
        self._start_stamps(None)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        anyio = self._anyio
        try:
            with anyio.fail_after(timeout):
                data = await self._tls.receive(max_bytes)
        except anyio.EndOfStream:
            data = b""
        except TimeoutError as exc:
            raise httpcore.ReadTimeout("read timed out") from exc
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise httpcore.ReadError(f"{type(exc).__name__}: {exc}") from exc
        self._stamp(None)
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        anyio = self._anyio
        if self._after_read:
            await hold(SEND_AT.get())  # (through TLS a gate wakes this task: no write from open())
        self._writing(buffer)
        try:
            with anyio.fail_after(timeout):
                await self._tls.send(buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout("write timed out") from exc
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise httpcore.WriteError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._tls.aclose()

    def get_extra_info(self, info: str):
        anyio = self._anyio
        if info == "ssl_object":
            return self._tls.extra(anyio.streams.tls.TLSAttribute.ssl_object, None)
        if info == "socket":
            return self._tls.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if info == "is_readable":
            sock = self._tls.extra(anyio.abc.SocketAttribute.raw_socket, None)
            return sock is None or _readable(sock)
        return None
