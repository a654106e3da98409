"""The interleaved A/B's statistics (longctx.analysis.paired) against truths the code did not make: hand-derived
figures (the ABBA order, pair differences of hand-written blocks, Student's t in closed form), and a machine that
drifts, simulated by bench/ab_drift.py at the default run's noise (tests/data/default_run_noise.json): a per-run drift
of 0-30% between runs and, inside one run, a random walk, a step, a stretch of contention and each block's own moment.

The figures the thresholds come from (bench/ab_drift.py, 1,000 seeds; docs/benchmarks.md has the table): the
interleaved A/B's family (m = 40) calls unchanged code slower beyond the 5% margin in at most 0.2% of seeds from 4 blocks
a side, and slower at all in 2.7% to 5.2% (the nominal rate of 40 one-sided bounds at 0.99875 is 4.9%; the 5.2% reads
4.1% over 5,000 seeds); at the recommended counts it finds a 10% slowdown at one row beyond the margin in 82.5% and 89.0%
of seeds (TTFT and decode at the median noise; 24 blocks of 1 trial a side) and 84.9% and 86.7% (20 blocks of 3
trials); its one-sided bounds at 95% hold the truth in 94.7% to 96.6% of rows. Two runs compared across time call
unchanged code slower beyond the margin in 27% of seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from longctx.analysis import paired
from longctx.analysis.compare import FASTER, NO_INTERVAL, SAME, SLOWER, change, family_level

from .conftest import bench_script

ab = bench_script("ab_drift")
ROWS = ab.version_gate.load_noise()
LEVEL = family_level(40, 0.95)
RECOMMENDED = [(24, 1), (20, 3)]  # blocks per side, trials per block


# Hand-derived figures


def test_the_schedule_is_abba():
    assert paired.schedule(3) == list("ABBAAB")
    assert paired.schedule(2) == list("ABBA")
    assert paired.schedule(4) == list("ABBAABBA")
    assert paired.schedule(1) == paired.schedule(0) == list("AB")


def test_pair_differences_of_hand_written_blocks():
    blocks = [("A", [10.0, 10.0]), ("B", [11.0, 11.0]),   # log 11 - log 10
              ("B", [6.0, 24.0]), ("A", [8.0, 18.0]),     # geometric means 12 and 12: 0
              ("A", []), ("B", [5.0]),                    # an empty block: the pair is dropped
              ("B", [12.0, 0.0, -1.0, float("nan")]), ("A", [10.0]),  # only the positive, finite values: log 12 - log 10
              ("A", [1.0]), ("A", [2.0]),                 # not one of each side: dropped
              ("B", [3.0])]                               # no neighbour: dropped
    d, dropped = paired.pair_differences(blocks)
    assert d == pytest.approx([math.log(1.1), 0.0, math.log(1.2)], abs=1e-15)
    assert dropped == 3


def t_quantile_2_dof(p: float) -> float:
    """Student's t at 2 degrees of freedom in closed form: F(t) = 1/2 + t / (2 sqrt(2 + t^2))."""
    u = 2 * p - 1
    return u * math.sqrt(2 / (1 - u * u))


def test_a_paired_bound_is_the_t_formula_by_hand():
    d = [0.10, 0.04, 0.07]  # mean 0.07, sd 0.03 (deviations 0.03, -0.03, 0)
    half = t_quantile_2_dof(0.95) * 0.03 / math.sqrt(3)  # 2.919986 x 0.03 / sqrt(3) = 0.0505756
    assert half == pytest.approx(0.0505756, abs=1e-7)
    c = paired.paired_change(d, True, 0.95, 0.05, trials=(6, 5))
    assert c["ratio"] == pytest.approx(math.exp(0.07))
    assert c["ci"] == pytest.approx([math.exp(0.07 - half), math.exp(0.07 + half)], rel=1e-9)
    assert c["noise"] == pytest.approx(0.03) and c["pairs"] == 3 and (c["trials"], c["trials_before"]) == (6, 5)
    # a time: B/A = 1.0196 to 1.128: slower, but its faster bound (1.0196) is not beyond 1.05
    assert c["verdict"] == SLOWER and not c["regression"] and c["threshold"] == pytest.approx(1.05)
    assert paired.paired_change(d, True, 0.95, 0.01)["regression"]  # beyond 1%: 1.0196 > 1.01
    assert not paired.paired_change(d, True, 0.95, 0.01, tolerance=0.01)["regression"]  # 1.0196 < 1.01 x 1.01
    # a rate: the same differences are B faster
    r = paired.paired_change(d, False, 0.95, 0.05)
    assert r["verdict"] == FASTER and r["speedup_ci"] == pytest.approx(c["ci"]) and not r["regression"]
    # 1 degree of freedom: t = tan(pi (p - 1/2)), 254.6 at the family's level of 40
    two = paired.paired_change([0.10, 0.04], True, LEVEL, 0.05)
    half = math.tan(math.pi * (LEVEL - 0.5)) * np.std([0.10, 0.04], ddof=1) / math.sqrt(2)
    assert two["ci"] == pytest.approx([math.exp(0.07 - half), math.exp(0.07 + half)], rel=1e-9) and two["verdict"] == SAME
    one = paired.paired_change([0.1], True, 0.95, 0.05)
    assert one["ci"] is None and one["verdict"] == NO_INTERVAL and one["detectable"] is None
    assert paired.paired_change([], True, 0.95, 0.05) is None


