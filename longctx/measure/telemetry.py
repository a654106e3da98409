"""Telemetry sampled beside the measurements, from the device the server computes on only.

telemetry_source decides it per configuration (its adapter's `device`): NVML for the GPUs a server on
this machine's GPUs uses; psutil for a server on this machine's CPU, over the server's own process tree
(a managed server's pid; an external server's, found as the process listening on its port) or, when that
process cannot be found, over the whole machine (said so); nothing for a remote server. Its description,
recorded in each raw file's provenance, says which source and over what.

longctx.measure.sampling reads a source every interval beside a measurement (its Sampler) and splits a trial's
samples into its prefill window (request sent to first token) and its decode window (first to last token).

NVML: per GPU, SM and memory utilisation (%), power (W), SM and memory clocks (MHz), memory used
(GB); the summary averages over the GPUs. With the server's process known, also the SM utilisation NVML attributes
to other processes (others_sm_util_pct, nvmlDeviceGetProcessUtilization): another job time-slicing the GPU, which
does not lower its clock; left out where NVML does not say it, or cannot see the server's processes (a container).
Where the GPUs have them, NVML's GPM counters over each sample's interval too (longctx.measure.gpm; the description
says why where they cannot be read). psutil: CPU utilisation (% of one core) and resident memory
(RSS) of the server's process tree; over the whole machine, the CPU utilisation of all processes and the
memory in use (its `rss_gb`), which is not the server's.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil

from . import gpm
from .process import listening_process

# and, where the GPUs have them, GPM's counters over each sample's interval (longctx.measure.gpm)
NVML_METRICS = ("sm_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz", "mem_clock_mhz", "mem_used_gb", "others_sm_util_pct",
                *gpm.METRICS)
DEVICE_METRICS = NVML_METRICS[:6]  # every GPU has them; others_sm_util_pct only where NVML attributes its work
PSUTIL_METRICS = ("cpu_util_pct", "rss_gb")


class NvmlSource:
    kind = "nvml"
    metrics = NVML_METRICS

    def __init__(self, nvml, gpu_indices: list[int | str] | None = None, which: str | None = None,
                 server_pids=None):
        """gpu_indices: NVML indices, or GPU UUIDs as CUDA_VISIBLE_DEVICES may give them (None: all);
        which: how they were chosen, for the description; server_pids: a callable giving the server's process ids
        (None: not known, and others_sm_util_pct not read)."""
        self.nvml = nvml
        self.which = which
        self.server_pids = server_pids
        self._since: dict[int, int] = {}  # per GPU, the newest process sample read (NVML's microseconds)
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        if count == 0 or gpu_indices == []:
            nvml.nvmlShutdown()
            raise RuntimeError("NVML sees no GPU" if count == 0 else "the server is given no GPU")
        self.indices = list(range(count)) if gpu_indices is None else list(gpu_indices)
        self.handles = [nvml.nvmlDeviceGetHandleByUUID(i) if isinstance(i, str) else nvml.nvmlDeviceGetHandleByIndex(i)
                        for i in self.indices]
        self.gpm, self.gpm_said = gpm.open_gpm(nvml, self.handles)

    @property
    def marks(self) -> bool:
        """Whether a trial brackets its phases with samples of their own (GPM counts over intervals: Sampler.mark)."""
        return self.gpm is not None

    def sample(self) -> dict:
        n = self.nvml
        rows = []
        for h in self.handles:
            util = n.nvmlDeviceGetUtilizationRates(h)
            rows.append((util.gpu, util.memory, n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                         n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
                         n.nvmlDeviceGetMemoryInfo(h).used / 1e9))
        out = {m: statistics.fmean(r[i] for r in rows) for i, m in enumerate(DEVICE_METRICS)}
        others = self._others()
        if others is not None:
            out["others_sm_util_pct"] = others
        if self.gpm is not None:
            try:
                out.update(self.gpm.sample())
            except Exception:  # noqa: BLE001 - a counter that fails once costs its interval, not the sample
                self.gpm.filled = False
        return out

    def _others(self) -> float | None:
        """The SM utilisation NVML attributes to processes other than the server's since the last sample, averaged
        over the GPUs; None where the server's processes are not known, NVML does not keep per-process samples, or
        its samples show none of the server's processes though the server computes there (NVML in a container
        does not share its process ids: everything would read as another's)."""
        if self.server_pids is None or not hasattr(self.nvml, "nvmlDeviceGetProcessUtilization"):
            return None
        mine = self.server_pids()
        per_gpu = []
        for k, h in enumerate(self.handles):
            try:
                samples = list(self.nvml.nvmlDeviceGetProcessUtilization(h, self._since.get(k, 0)) or [])
            except Exception as exc:  # noqa: BLE001 - pynvml's NVMLError_NotFound: no sample since; others: unsupported
                if "NotFound" in type(exc).__name__ or "Not Found" in str(exc):
                    per_gpu.append(0.0)
                    continue
                return None
            if samples:
                self._since[k] = max(int(x.timeStamp) for x in samples)
                if not any(x.pid in mine for x in samples) and any(x.smUtil for x in samples):
                    return None  # cannot tell the server's work from another's here
            per_gpu.append(float(sum(x.smUtil for x in samples if x.pid not in mine)))
        return statistics.fmean(per_gpu) if per_gpu else None

    def describe(self) -> str:
        gpus = ", ".join(map(str, self.indices))
        return (f"NVML, GPU{'s' if len(self.indices) > 1 else ''} {gpus}" + (f" ({self.which})" if self.which else "")
                + ": SM and memory utilisation, power, clocks and memory used of those GPUs"
                + (", mean over them" if len(self.indices) > 1 else "") + f"; {self.gpm_said}")

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()
        self.nvml.nvmlShutdown()


