"""Telemetry: psutil on real processes; NVML through a fake module, because no GPU exists here."""

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace


from longctx.measure.sweep import run_configuration
from longctx.measure.telemetry import NvmlSource, ProcessSource, Sampler, make_source, summarize, visible_gpus

from .conftest import tiny_spec


def test_psutil_source_sees_a_busy_process_tree():
    # a parent that sleeps and a child that spins: the tree's CPU is the child's
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'while True: pass']); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        source = ProcessSource(proc.pid)
        with Sampler(source, 0.05) as sampler:
            time.sleep(1.0)
        t_mid = sampler.samples[len(sampler.samples) // 2][0]
        s = summarize(sampler.samples, sampler.samples[0][0], t_mid, source.metrics)
        assert 5 <= s["n"] <= 15
        assert s["cpu_util_pct_mean"] > 50  # one core spinning
        assert s["rss_gb_mean"] > 0.005 and s["rss_gb_max"] >= s["rss_gb_mean"] * (1 - 1e-9)  # fmean may round up
    finally:
        for child in __import__("psutil").Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


def test_without_a_gpu_the_real_nvml_falls_back_to_psutil():
    source = make_source(None)
    assert source.kind == "psutil" and "no GPU telemetry" in source.describe()
    assert source.sample()["cpu_util_pct"] >= 0


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


def test_nvml_source_averages_the_gpus_it_watches():
    gpus = [dict(sm=100, mem=40, mw=300_000, sm_mhz=2400, mem_mhz=14000, used=90e9),
            dict(sm=50, mem=20, mw=200_000, sm_mhz=2200, mem_mhz=14000, used=80e9),
            dict(sm=0, mem=0, mw=50_000, sm_mhz=300, mem_mhz=400, used=1e9)]
    fake = FakeNvml(gpus)
    source = make_source(os.getpid(), nvml=fake, gpu_indices=[0, 1])
    assert isinstance(source, NvmlSource)
    assert source.sample() == {"sm_util_pct": 75, "mem_util_pct": 30, "power_w": 250.0, "sm_clock_mhz": 2300,
                               "mem_clock_mhz": 14000, "mem_used_gb": 85.0}
    source.close()
    assert fake.calls == ["init", "shutdown"]
    assert make_source(os.getpid(), nvml=FakeNvml([])).kind == "psutil"  # NVML without a GPU


def test_a_server_given_some_gpus_is_watched_on_those_only():
    """Two jobs sharing a node each see their own GPUs in CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    gpus = [dict(sm=100, mem=40, mw=300_000, sm_mhz=2400, mem_mhz=14000, used=90e9, uuid="GPU-aaaa"),
            dict(sm=10, mem=20, mw=100_000, sm_mhz=2200, mem_mhz=14000, used=10e9, uuid="GPU-bbbb")]
    assert visible_gpus({}) is None
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}) == [1]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-bbbb,-1,0"}) == ["GPU-bbbb"]  # CUDA stops at an invalid entry
    for visible in ("1", "GPU-bbbb"):
        source = make_source(os.getpid(), nvml=FakeNvml(gpus), gpu_indices=visible_gpus({"CUDA_VISIBLE_DEVICES": visible}))
        assert source.sample()["sm_util_pct"] == 10
    assert make_source(os.getpid(), nvml=FakeNvml(gpus), gpu_indices=visible_gpus({"CUDA_VISIBLE_DEVICES": ""})).kind == "psutil"


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


def test_telemetry_can_be_turned_off(tmp_path):
    spec = tiny_spec("page1", lengths=[32])
    spec.protocol.update(warmup=0, trials=1, output_tokens=3)
    spec.telemetry["enabled"] = False
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    raw = json.loads((tmp_path / "raw" / "32.json").read_text())
    assert "telemetry" not in raw and raw["provenance"]["telemetry"] == "off"
