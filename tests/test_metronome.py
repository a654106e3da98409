"""The metronome end to end on the reference engine (longctx.measure.metronome, longctx.analysis.drift): one run of
tests/configs/tiny.yaml's page1 (a sweep, a closed loop of one and of two, one reused-context point), during which the
machine is made slower for a stretch by processes busy on the same cores, from just before the reading between the
sweep and the load stage until just after the one between the load and the reused-context stages: the load stage is
measured in the stretch, between two readings in it. The stretch shows in the run's drift figure, and the what-if's
check, whose load points were measured in it, is said to be inconclusive rather than scored.

The contention is made strong against whatever else runs on the machine: BUSY processes spinning on its cores
beside the probe's own threads, so that the probe gets a fraction of the CPU it got before (about 2 of 2 + BUSY
runnable threads on a quiet 2-core machine, and still under half on one already running a few other jobs); the
thresholds asserted are a factor of 1.5, where the stretch measured 3 to 9 times slower here.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from longctx.analysis.aggregate import aggregate
from longctx.analysis.drift import value
from longctx.analysis.fits import fit_file
from longctx.analysis.load import aggregate_load
from longctx.analysis.load_summary import analyze_file
from longctx.analysis.whatif import whatif_file
from longctx.measure.metronome import Metronome, points
from longctx.measure.sweep import run_configuration
from longctx.report import whatif as whatifview

from .conftest import measuring, tiny_spec

# alone under -n (tests/conftest.py): quiet readings must be faster than busy ones. The run measures alone (measuring()),
# set up by the first test; the others read it, or a run's files, and share the machine
pytestmark = pytest.mark.alone

BUSY = 12  # processes spinning through the stretch
SETTLE_S = 0.5  # after they are started, before the reading: each has started spinning
FACTOR = 1.5  # a reading in the stretch against the faster of the quiet ones, at the least


class Busy:
    """BUSY processes spinning on this machine's cores, each in its own session, stopped by pid."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.spans: list[tuple[float, float | None]] = []

    def start(self) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                      for _ in range(BUSY)]
        self.spans.append((time.monotonic(), None))
        time.sleep(SETTLE_S)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, 9)
            p.wait()
        self.procs = []
        if self.spans and self.spans[-1][1] is None:
            self.spans[-1] = (self.spans[-1][0], time.monotonic())


def spec():
    s = tiny_spec("page1")
    protocol = {**s.protocol, "warmup": 1, "trials": 3, "output_tokens": 8, "concurrency": [],
                "needle": {**s.protocol["needle"], "enabled": False}, "itl_depth": {"length": None, "output_tokens": 2}}
    # no sweep twins (load.sweep_twins 0): the what-if's calibration is the sweep's, minutes before the stretch, and its
    # check is read against the metronome's drift, the path under test here (with twins beside each point the model
    # is set to what they measured in the stretch, and each row read against their drift: tests/test_whatif_measured.py)
    load = {**s.load, "lengths": [128], "output_tokens": 8, "closed": {"concurrency": [1, 2], "requests": 6, "duration_s": None},
            "sweep_twins": 0,
            "open": {**s.load["open"], "rates": []}, "interference": {**s.load["interference"], "lengths": []},
            "wake": {**s.load["wake"], "idle_s": []}, "metrics": {**s.load["metrics"], "enabled": False}}
    prefix = {**s.prefix, "lengths": [256], "hit_rates": [0.0], "trials": 1,
              "conversation": {**s.prefix["conversation"], "max_context": None}}
    return replace(s, protocol=protocol, load=load, prefix=prefix)


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # the run of the module docstring, its data aggregated and analysed as the workflow does
    work = tmp_path_factory.mktemp("metronome")
    raw = work / "raw" / "page1"
    s = spec()
    assert points(s) == ["start", "after_sweep", "after_load", "end"]
    busy = Busy()
    real = Metronome.tick

    def tick(self, session, point):  # the stretch: from just before the reading after the sweep to just after the next
        if point == "after_sweep":
            busy.start()
        real(self, session, point)
        if point == "after_load":
            busy.stop()

    Metronome.tick = tick
    try:
        with measuring():  # alone whichever test sets it up; what follows and the tests that read it time nothing
            assert run_configuration(s, raw, work / "server.log") == 0
    finally:
        Metronome.tick = real
        busy.stop()
    data = work / "data"
    data.mkdir()
    files = sorted(str(p) for p in raw.glob("*.json"))
    aggregate(files, data / "results.csv", data / "provenance.json", data / "itl_depth.csv")
    fit_file(data / "results.csv", data / "fits.json", data / "provenance.json")
    aggregate_load([str(raw / "load.json")], data / "load_requests.csv", data / "load_interference.csv",
                   data / "load_metrics.csv")
    analyze_file(data / "load_requests.csv", data / "load_interference.csv", data / "load_metrics.csv", data / "load.json",
                 data / "fits.json", data / "provenance.json")
    doc = whatif_file(data / "fits.json", data / "load.json", data / "provenance.json", data / "load_requests.csv",
                      data / "load_interference.csv", {"slo": {"ttft_s": 10.0}}, data / "whatif.json")
    return {"raw": raw, "data": data, "whatif": doc, "busy": busy,
            "provenance": json.loads((data / "provenance.json").read_text())["configurations"]["page1"]}


