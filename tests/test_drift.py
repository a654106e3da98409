"""The drift figures (longctx.analysis.drift) on hand-made metronome readings, each figure derived by hand; a check read
against the drift (verdict); the what-if's check (longctx.analysis.whatif.quoted) and its words in the report
(longctx.report.whatif); the sweep's lone request against the load stage's (lone_request); what a version keeps."""

import pandas as pd
import pytest

from longctx.analysis.drift import between, lone_request, through_load, verdict, within
from longctx.analysis.whatif import quoted
from longctx.report.versions import kept_reading, measurements
from longctx.report.whatif import view


def reading(point, ttft_ms, tpot_ms, probe_ms, run="r1"):
    return {"point": point, "run_id": run, "ttft_s": ttft_ms / 1e3 if ttft_ms else None,
            "tpot_s": tpot_ms / 1e3 if tpot_ms else None, "probe": {"median_s": probe_ms / 1e3 if probe_ms else None}}


RUN = [reading("start", 10, 2.0, 40), reading("after_sweep", 12, 2.0, 52), reading("end", 11, 2.2, 40)]


def test_a_runs_drift_is_its_largest_ratio_of_a_series_slowest_point_to_its_fastest():
    figure = within(RUN)
    # by hand: TTFT 12/10 = 1.2, TPOT 2.2/2.0 = 1.1, machine probe 52/40 = 1.3: the probe's 30%
    assert figure["drift"] == pytest.approx(0.30)
    assert figure["worst"] == "probe"
    assert figure["series"]["ttft"]["ratio"] == pytest.approx(1.2)
    assert figure["series"]["tpot"]["ratio"] == pytest.approx(1.1)
    assert figure["series"]["probe"]["slowest"] == "after sweep" and figure["series"]["probe"]["fastest"] == "start"
    assert figure["words"].startswith("the machine moved by up to 30% within the run (metronome: machine probe 1.00 "
                                      "to 1.30 (start to after sweep); request TTFT 1.00 to 1.20")
    # a series whose figure is missing at a point is read over the points that have it
    figure = within([reading("start", 10, None, 40), reading("end", 15, None, None)])
    assert figure["drift"] == pytest.approx(0.5) and set(figure["series"]) == {"ttft"}
    # fewer than two readings of any series: no figure
    assert within([reading("start", 10, 2, 40)]) is None and within([]) is None and within(None) is None
    # only the points asked for
    assert within(RUN, points=("start", "end"))["drift"] == pytest.approx(0.1)


def test_the_drift_between_two_runs_pools_them_and_counts_the_request_only_for_the_same_code():
    now = [reading("start", 20, 2.0, 60, "r2"), reading("after_sweep", 24, 2.0, 78, "r2"),
           reading("end", 22, 2.0, 60, "r2")]
    same = between(RUN, now, same_code=True)
    # by hand, pooled: TTFT 10 to 24 ms = 2.4; TPOT 2.0 to 2.2 = 1.1; probe 40 to 78 ms = 1.95
    assert same["drift"] == pytest.approx(1.4) and same["worst"] == "ttft"
    assert same["series"]["probe"]["ratio"] == pytest.approx(1.95)
    assert same["series"]["probe"]["shift"] == pytest.approx(60 / 40)  # now's median over before's
    assert same["words"].startswith("the machine moved by up to 140% between the two runs (metronome: request TTFT")
    # another engine or kernel: its short request is another request; only the machine probe counts
    other = between(RUN, now, same_code=False)
    assert other["drift"] == pytest.approx(0.95) and set(other["series"]) == {"probe"}
    assert "machine probe 1.00 to 1.95" in other["words"] and "the requests left out" in other["words"]
    # a side without a reading: no figure
    assert between([], now, True) is None and between(RUN, None, True) is None
    assert between([reading("start", None, None, None)], now, True) is None


