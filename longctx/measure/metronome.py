"""The metronome: the same short measurement at fixed points of a configuration's run, so that every run has a drift
figure of its own (longctx.analysis.drift) and every comparison between measurements taken at different times can be
quoted against it.

At each point of the run (POINTS; `points` says which this configuration's run has) a reading is taken:
- requests: metronome.repeats requests of metronome.length prompt tokens, decoding metronome.output_tokens, through
  the configuration's own server, each built as a trial is (measure.protocol: a prefix unique to it, the prefix cache
  flushed before it where the API can, its counts checked); the point's figures are their median TTFT and TPOT. An
  edit of the engine or of the kernel under study can change these, so they are compared across versions only where
  the code is the same (longctx.analysis.drift.between).
- the machine probe: nothing of the server's or the kernel's code in it, in a process of its own
  (longctx.measure.machineprobe, whose BLAS threads end with it): per repeat an n x n float64 matmul (numpy's BLAS,
  with the threads it is given: the job's CPUs, which Snakemake passes as OMP_NUM_THREADS) and a copy of a buffer,
  timed together, after one untimed repeat; the point's figure is their median. It is taken before the requests.
- the kernel call, where the configuration's kernel is native (the kernel under study, which its rule bench_kernel
  times alone): metronome.kernel.calls calls of it at the shape the configuration serves and metronome.kernel.length
  KV cells, in a process of its own (longctx.attention.kernelprobe); the point's figure is their median. Like the
  requests, an edit of the kernel changes it. Taken after the probe, before the requests.

Every reading is written to data/raw/<configuration>/metronome.json as soon as it is taken, with its wall-clock time
(and kept in the resume directory): the readings of an earlier run whose lengths this one reuses are carried over,
since what that run measured is in this one's results. The first reading is taken when the run's server is first up
and primed (Session.on_ready), before the run's first measurement: a run that measures nothing (every measurement
reused) starts no server for its metronome, and a point before that first reading is not taken. A point at which the
server is down (stopped after a fault, the next stage starts it again) has the probe and no request, said so; the
metronome never costs a measurement.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..attention.shapes import spec_shape
from ..engines import ConfigurationSpec
from . import machineprobe
from .prompts import check_counts
from .provenance import now_iso
from .rawfiles import FORMATS, read_kept, write_kept

log = logging.getLogger("longctx.measure.metronome")
progress = logging.getLogger("longctx.progress")

FORMAT = FORMATS["metronome"]
# the points of a run, in order, and what each is between
POINTS = {"start": "after the server's first bring-up and its prime, before the run's first measurement",
          "after_sweep": "between the sweep and the load workloads",
          "after_load": "between the load and the reused-context workloads",
          "end": "at the end, before the server goes down"}
def points(spec: ConfigurationSpec) -> list[str]:
    """The points of this configuration's run: start and end always; between the sweep and the load workloads where a
    workload follows the sweep; between the load and the reused-context workloads where both are measured."""
    out = ["start"]
    if spec.load or spec.prefix:
        out.append("after_sweep")
    if spec.load and spec.prefix:
        out.append("after_load")
    return out + ["end"]


PROBE_TIMEOUT_S = 120


def probe(settings: dict) -> dict:
    """The machine probe (module docstring), in a process of its own (longctx.measure.machineprobe: its BLAS threads
    end with it, and take no core from what the run measures next): per repeat the matmul's and the copy's seconds,
    and their sum's median."""
    proc = subprocess.run([sys.executable, machineprobe.__file__, json.dumps(settings)], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"the machine probe exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def kernel_probe(settings: dict) -> dict:
    """The kernel call (module docstring), in a process of its own (longctx.attention.kernelprobe): each call's
    seconds and their median."""
    proc = subprocess.run([sys.executable, "-m", "longctx.attention.kernelprobe", json.dumps(settings)],
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"the kernel call exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def kernel_settings(spec: ConfigurationSpec, session) -> dict | None:
    """What the kernel call at each point is (kernel_probe's settings), None where the configuration's kernel is
    not native (no kernel, or a PyTorch one: no rule bench_kernel times it alone) or the metronome's kernel call is
    off (metronome.kernel.calls 0)."""
    settings = (spec.metronome or {}).get("kernel") or {}
    if not spec.kernel_build or not settings.get("calls"):
        return None
    manifest = Path(spec.kernel_build) / "manifest.json"
    if not manifest.is_file() or json.loads(manifest.read_text()).get("kind") != "native":
        return None
    shape = spec_shape(spec.name, session.adapter.model_spec(spec.model, spec.args))
    return {"kernel_dir": spec.kernel_build, "shape": dataclasses.asdict(shape), "length": settings["length"],
            "calls": settings["calls"]}


def requests(session, spec: ConfigurationSpec, run_id: str, point: str) -> tuple[list[dict], str | None]:
    """The point's requests (module docstring), each one's summary as a trial's; none, and why, where the server
    would refuse them."""
    m, proto = spec.metronome, spec.protocol
    length, out = m["length"], m["output_tokens"]
    timeout = proto["request_timeout_s"]
    refused = session.refuses(length, out)
    if refused:
        return [], refused
    done = []
    for i in range(m["repeats"]):
        body = session.prompter.body(length, f"{run_id}/{spec.name}/metronome/{point}/{i}", out)
        flush_error = session.flush(timeout) if proto["flush_cache"] else None
        summary = session.prompter.generate(session.client, session.base + session.api.generate_path, body, timeout,
                                            length)
        summary.update(flush_error=flush_error, request=i)
        done.append(check_counts(summary, length, out))
    return done, None


def _median(values: list) -> float | None:
    v = [float(x) for x in values if x is not None]
    return float(np.median(v)) if v else None


class Metronome:
    """The readings of one configuration's run, written to outdir/metronome.json (and kept in resume_dir) as each is
    taken. A configuration without a metronome (spec.metronome None) writes a file that says so, and takes none."""

    def __init__(self, spec: ConfigurationSpec, common: dict, prov: dict, key: str, outdir: Path,
                 resume_dir: Path | None):
        self.spec, self.common, self.prov, self.key = spec, common, prov, key
        self.outdir, self.resume_dir = outdir, resume_dir
        self.points = points(spec) if spec.metronome else []
        self.readings: list[dict] = []
        self.carried: list[dict] = []
        self.skipped: dict[str, str] = {}  # points not taken, and why
        self.t0 = time.monotonic()
        kept = read_kept(resume_dir, "metronome")
        self.earlier = [r for r in (kept or {}).get("readings") or []
                        if kept.get("resume_key") == key and r.get("run_id") != common["run_id"]]
        self.write()

    def carry(self, run_ids: set[str]) -> None:
        """Carry over the kept readings of the earlier runs whose measurements this run reuses."""
        self.carried = [r for r in self.earlier if r.get("run_id") in run_ids]
        self.write()

    def ready(self, session) -> None:
        """Take the first reading when the run's server is first up and primed (Session.on_ready), before its first
        measurement; the readings after it are taken at their points (tick)."""
        if self.points:
            session.on_ready = lambda: self.tick(session, "start")

    def tick(self, session, point: str) -> None:
        """The reading at `point` (one of self.points; any other is not taken). Before the run's first reading (the
        server not up yet: nothing measured so far in this run) none is taken at the points after it; a run that
        measures nothing (every measurement reused) starts no server for its metronome. A server that is down (after
        a fault) gets no request."""
        if point not in self.points:
            return
        if point != "start" and not any(r["point"] == "start" for r in self.readings):
            self.skipped[point] = "no server had been started in this run by then (nothing measured before it)"
            if point == "end":
                self.skipped["start"] = "no server was started in this run"
            self.write()
            return
        spec, settings = self.spec, self.spec.metronome
        began = time.monotonic()
        reading = {"point": point, "run_id": self.common["run_id"], "started_at": now_iso(),
                   "t_s": round(time.monotonic() - self.t0, 3), "length": settings["length"],
                   "output_tokens": settings["output_tokens"]}
        # the probe first, the same at every point (its process, and the BLAS threads in it, gone before the requests)
        try:
            reading["probe"] = probe(settings["probe"])
        except Exception as exc:  # noqa: BLE001 - a bug or a surprise here must not cost what the run measures
            log.exception("%s: metronome probe at %s", spec.name, point)
            reading["probe"] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        try:
            kernel = kernel_settings(spec, session)
            if kernel is not None:
                reading["kernel"] = kernel_probe(kernel)
        except Exception as exc:  # noqa: BLE001 - as above
            log.exception("%s: metronome kernel call at %s", spec.name, point)
            reading["kernel"] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        try:
            if session.alive():
                done, why = requests(session, spec, self.common["run_id"], point)
            else:
                done, why = [], "no request: the server was down at this point (stopped after a fault)"
        except Exception as exc:  # noqa: BLE001 - as above
            log.exception("%s: metronome requests at %s", spec.name, point)
            done, why = [], f"{type(exc).__name__}: {exc}"
        reading["server_start"] = session.starts
        ok = [r for r in done if r["status"] == "ok"]
        bad = sorted({r.get("reason") or "failed" for r in done if r["status"] != "ok"})
        reasons = ([why] if why else []) + [f"{sum((r.get('reason') or 'failed') == b for r in done)} of {len(done)} "
                                            f"requests: {b}" for b in bad]
        if reading["probe"].get("status") == "failed":
            reasons.append(f"the machine probe failed: {reading['probe']['reason']}")
        if (reading.get("kernel") or {}).get("status") == "failed":
            reasons.append(f"the kernel call failed: {reading['kernel']['reason']}")
        reading.update(requests=done, ttft_s=_median([r.get("ttft_s") for r in ok]),
                       tpot_s=_median([r.get("tpot_s") for r in ok]),
                       status="ok" if not reasons else ("partial" if ok or "median_s" in reading["probe"] else "failed"),
                       reason="; ".join(reasons) or None, finished_at=now_iso(), took_s=round(time.monotonic() - began, 3))
        self.readings.append(reading)
        self.write()
        ms = lambda x: f"{x * 1e3:.3g} ms" if x is not None else "--"  # noqa: E731
        kernel = f"; kernel call {ms(reading['kernel'].get('median_s'))}" if "kernel" in reading else ""
        progress.info("%s: metronome %s: request TTFT %s, TPOT %s; machine probe %s%s%s", spec.name,
                      point.replace("_", " "), ms(reading["ttft_s"]), ms(reading["tpot_s"]),
                      ms(reading["probe"].get("median_s")), kernel, f" ({reading['reason']})" if reading["reason"] else "")

    def write(self) -> None:
        settings = self.spec.metronome
        if settings is None:
            status, reason = "not configured", None
        else:
            taken = {r["point"] for r in self.readings}
            missing = [p for p in self.points if p not in taken and p not in self.skipped]
            said = [f"{r['point']}: {r['reason']}" for r in self.readings if r.get("reason")]
            said += [f"not taken: {', '.join(missing)} (the run stopped before {'it' if len(missing) == 1 else 'them'})"
                     if self.readings else "not taken: the run stopped before its first point"] if missing else []
            good = [r for r in self.readings if r["status"] != "failed"]
            status = "ok" if not said else ("partial" if good else "failed")
            skipped = [f"{p}: not taken, {why}" for p, why in self.skipped.items()]
            if not self.readings and not missing:  # the run measured nothing: no server, no reading of its own
                skipped = ["nothing was measured in this run (every measurement reused), so no server was started for "
                           "the metronome: its readings are those of the runs whose measurements it reuses"]
            reason = "; ".join(said + skipped) or None
        doc = {**self.common, "format": FORMAT, "provenance": copy.deepcopy(self.prov), "metronome": settings,
               "resume_key": self.key, "points": self.points, "status": status, "reason": reason,
               "readings": self.carried + self.readings, "finished_at": now_iso()}
        write_kept("metronome", doc, self.outdir, self.resume_dir)