@pytest.mark.slow
def test_the_runs_readings_are_kept_with_their_times(run):  # alone: it sets the run up, first of the module
    doc = json.loads((run["raw"] / "metronome.json").read_text())
    assert doc["status"] == "ok" and doc["format"] == "longctx.metronome/1", doc["reason"]
    assert [r["point"] for r in doc["readings"]] == ["start", "after_sweep", "after_load", "end"]
    for r in doc["readings"]:
        assert r["started_at"] <= r["finished_at"] and r["took_s"] > 0
        assert len(r["requests"]) == 3 and all(q["status"] == "ok" and q["prompt_tokens"] == 128 for q in r["requests"])
        assert r["ttft_s"] > 0 and r["tpot_s"] > 0 and len(r["probe"]["seconds"]) == 5
    assert [r["t_s"] for r in doc["readings"]] == sorted(r["t_s"] for r in doc["readings"])
    kept = run["provenance"]["metronome"]
    assert kept["readings"] == doc["readings"] and kept["status"] == "ok"


@pytest.mark.alone(False)  # times nothing: it reads the run, or a run's files
@pytest.mark.slow
def test_a_stretch_of_a_slower_machine_shows_in_the_runs_drift(run):
    readings = {r["point"]: r for r in run["provenance"]["metronome"]["readings"]}
    probe = {p: value(r, "probe") for p, r in readings.items()}
    said = ", ".join(f"{p} {v * 1e3:.1f} ms" for p, v in probe.items())
    print(f"machine probe: {said}; TTFT: " + ", ".join(f"{p} {value(r, 'ttft') * 1e3:.2f} ms" for p, r in readings.items()))
    quiet = min(probe["start"], probe["end"])
    assert min(probe["after_sweep"], probe["after_load"]) >= FACTOR * quiet, said
    figure = run["provenance"]["metronome"]["drift"]
    print(figure["words"])
    assert figure["drift"] >= FACTOR - 1
    assert figure["series"]["probe"]["slowest"] in ("after sweep", "after load"), figure["words"]


