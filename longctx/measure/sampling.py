"""Sampling telemetry beside a measurement, and a trial's windows over the samples.

A Sampler thread reads a telemetry source (longctx.measure.telemetry) every interval and time-stamps each sample with the
same clock as the client (time.perf_counter); summarize splits the samples into a trial's prefill window (request sent
to first token) and its decode window (first to last token). Where the source counts over intervals (GPM's counters,
longctx.measure.gpm), a trial brackets each phase with samples of its own (Sampler.mark), and the window's figure is
its intervals' mean weighted by their lengths.
"""

from __future__ import annotations

import statistics
import threading
import time

from . import gpm


class Sampler:
    """Samples source every interval_s in a thread: [(perf_counter time, {metric: value}), ...].

    Where the source counts over intervals (its `marks`: GPM's counters, each sample a rate since the one before),
    a trial brackets each of its phases with a sample of its own, so that a phase's figure covers that phase and
    nothing else (summarize): `mark_now()` takes one in the caller's thread (before a request is sent, after its last
    token), `mark()` has the thread take one at once (at the first token, from the stream's reader, which must not
    wait for NVML). Elsewhere both do nothing: a sample of the CPU's process tree is not an interval's, and an extra
    one would cost the server its CPU."""

    def __init__(self, source, interval_s: float):
        self.source = source
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict]] = []
        self.marks = bool(getattr(source, "marks", False))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one sample at a time: the source's buffers are refilled in turn
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)

    def _take(self) -> None:
        with self._lock:
            now = time.perf_counter()
            try:
                self.samples.append((now, self.source.sample()))
            except Exception as exc:  # a sampler must never stop a measurement
                self.samples.append((now, {"error": str(exc)}))

    def _run(self) -> None:
        next_t = time.perf_counter()
        while not self._stop.is_set():
            self._take()
            next_t += self.interval_s
            while not self._stop.is_set():
                woke = self._wake.wait(max(0.0, next_t - time.perf_counter()))
                if not woke or self._stop.is_set():
                    break
                self._wake.clear()
                self._take()  # a mark: the schedule of the others is kept

    def mark(self) -> None:
        """A sample taken by the thread at once (where the source counts over intervals)."""
        if self.marks:
            self._wake.set()

    def mark_now(self) -> None:
        """A sample taken now, in the caller's thread (where the source counts over intervals)."""
        if self.marks:
            self._take()

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)


def summarize(samples: list, t0: float | None, t1: float | None, metrics) -> dict:
    """Mean and max of each metric over the samples taken in [t0, t1]; n says how many there were. A metric counted
    over intervals (GPM's: each sample the rate since the sample before) is taken over the intervals from the last
    sample at or before t0 to the first at or after t1, each weighted by its length, so that the whole window is
    counted once; `gpm_outside_s` says how much counted time lay outside the window and `gpm_missed_s` how much of the
    window no sample counted (a few milliseconds each where the trial bracketed its phases with samples of their own:
    Sampler.mark), and `<metric>_by_gpu_mean` holds each GPU's figure."""
    if t0 is None or t1 is None:
        return {"n": 0}
    good = [(t, s) for t, s in samples if "error" not in s]
    window = [s for t, s in good if t0 <= t <= t1]
    out: dict = {"n": len(window)}
    for m in metrics:
        if m in gpm.METRICS:
            continue
        values = [s[m] for s in window if m in s]
        if values:
            out[f"{m}_mean"] = statistics.fmean(values)
            out[f"{m}_max"] = max(values)
    out.update(_over_intervals(good, t0, t1, [m for m in metrics if m in gpm.METRICS]))
    return out


def _over_intervals(samples: list[tuple[float, dict]], t0: float, t1: float, metrics: list[str]) -> dict:
    """The interval-counted metrics over [t0, t1] (summarize): the samples from the first after the last at or
    before t0 to the first at or after t1, each weighted by the time since the sample before it."""
    if not metrics or len(samples) < 2:
        return {}
    before = [i for i, (t, _) in enumerate(samples) if t <= t0]
    after = [i for i, (t, _) in enumerate(samples) if t >= t1]
    start = before[-1] + 1 if before else 1  # the first sample's own interval began before any sample here
    end = after[0] if after else len(samples) - 1
    span = [(samples[i][0] - samples[i - 1][0], samples[i][1]) for i in range(start, end + 1)]
    out: dict = {}
    for m in metrics:
        part = [(w, s[m]) for w, s in span if m in s and w > 0]
        if not part:
            continue
        total = sum(w for w, _ in part)
        out[f"{m}_mean"] = sum(w * v for w, v in part) / total
        out[f"{m}_max"] = max(v for _, v in part)
        gpus = [(w, s[f"{m}_by_gpu"]) for w, s in span if f"{m}_by_gpu" in s and w > 0]
        if gpus and len({len(v) for _, v in gpus}) == 1:
            out[f"{m}_by_gpu_mean"] = [sum(w * v[k] for w, v in gpus) / sum(w for w, _ in gpus)
                                       for k in range(len(gpus[0][1]))]
    if out:
        first = samples[start - 1][0]
        last = samples[end][0]
        out["gpm_outside_s"] = max(0.0, t0 - first) + max(0.0, last - t1)
        out["gpm_missed_s"] = max(0.0, first - t0) + max(0.0, t1 - last)
    return out
