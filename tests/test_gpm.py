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
from longctx.measure.sampling import summarize
from longctx.measure.telemetry import NvmlSource

from .test_telemetry import FakeNvml

# alone under -n (tests/conftest.py): a sample must fall within half a second of each mark
pytestmark = pytest.mark.alone

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


def test_prefill_by_its_counters_beside_the_fit_and_a_compute_bound_they_contradict_is_not_stated():
    """Issue 56, item 3 for prefill: the study's deployment with a prefill whose attention the fit puts at 62% of the
    datasheet's FLOP rate (c = 5e-10 s per token pair: 1.56e5 FLOPs a pair over c is 312 TFLOP/s, of 504): compute-
    bound by the fit. With the tensor pipes read 70% active over prefill, by both, and said beside it; read 20%
    active, under the 50% the roof needs: not by both, so no bound is stated, and why."""
    def case(tensor):
        df, prov = _study_with_counters(lambda L: 0.10464 + 7.15639e-6 * L, {})
        df["ttft_s"] = 0.5 + 1e-5 * df["length"] + 5e-10 * df["length"] ** 2
        df["prefill_gpm_tensor_active_pct_mean"] = tensor
        df["prefill_gpm_sm_active_pct_mean"] = 99.0
        return _words(df, prov)

    fit, text = case(70.0)
    b = fit["bounds"]["prefill"]
    assert b["class"] == "compute" and b["compute"]["pct"]["datasheet"] == pytest.approx(62.0, rel=0.01)
    assert "prefill is compute-bound" in text
    assert ("By the GPU's own counters (GPM), prefill of 185,000 tokens kept SMs busy 99% of the time, tensor pipes 70% "
            "active; the prefill fit's attention runs at 62% of the datasheet's") in text, text
    fit, text = case(20.0)
    b = fit["bounds"]["prefill"]
    assert (b["class"], b["fit_class"]) == ("unknown", "compute")
    assert ("the GPU's counters read its tensor pipes 20% active, under the 50% the FLOP roof needs, so no bound is "
            "stated") in text and "prefill is compute-bound" not in text, text


def test_a_gpu_that_works_more_than_the_others_is_said():
    """Issue 56, item 2, per GPU: the study's 8 GPUs over decode, one reading DRAM at 40% and the others at 0.8%
    (results.csv's decode_gpm_dram_bw_pct_by_gpu, each GPU's median over the trials): the diagnosis names the spread
    and the GPUs; an even spread (0.8 to 1.0%) is not said."""
    import json

    uneven = [0.8, 0.8, 0.8, 40.0, 0.8, 0.8, 0.8, 0.8]
    df, prov = _study_with_counters(lambda L: 0.10464 + 7.15639e-6 * L, {"dram_bw_pct": 5.7})
    df["decode_gpm_dram_bw_pct_by_gpu"] = json.dumps(uneven)
    _, text = _words(df, prov)
    assert ("DRAM at 5.7% of its bandwidth; per GPU, DRAM from 0.8% (GPU 0) to 40% (GPU 3) of the 8 it ran on: the "
            "work is not even over them, and a step waits for the busiest") in text, text
    df["decode_gpm_dram_bw_pct_by_gpu"] = json.dumps([0.8, 0.9, 1.0, 0.8, 0.9, 1.0, 0.8, 0.9])
    _, text = _words(df, prov)
    assert "per GPU" not in text and "DRAM at 5.7% of its bandwidth" in text


def test_the_counters_per_gpu_reach_the_window_and_results_csv(tmp_path):
    """Two GPUs counting different DRAM rates: each sample has both, their window means per GPU reach results.csv
    as a JSON list beside the mean over them."""
    import json

    import pandas as pd

    from longctx.analysis.aggregate import aggregate

    fake = GpmNvml(gpus({**STUDY, 10: 2.0}, {**STUDY, 10: 30.0}))
    source = NvmlSource(fake)
    samples = [(k * 0.05, source.sample()) for k in range(1, 6)]
    assert samples[0][1]["gpm_dram_bw_pct_by_gpu"] == pytest.approx([2.0, 30.0])
    window = summarize(samples, 0.06, 0.25, source.metrics)
    assert window["gpm_dram_bw_pct_mean"] == pytest.approx(16.0) and window["gpm_dram_bw_pct_by_gpu_mean"] == pytest.approx([2.0, 30.0])
    raw = tmp_path / "raw" / "h200"
    raw.mkdir(parents=True)
    (raw / "1024.json").write_text(json.dumps({
        "configuration": "h200", "length": 1024, "status": "ok", "engine": "sglang",
        "trials": [{"trial": 0, "status": "ok", "ttft_s": 0.1, "tpot_s": 0.01, "decode_tok_s": 100.0,
                    "telemetry": {"prefill": {"n": 0}, "decode": window}}]}))
    aggregate([raw / "1024.json"], tmp_path / "results.csv", tmp_path / "provenance.json")
    row = pd.read_csv(tmp_path / "results.csv").iloc[0]
    assert json.loads(row["decode_gpm_dram_bw_pct_by_gpu"]) == pytest.approx([2.0, 30.0])
    assert row["decode_gpm_dram_bw_pct_mean"] == pytest.approx(16.0) and row["decode_gpm_outside_s"] == pytest.approx(0.01)