def test_the_kernel_call_is_a_series_of_its_own_and_counts_between_runs_only_for_the_same_code():
    """Issue 53, item 7: where the configuration's kernel is native, each reading has its call's median; the kernel
    is the code under study, so between two runs it counts only where they ran the same code, as the requests."""
    def with_kernel(r, ms):
        return {**r, "kernel": {"median_s": ms / 1e3}}

    run = [with_kernel(RUN[0], 1.0), with_kernel(RUN[1], 1.6), with_kernel(RUN[2], 1.1)]
    figure = within(run)
    # by hand: kernel 1.6/1.0 = 1.6 beside the probe's 1.3: the kernel's 60%
    assert figure["drift"] == pytest.approx(0.6) and figure["worst"] == "kernel"
    assert "kernel call 1.00 to 1.60 (start to after sweep)" in figure["words"]
    now = [with_kernel(reading("start", 10, 2.0, 40, "r2"), 2.0), with_kernel(reading("end", 10, 2.0, 40, "r2"), 2.0)]
    same = between(run, now, same_code=True)
    assert same["series"]["kernel"]["ratio"] == pytest.approx(2.0) and same["series"]["kernel"]["shift"] == pytest.approx(2.0 / 1.1)
    other = between(run, now, same_code=False)  # an edit of the kernel: its call is another call
    assert set(other["series"]) == {"probe"} and "the requests and the kernel call left out" in other["words"]
    # a version keeps the call's figure: the drift between two kept versions reads it back
    kept = [kept_reading(r) for r in run]
    assert between(kept, now, same_code=True)["series"]["kernel"]["ratio"] == pytest.approx(2.0)


@pytest.mark.parametrize("error, drift, tolerance, expected, low, high", [
    (0.18, 0.25, 0.15, "inconclusive", 1.18 / 1.25 - 1, 1.18 * 1.25 - 1),  # within the drift
    (0.03, 0.05, 0.15, "pass", 1.03 / 1.05 - 1, 1.03 * 1.05 - 1),  # -1.9% to +8.2%: within 15% either way
    (0.50, 0.25, 0.15, "fail", 0.2, 1.5 * 1.25 - 1),  # +20% at the least: beyond 15%
    (0.30, 0.20, 0.15, "inconclusive", 1.3 / 1.2 - 1, 1.3 * 1.2 - 1),  # +8% to +56%: across 15%
    (-0.60, 1.60, 0.15, "inconclusive", 0.4 / 2.6 - 1, 0.4 * 2.6 - 1),  # a factor 2.5 under a machine 2.6 times slower
    (0.08, 0.05, 0.0, "fail", 1.08 / 1.05 - 1, 1.08 * 1.05 - 1),  # no tolerance: beyond the drift, the stages differ
])
def test_a_check_against_the_drift_passes_fails_or_is_inconclusive(error, drift, tolerance, expected, low, high):
    v = verdict(error, drift, tolerance)
    assert v["verdict"] == expected
    assert v["low"] == pytest.approx(low) and v["high"] == pytest.approx(high)


def test_a_checks_words_say_why():
    assert verdict(0.18, 0.25, 0.15)["words"] == ("inconclusive: the error, +18%, is within the 25% the machine moved "
                                                  "while it was measured")
    assert verdict(0.5, 0.25, 0.15)["words"] == ("the error, +50%, is beyond the 25% the machine moved while it was "
                                                 "measured and the 15% held to")
    # without a drift the error alone is scored against the tolerance, as before the metronome
    assert verdict(0.18, None, 0.15)["verdict"] == "fail" and verdict(0.1, None, 0.15)["verdict"] == "pass"


