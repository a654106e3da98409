"""Telemetry: psutil on real processes; NVML through a fake module, because no GPU exists here."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import psutil
import pytest

from longctx.engines import get_adapter
from longctx.measure.process import free_port, listening_process
from longctx.measure.sweep import run_configuration
from longctx.measure.sampling import Sampler, summarize
from longctx.measure.telemetry import NvmlSource, ProcessSource, is_local_host, telemetry_source, visible_gpus

from .conftest import tiny_spec

# alone under -n (tests/conftest.py): its sampler must catch samples at its interval (the two tests that sample; the
# rest time nothing and share the machine)
pytestmark = pytest.mark.alone


def kernel_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of one process as the kernel counts them (/proc/<pid>/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_psutil_source_sees_a_busy_process_tree():
    # a parent that sleeps and a child that spins: the tree's CPU is the child's
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'while True: pass']); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        child = psutil.Process(proc.pid).children()[0].pid
        source = ProcessSource(proc.pid)
        with Sampler(source, 0.05) as sampler:
            cpu0, t0 = kernel_cpu_s(child), time.perf_counter()
            time.sleep(1.0)
            cpu1, t1 = kernel_cpu_s(child), time.perf_counter()
        t_mid = sampler.samples[len(sampler.samples) // 2][0]
        s = summarize(sampler.samples, sampler.samples[0][0], t_mid, source.metrics)
        assert 5 <= s["n"] <= 15
        # the spinning child's share of a core, as the kernel counted it (less than 100% on a busy machine)
        whole = summarize(sampler.samples, t0, t1, source.metrics)
        assert whole["cpu_util_pct_mean"] == pytest.approx(100 * (cpu1 - cpu0) / (t1 - t0), abs=20)
        assert whole["cpu_util_pct_mean"] > 20
        assert s["rss_gb_mean"] > 0.005 and s["rss_gb_max"] >= s["rss_gb_mean"] * (1 - 1e-9)  # fmean may round up
    finally:
        for child in __import__("psutil").Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_without_a_gpu_the_real_nvml_falls_back_to_psutil():
    """A managed server on CUDA, on this machine without a GPU driver: the real pynvml (or its absence)
    gives no GPU, and the server's process tree is watched, said so."""
    cuda = replace(tiny_spec("page1"), args={**tiny_spec("page1").args, "device": "cuda:0"})
    t = telemetry_source(get_adapter("reference"), cuda, os.getpid(), None)
    assert (t.device, t.source.kind, t.over) == ("gpu", "psutil", "process")
    assert "no GPU telemetry" in t.description and t.source.sample()["cpu_util_pct"] >= 0


class FakeNvml:
    """Stands in for pynvml: this machine has no GPU, so NVML cannot be called for real."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, gpus):
        self.gpus = gpus
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return next(g for g in self.gpus if g.get("uuid") == uuid)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=h["sm"], memory=h["mem"])

    def nvmlDeviceGetPowerUsage(self, h):
        return h["mw"]

    def nvmlDeviceGetClockInfo(self, h, which):
        return h["sm_mhz"] if which == self.NVML_CLOCK_SM else h["mem_mhz"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=h["used"])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in h.get("pids", ())]


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_nvml_source_averages_the_gpus_it_watches():
    gpus = [dict(sm=100, mem=40, mw=300_000, sm_mhz=2400, mem_mhz=14000, used=90e9),
            dict(sm=50, mem=20, mw=200_000, sm_mhz=2200, mem_mhz=14000, used=80e9),
            dict(sm=0, mem=0, mw=50_000, sm_mhz=300, mem_mhz=400, used=1e9)]
    fake = FakeNvml(gpus)
    source = NvmlSource(fake, [0, 1])
    assert source.sample() == {"sm_util_pct": 75, "mem_util_pct": 30, "power_w": 250.0, "sm_clock_mhz": 2300,
                               "mem_clock_mhz": 14000, "mem_used_gb": 85.0}
    source.close()
    assert fake.calls == ["init", "shutdown"]
    with pytest.raises(RuntimeError, match="NVML sees no GPU"):  # NVML without a GPU: telemetry_source falls back
        NvmlSource(FakeNvml([]))


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_a_server_given_some_gpus_is_watched_on_those_only():
    """Two jobs sharing a node each see their own GPUs in CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    gpus = [dict(sm=100, mem=40, mw=300_000, sm_mhz=2400, mem_mhz=14000, used=90e9, uuid="GPU-aaaa"),
            dict(sm=10, mem=20, mw=100_000, sm_mhz=2200, mem_mhz=14000, used=10e9, uuid="GPU-bbbb")]
    assert visible_gpus({}) is None
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}) == [1]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-bbbb,-1,0"}) == ["GPU-bbbb"]  # CUDA stops at an invalid entry
    for visible in ("1", "GPU-bbbb"):
        source = NvmlSource(FakeNvml(gpus), visible_gpus({"CUDA_VISIBLE_DEVICES": visible}))
        assert source.sample()["sm_util_pct"] == 10
    with pytest.raises(RuntimeError, match="the server is given no GPU"):  # an empty CUDA_VISIBLE_DEVICES
        NvmlSource(FakeNvml(gpus), visible_gpus({"CUDA_VISIBLE_DEVICES": ""}))


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_summaries_split_by_window():
    samples = [(0.0, {"x": 1.0}), (1.0, {"x": 3.0}), (2.0, {"error": "gone"}), (3.0, {"x": 5.0})]
    assert summarize(samples, 0.0, 1.5, ["x"]) == {"n": 2, "x_mean": 2.0, "x_max": 3.0}
    assert summarize(samples, 1.5, 3.0, ["x"]) == {"n": 1, "x_mean": 5.0, "x_max": 5.0}
    assert summarize(samples, None, 3.0, ["x"]) == {"n": 0}


