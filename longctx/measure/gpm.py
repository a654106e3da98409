"""The GPU's own performance counters (NVML's GPM: Hopper and later), read beside NVML's coarse utilisation.

NVML's utilisation rate is the share of time any kernel ran: it reads near 100% while the tensor cores idle. GPM
counts what the SMs and DRAM did between two samples: SM activity, SM occupancy, tensor-pipe activity and DRAM
bandwidth as a share of the device's peak. `Gpm` holds two sample buffers per GPU and, at each telemetry sample,
gives the metrics over the interval since the one before, per GPU and their mean over the GPUs (each a rate over that
interval: a window's figure is its samples' mean weighted by their intervals, longctx.measure.telemetry.summarize);
the first sample has none. Where GPM cannot be read (pynvml without its
GPM calls, a GPU before Hopper, MIG, no permission), `open_gpm` says why in one line, and nothing else changes.

Read through nvidia-ml-py's documented calls: nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc, nvmlGpmSampleGet,
nvmlGpmMetricsGet (with c_nvmlGpmMetricsGet_t) and nvmlGpmSampleFree.
"""

from __future__ import annotations

import statistics

# telemetry's metric name: (pynvml's metric identifier, what it is)
METRICS = {
    "gpm_sm_active_pct": ("NVML_GPM_METRIC_SM_UTIL", "SM activity"),
    "gpm_sm_occupancy_pct": ("NVML_GPM_METRIC_SM_OCCUPANCY", "SM occupancy"),
    "gpm_tensor_active_pct": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor-pipe activity"),
    "gpm_dram_bw_pct": ("NVML_GPM_METRIC_DRAM_BW_UTIL", "DRAM bandwidth"),
}
CALLS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
         "nvmlGpmSampleFree", "c_nvmlGpmMetricsGet_t")


class Gpm:
    """GPM over `handles` (every one supports it): two sample buffers per GPU, the newer one refilled each sample."""

    def __init__(self, nvml, handles: list):
        self.nvml = nvml
        self.handles = handles
        self.ids = {name: getattr(nvml, ident) for name, (ident, _) in METRICS.items()}
        self.buffers = [[nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()] for _ in handles]
        self.filled = False

    def sample(self) -> dict:
        """The metrics over the interval since the previous call: each one's mean over the GPUs, and under
        `<metric>_by_gpu` its value on each GPU, in the order of `handles` ({} at the first call, and nothing of a
        metric any GPU could not give)."""
        n = self.nvml
        per_gpu = []
        for h, pair in zip(self.handles, self.buffers):
            pair.reverse()  # pair[1]: the previous sample; pair[0] is filled now
            n.nvmlGpmSampleGet(h, pair[0])
            if self.filled:
                per_gpu.append(self._between(pair[1], pair[0]))
        self.filled = True
        out = {}
        for m in METRICS:
            if per_gpu and all(m in g for g in per_gpu):
                out[m] = statistics.fmean(g[m] for g in per_gpu)
                out[f"{m}_by_gpu"] = [g[m] for g in per_gpu]
        return out

    def _between(self, older, newer) -> dict:
        n = self.nvml
        get = n.c_nvmlGpmMetricsGet_t()
        get.version = n.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(self.ids)
        get.sample1, get.sample2 = older, newer
        for i, ident in enumerate(self.ids.values()):
            get.metrics[i].metricId = ident
        n.nvmlGpmMetricsGet(get)
        return {name: float(get.metrics[i].value) for i, name in enumerate(self.ids)
                if get.metrics[i].nvmlReturn == 0}

    def close(self) -> None:
        for pair in self.buffers:
            for buffer in pair:
                try:
                    self.nvml.nvmlGpmSampleFree(buffer)
                except Exception:  # noqa: BLE001 - freeing at the end never fails a measurement
                    pass
        self.buffers = []


def _no_permission(exc: Exception) -> bool:
    return "NoPermission" in type(exc).__name__ or "permission" in str(exc).lower()


def open_gpm(nvml, handles: list) -> tuple[Gpm | None, str]:
    """(Gpm, what it reads) where every GPU of `handles` supports GPM, else (None, the one line that says why not)."""
    missing = [c for c in CALLS if not hasattr(nvml, c)] + [i for i, _ in METRICS.values() if not hasattr(nvml, i)]
    if missing:
        return None, f"GPM counters not read: this pynvml has no {missing[0]} (nvidia-ml-py 12.535 or later has them)"
    for k, h in enumerate(handles):
        try:
            if hasattr(nvml, "nvmlDeviceGetMigMode") and nvml.nvmlDeviceGetMigMode(h)[0]:
                return None, f"GPM counters not read: GPU {k} is in MIG mode (GPM of a MIG instance is not read)"
        except Exception:  # noqa: BLE001 - a GPU without MIG raises NotSupported: not in MIG mode
            pass
        try:
            supported = bool(nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception as exc:  # noqa: BLE001 - NVML's own words for why
            why = "no permission to read them" if _no_permission(exc) else f"NVML: {exc}"
            return None, f"GPM counters not read: {why}"
        if not supported:
            name = _name(nvml, h)
            return None, f"GPM counters not read: {name or f'GPU {k}'} has none (GPM needs Hopper or later)"
    gpm = None
    try:
        gpm = Gpm(nvml, handles)
        gpm.sample()  # the first buffers filled: the next sample has an interval
    except Exception as exc:  # noqa: BLE001
        if gpm is not None:
            gpm.close()
        why = "no permission to read them" if _no_permission(exc) else f"NVML: {exc}"
        return None, f"GPM counters not read: {why}"
    what = ", ".join(w for _, w in METRICS.values())
    return gpm, f"GPM counters read ({what}, over each sample's interval)"


def _name(nvml, handle) -> str | None:
    try:
        name = nvml.nvmlDeviceGetName(handle)
    except Exception:  # noqa: BLE001
        return None
    return name.decode() if isinstance(name, bytes) else str(name)
