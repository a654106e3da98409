"""Issue 45 on the reference engine, at config/longctx.yaml's page1-scattered (its model, its flags), on one run:

- Two stages, one request: a 1,024-token prompt (no cached tokens) measured by the sweep's trials and by the load
  stage's closed loop of one agrees within its noise. Between them the run sends one 16k prompt (the ITL-depth
  request). Before the server was primed (protocol.prime: one request at the run's longest prompt on each server
  before its first measured one), the sweep measured a young server that had never held a long prompt: 35-41 ms
  against 26-30 ms after the 16k one (bench/server_age.py), 12-39% apart on the default run.
- A prediction where nothing was calibrated: the run's serving model (its fits, r from its closed loop of 2, its
  rules) asked by the what-if grid for a setting the run did not measure (max-running-requests 2 where it ran 4,
  chunked prefill 1,024 where it ran 8,192, a closed loop of 4 at 2,048 tokens where it measured loops of 1 and 2 at
  1,024), then that setting measured on a new server: the median TTFT and TPOT within the 15% the report holds the
  model to (longctx.report.whatif.TOLERANCE) where the drift between the two runs' metronomes leaves it to the model,
  and never beyond what that drift could explain.
- The advice against a brute force (issue 55; bench/advise_bruteforce.py): `longctx advise` asked, from this run, for
  the best of six settings it did not measure (max-running-requests 1, 2, 4 by chunked-prefill-size 512 and 4,096)
  for a closed loop of 4; then every one of the six measured, on six servers up at once, interleaved over three
  rounds. The pick's goodput is the best measured or within 5% of it, and its predicted TTFT, TPOT and goodput are
  within 10% of what was measured there, each read against the drift between the two runs.
"""

import json

import numpy as np
import pandas as pd
import pytest

from longctx.analysis import drift
from longctx.analysis.compare import welch_log_interval
from longctx.analysis.whatif import whatif_file
from longctx.measure.sweep import run_configuration
from longctx.report.whatif import TOLERANCE

from .conftest import bench_script

# alone under -n (tests/conftest.py): predictions are held against measurement
pytestmark = [pytest.mark.alone, pytest.mark.slow]

BRUTE = bench_script("advise_bruteforce")  # its page1-scattered run, its advice and its brute force
NAME, L, spec_of = BRUTE.NAME, BRUTE.L, BRUTE.spec_of
CLOSED = {"duration_s": None}
ASKED = {"max_running_requests": [2], "chunked_prefill_size": [1024], "concurrency": [4], "rates": [],
         "lengths": [2048], "output_tokens": 16, "requests": 8}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("whatif-measured")
    data = BRUTE.calibrate(work, itl_depth=4096)  # lengths 1k-4k, closed loops of 1 and 2 at 1,024 tokens
    doc = whatif_file(data / "fits.json", data / "load.json", data / "provenance.json", data / "load_requests.csv",
                      data / "load_interference.csv", {"whatif": ASKED, "slo": {"ttft_s": 10.0}}, data / "whatif.json")
    return {"work": work, "raw": work / "raw" / NAME, "whatif": doc["configurations"][NAME]}


def test_a_request_measured_by_the_sweep_and_by_the_load_stage_agrees(run):
    sweep = json.loads((run["raw"] / f"{L}.json").read_text())
    primed = sweep["provenance"].get("primed")
    assert primed and primed[0]["length"] == 4096 and primed[0]["status"] == "ok", primed
    assert len(sweep["trials"]) == 8
    doc = json.loads((run["raw"] / "load.json").read_text())
    (alone,) = [w for w in doc["workloads"] if w["kind"] == "closed" and w["concurrency"] == 1]
    loaded = [r["ttft_s"] for r in alone["requests"] if r["status"] == "ok"]
    # the sweep's side: its lone request (the sweep's code) sent 4 times just before the loop and 4 just after it
    # (load.sweep_twins), interleaved with the loop so that the machine's move over the minutes between the
    # two stages cancels (issue 53, item 7); the sweep's own trials were minutes before
    twins = alone["sweep_twins"]
    assert [t["twin"] for t in twins] == ["before"] * 4 + ["after"] * 4 and all(t["status"] == "ok" for t in twins)
    assert all(t["prompt_tokens"] == L and t["completion_tokens"] == 8 for t in twins)
    swept = [t["ttft_s"] for t in twins]
    assert len(loaded) == 8
    lo, hi = welch_log_interval(swept, loaded, 0.99)
    ratio = float(np.median(swept) / np.median(loaded))
    said = (f"sweep twins {[round(x * 1e3, 1) for x in swept]} ms, load stage {[round(x * 1e3, 1) for x in loaded]} "
            f"ms: ratio of medians {ratio:.3f}, 99% interval of the geometric means' [{lo:.3f}, {hi:.3f}]; the sweep's "
            f"own trials, minutes before: {[round(t['ttft_s'] * 1e3, 1) for t in sweep['trials']]} ms")
    print(said)
    # within its noise: the medians within 12%, or the interval holds 1. Where the drift between the two blocks leaves
    # the 12% open, the comparison is inconclusive, and it fails only beyond what that drift could explain
    # (longctx.analysis.drift); the report's row says the same (analysis.load_summary.sweep_twins, drift.lone_request)
    summary = json.loads((run["work"] / "data" / "load.json").read_text())["configurations"][NAME]
    (row,) = drift.lone_request(pd.read_csv(run["work"] / "data" / "results.csv"), summary, None)["rows"]
    assert row["interleaved"] and row["sweep"]["n"] == 8 and row["sweep"]["ttft"] == pytest.approx(np.median(swept))
    moved = row["drift"]
    judged = drift.verdict(ratio - 1, moved["drift"] if moved else None, 0.12, what="the sweep against the load stage")
    print(judged["words"] or "", (moved or {}).get("words"))
    assert lo <= 1 <= hi or judged["verdict"] != "fail", (said, judged)


