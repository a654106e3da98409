"""Whether a server is ready: its health paths probed in order, and what each one answered.

A server is ready when the first of its health paths that does not say "not here" (a 4xx) answers 200;
one that answers, but on none of them, has no health path among them (set server.health_path); one
that never answers within the timeout is said to, with what each path answered. A server someone
else runs (ExternalServer) has no lifecycle: it is only checked, at once.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx


class ServerError(RuntimeError):
    """The server did not come up or died; the message carries the log path and its tail."""


EXTERNAL_WAIT_S = 5.0  # an external server has no start-up to wait for: it answers now, or the run says why
ABSENT_GRACE_S = 2.0  # a server that says "not here" on every probe for this long has no health path among them
PROBE_TIMEOUT_S = 5.0


class NoHealthPath(ServerError):
    """The server answers HTTP, but none of the health probes is served there: no restart helps."""


def path_absent(code: int) -> bool:
    """An HTTP status that says the path is not served (or not to us), not that the server is busy
    starting (5xx, 408, 425, 429)."""
    return 400 <= code < 500 and code not in (408, 425, 429)


def _failure(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return f"{type(exc).__name__}: {text}"


class HealthProbes:
    """The health paths of one server, probed in order, and everything each one answered."""

    def __init__(self, base: str, paths: tuple[str, ...]):
        self.base, self.paths = base, tuple(paths)
        self.seen: dict[str, Counter] = {p: Counter() for p in self.paths}
        self.answers = 0  # HTTP answers, of any status
        self.absent = False  # the last round: every path said it is not served

    def round(self, client: httpx.Client, deadline: float) -> str | None:
        """Probe the paths in order up to the first that does not say "not here": that one if it
        answered 200, else None (not ready: refused, timed out, 5xx)."""
        self.absent = False
        for path in self.paths:
            timeout = max(0.5, min(PROBE_TIMEOUT_S, deadline - time.monotonic()))
            try:
                code = client.get(self.base + path, timeout=timeout).status_code
            except httpx.HTTPError as exc:
                self.seen[path][_failure(exc)] += 1
                return None
            self.answers += 1
            self.seen[path][f"HTTP {code}"] += 1
            if code == 200:
                return path
            if not path_absent(code):
                return None
        self.absent = True
        return None

    def tried(self) -> str:
        """Each path probed and what it answered (with counts): '/health: HTTP 404 x3; /v1/models: connection refused, HTTP 200'
        (in the order seen)."""
        return "; ".join(f"{p or self.base}: " + ", ".join(what if n == 1 else f"{what} x{n}" for what, n in seen.items())
                         for p, seen in self.seen.items() if seen)


def wait_health(base: str, paths: tuple[str, ...], timeout_s: float, alive=lambda: True, died=lambda: "",
                absent_grace_s: float = ABSENT_GRACE_S, headers: dict | None = None) -> tuple[str, float]:
    """Probe base + each of paths, in order, until the first one that does not say "not here" (4xx)
    answers 200: that path and the seconds it took. ServerError if alive() turns false or timeout_s
    passes (naming what each path answered); NoHealthPath as soon as every path has said "not here"
    for absent_grace_s: the server answers, but not on any of them. headers: sent with every probe (an API key's)."""
    probes = HealthProbes(base, paths)
    t0 = time.monotonic()
    deadline, absent_since = t0 + timeout_s, None
    with httpx.Client(headers=headers) as client:
        while True:
            if not alive():
                raise ServerError(died())
            path = probes.round(client, deadline)
            if path is not None:
                return path, time.monotonic() - t0
            now = time.monotonic()
            absent_since = (absent_since or now) if probes.absent else None
            if absent_since is not None and now - absent_since >= absent_grace_s:
                raise NoHealthPath(f"{base} answers, but not on any health path: {probes.tried()}; "
                                   "set server.health_path to the path where this server answers 200 when ready")
            if now >= deadline:
                said = (f"{base} answered {probes.answers} times but no health probe answered 200" if probes.answers
                        else f"no answer from {base}")
                raise ServerError(f"{said} within {timeout_s:.3g} s: {probes.tried()}")
            time.sleep(0.2)


class ExternalServer:
    """A server someone else runs: ManagedServer's interface with no lifecycle (wait_ready probes the
    server's own base URL)."""

    pid = None

    def __init__(self, base_url: str, headers: dict | None = None):
        self.base_url, self.headers = base_url, headers

    def __enter__(self) -> "ExternalServer":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        pass

    def wait_ready(self, paths: tuple[str, ...], timeout_s: float) -> tuple[str, float]:
        """The health path and the seconds it took, within seconds: the server is up or it is not
        (at most EXTERNAL_WAIT_S, or timeout_s if shorter; "not here" on every path fails at once)."""
        return wait_health(self.base_url, paths, min(timeout_s, EXTERNAL_WAIT_S), absent_grace_s=0, headers=self.headers)

    def died_message(self, what: str) -> str:
        return f"{what} (external server at {self.base_url})"
