"""A server process in its own process group: start, wait for health, stop; never by name."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import psutil

# How servers (uvicorn, SGLang, vLLM) say that their port was taken.
ADDRESS_IN_USE_RE = re.compile(r"address already in use|\[Errno 98\]|EADDRINUSE", re.IGNORECASE)


class ServerError(RuntimeError):
    """The server did not come up or died; the message carries the log path and its tail."""


class PortTaken(ServerError):
    """Another process had the server's port: the server could not bind it, or someone else answers there."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free at the moment of asking. Another process may take it before the server binds
    it (two bench jobs on one node): ManagedServer.wait_healthy(port=...) notices, and the caller
    picks another."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening_pids(port: int) -> set[int | None]:
    """The processes listening on TCP port `port` (None for a socket whose owner this user cannot see)."""
    try:
        connections = psutil.net_connections("tcp")
    except psutil.Error:
        return set()
    return {c.pid for c in connections if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


def tail(path: str | Path, lines: int = 20) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ManagedServer:
    """Start ``command`` with stdout and stderr in ``log_path``; stop its whole process group."""

    def __init__(self, command: list[str], log_path: str | Path, env: dict[str, str] | None = None,
                 stop_timeout_s: float = 20, unset: tuple[str, ...] = ()):
        self.command = command
        self.log_path = Path(log_path)
        self.env = {**{k: v for k, v in os.environ.items() if k not in unset}, **(env or {})}
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0  # where this start's lines begin in the (appended) log

    def __enter__(self) -> "ManagedServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died_message(self, what: str) -> str:
        code = self.proc.returncode if self.proc else None
        return f"{what} (exit code {code}); server log: {self.log_path}\n--- last lines ---\n{tail(self.log_path)}"

    def wait_healthy(self, url: str, timeout_s: float, port: int | None = None) -> float:
        """Poll url until it answers 200; return the seconds it took. With `port`, PortTaken (the
        server stopped) when the server could not bind it, or when what answers there is another
        process's server."""
        try:
            seconds = wait_http_ok(url, timeout_s, self.alive, lambda: self.died_message("the server exited during start-up"))
        except ServerError as exc:
            self.stop()
            if port is not None and ADDRESS_IN_USE_RE.search(self.log_since_start()):
                raise PortTaken(f"the server could not bind port {port}: another process has it") from exc
            raise
        if port is not None:
            visible = listening_pids(port) - {None}  # a listener this user cannot see is given the benefit of the doubt
            if visible and not visible & self.tree_pids():
                self.stop()
                raise PortTaken(f"port {port} is answered by another process (pid {', '.join(map(str, sorted(visible)))}), "
                                "not by this server")
        return seconds

    def log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def tree_pids(self) -> set[int]:
        """The server's process and its descendants."""
        if self.proc is None:
            return set()
        try:
            root = psutil.Process(self.proc.pid)
            return {root.pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.Error:
            return set()

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL what is left after stop_timeout_s."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 5.0)):
            if not self.group_alive():
                return
            try:
                os.killpg(self.proc.pid, sig)  # the leader of its own session: pgid == pid
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.group_alive():
                time.sleep(0.05)

    def group_alive(self) -> bool:
        """Whether any process of the server's group is left (the leader reaped first)."""
        if self.proc is None:
            return False
        self.proc.poll()
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_http_ok(url: str, timeout_s: float, alive=lambda: True, died=lambda: "") -> float:
    """Poll url until it answers 200 (seconds taken); ServerError if alive() turns false or time runs out."""
    t0 = time.monotonic()
    with httpx.Client(timeout=5.0) as client:
        while True:
            if not alive():
                raise ServerError(died())
            try:
                if client.get(url).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > timeout_s:
                raise ServerError(f"no answer from {url} within {timeout_s:.0f} s")
            time.sleep(0.2)


class ExternalServer:
    """A server someone else runs: the same interface as ManagedServer, with no lifecycle."""

    pid = None

    def __init__(self, base_url: str):
        self.base_url = base_url

    def __enter__(self) -> "ExternalServer":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        pass

    def wait_healthy(self, url: str, timeout_s: float) -> float:
        return wait_http_ok(url, timeout_s)

    def died_message(self, what: str) -> str:
        return f"{what} (external server at {self.base_url})"