@pytest.mark.parametrize("noise, pairs", [(0.03, 8), (0.02, 20)])
def test_the_detectable_change_is_found_in_4_of_5_reruns(noise, pairs):
    """A true change of exactly `detectable`, drawn 20,000 times and judged by the one-sided t bound at the family's
    level (written here from the formula, not paired's code): found beyond the margin in 80% of draws."""
    rng = np.random.default_rng(5)
    det = paired.detectable(noise, pairs, LEVEL, 1.05)
    d = rng.normal(math.log1p(det), noise, (20000, pairs))
    t = t_quantile(LEVEL, pairs - 1)
    low = d.mean(axis=1) - t * d.std(axis=1, ddof=1) / math.sqrt(pairs)
    assert (low > math.log(1.05)).mean() == pytest.approx(0.8, abs=0.015)


def t_quantile(p: float, dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(p, dof))


# The simulation: the figures that the A/B is for


def test_the_family_is_the_default_workflows_40_rows():
    fam = ab.family()
    assert fam["configurations"] == ["page1-scattered", "page1-twin", "page64", "page64-ngram"]
    assert len(fam["lengths"]) == 5 and fam["m"] == 40 == 2 * len(ROWS)


def test_the_shortcut_and_the_vectorised_differences_are_paireds_own():
    """The bench computes the pair differences for all seeds at once and skips rows whose |t| is under z(level): on
    60 seeds x 40 rows, the differences are pair_differences' and the verdicts those of calling every row."""
    logs = ab.ab_logs(ROWS, range(60), 4, 2)
    d = ab.differences(logs, 4)
    ab.check_differences(logs, d, 4, seeds=60)
    for level in (LEVEL, 0.95):
        fast, every = ab.verdicts(d, level), ab.verdicts(d, level, every=True)
        assert fast["called"] < every["called"]
        for key in ("slower", "regression", "wrong"):
            assert (fast[key] == every[key]).all(), key
        assert every["wrong"].sum() > 0 if level == 0.95 else True


def test_run_to_run_calls_unchanged_code_slower_often():
    """Two runs of unchanged code, each with its own drift of 0-30%, compared as the gate compares versions: some row is
    a regression beyond the 5% margin in far more than 5% of seeds (27% over 1,000), one-sided or two-sided."""
    null = ab.run_to_run(ROWS, 200)
    assert null["false_alarm"]["two-sided"] > 0.2 and null["false_alarm"]["one-sided"] > 0.2, null


def test_without_drift_between_the_runs_the_same_check_passes(monkeypatch):
    """The check above fails for the drift, not for the trials: with no drift between runs, at most 5%."""
    monkeypatch.setattr(ab, "RUN_DRIFT", 0.0)
    null = ab.run_to_run(ROWS, 200)
    assert null["false_alarm"]["two-sided"] <= 0.05, null


@pytest.mark.parametrize("blocks, trials", RECOMMENDED)
def test_interleaved_holds_its_family_finds_10_percent_and_covers(blocks, trials):
    """1,000 seeds of one run with drift between and within runs, at the recommended blocks: the family calls
    unchanged code slower in at most 5% of seeds (seen: 3.2% and 4.1%) and a regression in none; a 10% slowdown at
    one length and figure at the median noise is found beyond the 5% margin in at least 80% of seeds (seen: 82.5-89%);
    the one-sided bounds at 95% hold the truth in 95% of rows, within 2 points (seen: 95.4% and 95.8%)."""
    r = ab.interleaved(ROWS, 1000, blocks, trials, cover_seeds=100)
    assert r["false_alarm"]["slower"] <= 0.05 and r["false_alarm"]["regression"] == 0, r["false_alarm"]
    assert all(f["regression"] >= 0.8 for f in r["found"].values()), r["found"]
    assert abs(r["coverage"]["gate"] - 0.95) <= 0.02 and abs(r["coverage"]["both"] - 0.90) <= 0.025, r["coverage"]


def test_without_drift_inside_the_run_coverage_is_nominal():
    """No drift inside the run (the run's own cancels in every pair): the one-sided bound holds in 95% of rows within
    a point (t on normal differences is exact)."""
    d = ab.differences(ab.ab_logs(ROWS, range(250), 8, 1, ab.QUIET), 8)
    assert abs(ab.coverage(d, 0.95)["gate"] - 0.95) <= 0.01