class ProcessSource:
    kind = "psutil"
    metrics = PSUTIL_METRICS

    def __init__(self, pid: int | None, note: str | None = None):
        """pid: the server's process (its tree is watched), None: the whole machine; note: how the process
        was found or why it was not, for the description."""
        self.pid = pid
        self.note = note
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

    @property
    def over(self) -> str:
        return "process" if self.pid else "machine"

    def describe(self) -> str:
        note = f"; {self.note}" if self.note else ""
        if self.pid:
            return (f"psutil, over the server's process tree (pid {self.pid}{note}): CPU utilisation (% of one core) "
                    "and resident memory (RSS) of the server's processes")
        return (f"psutil, over the whole machine, not the server alone ({self.note or 'no server process to watch'}): "
                "CPU utilisation of all processes (% of one core) and the machine's memory in use")

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


def _nvml_module():
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def is_local_host(host: str | None) -> bool:
    """Whether host names this machine: a loopback address, or one of its network interfaces' addresses."""
    if not host:
        return False
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError):
        return False
    mine = {a.address.split("%")[0] for nic in psutil.net_if_addrs().values() for a in nic
            if a.family in (socket.AF_INET, socket.AF_INET6)}
    for address in addresses:
        address = address.split("%")[0]
        try:
            if ipaddress.ip_address(address).is_loopback or address in mine:
                return True
        except ValueError:
            continue
    return False


