"""Telemetry sampled beside the measurements: NVML on GPU machines, psutil elsewhere.

A Sampler thread reads its source every interval and time-stamps each sample with the same
clock as the client (time.perf_counter), so a trial's samples can be split into its prefill
window (request sent to first token) and its decode window (first to last token).

NVML: per GPU, SM and memory utilisation (%), power (W), SM and memory clocks (MHz), memory used
(GB); the summary averages over the GPUs. Without NVML (no GPU, or an external server on another
machine) the psutil source reads the CPU utilisation (% of one core) and resident memory of the
server's process tree, or of the whole machine when there is no local server process.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Mapping

import psutil

NVML_METRICS = ("sm_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz", "mem_clock_mhz", "mem_used_gb")
PSUTIL_METRICS = ("cpu_util_pct", "rss_gb")


class NvmlSource:
    kind = "nvml"
    metrics = NVML_METRICS

    def __init__(self, nvml, gpu_indices: list[int | str] | None = None):
        """gpu_indices: NVML indices, or GPU UUIDs as CUDA_VISIBLE_DEVICES may give them (None: all)."""
        self.nvml = nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        if count == 0 or gpu_indices == []:
            nvml.nvmlShutdown()
            raise RuntimeError("NVML sees no GPU" if count == 0 else "the server is given no GPU")
        self.indices = list(range(count)) if gpu_indices is None else list(gpu_indices)
        self.handles = [nvml.nvmlDeviceGetHandleByUUID(i) if isinstance(i, str) else nvml.nvmlDeviceGetHandleByIndex(i)
                        for i in self.indices]

    def sample(self) -> dict:
        n = self.nvml
        rows = []
        for h in self.handles:
            util = n.nvmlDeviceGetUtilizationRates(h)
            rows.append((util.gpu, util.memory, n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                         n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
                         n.nvmlDeviceGetMemoryInfo(h).used / 1e9))
        return {m: statistics.fmean(r[i] for r in rows) for i, m in enumerate(NVML_METRICS)}

    def describe(self) -> str:
        return f"NVML, GPUs {self.indices} (mean over them)"

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class ProcessSource:
    kind = "psutil"
    metrics = PSUTIL_METRICS

    def __init__(self, pid: int | None):
        self.pid = pid
        self.root = psutil.Process(pid) if pid else None
        self._procs: dict[int, psutil.Process] = {}
        self.sample()  # cpu_percent() measures from the previous call: prime it

    def _tree(self) -> list[psutil.Process]:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []
        for p in procs:  # keep the same objects so cpu_percent has a previous reading
            self._procs.setdefault(p.pid, p)
        return [self._procs[p.pid] for p in procs]

    def sample(self) -> dict:
        if self.root is None:
            return {"cpu_util_pct": psutil.cpu_percent() * psutil.cpu_count(), "rss_gb": psutil.virtual_memory().used / 1e9}
        cpu = rss = 0.0
        for p in self._tree():
            try:
                cpu += p.cpu_percent()
                rss += p.memory_info().rss
            except psutil.Error:
                continue
        return {"cpu_util_pct": cpu, "rss_gb": rss / 1e9}

    def describe(self) -> str:
        what = f"the server's process tree (pid {self.pid})" if self.pid else "the whole machine"
        return f"psutil, no GPU telemetry: CPU utilisation (% of one core) and resident memory of {what}"

    def close(self) -> None:
        pass


def visible_gpus(environ: Mapping[str, str]) -> list[int | str] | None:
    """The GPUs a server started with `environ` may use, from CUDA_VISIBLE_DEVICES (indices, or
    UUIDs: GPU-..., MIG-...); None when it is unset (every GPU). A job scheduler that shares a node
    between jobs sets it, so that each job's telemetry watches its own GPUs only."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    gpus: list[int | str] = []
    for item in (v.strip() for v in value.split(",")):
        if item.isdigit():
            gpus.append(int(item))
        elif item.startswith(("GPU-", "MIG-")):
            gpus.append(item)
        else:  # CUDA stops at the first invalid entry ("", "-1", "NoDevFiles")
            break
    return gpus


def make_source(server_pid: int | None, nvml=None, gpu_indices: list[int] | None = None):
    """NVML where a driver and a GPU answer, else psutil on the server's processes."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            nvml = None
    if nvml is not None:
        try:
            return NvmlSource(nvml, gpu_indices)
        except Exception:  # pynvml.NVMLError_LibraryNotFound without a GPU driver, or no GPU
            pass
    return ProcessSource(server_pid)


class Sampler:
    """Samples source every interval_s in a thread: [(perf_counter time, {metric: value}), ...]."""

    def __init__(self, source, interval_s: float):
        self.source = source
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)

    def _run(self) -> None:
        next_t = time.perf_counter()
        while not self._stop.is_set():
            now = time.perf_counter()
            try:
                self.samples.append((now, self.source.sample()))
            except Exception as exc:  # a sampler must never stop a measurement
                self.samples.append((now, {"error": str(exc)}))
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def summarize(samples: list, t0: float | None, t1: float | None, metrics) -> dict:
    """Mean and max of each metric over the samples taken in [t0, t1]; n says how many there were."""
    if t0 is None or t1 is None:
        return {"n": 0}
    window = [s for t, s in samples if t0 <= t <= t1 and "error" not in s]
    out: dict = {"n": len(window)}
    for m in metrics:
        values = [s[m] for s in window if m in s]
        if values:
            out[f"{m}_mean"] = statistics.fmean(values)
            out[f"{m}_max"] = max(values)
    return out
