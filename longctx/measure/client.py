"""Streaming HTTP client: one timed request, every stream event time-stamped on arrival.

The request body is serialised before the clock starts; bytes are read as the network hands
them over (no small fixed read buffer), and events are split on the SSE blank line.

With a client from ``timed_client()`` the times are taken at the socket, not where the code that
parses the stream happens to run: a request starts when its first byte is written, and an event
arrives when the kernel received its bytes (Linux's receive timestamp, SO_TIMESTAMPNS), so that
neither httpx's request set-up (about 0.5 ms on a busy 2-core machine), nor its HTTP parsing,
nor the client being scheduled late counts. Any other httpx.Client works too, timed around the
httpx calls.

``async_timed_client()`` and ``astream_generate()`` are the same on asyncio (httpx.AsyncClient over
our own httpcore network backend: a non-blocking socket read when the event loop says it is
readable, with the same peek to the blank line and the same kernel stamps), for many streams on
one event loop. Both loops feed one parser (``StreamParser``), so a stream gives the same record
either way.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import json
import select
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


def openai_body(prompt: list[int] | str, max_new_tokens: int, model: str, stream: bool = True,
                extra: dict | None = None) -> bytes:
    """/v1/completions with a token-id or text prompt; usage in the last chunk where the server honours
    stream_options (vLLM, SGLang, llama.cpp); `extra`: fields a given engine takes beside (the adapter's)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": stream, **(extra or {})}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def request_body(api: str, prompt: list[int] | str, max_new_tokens: int, model: str, stream: bool = True,
                 extra: dict | None = None) -> bytes:
    if api == "sglang":
        return sglang_body(prompt, max_new_tokens, stream=stream)
    return openai_body(prompt, max_new_tokens, model, stream=stream, extra=extra)


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


class _Stamps:
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

    def _writing(self, buffer: bytes) -> None:
        """Called right before a write's first byte goes to the socket."""
        if buffer and self._after_read:
            self.request_sent = time.perf_counter()
            self._after_read = False
            self._last_stamp = 0.0

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
        cut = waiting.find(b"\n\n")
        if cut >= 0:
            cut += 2
            if waiting.startswith(b"\r\n", cut):  # the chunk's own end (chunked encoding): not a read of its own
                cut += 2
        data, ancillary, _, _ = self._sock.recvmsg(cut if cut >= 0 else max_bytes, _CMSG_BYTES)
        return data, ancillary


