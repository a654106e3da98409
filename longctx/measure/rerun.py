"""What a rerun after an interruption needs, and what a run says when another holds its directory.

A run that Ctrl-C, SIGHUP or a crash ended may leave `.snakemake/locks/` behind, and the next run then
refuses to start until `--unlock`. The lock is stale when no other snakemake process on this machine
runs in the directory; then it is removed, and the caller says so. (Two runs from two machines in one
directory on a shared file system cannot see each other's processes: there Snakemake's own check
stands, since a job step never clears a lock; see stale_locks' caller in the Snakefile.)

A lock that a live run holds is not stale: Snakemake refuses the second run, and its stock words say to
`--unlock` if no other run is alive, which here would let two runs write the same files. name_lock_holders
makes that refusal one line that names the run holding the lock and says to wait for it. And a run that
Ctrl-C stopped exits 130, the shell's convention, rather than Snakemake's 1 (watch_interrupt, interrupted).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil

from ..core.secrets import HIDDEN, mask_argv


def _snakemake_elsewhere(workdir: Path) -> list[int]:
    """Other snakemake processes on this machine whose working directory is workdir (not this
    process, nor its ancestors: a `snakemake` wrapper script that runs this one)."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if proc.pid in mine or not any("snakemake" in os.path.basename(a) for a in cmd[:3]):
                continue
            if Path(proc.cwd()).resolve() == workdir:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def clear_stale_locks(workdir: str | Path = ".") -> str | None:
    """Remove Snakemake's locks in workdir when no other snakemake runs there; what was done, or None."""
    workdir = Path(workdir).resolve()
    locks = sorted((workdir / ".snakemake" / "locks").glob("*.lock"))
    if not locks:
        return None
    others = _snakemake_elsewhere(workdir)
    if others:
        return None  # held: the refusal names the run (name_lock_holders)
    for lock in locks:
        lock.unlink(missing_ok=True)
    return (f"longctx: removed {len(locks)} stale Snakemake lock file(s) in {workdir / '.snakemake' / 'locks'}: "
            "the run that held them is gone (no other snakemake runs in this directory)")


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _described(proc: psutil.Process, workdir: Path) -> str:
    """'pid 123, running for 4 min 5 s: snakemake --cores 1 (its log: .snakemake/log/....snakemake.log)'."""
    with proc.oneshot():
        cmd = list(proc.cmdline())
        if cmd and os.path.basename(cmd[0]).startswith("python"):
            cmd[0] = os.path.basename(cmd[0])
        if len(cmd) > 1 and os.path.basename(cmd[1]) == "snakemake":  # the console script: `python .../bin/snakemake`
            cmd = cmd[1:]
            cmd[0] = "snakemake"
        # its secrets hidden: a flag named like one, a URL's user and password (a --config value may carry one)
        cmd = [re.sub(r"(\w+://)[^/@\s]+@", rf"\1{HIDDEN}@", w) for w in mask_argv(cmd)]
        said = f"pid {proc.pid}, running for {_duration(time.time() - proc.create_time())}: {shlex.join(cmd)}"
        try:
            logs = sorted(f.path for f in proc.open_files() if f.path.endswith(".snakemake.log"))
        except (psutil.Error, OSError):
            logs = []
    if logs:
        log = Path(logs[-1])
        said += f" (its log: {log.relative_to(workdir) if log.is_relative_to(workdir) else log})"
    return said


def lock_holders(workdir: str | Path = ".") -> list[psutil.Process]:
    """The snakemake runs in workdir other than this one: those of _snakemake_elsewhere that no other of them
    started (a run's job steps, `python -m snakemake --mode subprocess ...`, are its children)."""
    workdir = Path(workdir).resolve()
    pids = set(_snakemake_elsewhere(workdir))
    holders = []
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            if not any(parent.pid in pids for parent in proc.parents()):
                holders.append(proc)
        except psutil.Error:
            continue
    return holders