def test_the_readings_around_the_sweep_and_the_load_stage():
    four = [reading(p, 10, 2, 40) for p in ("start", "after_sweep", "after_load", "end")]
    assert [r["point"] for r in through_load(four)] == ["start", "after_sweep", "after_load"]
    three = [reading(p, 10, 2, 40) for p in ("start", "after_sweep", "end")]  # no reused-context stage after load
    assert [r["point"] for r in through_load(three)] == ["start", "after_sweep", "end"]
    two_runs = four + [reading(p, 10, 2, 40, "r0") for p in ("start", "end")]  # an earlier run's, carried over
    assert [(r["run_id"], r["point"]) for r in through_load(two_runs)] == [
        ("r1", "start"), ("r1", "after_sweep"), ("r1", "after_load"), ("r0", "start"), ("r0", "end")]


def _results(ttfts, length=128):
    return pd.DataFrame({"configuration": "a", "length": length, "concurrency": 1, "status": "ok",
                         "ttft_s": ttfts, "tpot_s": [0.002] * len(ttfts)})


def _load(ttft_p50, tpot_p50=0.002, level=1, length=128):
    return {"closed": [{"level": level, "length": length, "n": 8, "ttft": {"p50": {"value": ttft_p50}},
                        "tpot": {"p50": {"value": tpot_p50}}}]}


def test_the_sweeps_lone_request_against_the_load_stages_is_read_against_the_drift_around_them():
    # sweep median 11 ms, load stage 16.5 ms: 1.5 times; the machine moved 30% (RUN's probe): beyond it, they differ
    cmp = lone_request(_results([0.010, 0.011, 0.012]), _load(0.0165), RUN)
    (row,) = cmp["rows"]
    assert row["length"] == 128 and row["sweep"]["ttft"] == pytest.approx(0.011) and row["sweep"]["n"] == 3
    assert row["ratio"]["ttft"] == pytest.approx(1.5) and row["ratio"]["tpot"] == pytest.approx(1.0)
    assert cmp["drift"]["drift"] == pytest.approx(0.30)
    assert row["verdicts"]["ttft"]["verdict"] == "fail"
    assert row["verdicts"]["tpot"]["verdict"] == "inconclusive"  # the same TPOT: within any drift
    # the machine moved 60% around them (a probe of 64 ms at the end): 1.5 times is within it
    moved = [*RUN[:2], reading("end", 11, 2.2, 64)]
    assert lone_request(_results([0.010, 0.011, 0.012]), _load(0.0165), moved)["rows"][0]["verdicts"]["ttft"][
        "verdict"] == "inconclusive"
    # no metronome: the ratio stands, not read against anything
    (row,) = lone_request(_results([0.010, 0.011, 0.012]), _load(0.0165), None)["rows"]
    assert row["ratio"]["ttft"] == pytest.approx(1.5) and row["verdicts"]["ttft"] is None
    # a closed loop of two, or a length the sweep did not measure: nothing to compare
    assert lone_request(_results([0.01]), _load(0.02, level=2), RUN)["rows"] == []
    assert lone_request(_results([0.01], length=256), _load(0.02), RUN)["rows"] == []