class WireStream(_Stamps, httpcore.NetworkStream):
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
        self._start_stamps(inner.get_extra_info("socket"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._writing(buffer)
        self._inner.write(buffer, timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
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


def _wake(fut: asyncio.Future, exc: BaseException | None = None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


def _readable(sock: socket.socket) -> bool:
    """Whether a read would return at once (bytes waiting, or the peer closed); a closed socket is."""
    if sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    return bool(poll.poll(0))


# A request's first byte is held until this perf_counter time where it is set (an open loop's schedule): the
# request is built and its connection taken beforehand, so that its send time is its scheduled time and not
# that plus httpx's set-up (0.3 to 1 ms here, more on a busy loop)
SEND_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("longctx_send_at", default=None)
SPIN_S = 0.0015  # the last stretch before a hold's end is waited out spinning (epoll's timeout has a millisecond's grain)


async def _hold_until(target: float | None) -> None:
    if target is None:
        return
    ahead = target - time.perf_counter() - SPIN_S
    if ahead > 0:
        await asyncio.sleep(ahead)
    while time.perf_counter() < target:
        pass


class AsyncWireStream(_Stamps, httpcore.AsyncNetworkStream):
    """WireStream on asyncio: the connection's own non-blocking socket, read when the event loop says
    it is readable (``loop.add_reader``; asyncio has no ``sock_recvmsg``) with the same peek to the blank
    line, the same recvmsg and kernel stamp; written directly (the first byte's time is
    ``request_sent``), waiting for writability only where the socket's buffer is full."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._start_stamps(sock)

    async def _ready(self, add, remove, deadline: float | None, timeout_exc: type[Exception]) -> None:
        fut = self._loop.create_future()
        fd = self._sock.fileno()
        add(fd, _wake, fut)
        timer = None
        if deadline is not None:
            timer = self._loop.call_at(deadline, _wake, fut, timeout_exc("timed out"))
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
            timer = self._loop.call_later(timeout, _wake, fut, httpcore.ReadTimeout("timed out"))
        try:
            return await fut
        finally:
            self._loop.remove_reader(fd)
            if timer is not None:
                timer.cancel()

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        deadline = None if timeout is None else self._loop.time() + timeout
        view = memoryview(buffer)
        if buffer and self._after_read:
            await _hold_until(SEND_AT.get())
        self._writing(buffer)
        while view:
            try:
                view = view[self._sock.send(view):]
            except (BlockingIOError, InterruptedError):
                await self._ready(self._loop.add_writer, self._loop.remove_writer, deadline, httpcore.WriteTimeout)
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc

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


class _AsyncTLSWire(_Stamps, httpcore.AsyncNetworkStream):
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


class AsyncWireBackend(httpcore.AsyncNetworkBackend):
    """httpcore's asyncio network backend with AsyncWireStream connections (TCP_NODELAY, as httpcore's own)."""

    async def _connect(self, family_addrs, timeout: float | None, options, bind=None) -> AsyncWireStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                last: OSError | None = None
                for family, kind, proto, addr in await family_addrs():
                    sock = socket.socket(family, kind, proto)
                    try:
                        sock.setblocking(False)
                        for option in options or ():
                            sock.setsockopt(*option)
                        if bind is not None:
                            sock.bind(bind)
                        await loop.sock_connect(sock, addr)
                    except OSError as exc:
                        sock.close()
                        last = exc
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    if family in (socket.AF_INET, socket.AF_INET6):
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return AsyncWireStream(sock)
                raise last or OSError("no address to connect to")
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options=None) -> AsyncWireStream:
        async def addresses():
            try:  # an address already: no resolver (asyncio's runs in a thread)
                ip = ipaddress.ip_address(host)
                family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
                return [(family, socket.SOCK_STREAM, 0, (host, port))]
            except ValueError:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
                return [(f, k, p, a) for f, k, p, _, a in infos]

        return await self._connect(addresses, timeout, socket_options, (local_address, 0) if local_address else None)

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None) -> AsyncWireStream:
        async def addresses():
            return [(socket.AF_UNIX, socket.SOCK_STREAM, 0, path)]

        return await self._connect(addresses, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _ReturningStream:
    """A response's body that hands its connection back to the pool when it is closed."""

    def __init__(self, inner, connection: httpcore.AsyncHTTPConnection, pool: "_KeepAlivePool"):
        self._inner, self._connection, self._pool = inner, connection, pool

    async def __aiter__(self):
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            if hasattr(self._inner, "aclose"):
                await self._inner.aclose()
        finally:
            await self._pool.put(self._connection)


class _KeepAlivePool:
    """What AsyncWireTransport sends through in place of httpcore's pool: idle connections (AsyncWireStreams)
    kept per origin, newest first, taken in O(1); a new one for each request beyond them, as many as are
    sent. httpcore's AsyncConnectionPool walks every connection it holds (is_idle, has_expired: a poll of
    each idle socket) at every request and response, quadratic in the streams in flight: with 64 streams
    on a 2-core machine that took 2.6 of the 4.3 s a closed loop of 128 requests ran, and the client fell
    20 ms behind its events. Reusing a connection spares a connect and a close (about 1 ms of this loop's
    time per request on a busy 2-core machine). An idle connection is kept KEEPALIVE_S, less than
    uvicorn's 5 s, so the server does not close one as it is reused; one that has expired is closed."""

    KEEPALIVE_S = 2.0
    MAX_IDLE = 256

    def __init__(self, backend: httpcore.AsyncNetworkBackend):
        self._backend = backend
        self._idle: dict = {}

    @staticmethod
    def _key(origin) -> tuple:
        return origin.scheme, origin.host, origin.port

    def _take(self, origin) -> tuple[httpcore.AsyncHTTPConnection | None, list]:
        """An idle connection to origin that may be used, and the expired ones met on the way (to close)."""
        idle, expired = self._idle.get(self._key(origin)) or [], []
        while idle:
            connection, since = idle.pop()
            if time.monotonic() - since < self.KEEPALIVE_S and connection.is_idle() and not connection.has_expired():
                return connection, expired
            expired.append(connection)
        return None, expired

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        connection, expired = self._take(request.url.origin)
        for old in expired:
            await old.aclose()
        if connection is None:
            connection = httpcore.AsyncHTTPConnection(
                origin=request.url.origin, network_backend=self._backend, keepalive_expiry=self.KEEPALIVE_S,
                ssl_context=_ssl_context() if request.url.scheme == b"https" else None)
        try:
            response = await connection.handle_async_request(request)
        except BaseException:
            await connection.aclose()
            raise
        return httpcore.Response(status=response.status, headers=response.headers,
                                 content=_ReturningStream(response.stream, connection, self), extensions=response.extensions)

    async def put(self, connection: httpcore.AsyncHTTPConnection) -> None:
        idle = self._idle.setdefault(self._key(connection._origin), [])
        if connection.is_idle() and len(idle) < self.MAX_IDLE:
            idle.append((connection, time.monotonic()))
        else:  # a response not read to its end, or a server that said close
            await connection.aclose()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection, _ in idle:
                await connection.aclose()
        self._idle.clear()

    async def __aenter__(self) -> "_KeepAlivePool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


_SSL: list = []


def _ssl_context():
    """One SSL context for every connection (creating one reads the CA store: 50 ms)."""
    if not _SSL:
        _SSL.append(httpx.create_ssl_context())
    return _SSL[0]


class AsyncWireTransport(httpx.AsyncHTTPTransport):
    """httpx's asyncio transport over AsyncWireStream connections, pooled by _KeepAlivePool."""

    def __init__(self):
        super().__init__()
        self._pool = _KeepAlivePool(AsyncWireBackend())


def async_timed_client(**kwargs) -> httpx.AsyncClient:
    """An httpx.AsyncClient whose streams astream_generate times at the socket, as timed_client's, each
    request on an idle connection or a new one, as many at once as are sent (arguments go to httpx.AsyncClient)."""
    return httpx.AsyncClient(transport=AsyncWireTransport(), **kwargs)


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
    # what was generated, where the stream says (a conversation's next turn carries it): SGLang's output_ids
    # (cumulative or, with incremental streaming, deltas) or the token_ids of OpenAI chunks; the text of OpenAI chunks
    output_ids: list[int] | None = None
    output_text: list[str] = field(default_factory=list)

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


_HEADERS = {"Content-Type": "application/json"}


def _begin(rec: StreamRecord, timeout_s: float, api: str, events: str) -> tuple[StreamParser, httpx.Timeout]:
    rec.t_sent = rec.t_call = time.perf_counter()
    return StreamParser(rec, api, events, rec.t_sent + timeout_s, timeout_s), httpx.Timeout(timeout_s, connect=10.0)


def _opened(rec: StreamRecord, resp: httpx.Response):
    """The response's headers are in: its status, and the timed connection where there is one."""
    rec.http_status = resp.status_code
    wire = resp.extensions.get("network_stream")
    if isinstance(wire, _Stamps) and wire.request_sent is not None:
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
                    events: str = "every", record: StreamRecord | None = None) -> StreamRecord:
    """POST a streaming request (SGLang /generate or OpenAI /v1/completions) and time every event;
    `events` says which OpenAI events are tokens (EVENT_RULES); `record` is filled where given."""
    rec = record if record is not None else StreamRecord()
    try:
        parser, timeout = _begin(rec, timeout_s, api, events)
        with client.stream("POST", url, content=body, headers=_HEADERS, timeout=timeout) as resp:
            wire = _opened(rec, resp)
            if resp.status_code != 200:
                _http_error(rec, resp.status_code, resp.read())
                return rec
            for raw in resp.iter_raw():
                seen = time.perf_counter()
                if not parser.feed(raw, wire.read_at if wire is not None else seen, seen):
                    return rec
        parser.finish()
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = _failure(exc, timeout_s)
    return rec


CANCELLED = "cancelled by the client"


async def astream_generate(client: httpx.AsyncClient, url: str, body: bytes, timeout_s: float, api: str = "sglang",
                           events: str = "every", record: StreamRecord | None = None) -> StreamRecord:
    """stream_generate on asyncio (a client from async_timed_client times at the socket), filling
    `record` (a new StreamRecord if None) as events arrive: if the task is cancelled, the record keeps
    every event that arrived, its error is CANCELLED and t_done None, and the CancelledError goes on."""
    rec = record if record is not None else StreamRecord()
    try:
        parser, timeout = _begin(rec, timeout_s, api, events)
        async with client.stream("POST", url, content=body, headers=_HEADERS, timeout=timeout) as resp:
            wire = _opened(rec, resp)
            if resp.status_code != 200:
                _http_error(rec, resp.status_code, await resp.aread())
                return rec
            async for raw in resp.aiter_raw():
                seen = time.perf_counter()
                if not parser.feed(raw, wire.read_at if wire is not None else seen, seen):
                    return rec
        parser.finish()
    except asyncio.CancelledError:
        rec.error, rec.t_done = CANCELLED, None
        raise
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = _failure(exc, timeout_s)
    return rec
