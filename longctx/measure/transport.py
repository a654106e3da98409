"""httpx clients whose connections are timed at the socket (measure.wire), and the asyncio keep-alive pool.

``timed_client()`` is an httpx.Client over WireStream connections (httpx's own pool);
``async_timed_client()`` an httpx.AsyncClient over AsyncWireStream connections, pooled by
``KeepAlivePool`` (O(1) per request, as many connections at once as requests are sent). Any other
httpx client works with measure.stream too, timed around the httpx calls.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time

import httpcore
import httpx

from .wire import AsyncWireStream, WireStream

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

    def __init__(self, inner, connection: httpcore.AsyncHTTPConnection, pool: "KeepAlivePool"):
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


class KeepAlivePool:
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

    async def __aenter__(self) -> "KeepAlivePool":
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
    """httpx's asyncio transport over AsyncWireStream connections, pooled by KeepAlivePool."""

    def __init__(self):
        super().__init__()
        self._pool = KeepAlivePool(AsyncWireBackend())


def async_timed_client(**kwargs) -> httpx.AsyncClient:
    """An httpx.AsyncClient whose streams astream_generate times at the socket, as timed_client's, each
    request on an idle connection or a new one, as many at once as are sent (arguments go to httpx.AsyncClient)."""
    return httpx.AsyncClient(transport=AsyncWireTransport(), **kwargs)
