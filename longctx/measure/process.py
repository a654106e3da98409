"""A server process in its own process group: start, wait for health (measure.health: the first health
probe that answers), stop; never by name.

A server never outlives the process that started it: on Linux the kernel sends it SIGTERM when its
parent dies, however (PR_SET_PDEATHSIG, set in the child before exec, so a SIGKILL of the parent
counts); and its pid file (``<log>.pid``) lets the next start find and stop a server that an earlier
one left behind anyway (one that ignored the signal, or children that outlived their leader).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import sys
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil

from ..core.secrets import mask_argv, scrub
from .health import ServerError, wait_health

log = logging.getLogger(__name__)

# How servers (uvicorn, SGLang, vLLM) say that their port was taken.
ADDRESS_IN_USE_RE = re.compile(r"address already in use|\[Errno 98\]|EADDRINUSE", re.IGNORECASE)


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with(parent: int):
    """A preexec_fn: this child gets SIGTERM when `parent` dies (at once if it already has)."""
    def set_signal() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), signal.SIGTERM)
    return set_signal if _LIBC is not None else None


def _stop_group(pgid: int, members: set[int], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after timeout_s, to the processes of group pgid (by the group while its
    leader lives, else each member by pid)."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        alive = {p for p in members if psutil.pid_exists(p)}
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(psutil.pid_exists(p) and _state(p) != psutil.STATUS_ZOMBIE for p in alive):
            time.sleep(0.05)


def _state(pid: int) -> str | None:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def pid_file(log_path: str | Path) -> Path:
    """Where a managed server's pid is kept while it runs (beside its log), for reap_stray at the next start."""
    log_path = Path(log_path)
    return log_path.with_name(log_path.name + ".pid")