# Each check can fail


def test_too_few_blocks_miss_the_slowdown():
    r = ab.interleaved(ROWS, 300, 4, 3, cover_seeds=0, check=False)
    assert all(f["regression"] < 0.2 for f in r["found"].values()), r["found"]


def trial_differences(logs: np.ndarray, blocks: int) -> np.ndarray:
    """Trials paired as if independent: the i-th trial of each pair's B block against the i-th of its A block, every
    such difference a replicate (n = blocks x trials), ignoring that a block's trials share its moment."""
    k = logs.shape[-1]
    pairs = logs.reshape(*logs.shape[:-2], blocks, 2, k)
    first_is_a = np.array([s == "A" for s in paired.schedule(blocks)[::2]])[:, None]
    d = np.where(first_is_a, pairs[..., 1, :] - pairs[..., 0, :], pairs[..., 0, :] - pairs[..., 1, :])
    return d.reshape(*logs.shape[:-2], blocks * k)


def test_the_unit_of_replication_matters_when_blocks_share_drift():
    """The same runs judged with trials as the unit (blocks ignored): the bound at 95% under-covers by several points
    and the family calls unchanged code slower in far more than 5% of seeds; the pair of blocks as the unit covers.
    Where a block's trials share nothing (no drift inside the run, no block moment) the trial unit would be right."""
    blocks, k = 12, 3
    logs = ab.ab_logs(ROWS, range(400), blocks, k)
    by_trial, by_pair = trial_differences(logs, blocks), ab.differences(logs, blocks)
    assert ab.coverage(by_trial[:100], 0.95)["gate"] < 0.92  # seen: 87.9%
    assert abs(ab.coverage(by_pair[:100], 0.95)["gate"] - 0.95) <= 0.02
    alarms = ab.verdicts(by_trial, LEVEL)["slower"].reshape(400, -1).any(axis=1).mean()
    assert alarms > 0.10, alarms  # seen: 29% (by the pair: 4%)


def test_ignoring_the_pairs_over_covers_and_loses_the_slowdown():
    """All of A's trials against all of B's (Welch, compare.change, as if the blocks were not paired): drift inside the
    run widens both sides' spread though it cancels in the difference, so its one-sided 95% bound over-covers and the
    10% slowdown is found far less often than by the pairs, from the same trials (seen: 98.6% coverage; found in 48.5%
    of seeds against 81.5%)."""
    blocks, k = 24, 1
    logs = ab.ab_logs(ROWS, range(50), blocks, k)
    side_b = np.array([s == "B" for s in paired.schedule(blocks)])
    held = rows = 0
    for s in range(50):
        for r in range(len(ROWS)):
            for f, (_, smaller) in enumerate(ab.FIGURES):
                v = np.exp(logs[s, r, f])
                c = change(v[~side_b].ravel(), v[side_b].ravel(), smaller, 0.90, ab.MARGIN)  # one-sided 95% bounds
                held += c["ci"][0] <= 1 if smaller else c["ci"][1] >= 1
                rows += 1
    assert held / rows > 0.975, held / rows  # nominal 0.95
    (row, f) = ab.median_rows(ROWS)[0]
    slow = ab.ab_logs(ROWS, range(200), blocks, k, slowed={(row, f): ab.SLOWDOWN}, only=[(row, f)], tag=13)
    welch = sum(change(np.exp(slow[s, row, f][~side_b]).ravel(), np.exp(slow[s, row, f][side_b]).ravel(), True, LEVEL,
                       ab.MARGIN)["regression"] for s in range(200)) / 200
    pairs = sum(paired.paired_change(d, True, LEVEL, ab.MARGIN)["regression"]
                for d in ab.differences(slow, blocks)[:, row, f]) / 200
    assert pairs >= 0.8 and welch < pairs - 0.2, (pairs, welch)


def test_not_interleaving_inside_one_run_is_fooled_by_its_drift():
    """One run, but all of A's blocks first and then all of B's (AAAA BBBB), paired in order: a step or a stretch of
    contention between the halves lands on one side, and the family calls unchanged code slower in far more than 5%
    of seeds. Interleaved (ABBA), the same drift cancels."""
    blocks = 8
    sides = ["A"] * blocks + ["B"] * blocks
    logs = ab.ab_logs(ROWS, range(400), blocks, 1, sides=sides)
    d = logs[..., blocks:, :].mean(axis=-1) - logs[..., :blocks, :].mean(axis=-1)
    alarms = ab.verdicts(d, LEVEL)["slower"].reshape(400, -1).any(axis=1).mean()
    assert alarms > 0.2, alarms