def tree_pids(pid: int) -> set[int]:
    """pid and its descendants (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return {root.pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return set()


def gpus_of_processes(nvml, pids: set[int]) -> list[int]:
    """NVML indices of the GPUs on which NVML lists a compute process among pids (empty when none, or when
    NVML cannot tell, as inside a container whose process ids NVML does not share)."""
    found = []
    try:
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(i))
            except Exception:
                continue
            if any(p.pid in pids for p in procs):
                found.append(i)
    finally:
        nvml.nvmlShutdown()
    return found


def process_gpus_env(pid: int) -> dict[str, str]:
    """The CUDA_VISIBLE_DEVICES a running process was started with ({} when not set or not readable)."""
    try:
        value = psutil.Process(pid).environ().get("CUDA_VISIBLE_DEVICES")
    except psutil.Error:
        return {}
    return {} if value is None else {"CUDA_VISIBLE_DEVICES": value}


@dataclass
class Telemetry:
    """What telemetry_source decided for one configuration: the device its server computes on, the source
    the Sampler reads (None: no telemetry), and in words which source, over what and why."""

    device: str  # cpu | gpu (of this machine) | remote
    source: object | None
    description: str  # for the report; "off" when telemetry is turned off
    over: str | None = None  # gpus | process | machine | None (no telemetry)
    pid: int | None = None  # the process whose tree psutil watches, or whose GPUs NVML watches
    gpus: list | None = None  # the GPUs NVML watches
    notes: list[str] = field(default_factory=list)

    def scope(self) -> dict:
        """The decision as data, for the provenance: device, source, over, pid, gpus."""
        return {"device": self.device, "source": getattr(self.source, "kind", None), "over": self.over,
                "pid": self.pid, "gpus": self.gpus}


def telemetry_source(adapter, spec, pid: int | None, base_url: str | None, nvml=None) -> Telemetry:
    """The telemetry of one configuration's server, from the device it computes on only.

    adapter.device(spec) says where: 'remote': nothing (the machine that measures sees neither its CPU
    nor its GPUs); 'gpu': NVML over the GPUs the server uses (telemetry.gpus as configured; else those on
    which NVML lists one of the server's processes; else its CUDA_VISIBLE_DEVICES; else every GPU, said
    so); 'cpu' (or a GPU that NVML cannot read): psutil over the server's process tree. The server's
    process: `pid` for a managed server; for an external one on this machine, the process listening on the
    port of base_url; where none can be found, psutil watches the whole machine and says why.
    nvml: the pynvml module (or a stand-in); None imports pynvml."""
    device = adapter.device(spec)
    conf = spec.telemetry
    if not conf["enabled"]:
        return Telemetry(device, None, "off")
    if device == "remote":
        default = ", the default" if getattr(spec, "device", None) is None else ""
        return Telemetry(device, None, f"none: the server computes on another machine (configurations.{spec.name}.device: "
                                       f"remote{default}), whose CPU and GPUs this one cannot see")
    how = None  # how the server's process was found, or why it was not
    if adapter.managed:
        how = None if pid else "the server's process is not known"
    else:
        parts = urlsplit(base_url or spec.url or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        pid = None
        if not is_local_host(parts.hostname):
            how = f"{parts.hostname} is not an address of this machine, so its process cannot be found"
        else:
            pid, how = listening_process(port)
            how = how or f"found as the process listening on port {port}"
    if device == "gpu":
        nvml = nvml if nvml is not None else _nvml_module()
        if nvml is None:
            problem = "pynvml is not installed"
        else:
            if conf.get("gpus") is not None:
                gpus, which = list(conf["gpus"]), "as configured, telemetry.gpus"
            else:
                gpus = gpus_of_processes(nvml, tree_pids(pid)) if pid else []
                which = "those on which NVML lists the server's processes"
                if not gpus:
                    env = {**os.environ, **(spec.env or {})} if adapter.managed else (process_gpus_env(pid) if pid else {})
                    gpus = visible_gpus(env)
                    which = "the server's CUDA_VISIBLE_DEVICES"
                    if gpus is None:
                        which = "every GPU of this machine: which ones the server uses is not known"
            try:
                src = NvmlSource(nvml, gpus, which, (lambda p=pid: tree_pids(p)) if pid else None)
                return Telemetry(device, src, src.describe(), "gpus", pid, src.indices)
            except Exception as exc:  # pynvml.NVMLError_LibraryNotFound without a driver, no GPU, none given
                problem = f"NVML: {exc}" if str(exc) else f"NVML: {type(exc).__name__}"
        note = f"no GPU telemetry, {problem}"
        how = f"{how}; {note}" if how else note
    try:
        src = ProcessSource(pid, how)
    except psutil.Error as exc:  # the process ended between being found and being watched
        src = ProcessSource(None, f"the server's process {pid} cannot be watched: {type(exc).__name__}")
    return Telemetry(device, src, src.describe(), src.over, src.pid)
