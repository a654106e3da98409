"""The prediction check (longctx.analysis.fits.prediction_check, longctx.report.wording.prediction): the models fitted
to the shorter lengths against the longer ones, on data whose answer is known by construction."""

import os
import re

import numpy as np
import pandas as pd
import pytest

from longctx.analysis.fits import prediction_check
from longctx.core.fitting import regime_change_in
from longctx.report import wording

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]
SEEDS = int(os.environ.get("LONGCTX_COVERAGE_SEEDS", 500))  # the coverage test's seeds


def rows(ttft, step, noise=0.01, trials=3, seed=0):
    rng = np.random.default_rng(seed)
    out = [{"length": L, "ttft_s": ttft(L) * (1 + noise * rng.standard_normal()), "step_s": step(L) * (1 + noise * rng.standard_normal())}
           for L in LENGTHS for _ in range(trials)]
    return pd.DataFrame(out)


def test_models_that_hold_predict_the_longest_length_inside_their_intervals():
    # TTFT = 0.05 + 2e-5 L + 1e-9 L^2 and step = 0.01 + 1e-7 L, with 0.2% noise: at 32k the TTFT is 1.78 s, the step
    # 13.3 ms (with 1% noise the quadratic term, a tenth of 4k's TTFT, is too loose to carry 8x further within 5%)
    g = rows(lambda L: 0.05 + 2e-5 * L + 1e-9 * L**2, lambda L: 0.01 + 1e-7 * L, noise=0.002)
    check = prediction_check({"prefill": g, "decode": g}, 0.95)
    head = check["prefill"]["headline"]
    # the first half: 3 of the 6 lengths (up to 4,096) predict 32,768
    assert (head["fitted_up_to"], head["length"], head["lengths_fitted"]) == (4096, 32768, 3)
    assert head["measured"] == pytest.approx(0.05 + 2e-5 * 32768 + 1e-9 * 32768**2, rel=0.03)
    assert abs(head["deviation"]) < 0.05 and head["inside"]
    dec = check["decode"]["headline"]
    assert dec["fitted_up_to"] == 4096 and abs(dec["rate_deviation"]) < 0.05 and dec["inside"]
    # every cut: from as many lengths as the model has coefficients to all but the last
    assert [c["lengths_fitted"] for c in check["prefill"]["cuts"]] == [3, 4, 5]
    assert [len(c["predictions"]) for c in check["decode"]["cuts"]] == [4, 3, 2, 1]
    fit = {"prediction": check, "prefill": {"regime_change": None}, "decode": {"regime_change": None}}
    said = wording.prediction(fit)
    assert said["sentence"].startswith("Fitted up to 4,096 tokens, the models predicted 32,768's TTFT within ")
    assert said["sentence"].count("inside its interval") == 2 and said["missed"] == []


def test_a_miss_is_tied_to_the_regime_change_it_is():
    # decode steps twice as long from 16k on (by construction): the rate there is half the model's, -50%
    g = rows(lambda L: 0.05 + 2e-5 * L, lambda L: (0.01 + 1e-7 * L) * (2 if L >= 16384 else 1))
    check = prediction_check({"prefill": None, "decode": g}, 0.95)
    head = check["decode"]["headline"]
    assert head["inside"] is False and head["rate_deviation"] == pytest.approx(-0.5, abs=0.03)
    rc = regime_change_in("decode", check["decode"]["cuts"], 0.2)  # as longctx.analysis.fits finds it
    assert rc["from_length"] == 16384 and rc["direction"] == "slower"
    said = wording.prediction({"prediction": check, "decode": {"regime_change": rc}})
    assert re.search(r"decode rate within 5\d% \(outside its interval, 5\d% slower than predicted: the regime change "
                     r"detected from 16,384 tokens\)", said["sentence"]), said["sentence"]
    assert said["missed"] == ["decode"]
    # one odd length, no trend: said to be no regime change
    g = rows(lambda L: 0.05, lambda L: (0.01 + 1e-7 * L) * (2 if L == 32768 else 1))
    check = prediction_check({"decode": g}, 0.95)
    said = wording.prediction({"prediction": check, "decode": {"regime_change": None}})
    assert "with no regime change detected" in said["sentence"]


def test_too_few_lengths_check_nothing():
    g = rows(lambda L: 0.05, lambda L: 0.01)[lambda d: d["length"] <= 4096]
    assert prediction_check({"prefill": g, "decode": g.iloc[:0]}, 0.95) == {}
    assert wording.prediction({"prediction": {}}) is None


@pytest.mark.parametrize("noise", [0.02, 0.05, 0.1, 0.3])
def test_the_prediction_interval_covers_the_held_out_median_as_often_as_it_states(noise):
    """Issue 32: 'inside its interval' must hold as often as the 95% it states, 93% to 97%. Models that hold exactly,
    3 trials a length, relative noise of 2% to 30% over a floor (2 ms on TTFT, 0.2 ms on a step): the headline's
    held-out median (the longest length, predicted from the first half) falls inside its prediction interval in
    94.2-96.4% of 500 seeds (the suite's), 94.4-95.9% of 1,000 (LONGCTX_COVERAGE_SEEDS=1000). Before: the curve's
    interval alone (which leaves out the held-out median's own noise) held 90% at 2% noise; the textbook interval
    on the non-negative fits held 97% at 2%, 98% at 5% and 100% at 30% (a coefficient the shorter lengths barely
    resolve, held at 0, leaves it too wide)."""
    inside = {"prefill": [], "decode": []}
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        L = np.repeat(LENGTHS, 3).astype(float)
        t, s = 0.05 + 2e-5 * L + 1e-9 * L**2, 0.01 + 1e-7 * L
        g = pd.DataFrame({"length": L, "ttft_s": t + np.hypot(noise * t, 0.002) * rng.standard_normal(L.size),
                          "step_s": s + np.hypot(noise * s, 0.0002) * rng.standard_normal(L.size)})
        check = prediction_check({"prefill": g, "decode": g}, 0.95)
        for kind in inside:
            inside[kind].append(check[kind]["headline"]["inside"])
    rates = {kind: float(np.mean(v)) for kind, v in inside.items()}
    print(f"\nnoise {noise:.0%}: inside {rates}")
    assert all(0.93 <= r <= 0.97 for r in rates.values()), rates
