"""What a rerun after an interruption needs: Snakemake's lock of a run that is gone, cleared.

A run that Ctrl-C, SIGHUP or a crash ended may leave `.snakemake/locks/` behind, and the next run then
refuses to start until `--unlock`. The lock is stale when no other snakemake process on this machine
runs in the directory; then it is removed, and the caller says so. (Two runs from two machines in one
directory on a shared file system cannot see each other's processes: there Snakemake's own check
stands, since a job step never clears a lock; see stale_locks' caller in the Snakefile.)
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil


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
        return None  # held: Snakemake says so itself
    for lock in locks:
        lock.unlink(missing_ok=True)
    return (f"longctx: removed {len(locks)} stale Snakemake lock file(s) in {workdir / '.snakemake' / 'locks'}: "
            "the run that held them is gone (no other snakemake runs in this directory)")
