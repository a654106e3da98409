"""Hand-over between requests: a request's first byte held until a time (an open loop's schedule) or until another
request ends (a closed loop's next request, wire.AsyncWireStream writes it when its Gate opens), and the thread that
sees a stream's end reach its socket while the event loop is busy (EndWatcher)."""

from __future__ import annotations

import asyncio
import contextvars
import select
import socket
import sys
import threading
import time


def wake(fut: asyncio.Future, exc: BaseException | None = None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


# A request's first byte is held until this perf_counter time where it is set (an open loop's schedule), or
# until a Gate opens (a closed loop's next request, held until the one before it ends): the request is built and
# its connection taken beforehand, so that its send time is its due time and not that plus httpx's set-up (0.3 to
# 1 ms here, more on a busy loop)
SEND_AT: contextvars.ContextVar["float | Gate | None"] = contextvars.ContextVar("longctx_send_at", default=None)
HELD_CLOSED = "the server closed the connection while the request was held before its send"
SPIN_S = 0.0015  # the last stretch before a hold's end is waited out spinning (epoll's timeout has a millisecond's grain)


class Gate:
    """Holds a request until ``open()`` is called (by the code that saw another request end). A timed asyncio
    connection (AsyncWireStream) keeps the request's bytes while the gate is shut (headers and body: httpx writes
    them apart) and open() writes them itself, at once, in one send: the request's task, woken instead, would run
    an iteration later, after every other stream's event waiting in the loop (64 streams that end together:
    each replacement would wait for the others' parsing). open() may be called from another thread (EndWatcher)."""

    def __init__(self) -> None:
        self.is_open = False
        self._held: "AsyncWireStream | None" = None
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._lock = threading.Lock()

    def hold(self, stream: "AsyncWireStream") -> bool:
        """Whether the gate took `stream`'s request to write when it opens (False: open already)."""
        with self._lock:
            if not self.is_open:
                self._held = stream
            return not self.is_open

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if self.is_open:
                return
            self._waiting.append((loop, fut))
        await fut

    def open(self) -> None:
        with self._lock:
            if self.is_open:
                return
            self.is_open = True
            held, self._held = self._held, None
            waiting, self._waiting = self._waiting, []
        if held is not None:
            held._release()
        on_loop = _running_loop()
        for loop, fut in waiting:
            if loop is on_loop:
                wake(fut)
            else:
                loop.call_soon_threadsafe(wake, fut)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class EndWatcher:
    """A thread that opens a stream's Gate as soon as the stream's last bytes (`marker`) reach its socket,
    whatever the event loop is doing: 64 streams that end together leave the loop tens of milliseconds of
    work (their last events, the next requests' answers), and a gate opened by the loop would wait for it.
    ``watch(stream, gate)`` a stream near its end; the thread, woken by epoll (edge-triggered) when new bytes
    arrive, peeks at them (the loop still reads them) and opens the gate on the marker. While it runs, the
    interpreter hands the GIL over every SWITCH_S (a waiting thread gets it within that, not 5 ms)."""

    SWITCH_S = 0.0002

    def __init__(self, marker: bytes) -> None:
        self._marker = marker
        self._ep = select.epoll() if hasattr(select, "epoll") else None  # (not Linux: the event loop opens the gates)
        self._watched: dict[int, tuple[socket.socket, Gate]] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="longctx-end-watcher", daemon=True)
        self._switch = sys.getswitchinterval()

    def __enter__(self) -> "EndWatcher":
        if self._ep is not None:
            sys.setswitchinterval(self.SWITCH_S)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._ep is not None:
            self._stopping = True
            self._thread.join()
            self._ep.close()
            sys.setswitchinterval(self._switch)

    def watch(self, stream: "Stamped", gate: Gate) -> None:
        sock = stream._sock
        if self._ep is None or not isinstance(sock, socket.socket) or sock.fileno() < 0:
            return
        fd = sock.fileno()
        with self._lock:
            self._watched[fd] = (sock, gate)
        try:
            self._ep.register(fd, select.EPOLLIN | select.EPOLLET)
        except FileExistsError:
            self._ep.modify(fd, select.EPOLLIN | select.EPOLLET)
        except (OSError, ValueError):
            return
        self._check(fd)  # bytes that came before the registration raise no edge

    def _check(self, fd: int) -> None:
        with self._lock:
            item = self._watched.get(fd)
        if item is None or item[0].fileno() != fd:
            return
        sock, gate = item
        try:
            data = sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data and self._marker not in data:
            return
        with self._lock:
            self._watched.pop(fd, None)
        try:
            self._ep.unregister(fd)
        except (OSError, ValueError):
            pass
        if data:
            gate.open()

    def _run(self) -> None:
        while not self._stopping:
            for fd, _ in self._ep.poll(0.05):
                self._check(fd)


async def hold(until: "float | Gate | None") -> None:
    if isinstance(until, Gate):
        await until.wait()
    elif until is not None:
        ahead = until - time.perf_counter() - SPIN_S
        if ahead > 0:
            await asyncio.sleep(ahead)
        while time.perf_counter() < until:
            pass