@pytest.mark.alone(False)  # times nothing: it reads the run, or a run's files
@pytest.mark.slow
def test_a_whatif_check_measured_across_the_stretch_is_inconclusive_rather_than_scored(run):
    c = run["whatif"]["configurations"]["page1"]
    assert "reason" not in c, c
    q = c["drift"]
    rows = [r for r in c["check"] if r["error"] is not None]
    print(q["drift"]["words"], "|", (q["verdict"] or {}).get("words"), "|",
          [(r["kind"], r["level"], r["quantity"], r["which"], round(r["error"], 3), r["verdict"], r.get("excluded"))
           for r in rows])
    d = q["drift"]["drift"]
    assert d >= FACTOR - 1
    # a figure whose error is within the machine's move (1 + error between 1 / (1 + drift) and 1 + drift) is neither a
    # pass nor a miss. One further off than the move is scored: the busy process holds the closed loops' cores for
    # their whole run while the probe reads the move at two points, and a machine busy with more than this test made
    # one of them 34 times slower than predicted while the probe read 25 times (a suite run beside other work: -97%
    # against 2437%), a miss by the rule (longctx.analysis.drift.verdict), so the test reads the rule, not one
    # outcome of it: which rows fall within the move is the machine's to say (every one of them could fall outside on a
    # machine busier still), so the rule is read on each row, and no row passes across a move this large
    within = [r for r in rows if 1 / (1 + d) <= 1 + r["error"] <= 1 + d]
    assert rows and all(r["verdict"] == "inconclusive" for r in within), rows
    assert not any(r["verdict"] == "pass" for r in rows), rows
    if not [r for r in rows if r["which"] == "p50" and not r.get("excluded")]:
        # the busy cores kept the client off its CPUs until every closed loop was held below its level (seen once in
        # three clean-clone runs: 1 held 88% of the time, 2 84%): the what-if scores none of them, so no headline
        assert q["verdict"] is None and all(r.get("excluded") for r in rows), q
        return
    median = q["verdict"]["error"]
    if not 1 / (1 + d) <= 1 + median <= 1 + d:  # the headline figure further off than the move: scored by the rule
        return
    assert q["verdict"]["verdict"] == "inconclusive", q["verdict"]["words"]
    assert q["verdict"]["words"].startswith("inconclusive: ")
    # the report says so where it would have scored it, and names no figure inconclusive as a miss
    shown = whatifview.view(whatifview.read(run["data"] / "whatif.json"), ["page1"], {})["configurations"][0]
    assert shown["verdict"] == "inconclusive" and shown["verdict_words"] == q["verdict"]["words"]
    assert shown["drift_words"] == q["drift"]["words"]
    inconclusive = {(r["quantity"], r["which"]) for r in c["check"] if r.get("verdict") == "inconclusive"}
    assert inconclusive and len(shown["inconclusive"]) + len(shown["misses"]) <= len(c["check"])
    assert not any(w in shown["misses"] for w in shown["inconclusive"])


class DownSession:
    """A session whose server is down (stopped after a fault): the metronome takes its probe and no request."""

    starts = 2

    def alive(self):
        return False

    def up(self):
        raise AssertionError("the metronome brings a server up only at the start")


SMALL_PROBE = {"matmul_size": 64, "copy_mib": 1, "repeats": 2}


@pytest.mark.alone(False)  # times nothing: it reads the run, or a run's files
def test_a_point_whose_server_is_down_has_the_probe_and_says_why_it_has_no_request(tmp_path):
    s = replace(spec(), prefix=None, metronome={**spec().metronome, "probe": SMALL_PROBE})  # no after_load point
    m = Metronome(s, {"run_id": "now", "configuration": "page1"}, {}, "k", tmp_path / "raw", None)
    m.tick(DownSession(), "after_sweep")  # before the first reading (no server up yet in this run): none
    assert json.loads((tmp_path / "raw" / "metronome.json").read_text())["readings"] == []
    m.tick(DownSession(), "start")  # (as Session.on_ready calls it: the server up, and here dead at once)
    m.tick(DownSession(), "after_sweep")
    m.tick(DownSession(), "after_load")  # not a point of this run (no reused-context stage): not taken
    doc = json.loads((tmp_path / "raw" / "metronome.json").read_text())
    assert [r["point"] for r in doc["readings"]] == ["start", "after_sweep"]
    r = doc["readings"][1]
    assert r["requests"] == [] and r["ttft_s"] is None and r["server_start"] == 2
    assert r["probe"]["median_s"] > 0 and len(r["probe"]["seconds"]) == 2 and r["status"] == "partial"
    assert "the server was down at this point" in r["reason"]
    assert doc["status"] == "partial" and "not taken: end (the run stopped before it)" in doc["reason"]