def test_the_grids_answer_at_a_setting_not_measured_holds_when_it_is_measured(run):
    c = run["whatif"]
    assert "reason" not in c, c
    (setting,) = c["whatif"]
    assert (setting["max_running_requests"], setting["chunked_prefill_size"]) == (2, 1024)
    (point,) = [p for p in setting["points"] if p.get("concurrency") == 4]
    spec = spec_of([2048], 3, {"lengths": [2048], "output_tokens": 16, "sweep_twins": 0,
                               "closed": {**CLOSED, "concurrency": [4], "requests": 8}},
                   **{"max-running-requests": 2, "chunked-prefill-size": 1024})
    out = run["work"] / "asked"
    assert run_configuration(spec, out, run["work"] / "asked.log") == 0
    doc = json.loads((out / "load.json").read_text())
    (measured,) = [w for w in doc["workloads"] if w["kind"] == "closed"]
    ok = [r for r in measured["requests"] if r["status"] == "ok"]
    assert len(ok) == 8
    figures = {"ttft": float(np.median([r["ttft_s"] for r in ok])), "tpot": float(np.median([r["tpot_s"] for r in ok]))}
    errors = {q: point[f"{q}_p50"] / figures[q] - 1 for q in figures}
    # a prediction made from one run and checked in another: the machine between the two runs is read from both runs'
    # metronomes (the same code on both: the request series count too), and the check is held to the report's 15% only
    # where that drift leaves the verdict to the model; within the drift it is inconclusive, which it says, and it
    # fails only where the error is beyond what the machine's move could explain (longctx.analysis.drift.verdict).
    # Before the metronome a hand-made correction (one lone request on each server) failed this check by chance in
    # about one clean-clone run of three.
    readings = [json.loads((d / "metronome.json").read_text())["readings"] for d in (run["raw"], out)]
    moved = drift.between(*readings, same_code=True)
    assert moved is not None and moved["drift"] >= 0, readings
    judged = {q: drift.verdict(errors[q], moved["drift"], TOLERANCE, what=f"{q}'s error") for q in figures}
    said = "; ".join(f"{q}: predicted {point[f'{q}_p50'] * 1e3:.1f} ms, measured {figures[q] * 1e3:.1f} ms ({errors[q]:+.1%}): "
                     f"{judged[q]['verdict']} ({judged[q]['words']})" for q in figures) + f"; {moved['words']}"
    print(said, f"(r = {c['costs']['r'] * 1e3:.3f} ms, s = {c['costs']['s'] * 1e3:.3f} ms)")
    assert all(j["verdict"] != "fail" for j in judged.values()), said


def test_the_advice_picks_as_well_as_a_brute_force_over_six_settings_it_did_not_measure(run, tmp_path):
    """Issue 55's check on the reference engine (module docstring; bench/advise_bruteforce.py prints the same table)."""
    advised = BRUTE.advice(run["work"] / "data")
    assert advised["feasible"] and advised["measured"]["chunked-prefill-size"] == 8192  # none of the six was measured
    measured = BRUTE.brute_force(BRUTE.settings_of(), BRUTE.ROUNDS, tmp_path)
    readings = json.loads((run["raw"] / "metronome.json").read_text())["readings"]
    verdict = BRUTE.judge(advised, measured, readings)
    print(BRUTE.report(verdict, measured, BRUTE.ROUNDS))
    assert len(verdict["table"]) == 6 and measured["starts"] >= 6  # a server per setting (one that died restarted)
    assert all(t["ok"] == t["n"] == BRUTE.ROUNDS * 16 for t in verdict["table"]), [(t["label"], t["ok"]) for t in verdict["table"]]
    # the pick: the best measured, or a setting whose goodput is within 5% of it; where the rounds leave that open (the
    # winner of six settings measured with noise is flattered by its luck) it is inconclusive, and it fails only where
    # the whole 99% interval of the pick's share of the best is below 95% (under 1% of seeds for a pick as good as the
    # best: tests/test_advise.py)
    assert verdict["pick_holds"] != "fail", verdict["pick_ratio"]
    # predicted against measured at the pick within 10%, read against the drift between the two runs
    assert all(v["verdict"] != "fail" for v in verdict["prediction"].values()), verdict["prediction"]
