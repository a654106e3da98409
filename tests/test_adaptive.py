"""The adaptive sweep's planner (longctx.measure.adaptive) against a server whose times are known by construction:
TTFT = 0.02 + 2e-5 L + 4e-10 L^2 s and TPOT = 2e-3 + 1e-7 L s, each trial off by a seeded 2% noise."""

import numpy as np

from longctx.measure.adaptive import Planner, grid

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
    assert sum(s["phase"] == "choose" for s in p.path) == 4 and "4 choices made" in p.path[-1]["reason"]


def test_a_confirmation_that_misses_measures_around_the_miss():
    # decode three times slower from 32k on: the models of the shorter lengths miss at max
    p = run(SETTINGS, bend=lambda L: 3.0 if L >= 32768 else 1.0)
    assert p.outcome["inside"] is False and p.outcome["checks"]["decode"]["inside"] is False
    around = [s for s in p.path if s["phase"] == "around"]
    assert around and all("missed (decode" in s["reason"] for s in around)
    assert [s["length"] for s in around] == [32768, 16384] and all(s["trials"] == 3 for s in around)