def test_the_sweeps_lone_request_sent_beside_the_loop_is_its_side_and_its_two_blocks_the_drift():
    """Issue 53, item 7: where the load stage sent the sweep's lone request just before and just after the loop of one
    (load.sweep_twins), those are the sweep's side, read against the drift between the two blocks; the sweep's
    own trials (minutes before, and here 1.5 times slower) and the metronome's readings are not used."""
    twins = {"sent": 4, "n": 4, "ttft": 0.0160, "tpot": 0.002, "before": {"n": 2, "ttft": 0.0155, "tpot": 0.002},
             "after": {"n": 2, "ttft": 0.0170, "tpot": 0.002}}
    load = {"closed": [{**_load(0.0165)["closed"][0], "sweep_twins": twins}]}
    cmp = lone_request(_results([0.010, 0.011, 0.012]), load, RUN)
    (row,) = cmp["rows"]
    assert row["interleaved"] and row["sweep"] == {"n": 4, "ttft": 0.016, "tpot": 0.002}
    # by hand: 16.5 / 16.0 = 1.031; the blocks 15.5 and 17.0 ms: 17.0 / 15.5 = 1.097, a drift of 9.7%: within it
    assert row["ratio"]["ttft"] == pytest.approx(16.5 / 16.0)
    assert row["drift"]["drift"] == pytest.approx(17.0 / 15.5 - 1) and row["verdicts"]["ttft"]["verdict"] == "inconclusive"
    assert row["drift"]["words"].startswith("the machine moved by up to 10% over the loop of one (the sweep's lone "
                                            "request before and after it: request TTFT 1.00 to 1.10 (before the loop of "
                                            "one to after the loop of one)")
    # a loop 1.5 times the blocks around it: beyond their 9.7%, the stages differ
    (row,) = lone_request(_results([0.010]), {"closed": [{**_load(0.024)["closed"][0], "sweep_twins": twins}]}, RUN)["rows"]
    assert row["ratio"]["ttft"] == pytest.approx(1.5) and row["verdicts"]["ttft"]["verdict"] == "fail"
    # the report says what each row was read against
    from longctx.report.drift import lone_requests

    prov = {"configurations": {"a": {"metronome": {"readings": RUN}}}}
    (c,) = lone_requests(_results([0.010, 0.011, 0.012]), {"configurations": {"a": load}}, prov, ["a"])["configurations"]
    assert c["rows"][0]["ttft"]["sweep"] == "16" and c["drift_words"].startswith(
        "at 128 tokens, the sweep's lone request sent just before and after the loop of one: the machine moved by up "
        "to 10% over the loop of one") and "around the sweep and the load stage" not in c["drift_words"]


def _row(error, measured=0.010, low=None, high=None):
    return {"kind": "closed", "level": 2, "length": 128, "n": 4, "quantity": "ttft", "which": "p50",
            "measured": measured, "predicted": measured * (1 + error), "low": low, "high": high, "error": error,
            "r_left_out": None, "excluded": None}


def test_the_whatif_check_across_a_machine_that_moved_is_inconclusive_rather_than_scored():
    rows = [_row(-0.40), _row(-0.35), _row(0.05)]
    # by hand: the probe 40 ms at the start, 100 ms between the stages: the machine moved 150% around them
    moved = [reading("start", 10, 2, 40), reading("after_sweep", 10, 2, 100), reading("end", 10, 2, 40)]
    q = quoted(rows, moved)
    assert q["drift"]["drift"] == pytest.approx(1.5)
    assert [r["verdict"] for r in rows] == ["inconclusive", "inconclusive", "inconclusive"]
    assert q["verdict"]["verdict"] == "inconclusive"  # the median figure's error, -35%, within 150%
    assert q["verdict"]["words"] == ("inconclusive: the median error at p50, -35%, is within the 150% the machine "
                                     "moved while it was measured")
    doc = {"configurations": {"a": {"costs": {"a": 0.001, "b": 1e-6, "c": 1e-10, "t0": 0.001, "r": 0.0, "beta": 1e-7, "s": 0.001},
                                        "rules": {"policy": "prefill_first", "chunk": 8192, "max_running": 4, "pool_tokens": 4096, "page": 1},
                                        "r_source": "0", "rules_source": "x", "check": rows, "errors": {"p50": {"median_abs": 0.35, "n": 3}},
                                        "drift": q, "whatif": [], "draws": 24}}, "grid": {}}
    c = view(doc, ["a"], {})["configurations"][0]
    # even the +5%: a model 5% off as measured could be 58% off without the machine's move
    assert c["misses"] == [] and len(c["inconclusive"]) == 3
    assert c["verdict"] == "inconclusive" and c["verdict_words"].startswith("inconclusive: the median error at p50")
    assert c["drift_words"].startswith("the machine moved by up to 150% around the sweep and the load stage")
    # the same errors on a machine that held still (probe 40 to 41 ms): scored, and the two -40%/-35% are misses
    still = [reading("start", 10, 2, 40), reading("after_sweep", 10, 2, 41), reading("end", 10, 2, 40)]
    rows = [_row(-0.40), _row(-0.35), _row(0.05)]
    q = quoted(rows, still)
    # by hand: drift 41/40 - 1 = 2.5%; the median figure's -35% gives 0.65 x 1.025 - 1 = -33% at the most: a miss
    assert [r["verdict"] for r in rows] == ["fail", "fail", "pass"] and q["verdict"]["verdict"] == "fail"
    doc["configurations"]["a"].update(check=rows, drift=q)
    c = view(doc, ["a"], {})["configurations"][0]
    assert len(c["misses"]) == 2 and c["inconclusive"] == []
    # no metronome: the check as it was scored before it (more than 15% off)
    rows = [_row(-0.40), _row(0.05)]
    q = quoted(rows, None)
    assert q["drift"] is None and [r["verdict"] for r in rows] == ["fail", "pass"]