def reap_stray(pid_file: str | Path, timeout_s: float = 20) -> str | None:
    """Stop the server an earlier start left running (recorded in pid_file), and say so; None where
    there is none. A process counts only if it is the one recorded (same pid and start time) or one of
    its group started after it, so that a reused pid is never killed."""
    pid_file = Path(pid_file)
    try:
        rec = json.loads(pid_file.read_text())
        pid, started = int(rec["pid"]), float(rec["create_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    members = set()
    for proc in psutil.process_iter(["pid", "create_time"]):
        try:
            if os.getpgid(proc.pid) == pid and proc.info["create_time"] >= started - 1:
                members.add(proc.pid)
        except (OSError, psutil.Error):
            continue
    pid_file.unlink(missing_ok=True)
    if not members:
        return None
    _stop_group(pid, members, timeout_s)
    left = {p for p in members if psutil.pid_exists(p) and _state(p) != psutil.STATUS_ZOMBIE}
    what = (f"a server an earlier run left running (process group {pid}, started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}: {' '.join(rec.get('command', []))[:200]})")
    return f"stopped {what}" if not left else f"could not stop {what}: pids {sorted(left)} remain"


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


def listening_process(port: int) -> tuple[int | None, str | None]:
    """The process that listens on TCP port `port` and the reason when there is none to name: nobody
    listens, the listener belongs to another user (psutil cannot see its owner), or unrelated processes
    share the port. Where a server's workers inherit its listening socket, psutil names one holder per
    socket, maybe a worker: the topmost ancestor that listens on the port too is named, whose process
    tree holds them all."""
    try:
        connections = psutil.net_connections("tcp")
    except psutil.Error as exc:
        return None, f"psutil cannot list this machine's sockets ({type(exc).__name__})"
    pids = {c.pid for c in connections if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    seen = pids - {None}
    if not pids:
        return None, f"no process on this machine listens on port {port}"
    if not seen:
        return None, f"the process listening on port {port} belongs to another user (psutil cannot see it)"

    def listens(proc: psutil.Process) -> bool:
        try:
            return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                       for c in proc.net_connections("tcp"))
        except psutil.Error:
            return False

    def top(pid: int) -> int:
        try:
            proc = psutil.Process(pid)
            while (parent := proc.parent()) is not None and listens(parent):
                proc = parent
            return proc.pid
        except psutil.Error:
            return pid

    tops = sorted({top(p) for p in seen})
    if len(tops) > 1:
        return None, f"unrelated processes listen on port {port} (pids {', '.join(map(str, tops))})"
    return tops[0], None


TAIL_LINES = 20  # of a dead server's log, into this process's log
LAST_LINE_CHARS = 160  # of its last line, in the one line that says it died


# a Python exception's line, after whatever prefix a server's logger puts before it ("(EngineCore_DP0 pid=7) ",
# "ERROR 12-06 07:00:00 [core.py:708] "): its name and its message
# (at the line's start or right after the prefix: a traceback's indented source lines are not it)
_EXCEPTION = re.compile(r"(?:^|[\])] )((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit))(?::\s*(.*\S))?\s*$")
_TRACEBACK = "Traceback (most recent call last):"
# causes no restart helps: a file that is not there, a flag the engine does not take
_WILL_NOT_PASS = re.compile(r"FileNotFoundError|IsADirectoryError|NotADirectoryError|PermissionError|No such file|"
                            r"[Cc]annot find|[Cc]ould not find|does not exist|unrecognized arguments|invalid choice|"
                            r"error: argument|is not a valid")


def root_cause(text: str) -> str | None:
    """The error a server's log gives as the cause of its failure: the last line of the first Python traceback
    printed (a chained exception prints its cause first; vLLM's engine core prints its own traceback, "RuntimeError:
    Cannot find any model weights with ...", before the front end's "Engine core initialization failed. See root
    cause above."), or None where the log holds no traceback."""
    lines = text.splitlines()
    seen = False
    for line in lines:
        if _TRACEBACK in line:
            seen = True
            continue
        if seen and not line.lstrip().startswith(("File ", "^", "~")):
            m = _EXCEPTION.search(line)
            if m:
                return f"{m.group(1)}: {m.group(2)}" if m.group(2) else m.group(1)
    return None


def will_not_pass(cause: str | None) -> bool:
    """Whether a start-up failure's cause is one that no restart can change (a missing file, a bad flag)."""
    return bool(cause and _WILL_NOT_PASS.search(cause))


def tail(path: str | Path, lines: int = TAIL_LINES) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ManagedServer:
    """Start ``command`` with stdout and stderr in ``log_path``; stop its whole process group."""

    def __init__(self, command: list[str], log_path: str | Path, env: dict[str, str] | None = None,
                 stop_timeout_s: float = 20, unset: tuple[str, ...] = (), secrets: tuple[str, ...] = ()):
        self.command = command
        self.log_path = Path(log_path)
        self.env = {**{k: v for k, v in os.environ.items() if k not in unset}, **(env or {})}
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0  # where this start's lines begin in the (appended) log
        self.cause: str | None = None  # the cause its log gave for its death (root_cause), once died_message read it
        # values the server may print (SGLang logs its API key in its server_args line): its output then goes to the log
        # through a pipe, each line scrubbed as it is written, so the log never holds them, however the bench ends
        self.secrets = tuple(v for v in secrets if v)
        self._copier: threading.Thread | None = None

    def __enter__(self) -> "ManagedServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            log.write(f"$ {' '.join(mask_argv(self.command))}\n".encode())
            log.flush()
            # a process group of its own (stopped by it), in this process's session: a session of its own would be
            # an autogroup of its own, and Linux (CONFIG_SCHED_AUTOGROUP) shares the CPUs between autogroups before
            # their tasks, so while a CPU server computes, the client that times its tokens may wait off the CPUs
            # (vLLM's CPU build on 2 cores: the client and a bare 1 ms sleeper waited up to 1 s, runnable; none
            # over 25 ms with the server in their session)
            self.proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE if self.secrets else log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self.env, process_group=0, preexec_fn=_die_with(os.getpid()),
            )
        if self.secrets:
            self._copier = threading.Thread(target=self._copy_scrubbed, name="server-log", daemon=True)
            self._copier.start()
        try:
            created = psutil.Process(self.proc.pid).create_time()
            self.pid_file.write_text(json.dumps({"pid": self.proc.pid, "create_time": created, "command": mask_argv(self.command)}))
        except (OSError, psutil.Error):
            pass  # gone already: wait_ready says why

    def _copy_scrubbed(self) -> None:
        """The server's output into its log, line by line, without self.secrets."""
        with open(self.log_path, "ab", buffering=0) as log:
            for line in iter(self.proc.stdout.readline, b""):
                log.write(scrub(line.decode(errors="replace"), *self.secrets).encode())

    @property
    def pid_file(self) -> Path:
        return pid_file(self.log_path)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died_message(self, what: str) -> str:
        """One line: what happened, the exit code, the log's path and the log's last line; the log's last
        TAIL_LINES lines go to this process's log."""
        code = self.proc.returncode if self.proc else None
        lines = tail(self.log_path, TAIL_LINES)
        log.info("%s: the last lines of %s:\n%s", what, self.log_path, lines)
        last = next((ln.strip() for ln in reversed(lines.splitlines()) if ln.strip()), "")
        self.cause = root_cause(self.log_since_start())
        cause = self.cause if self.cause and self.cause not in last else None
        return (f"{what} (exit code {code}); server log: {self.log_path}"
                + (f"; the cause it gives: {cause[:LAST_LINE_CHARS]}" if cause else "")
                + (f"; its last line: {last[:LAST_LINE_CHARS]}" if last else ""))

    def wait_healthy(self, url: str, timeout_s: float, port: int | None = None) -> float:
        """Poll url until it answers 200; the seconds it took (wait_ready with url as the only probe)."""
        return self.wait_ready(url, ("",), timeout_s, port)[1]

    def wait_ready(self, base: str, paths: tuple[str, ...], timeout_s: float, port: int | None = None,
                   headers: dict | None = None) -> tuple[str, float]:
        """Wait for start-up, then the health path (wait_health, its probes sent with headers) and the seconds it took. With `port`,
        PortTaken (the server stopped) when the server could not bind it, or when what answers there is
        another process's server."""
        try:
            found = wait_health(base, paths, timeout_s, self.alive,
                                lambda: self.died_message("the server exited during start-up"), headers=headers)
        except ServerError as exc:
            foreign = self.foreign_listeners(port)
            self.stop()
            if port is not None and ADDRESS_IN_USE_RE.search(self.log_since_start()):
                raise PortTaken(f"the server could not bind port {port}: another process has it") from exc
            if foreign:
                raise PortTaken(self.answered_by(port, foreign)) from exc
            raise
        foreign = self.foreign_listeners(port)
        if foreign:
            self.stop()
            raise PortTaken(self.answered_by(port, foreign))
        return found

    def foreign_listeners(self, port: int | None) -> set[int]:
        """The processes outside the server's tree that listen on port, when none of the tree does
        (a listener this user cannot see is given the benefit of the doubt)."""
        if port is None:
            return set()
        visible = listening_pids(port) - {None}
        return visible if visible and not visible & self.tree_pids() else set()

    @staticmethod
    def answered_by(port: int, pids: set[int]) -> str:
        return f"port {port} is answered by another process (pid {', '.join(map(str, sorted(pids)))}), not by this server"

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
        """SIGTERM (and SIGCONT, for a stopped one) the process group, then SIGKILL what is left after stop_timeout_s."""
        if self.proc is None:
            return
        try:
            for sig, wait in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 5.0)):
                if not self.group_alive():
                    self.pid_file.unlink(missing_ok=True)
                    return
                try:
                    os.killpg(self.proc.pid, sig)  # the leader of its own process group: pgid == pid
                    if sig == signal.SIGTERM:  # a stopped server (SIGSTOP, a debugger) handles it once continued
                        os.killpg(self.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    return
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and self.group_alive():
                    time.sleep(0.05)
        finally:
            if self._copier is not None:  # its last lines into the log
                self._copier.join(timeout=5)

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
