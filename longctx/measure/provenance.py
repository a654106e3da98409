"""Where a measurement came from: code version, packages, machine, the model as served, the kernel build."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import psutil

from ..attention.microbench import cpu_name
from ..core.errors import ConfigError
from ..engines import ConfigurationSpec, EngineAdapter
from ..specs.model import ModelNotDescribed, ModelSpecError, as_reported
from .health import ServerError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("longctx", "torch", "httpx", "snakemake", "pandas", "scipy", "matplotlib", "jinja2", "nvidia-ml-py", "apache-otava")


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


def resolved_model_spec(adapter: EngineAdapter, spec: ConfigurationSpec,
                        reports: dict | None = None) -> tuple[dict | None, str | None]:
    """The architecture as this configuration serves it (TP size, KV dtype, model.kv_bytes_per_token, and what
    the server reported of itself: the adapter's server_reports), for the analysis, or None and why: the config
    describes no model, or one the spec cannot (then model.kv_bytes_per_token, if given, is the only KV
    figure). A description that is wrong (a missing file, a field an MHA/GQA/MLA model needs) is a ConfigError."""
    try:
        return as_reported(adapter.model_spec(spec.model, spec.args), reports or {}).to_dict(), None
    except ModelNotDescribed as exc:
        return None, str(exc)
    except ModelSpecError as exc:
        if spec.model.get("kv_bytes_per_token"):
            return None, str(exc)
        raise ConfigError(str(exc)) from None


def model_provenance(adapter: EngineAdapter, spec: ConfigurationSpec, reports: dict | None = None) -> dict:
    """The provenance's model, model_spec and model_spec_absent: the config's model with the KV figure the spec
    derives where it describes the model exactly (resolved_model_spec, with what the server reported)."""
    mspec, absent = resolved_model_spec(adapter, spec, reports)
    exact = mspec["kv_bytes_per_token"] if mspec and (mspec["exact"] or mspec["kv_bytes_override"]) else None
    return {"model": {**spec.model, "kv_bytes_per_token": spec.model.get("kv_bytes_per_token") or exact},
            "model_spec": mspec, "model_spec_absent": absent}


def kernel_manifest(spec: ConfigurationSpec) -> dict | None:
    if not spec.kernel_build:
        return None
    path = Path(spec.kernel_build) / "manifest.json"
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ServerError(f"kernel build {path} is missing or unreadable ({exc}); run the build_kernel rule") from None
    return {"name": m["name"], "build_hash": m["build_hash"], "sources": m["sources"]}