def test_a_phase_bracketed_by_samples_of_its_own_is_counted_alone():
    """Issue 56, item 2: GPM's figures are rates over the time since the sample before. A prefill at 70% tensor
    activity from 0 to 0.23 s, then decode at 3% to 0.43 s, sampled every 0.1 s. Without a sample at the phase's
    edges, the decode window [0.23, 0.43] takes the intervals (0.2, 0.3] and (0.3, 0.4]: the first holds 0.03 s of
    prefill (by hand 0.3 x 70 + 0.7 x 3 = 23.1%), so the window reads (23.1 + 3) / 2 = 13.05%, with 0.03 s counted
    outside it. With a sample taken at 0.23 s (the first token's: Sampler.mark) and at 0.43 s (after the last),
    the window is the decode's own, 3%, nothing outside it."""
    def at(t, v):
        return (t, {"gpm_tensor_active_pct": v})

    plain = [at(0.0, 70.0), at(0.1, 70.0), at(0.2, 70.0), at(0.3, 23.1), at(0.4, 3.0), at(0.5, 3.0)]
    w = summarize(plain, 0.23, 0.43, ["gpm_tensor_active_pct"])
    # the window closes at the first sample at or after 0.43: (0.4, 0.5] too, at 3%
    assert w["gpm_tensor_active_pct_mean"] == pytest.approx((23.1 + 3.0 + 3.0) / 3)
    assert w["gpm_outside_s"] == pytest.approx(0.03 + 0.07)
    marked = [at(0.0, 70.0), at(0.1, 70.0), at(0.2, 70.0), at(0.23, 70.0), at(0.33, 3.0), at(0.43, 3.0), at(0.53, 3.0)]
    w = summarize(marked, 0.23, 0.43, ["gpm_tensor_active_pct"])
    assert w["gpm_tensor_active_pct_mean"] == pytest.approx(3.0) and w["gpm_outside_s"] == pytest.approx(0.0)
    prefill = summarize(marked, 0.0, 0.23, ["gpm_tensor_active_pct"])
    assert prefill["gpm_tensor_active_pct_mean"] == pytest.approx(70.0)


def test_the_sampler_brackets_a_phase_only_where_the_counters_count_over_intervals():
    """Sampler.mark_now takes a sample in the caller's thread and Sampler.mark has the thread take one at once, where
    the source is GPM's (NvmlSource with GPM); on a GPU without it, and for the CPU's process tree, neither adds a
    sample (an extra psutil walk would cost the server its CPU)."""
    import time

    from longctx.measure.sampling import Sampler

    with Sampler(NvmlSource(GpmNvml(gpus(STUDY))), 30.0) as s:  # one sample at the start, the next in 30 s
        time.sleep(0.05)
        n = len(s.samples)
        s.mark_now()
        assert len(s.samples) == n + 1
        s.mark()
        deadline = time.monotonic() + 5
        while len(s.samples) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(s.samples) == n + 2
    with Sampler(NvmlSource(GpmNvml(gpus(STUDY, gpm=False))), 30.0) as s:
        time.sleep(0.05)
        n = len(s.samples)
        s.mark_now()
        s.mark()
        time.sleep(0.1)
        assert len(s.samples) == n and not s.marks


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


def test_a_real_sweep_brackets_each_trials_phases_with_samples_of_their_own(tmp_path, monkeypatch):
    """End to end on the reference engine (a real server and client), its telemetry the GPM stand-in sampled every
    5 s: each trial takes a sample just before it is sent, one at its first token and one after its last (3 a trial,
    beside the sampler's first), so each window's counted time is the window's own within the marks' latency
    (gpm_outside_s, gpm_missed_s). Without the marks the 5 s schedule gives 1 sample for the whole length, and no
    window has a figure of its own."""
    import json

    from longctx.measure import session as session_module
    from longctx.measure.sweep import run_configuration
    from longctx.measure.telemetry import Telemetry

    from .conftest import tiny_spec

    def gpm_telemetry(adapter, spec, pid, base, **_):
        src = NvmlSource(GpmNvml(gpus(STUDY)), [0], "the stand-in")
        return Telemetry("gpu", src, src.describe(), "gpus", pid, src.indices)

    monkeypatch.setattr(session_module, "telemetry_source", gpm_telemetry)
    spec = tiny_spec("page1", lengths=[256])
    spec.protocol.update(warmup=0, trials=2, output_tokens=16)
    spec.telemetry["interval_s"] = 5.0
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log") == 0
    raw = json.loads((tmp_path / "raw" / "256.json").read_text())
    assert "GPM counters read" in raw["telemetry"]["description"]
    times = [t for t, _ in raw["telemetry"]["samples"]]
    trials = raw["trials"]
    assert len(times) >= 1 + 3 * len(trials), times
    for t in trials:
        # a sample just before the request was sent, just after its first token and just after its last
        assert any(t["t_sent"] - 0.5 <= x <= t["t_sent"] for x in times), (t["t_sent"], times)
        for edge in ("t_first_token", "t_last_token"):
            assert any(t[edge] <= x <= t[edge] + 0.5 for x in times), (edge, t[edge], times)
        for window in ("prefill", "decode"):
            w = t["telemetry"][window]
            assert w["gpm_dram_bw_pct_mean"] == pytest.approx(0.8) and w["gpm_dram_bw_pct_by_gpu_mean"] == pytest.approx([0.8])
            assert w["gpm_outside_s"] < 0.5 and w["gpm_missed_s"] < 0.5, (window, w)