def test_bench_records_telemetry_per_length_and_window(tmp_path):
    spec = tiny_spec("page1", lengths=[200])
    spec.protocol.update(warmup=0, trials=1, output_tokens=120)
    spec.telemetry["interval_s"] = 0.005
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    raw = json.loads((tmp_path / "raw" / "200.json").read_text())
    assert raw["telemetry"]["source"] == "psutil" and len(raw["telemetry"]["samples"]) >= 5
    assert "psutil" in raw["provenance"]["telemetry"]
    decode = raw["trials"][0]["telemetry"]["decode"]
    assert decode["n"] >= 2 and decode["cpu_util_pct_mean"] > 0 and decode["rss_gb_mean"] > 0.01


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_telemetry_can_be_turned_off(tmp_path):
    spec = tiny_spec("page1", lengths=[32])
    spec.protocol.update(warmup=0, trials=1, output_tokens=3)
    spec.telemetry["enabled"] = False
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    raw = json.loads((tmp_path / "raw" / "32.json").read_text())
    assert "telemetry" not in raw and raw["provenance"]["telemetry"] == "off"


# --- where the server computes: telemetry from that device only ------------------------------

def vm_rss_bytes(pid: int) -> int:
    """The kernel's own figure of a process's resident memory (/proc/<pid>/status, VmRSS in kB)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


@contextlib.contextmanager
def http_server(code: str | None = None):
    """A real loopback HTTP server process (Python's http.server, or `code` given the port as argv[1])."""
    port = free_port()
    cmd = ([sys.executable, "-c", code, str(port)] if code else
           [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_listening(port, proc)
        yield port, proc
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


# A server whose worker inherits the listening socket (as forking servers' workers do): both listen.
FORKING_SERVER = """\
import os, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
if os.fork() == 0:
    time.sleep(60)
time.sleep(60)
"""


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_the_process_listening_on_a_port_is_found_by_it():
    with http_server() as (port, proc):
        assert listening_process(port) == (proc.pid, None)
    with http_server(FORKING_SERVER) as (port, proc):
        deadline = time.monotonic() + 10
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = psutil.Process(proc.pid).children()[0]
        holders = [p.pid for p in (psutil.Process(proc.pid), worker)
                   if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in p.net_connections("tcp"))]
        assert holders == [proc.pid, worker.pid]  # both hold the listening socket
        assert listening_process(port) == (proc.pid, None)  # the parent, whose tree holds the worker
    pid, why = listening_process(free_port())
    assert pid is None and "no process on this machine listens on port" in why


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_this_machines_addresses_are_local_and_others_are_not():
    assert all(map(is_local_host, ("127.0.0.1", "localhost", "127.0.0.2")))
    mine = [a.address for nic in psutil.net_if_addrs().values() for a in nic if a.family == socket.AF_INET]
    assert all(map(is_local_host, mine))
    assert not is_local_host("192.0.2.1")  # TEST-NET-1: documentation only, never a machine's address
    assert not is_local_host(None)


def external_spec(url: str, device: str | None = None, **telemetry):
    spec = tiny_spec("page1")
    return replace(spec, engine="external", url=url, api="openai", device=device, args={}, kernel=None,
                   telemetry={**spec.telemetry, **telemetry})


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_an_external_server_on_this_cpu_is_watched_by_its_own_process_tree():
    adapter = get_adapter("external")
    with http_server() as (port, proc):
        url = f"http://127.0.0.1:{port}"
        t = telemetry_source(adapter, external_spec(url, "cpu"), None, url)
        assert (t.device, t.over, t.pid, t.source.kind) == ("cpu", "process", proc.pid, "psutil")
        assert t.description.startswith("psutil, over the server's process tree")
        assert f"pid {proc.pid}; found as the process listening on port {port}" in t.description
        assert t.scope() == {"device": "cpu", "source": "psutil", "over": "process", "pid": proc.pid, "gpus": None}
        # its memory is that process's, as the kernel counts it, not the machine's
        rss = t.source.sample()["rss_gb"] * 1e9
        assert rss == pytest.approx(vm_rss_bytes(proc.pid), rel=0.2)
        assert rss < psutil.virtual_memory().used / 10
        # on this machine's GPU, but NVML cannot be read here (no driver): the process tree, said so
        g = telemetry_source(adapter, external_spec(url, "gpu"), None, url)
        assert (g.device, g.over, g.pid) == ("gpu", "process", proc.pid)
        assert "no GPU telemetry, NVML" in g.description


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_an_external_server_on_this_gpu_is_watched_on_the_gpus_its_processes_hold():
    adapter = get_adapter("external")
    with http_server() as (port, proc):
        url = f"http://127.0.0.1:{port}"
        gpus = [dict(sm=90, mem=40, mw=300_000, sm_mhz=2400, mem_mhz=14000, used=90e9, pids=[1]),
                dict(sm=30, mem=20, mw=100_000, sm_mhz=2200, mem_mhz=14000, used=10e9, pids=[proc.pid]),
                dict(sm=0, mem=0, mw=50_000, sm_mhz=300, mem_mhz=400, used=1e9)]
        t = telemetry_source(adapter, external_spec(url, "gpu"), None, url, nvml=FakeNvml(gpus))
        assert (t.over, t.gpus, t.pid) == ("gpus", [1], proc.pid)
        assert t.source.sample()["sm_util_pct"] == 30
        assert t.description.startswith("NVML, GPU 1 (those on which NVML lists the server's processes)")
        # telemetry.gpus, where configured, wins
        t = telemetry_source(adapter, external_spec(url, "gpu", gpus=[0, 2]), None, url, nvml=FakeNvml(gpus))
        assert t.gpus == [0, 2] and "as configured, telemetry.gpus" in t.description
        # a process NVML does not list (another container's ids): every GPU, said so
        for g in gpus:
            g.pop("pids", None)
        t = telemetry_source(adapter, external_spec(url, "gpu"), None, url, nvml=FakeNvml(gpus))
        assert t.gpus == [0, 1, 2] and "every GPU of this machine" in t.description


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_a_remote_server_has_no_telemetry_and_an_unfound_process_means_the_whole_machine():
    adapter = get_adapter("external")
    for device in (None, "remote"):
        t = telemetry_source(adapter, external_spec("http://127.0.0.1:9", device), None, "http://127.0.0.1:9",
                             nvml=FakeNvml([dict(sm=1, mem=1, mw=1, sm_mhz=1, mem_mhz=1, used=1)]))
        assert (t.device, t.source, t.over) == ("remote", None, None)
        assert t.description.startswith("none: the server computes on another machine")
        assert (", the default)" in t.description) == (device is None)
    port = free_port()  # nobody listens there: the machine, not a process, and the report is told so
    t = telemetry_source(adapter, external_spec(f"http://127.0.0.1:{port}", "cpu"), None, f"http://127.0.0.1:{port}")
    assert (t.over, t.pid) == ("machine", None)
    assert t.description.startswith("psutil, over the whole machine, not the server alone (no process on this machine")
    t = telemetry_source(adapter, external_spec("http://192.0.2.1:80", "cpu"), None, "http://192.0.2.1:80")
    assert t.over == "machine" and "192.0.2.1 is not an address of this machine" in t.description
    off = telemetry_source(adapter, external_spec("http://192.0.2.1:80", "cpu", enabled=False), None, "http://192.0.2.1:80")
    assert (off.source, off.description) == (None, "off")


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_a_managed_server_on_the_cpu_is_not_watched_through_the_gpus_of_its_machine():
    gpus = [dict(sm=100, mem=40, mw=300_000, sm_mhz=2400, mem_mhz=14000, used=90e9, pids=[os.getpid()])]
    spec = tiny_spec("page1")  # the reference engine on --device cpu
    t = telemetry_source(get_adapter("reference"), spec, os.getpid(), None, nvml=FakeNvml(gpus))
    assert (t.device, t.source.kind, t.over, t.pid) == ("cpu", "psutil", "process", os.getpid())
    assert t.description == (f"psutil, over the server's process tree (pid {os.getpid()}): CPU utilisation (% of one core) "
                             "and resident memory (RSS) of the server's processes")
    # on CUDA: NVML, on the GPUs its processes hold; else the CUDA_VISIBLE_DEVICES it was started with
    cuda = replace(spec, args={**spec.args, "device": "cuda:0"})
    gpus.append(dict(sm=10, mem=20, mw=100_000, sm_mhz=2200, mem_mhz=14000, used=10e9, uuid="GPU-bbbb"))
    t = telemetry_source(get_adapter("reference"), cuda, os.getpid(), None, nvml=FakeNvml(gpus))
    assert (t.device, t.over, t.gpus) == ("gpu", "gpus", [0])
    gpus[0].pop("pids")
    t = telemetry_source(get_adapter("reference"), replace(cuda, env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}), os.getpid(),
                         None, nvml=FakeNvml(gpus))
    assert t.gpus == ["GPU-bbbb"] and "the server's CUDA_VISIBLE_DEVICES" in t.description
    assert t.source.sample()["sm_util_pct"] == 10


class ProcessNvml(FakeNvml):
    """FakeNvml with NVML's per-process samples (nvmlDeviceGetProcessUtilization): each GPU's `procs`, (pid, SM %)
    samples stamped 1, 2, ... Stands in for pynvml: this machine has no GPU."""

    class NVMLError_NotFound(Exception):
        pass

    def nvmlDeviceGetProcessUtilization(self, h, since):
        samples = [SimpleNamespace(pid=pid, smUtil=sm, timeStamp=t) for t, (pid, sm) in enumerate(h.get("procs", ()), 1)
                   if t > since]
        if not samples:
            raise self.NVMLError_NotFound("Not Found")
        return samples


@pytest.mark.alone(False)  # nothing timed: it shares the machine
def test_nvml_reads_what_other_processes_take_of_the_servers_gpus():
    """Issue 46, item 6: another process time-slicing the GPU does not lower its clock; NVML's per-process samples
    show it. The SM utilisation of processes other than the server's, averaged over its GPUs, each sample read once;
    none without the server's processes known, and none where NVML's samples show none of them (a container whose
    process ids NVML does not share: everything would read as another's)."""
    gpus = [dict(sm=100, mem=40, mw=300_000, sm_mhz=2400, mem_mhz=14000, used=90e9, procs=[(101, 60), (999, 30)]),
            dict(sm=50, mem=20, mw=200_000, sm_mhz=2400, mem_mhz=14000, used=80e9, procs=[(102, 40), (998, 10)])]
    source = NvmlSource(ProcessNvml(gpus), [0, 1], server_pids=lambda: {101, 102})
    assert source.sample()["others_sm_util_pct"] == 20.0  # (30 + 10) / 2
    assert source.sample()["others_sm_util_pct"] == 0.0  # nothing new since: NVML's NotFound
    assert "others_sm_util_pct" not in NvmlSource(ProcessNvml(gpus), [0, 1]).sample()
    assert "others_sm_util_pct" not in NvmlSource(ProcessNvml(gpus), [0, 1], server_pids=lambda: {5}).sample()
    assert "others_sm_util_pct" not in NvmlSource(FakeNvml(gpus), [0, 1], server_pids=lambda: {101}).sample()
