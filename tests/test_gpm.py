"""The GPU's own counters (NVML's GPM, issue 56): read per telemetry sample where the GPUs have them, split into each
trial's prefill and decode windows, in results.csv, and set beside what the decode fit infers.

This machine has no GPU: GpmNvml stands in for pynvml, following nvidia-ml-py's GPM calls as it documents and
implements them (pynvml.py: nvmlGpmQueryDeviceSupport returns a c_nvmlGpmSupport_t whose isSupportedDevice says;
nvmlGpmSampleAlloc returns a sample buffer that nvmlGpmSampleGet(device, sample) fills; nvmlGpmMetricsGet takes a
c_nvmlGpmMetricsGet_t with version NVML_GPM_METRICS_GET_VERSION, numMetrics, sample1, sample2 and metrics[i].metricId,
and fills each metrics[i].value and .nvmlReturn; nvmlGpmSampleFree). Its counters are cumulative per GPU, advanced by
the test as a GPU would count: a metric over two samples is the counters' rise over the time between them, so the
known values come out only where the buffers are used in the right order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from longctx.measure import gpm
from longctx.measure.telemetry import NvmlSource, summarize

from .test_telemetry import FakeNvml

IDS = {"gpm_sm_active_pct": 2, "gpm_sm_occupancy_pct": 3, "gpm_tensor_active_pct": 5, "gpm_dram_bw_pct": 10}


class GpmNvml(FakeNvml):
    """FakeNvml with GPM. Each GPU dict's `gpm`: False for a GPU without it; `rates`: {metric id: percent} it counts
    at now (set by the test); the clock moves by `tick` seconds each time a sample buffer is filled."""

    NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY = 2, 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL, NVML_GPM_METRIC_DRAM_BW_UTIL = 5, 10
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED = 0, 3

    class c_nvmlGpmMetricsGet_t:
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(477)]

    def __init__(self, gpus, tick: float = 0.05):
        super().__init__(gpus)
        self.tick, self.clock, self.alive = tick, 0.0, set()
        for g in gpus:
            g.setdefault("counted", {i: 0.0 for i in IDS.values()})

    def advance(self, seconds: float) -> None:
        """The GPUs count at their rates for `seconds`."""
        self.clock += seconds
        for g in self.gpus:
            for i, rate in g.get("rates", {}).items():
                g["counted"][i] += rate * seconds

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(version=1, isSupportedDevice=int(h.get("gpm", True)))

    def nvmlGpmSampleAlloc(self):
        buffer = {"id": len(self.alive) + len(self.calls)}
        self.alive.add(id(buffer))
        self.calls.append("alloc")
        return buffer

    def nvmlGpmSampleGet(self, h, sample):
        self.advance(self.tick)
        sample.update(gpu=id(h), at=self.clock, counted=dict(h["counted"]))
        return sample

    def nvmlGpmMetricsGet(self, get):
        assert get.version == self.NVML_GPM_METRICS_GET_VERSION
        a, b = get.sample1, get.sample2
        assert a["gpu"] == b["gpu"] and b["at"] > a["at"], "two samples of one GPU, the older first"
        for m in get.metrics[: get.numMetrics]:
            if m.metricId not in b["counted"]:
                m.nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED
                continue
            m.value = (b["counted"][m.metricId] - a["counted"][m.metricId]) / (b["at"] - a["at"])
            m.nvmlReturn = self.NVML_SUCCESS
        return get

    def nvmlGpmSampleFree(self, sample):
        self.alive.discard(id(sample))

    def nvmlDeviceGetName(self, h):
        return h.get("name", "NVIDIA H200")


def gpus(*rates, **more):
    base = dict(sm=100, mem=40, mw=300_000, sm_mhz=1980, mem_mhz=2619, used=90e9)
    return [{**base, "rates": dict(r), **more} for r in rates]


STUDY = {2: 99.8, 3: 45.0, 5: 3.0, 10: 0.8}  # the study's decode at 185k: SMs busy, tensor pipes idle, DRAM nearly idle


def test_the_counters_over_each_interval_are_read_and_averaged_over_the_gpus():
    fake = GpmNvml(gpus(STUDY, {**STUDY, 10: 1.2}))
    source = NvmlSource(fake)
    assert "GPM counters read (SM activity, SM occupancy, tensor-pipe activity, DRAM bandwidth" in source.describe()
    s = source.sample()
    assert s["gpm_sm_active_pct"] == pytest.approx(99.8) and s["gpm_tensor_active_pct"] == pytest.approx(3.0)
    assert s["gpm_dram_bw_pct"] == pytest.approx(1.0) and s["gpm_sm_occupancy_pct"] == pytest.approx(45.0)
    assert s["sm_util_pct"] == 100  # NVML's coarse figure beside them: any kernel ran, all the time
    source.close()
    assert not fake.alive  # every buffer freed


def test_a_window_gets_the_counters_of_its_own_samples():
    """Prefill then decode, as the GPU counts them: the prefill window's mean is the prefill's rates, the decode
    window's the decode's, each from the samples taken in it (telemetry.summarize, as for every metric)."""
    fake = GpmNvml(gpus({2: 90.0, 3: 60.0, 5: 70.0, 10: 40.0}), tick=0.05)
    source = NvmlSource(fake)
    samples = []
    for _ in range(4):  # prefill: tensor pipes busy
        samples.append((fake.clock + fake.tick, source.sample()))
    t_first = fake.clock
    for g in fake.gpus:
        g["rates"] = dict(STUDY)
    for _ in range(6):  # decode
        samples.append((fake.clock + fake.tick, source.sample()))
    prefill = summarize(samples, 0.0, t_first, source.metrics)
    decode = summarize(samples, t_first + 1e-9, fake.clock, source.metrics)
    assert prefill["gpm_tensor_active_pct_mean"] == pytest.approx(70.0) and prefill["gpm_dram_bw_pct_mean"] == pytest.approx(40.0)
    assert decode["gpm_tensor_active_pct_mean"] == pytest.approx(3.0) and decode["gpm_dram_bw_pct_mean"] == pytest.approx(0.8)
    assert decode["n"] == 6


@pytest.mark.parametrize("gpus_, said", [
    (gpus(STUDY, {**STUDY}, gpm=False), "GPM counters not read: NVIDIA H200 has none (GPM needs Hopper or later)"),
])
def test_a_gpu_without_gpm_gives_one_line_and_the_rest_as_before(gpus_, said):
    source = NvmlSource(GpmNvml(gpus_))
    assert source.describe().endswith("; " + said)
    s = source.sample()
    assert not any(k.startswith("gpm_") for k in s) and s["sm_util_pct"] == 100


def test_a_pynvml_without_gpm_or_without_permission_gives_one_line():
    old = NvmlSource(FakeNvml(gpus(STUDY)))  # no nvmlGpm* calls at all
    assert "GPM counters not read: this pynvml has no nvmlGpmQueryDeviceSupport" in old.describe()
    assert not any(k.startswith("gpm_") for k in old.sample())

    class NVMLError_NoPermission(Exception):
        pass

    class Denied(GpmNvml):
        def nvmlGpmQueryDeviceSupport(self, h):
            raise NVMLError_NoPermission("Insufficient Permissions")

    assert NvmlSource(Denied(gpus(STUDY))).describe().endswith("; GPM counters not read: no permission to read them")

    class Mig(GpmNvml):
        def nvmlDeviceGetMigMode(self, h):
            return [1, 1]

    assert "GPU 0 is in MIG mode" in NvmlSource(Mig(gpus(STUDY))).describe()

    class Unsampled(GpmNvml):  # supported, but the first sample is refused (a container without the capability)
        def nvmlGpmSampleGet(self, h, sample):
            raise NVMLError_NoPermission("Insufficient Permissions")

    fake = Unsampled(gpus(STUDY))
    assert NvmlSource(fake).describe().endswith("; GPM counters not read: no permission to read them")
    assert fake.calls.count("alloc") == 2 and not fake.alive  # its buffers freed


def test_a_counter_that_fails_once_costs_its_interval_not_the_sample():
    fake = GpmNvml(gpus(STUDY))
    source = NvmlSource(fake)
    real = fake.nvmlGpmSampleGet

    def once(h, sample):
        fake.nvmlGpmSampleGet = real
        raise RuntimeError("NVML: Unknown Error")

    fake.nvmlGpmSampleGet = once
    s = source.sample()
    assert s["sm_util_pct"] == 100 and "gpm_dram_bw_pct" not in s
    assert "gpm_dram_bw_pct" not in source.sample()  # the buffers start again: the next interval has both ends
    assert source.sample()["gpm_dram_bw_pct"] == pytest.approx(0.8)


def test_the_metric_identifiers_are_pynvmls_own():
    import pynvml

    for name, (ident, _) in gpm.METRICS.items():
        assert getattr(pynvml, ident) == IDS[name] == getattr(GpmNvml, ident)
    assert all(hasattr(pynvml, c) for c in gpm.CALLS)


# --- results.csv and the diagnosis -------------------------------------------------------------------------------

def test_results_csv_carries_the_counters_per_window_and_dram_in_gb_per_s(tmp_path):
    """A raw file as the sweep writes it on an H200 (provenance: NVML's name of its GPU): each window's GPM means
    reach results.csv, and DRAM's share in GB/s against the H200's datasheet 4,800 GB/s (specs/hardware.yaml):
    1.25% of it is 60 GB/s, 40% is 1,920."""
    import json

    import pandas as pd

    from longctx.analysis.aggregate import aggregate

    raw = tmp_path / "raw" / "h200"
    raw.mkdir(parents=True)
    window = {"prefill": {"n": 4, "gpm_dram_bw_pct_mean": 40.0, "gpm_tensor_active_pct_mean": 70.0, "sm_util_pct_mean": 100.0},
              "decode": {"n": 9, "gpm_dram_bw_pct_mean": 1.25, "gpm_tensor_active_pct_mean": 3.0,
                         "gpm_sm_active_pct_mean": 99.8, "gpm_sm_occupancy_pct_mean": 45.0, "sm_util_pct_mean": 100.0}}
    (raw / "1024.json").write_text(json.dumps({
        "configuration": "h200", "length": 1024, "status": "ok", "engine": "sglang",
        "provenance": {"hardware": {"gpus": [{"index": 0, "name": "NVIDIA H200"}]}},
        "trials": [{"trial": 0, "status": "ok", "ttft_s": 0.1, "tpot_s": 0.01, "decode_tok_s": 100.0, "telemetry": window}]}))
    df = aggregate([raw / "1024.json"], tmp_path / "results.csv", tmp_path / "provenance.json")
    row = pd.read_csv(tmp_path / "results.csv").iloc[0]
    assert row["decode_gpm_dram_bw_pct_mean"] == 1.25 and row["prefill_gpm_tensor_active_pct_mean"] == 70.0
    assert row["decode_gpm_sm_active_pct_mean"] == 99.8 and row["decode_gpm_sm_occupancy_pct_mean"] == 45.0
    assert row["decode_gpm_dram_gbs_mean"] == pytest.approx(60.0) and row["prefill_gpm_dram_gbs_mean"] == pytest.approx(1920.0)
    assert len(df) == 1


def _study_with_counters(step, counters: dict):
    """The study's deployment (tests/test_analysis.py: 8 RTX PRO 6000 Blackwell, datasheet 1,792 GB/s) with decode
    steps step(L), and the GPU's counters over every decode window."""
    from .test_analysis import _decode_case

    df, prov = _decode_case(step)
    for k, v in counters.items():
        df[f"decode_gpm_{k}_mean"] = v
    return df, prov


def _words(df, prov):
    from longctx.analysis.fits import fit_all
    from longctx.analysis.tables import medians
    from longctx.report.diagnosis import diagnose

    from .test_analysis import _said

    fit = fit_all(df, prov, None, {"bootstrap": 200})["configurations"]["triton-page1"]
    return fit, " ".join(_said(diagnose(medians(df), {"triton-page1": fit})))


def test_the_studys_decode_by_its_counters_beside_the_fit():
    """The study's decode at 185k (0.7 tok/s; the fit's KV reads at 9.82 GB/s, tests/test_analysis.py) with the
    counters the study read: DRAM at 0.8% of its bandwidth (0.8% of 1,792 GB/s = 14.3 GB/s), SMs busy 99.8% at 45%
    occupancy, tensor pipes 3%. Latency-bound by both; the fit's KV reads are 9.82 / 14.34 = 68% of the DRAM traffic
    counted, the rest traffic the model does not count."""
    df, prov = _study_with_counters(lambda L: 0.10464 + 7.15639e-6 * L, {
        "dram_bw_pct": 0.8, "dram_gbs": 0.008 * 1792, "sm_active_pct": 99.8, "sm_occupancy_pct": 45.0,
        "tensor_active_pct": 3.0})
    fit, text = _words(df, prov)
    assert fit["bounds"]["decode"]["class"] == "latency" and fit["bounds"]["decode"]["counters"]["dram_bw_pct"] == 0.8
    assert ("By the GPU's own counters (GPM), decode at 185,000 tokens kept DRAM at 0.8% of its bandwidth (14.3 GB/s "
            "of the datasheet's 1,792 GB/s), SMs busy 99.8% of the time at 45% occupancy, tensor pipes 3% active; the "
            "decode fit's KV reads at 9.82 GB/s") in text, text
    assert "(interval 9.81 to 9.83 GB/s) are 68% of that traffic: the rest is DRAM traffic the model does not count" in text, text
    assert "decode is latency-bound, on neither roof" in text


def test_a_bound_the_counters_contradict_is_not_stated():
    """The kernel the fit puts at 80% of the bandwidth roof (tests/test_analysis.py), with counters that read DRAM
    at 5%: bandwidth-bound by the fit alone, not by both, so no bound is stated, and why; the fit's 1,434 GB/s
    KV reads against 5% of 1,792 = 89.6 GB/s counted: the model counts bytes the GPU did not read from DRAM."""
    beta = 70_272 / (0.8 * 1792e9)
    df, prov = _study_with_counters(lambda L: 0.002 + beta * L, {"dram_bw_pct": 5.0, "dram_gbs": 0.05 * 1792})
    fit, text = _words(df, prov)
    b = fit["bounds"]["decode"]
    assert (b["class"], b["fit_class"]) == ("unknown", "bandwidth")
    assert ("the GPU's counters read DRAM at 5% of its bandwidth, under the 50% the bandwidth roof needs, so no bound "
            "is stated") in text, text
    assert "bandwidth-bound" not in text and "the model counts bytes the GPU did not read from DRAM" in text
    # the same kernel whose counters agree: bandwidth-bound by both, and the fit within its interval of the counted
    df, prov = _study_with_counters(lambda L: 0.002 + beta * L, {"dram_bw_pct": 80.0, "dram_gbs": 0.8 * 1792})
    fit, text = _words(df, prov)
    assert fit["bounds"]["decode"]["class"] == "bandwidth" and "decode is bandwidth-bound" in text
    assert "agree with them, within the fit's interval" in text, text
    # and the study's latency-bound decode with counters that read DRAM at 60%: on the roof the fit puts it under
    df, prov = _study_with_counters(lambda L: 0.10464 + 7.15639e-6 * L, {"dram_bw_pct": 60.0})
    fit, text = _words(df, prov)
    assert (fit["bounds"]["decode"]["class"], fit["bounds"]["decode"]["fit_class"]) == ("unknown", "latency")
    assert ("the GPU's counters read DRAM at 60% of its bandwidth, on the roof the fit puts decode under, so no bound "
            "is stated") in text and "decode is latency-bound" not in text, text


def test_the_telemetry_line_says_whether_the_counters_were_read():
    from longctx.report.wording import gpm_line

    read = NvmlSource(GpmNvml(gpus(STUDY))).describe()
    assert gpm_line([read]).startswith("The GPU's own counters (GPM) were read")
    old = NvmlSource(GpmNvml(gpus(STUDY, gpm=False))).describe()
    assert gpm_line([old]) == ("GPM counters not read: NVIDIA H200 has none (GPM needs Hopper or later): the diagnosis "
                               "stands on the fits alone.")
    assert gpm_line(["psutil over the server's process tree (pid 1)"]).startswith(
        "GPM counters not read: no configuration's telemetry watches a GPU")


def test_the_device_checks_gpm_step_says_why_where_there_is_no_gpu(tmp_path):
    """bench/gpm_kernel.py (bench/device_check.sh's GPM step) with the real pynvml on this machine, which has no GPU
    driver: the one line why, exit 0, and the same line in its record."""
    import json
    import subprocess
    import sys

    from .conftest import ENV, ROOT

    out = tmp_path / "gpm.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpm_kernel.py"), "--build-dir", str(tmp_path),
                           "--json", str(out)], env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    assert line.startswith("GPM counters not read: ") and json.loads(out.read_text())["said"] == line
