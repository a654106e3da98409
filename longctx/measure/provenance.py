"""Where a measurement came from: code version, packages, machine."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import psutil

from ..attention.microbench import cpu_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("longctx", "torch", "httpx", "snakemake", "pandas", "scipy", "matplotlib", "jinja2", "nvidia-ml-py")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_info(root: Path = ROOT) -> dict:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit or "unknown", "dirty": bool(status) if status is not None else None}


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def gpus() -> list[dict]:
    """GPUs seen by NVML; an empty list where there is no NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound without a GPU; ImportError without the package
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_total_bytes": pynvml.nvmlDeviceGetMemoryInfo(h).total,
            })
        driver = pynvml.nvmlSystemGetDriverVersion()
        for g in out:
            g["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        return out
    finally:
        pynvml.nvmlShutdown()


def hardware() -> dict:
    return {
        "host": socket.gethostname(),
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "gpus": gpus(),
        "os": platform.platform(),
    }
