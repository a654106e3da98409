"""The adaptive sweep's planner (longctx.measure.adaptive) against a server whose times are known by construction:
TTFT = 0.02 + 2e-5 L + 4e-10 L^2 s and TPOT = 2e-3 + 1e-7 L s, each trial off by a seeded 2% noise."""

import numpy as np

from longctx.measure.adaptive import Planner, grid
from longctx.report.wording import sweep_confirmation

SETTINGS = {"min": 1024, "max": 65536, "ratio": 2.0, "target_relative_interval": 0.1, "budget_s": 600.0,
            "start_lengths": 3, "max_trials": 3, "confirm_trials": 1, "max_steps": 24}
PROTOCOL = {"warmup": 1, "output_tokens": 32}


def ttft(L):
    return 0.02 + 2e-5 * L + 4e-10 * L**2


def tpot(L):
    return 2e-3 + 1e-7 * L


def run(settings, bend=None, seed=0):
    """The sweep against the synthetic server; bend(L) multiplies TPOT (a regime change), if given."""
    rng = np.random.default_rng(seed)
    p = Planner(settings, PROTOCOL, n_boot=200)

    def measure(L, n):
        k = bend(L) if bend else 1.0
        samples = [(L, ttft(L) * (1 + 0.02 * rng.standard_normal()), tpot(L) * k * (1 + 0.02 * rng.standard_normal()))
                   for _ in range(n)]
        seconds = (n + p.warmup()) * (ttft(L) + PROTOCOL["output_tokens"] * tpot(L) * k)
        p.record(L, n, samples, seconds)

    while (step := p.next_step()) is not None:
        measure(step[0], step[1])
    if p.phase == "around":
        for L, n, _ in p.around():
            measure(L, n)
    return p


def test_the_grid_runs_from_min_to_max_by_the_ratio():
    assert grid(SETTINGS) == [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    assert grid({**SETTINGS, "min": 1000, "max": 185000, "ratio": 4}) == [1000, 4000, 16000, 64000, 185000]


def test_it_starts_short_chooses_by_gain_per_second_and_ends_confirmed_at_max():
    p = run(SETTINGS)
    s = p.summary()
    lengths = [step["length"] for step in s["path"]]
    assert lengths[:3] == [1024, 2048, 4096] and lengths[-1] == 65536
    assert all(step["reason"] for step in s["path"])
    assert p.outcome["inside"], p.outcome  # the models hold: the confirmation falls inside both predictions
    # the choosing stopped at the target, projected with the confirmation's trial, and the fits with it are within it
    assert "projected within the target" in s["path"][-1]["reason"], s["path"][-1]
    assert all(v["relative_interval"] <= 0.1 for v in s["at_max"].values()), s["at_max"]
    # far less server time than three trials at every grid length (and their warm-ups)
    fixed = sum(4 * (ttft(L) + 32 * tpot(L)) for L in grid(SETTINGS))
    assert s["spent_s"] < fixed / 2, (s["spent_s"], fixed)
    print(f"\nadaptive: {s['spent_s']:.1f} s at {lengths}; fixed: {fixed:.1f} s")


def test_the_budget_ends_the_choosing_and_the_confirmation_still_runs():
    p = run({**SETTINGS, "budget_s": 15.0, "target_relative_interval": 0.001})
    (confirm,) = [s for s in p.path if s["phase"] == "confirm"]
    assert confirm["length"] == 65536 and "the budget would be spent" in confirm["reason"]
    assert p.spent_s <= 15.0 + confirm["spent_s"]
    p = run({**SETTINGS, "target_relative_interval": 0.001, "max_steps": 4})
    assert sum(s["phase"] == "choose" for s in p.path) == 4
    confirms = [s for s in p.path if s["phase"] == "confirm"]
    assert "4 choices made" in confirms[0]["reason"]
    # a target out of reach: more trials at max, each confirming again, until max_steps of them (the budget allows)
    assert len(confirms) == 1 + 4 and all("more trial(s) at max" in s["reason"] for s in confirms[1:])
    assert p.outcome["confirmations"] == 5 and p.outcome["inside"]


def test_a_confirmation_that_leaves_the_target_unmet_is_followed_by_more_trials_at_max():
    # two choices only, then the confirmation: its one trial leaves the intervals at max wider than 4%; the budget
    # buys more trials at max until they are within it
    p = run({**SETTINGS, "target_relative_interval": 0.04, "max_steps": 2})
    confirms = [s for s in p.path if s["phase"] == "confirm"]
    assert "2 choices made" in confirms[0]["reason"] and len(confirms) >= 2, [s["reason"] for s in p.path]
    assert all(s["length"] == 65536 and "wider than the target" in s["reason"] for s in confirms[1:])
    assert any(v["relative_interval"] > 0.04 for v in confirms[-1]["at_max"].values())  # the last one was needed
    assert all(v["relative_interval"] <= 0.04 for v in p.summary()["at_max"].values()), p.summary()["at_max"]
    assert p.outcome["inside"] and p.outcome["confirmations"] == len(confirms)
    text = sweep_confirmation(p.summary())
    assert text.startswith(f"The last of {len(confirms)} confirmations at 65,536") and "inside" in text, text


def test_the_budget_checks_scale_the_fits_time_by_how_far_the_sweep_ran_over_it():
    p = Planner(SETTINGS, PROTOCOL)
    assert p.overrun() == 1.0
    p.path = [{"predicted_s": None, "spent_s": 9.0}, {"predicted_s": 2.0, "spent_s": 2.5}, {"predicted_s": 2.0, "spent_s": 2.3}]
    assert p.overrun() == 4.8 / 4.0  # the first step (no fits yet, no prediction) counts for nothing
    p.path[1]["spent_s"] = 1.0
    assert p.overrun() == 1.0  # faster than predicted: the predictions as they are


def test_a_confirmation_that_misses_measures_around_the_miss():
    # decode three times slower from 32k on: the models of the shorter lengths miss at max
    p = run(SETTINGS, bend=lambda L: 3.0 if L >= 32768 else 1.0)
    assert p.outcome["inside"] is False and p.outcome["checks"]["decode"]["inside"] is False
    around = [s for s in p.path if s["phase"] == "around"]
    assert around and all("missed (decode" in s["reason"] for s in around)
    assert [s["length"] for s in around] == [32768, 16384] and all(s["trials"] == 3 for s in around)
    # each step its own time: around() logs both before either is measured
    assert all(s["spent_s"] > 0 and s["ok"] == 3 for s in around), around