@pytest.mark.alone(False)  # times nothing: it reads the run, or a run's files
def test_a_run_that_measures_nothing_starts_no_server_for_its_metronome(tmp_path):
    m = Metronome(spec(), {"run_id": "now", "configuration": "page1"}, {}, "k", tmp_path, None)
    for point in ("after_sweep", "after_load", "end"):  # the server never came up (Session.on_ready never called)
        m.tick(DownSession(), point)
    doc = json.loads((tmp_path / "metronome.json").read_text())
    assert doc["readings"] == [] and doc["status"] == "ok"
    assert doc["reason"].startswith("nothing was measured in this run (every measurement reused)")


@pytest.mark.alone(False)  # times nothing: it reads the run, or a run's files
def test_a_configuration_without_a_metronome_says_so(tmp_path):
    m = Metronome(replace(spec(), metronome=None), {"run_id": "now"}, {}, "k", tmp_path, None)
    m.tick(DownSession(), "start")  # nothing taken, no server asked for
    doc = json.loads((tmp_path / "metronome.json").read_text())
    assert doc["status"] == "not configured" and doc["readings"] == [] and doc["points"] == []


@pytest.mark.alone(False)  # times nothing: it reads the run, or a run's files
def test_readings_of_the_runs_whose_lengths_are_reused_are_carried_over(tmp_path):
    earlier = [{"point": "start", "run_id": "a"}, {"point": "end", "run_id": "a"}, {"point": "start", "run_id": "b"}]
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "metronome.json").write_text(json.dumps({"resume_key": "k", "readings": earlier}))
    m = Metronome(spec(), {"run_id": "now"}, {}, "k", tmp_path / "raw", tmp_path / "partial")
    m.carry({"a"})  # this run reuses lengths run a measured, none of run b's
    doc = json.loads((tmp_path / "raw" / "metronome.json").read_text())
    assert doc["readings"] == earlier[:2] and doc["resume_key"] == "k"
    assert json.loads((tmp_path / "partial" / "metronome.json").read_text())["readings"] == earlier[:2]  # kept too
    # readings kept under another resume key (another spec, kernel or engine) are another run's business
    other = Metronome(spec(), {"run_id": "now"}, {}, "other", tmp_path / "raw2", tmp_path / "partial")
    other.carry({"a"})
    assert json.loads((tmp_path / "raw2" / "metronome.json").read_text())["readings"] == []


@pytest.mark.alone(False)  # times nothing: it reads the run, or a run's files
def test_an_unreadable_metronome_file_is_read_from_its_intact_copy_or_said(tmp_path):
    from longctx.analysis.aggregate import metronome_entry

    readings = [{"point": "start", "run_id": "r", "ttft_s": 0.010, "tpot_s": 0.002, "probe": {"median_s": 0.040}},
                {"point": "end", "run_id": "r", "ttft_s": 0.012, "tpot_s": 0.002, "probe": {"median_s": 0.050}}]
    (tmp_path / "raw" / "page1").mkdir(parents=True)
    (tmp_path / "partial" / "page1").mkdir(parents=True)
    path = tmp_path / "raw" / "page1" / "metronome.json"
    path.write_text('{"readings": [')  # cut off mid-write
    (tmp_path / "partial" / "page1" / "metronome.json").write_text(json.dumps({"status": "ok", "readings": readings}))
    entry = metronome_entry(path, tmp_path / "partial")
    assert entry["readings"] == readings and entry["drift"]["drift"] == pytest.approx(0.25)  # probe 40 to 50 ms
    assert entry["recovered_from"] == str(tmp_path / "partial" / "page1" / "metronome.json")
    lost = metronome_entry(path)
    assert lost["status"] == "failed" and lost["reason"].startswith(f"unreadable {path}") and lost["drift"] is None