def test_a_version_keeps_each_configurations_metronome_readings():
    df = pd.DataFrame({"configuration": ["a"], "length": [128], "concurrency": [1], "status": ["ok"], "trial": [0],
                       "run_id": ["r1"], "ttft_s": [0.01], "tpot_s": [0.002], "decode_tok_s": [500.0]})
    full = {**RUN[0], "requests": [{"status": "ok", "ttft_s": 0.01, "tpot_s": 0.002, "itl_s": [0.002] * 7}],
            "probe": {"median_s": 0.04, "seconds": [0.04, 0.041], "threads": 2, "matmul_s": [0.03, 0.031]}}
    kept = measurements(df, {"configurations": {"a": {"metronome": {"readings": [full]}}, "b": {}}})["metronome"]
    assert list(kept) == ["a"]
    (r,) = kept["a"]
    assert r["point"] == "start" and r["ttft_s"] == 0.01 and r["probe"]["median_s"] == 0.04
    assert r["requests"] == [{"status": "ok", "ttft_s": 0.01, "tpot_s": 0.002}] and "matmul_s" not in r["probe"]
    assert within(kept["a"] + [{**r, "point": "end", "probe": {"median_s": 0.05}}])["drift"] == pytest.approx(0.25)


def test_the_report_says_the_lone_request_and_each_runs_drift_in_words():
    from longctx.report.drift import lone_requests, run_words

    df = _results([0.010, 0.011, 0.012])
    prov = {"configurations": {"a": {"metronome": {"readings": RUN, "drift": within(RUN), "status": "ok"}}}}
    shown = lone_requests(df, {"configurations": {"a": _load(0.0165)}}, prov, ["a"])
    (c,) = shown["configurations"]
    (row,) = c["rows"]
    assert shown["any"] and row["length"] == 128
    assert row["ttft"] == {"sweep": "11", "load": "16.5", "ratio": "1.50", "verdict": "differ",
                           "words": "the difference, +50%, is beyond the 30% the machine moved while it was measured"}
    assert row["tpot"]["verdict"] == "within the drift"
    assert c["drift_words"].startswith("the machine moved by up to 30% around the sweep and the load stage")
    # a run without a metronome: the ratio, not read against anything
    (row,) = lone_requests(df, {"configurations": {"a": _load(0.0165)}}, {"configurations": {}}, ["a"])[
        "configurations"][0]["rows"]
    assert row["ttft"]["ratio"] == "1.50" and row["ttft"]["verdict"] == "no drift measured"
    assert run_words(prov["configurations"]["a"]["metronome"]).startswith("the machine moved by up to 30% within the run")
    assert run_words({"status": "not configured", "readings": []}).startswith("no metronome readings")
    assert run_words({"status": "ok", "readings": RUN[:1], "drift": None}) == (
        "1 metronome reading(s): too few for a drift figure")