def held_lock_message(workdir: str | Path = ".") -> str | None:
    """The line that says which run holds workdir's lock and to wait for it, or None where none on this machine
    runs there (a run on another machine over a shared file system: Snakemake's own words stand)."""
    workdir = Path(workdir).resolve()
    described = []
    for proc in lock_holders(workdir):
        try:
            described.append(_described(proc, workdir))
        except psutil.Error:  # it ended meanwhile
            continue
    if not described:
        return None
    run = "another snakemake run" if len(described) == 1 else f"{len(described)} other snakemake runs"
    return (f"longctx: the files this run would write in {workdir} are locked by {run}, {'; and '.join(described)}; "
            "wait for it to finish, then run this command again (not --unlock: that run is alive, and both would "
            "write the same files)")


def name_lock_holders(workdir: str | Path = ".") -> bool:
    """Snakemake's refusal to lock the directory (its LockException, raised only where a run would write files
    that another run's lock holds: a dry run, --unlock, --summary and --lint lock nothing) as held_lock_message's
    one line, exit status 1. Called by the Snakefile in the main process, before Snakemake locks. False where
    Snakemake has no such exception (another version): its own words stand."""
    try:
        import snakemake.exceptions as sx
    except ImportError:
        return False
    stock = getattr(sx, "LockException", None)
    if not isinstance(stock, type):
        return False
    if getattr(stock, "longctx_names_holder", False):
        return True
    workdir = Path(workdir).resolve()

    class HeldLock(stock):
        longctx_names_holder = True

        def __init__(self, *args, **kwargs):
            said = held_lock_message(workdir)
            if said:
                # the line alone, as the config errors are said: raised as the exception, it would be printed
                # under a line of its class name
                raise SystemExit(said)
            super().__init__(*args, **kwargs)

    sx.LockException = HeldLock
    return True


_INTERRUPTED: list[int] = []


def watch_interrupt() -> bool:
    """Note a SIGINT (Ctrl-C) before Python's own handler raises KeyboardInterrupt, as before: Snakemake catches
    that, cancels its jobs and fails the run with exit status 1; the Snakefile's onerror then makes it 130
    (interrupted). Main thread only (False elsewhere, or where SIGINT is not Python's to handle)."""
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or getattr(previous, "longctx_watch", False):
        return getattr(previous, "longctx_watch", False)

    def noted(signum, frame):
        _INTERRUPTED.append(signum)
        previous(signum, frame)

    noted.longctx_watch = True
    try:
        signal.signal(signal.SIGINT, noted)
    except ValueError:  # not the main thread
        return False
    return True


def interrupted() -> bool:
    """Whether this process got SIGINT since watch_interrupt."""
    return bool(_INTERRUPTED)


def interrupted_message(logs) -> str:
    """The run's last line after Ctrl-C: its jobs were cancelled, and the same command resumes. logs: the
    Snakefile's onerror `log` (Snakemake's log files, a list or one path)."""
    logs = [logs] if isinstance(logs, (str, Path)) else list(logs or [])
    where = f" (Snakemake's log: {logs[-1]})" if logs else ""
    return ("longctx: interrupted; the jobs were stopped, what they measured is kept, and the same command "
            f"resumes{where}")


def judge_nothing_to_do(verdict, judged) -> None:
    """A run that has nothing to do ends before Snakemake's onsuccess: make it exit 1 where verdict() (the run's
    exit verdict: what is missing, or None) says so, where Snakemake says "Nothing to be done", once its lock is
    released; only where judged() (the Snakefile's: not a dry run, --touch or --no-hooks, and targets that read the
    results). Called by the Snakefile in the main process."""
    import logging

    from snakemake.common import NOTHING_TO_BE_DONE_MSG

    class Judge(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.getMessage() == NOTHING_TO_BE_DONE_MSG and judged():
                problem = verdict()
                if problem:
                    print(f"{NOTHING_TO_BE_DONE_MSG}\nlongctx: {problem}", file=sys.stderr)
                    raise SystemExit(1)  # out of Snakemake's execute, through its lock's release
            return True

    logging.getLogger("snakemake.logging").addFilter(Judge())
