#!/usr/bin/env python3
"""A machine that drifts, two ways of asking "did the kernel edit make it slower?", over 1,000 seeds.

Trials are lognormal about a fixed centre with the log-sd each row and figure (TTFT, decode rate) showed in a default
run (tests/data/default_run_noise.json, as bench/version_gate.py draws them). The family is the default workflow's
A/B: every configuration of config/longctx.yaml that uses a kernel (4) x its 5 lengths x 2 figures, m = 40 rows, each
at longctx.analysis.compare.family_level(40, 0.95) = 0.99875; a regression is slower beyond the 5% margin.

- Run to run (what `longctx gate` compares today): two runs of unchanged code, 3 trials a side, each run with its own
  multiplicative drift drawn from 0-30% (times multiplied, rates divided), judged by longctx.analysis.compare.change
  as longctx.report.changes calls it (two-sided at the family's level), and one-sided (the same call at level
  2 x level - 1, whose bounds are the one-sided bounds at level), also with the margin raised by a 30% drift
  tolerance. Printed: the share of seeds whose family calls any row slower beyond the margin, and the share that
  finds a true 10% slowdown at one row.
- Interleaved A/B in one run: blocks of each side in ABBA order (longctx.analysis.paired.schedule), the run measured
  configuration by configuration, each block all 5 lengths (one server bring-up per block; --order blocks-inside
  puts the blocks of a length back to back instead). The run's own drift (0-30%) hits both sides; inside the run,
  on a time line of trials: a slow random walk (log-sd 10% over the run), a step of 0-30% at a random moment,
  a stretch of contention (5-25% of the run, 10-50% slower, trial noise x1.5 inside it), and each block its own
  moment (a factor shared by the block's trials, log-sd half the row's trial noise). Judged by
  paired.pair_differences' differences and paired.paired_change at the family's level. Printed per trials per
  block (k) and blocks per side (b): the family's false alarms (any row slower; any row a regression; any wrong
  verdict), the detection share of a true 10% slowdown at one row and figure (a TTFT row and a decode row, each
  at the default run's median noise of its figure: slower beyond the margin, and slower at all), and the coverage
  of the one-sided bounds at 95% (the gate's bound, the one on the faster side; both bounds together, nominal 90%).

Speed, without a copy of the verdict: each row's pair differences are computed for all seeds at once (the arithmetic
of pair_differences, checked against pair_differences itself on the first seeds' rows of every grid point), and
paired_change is called on every row that could be called slower or faster: a bound on the faster side clears 1
only where the row's t statistic exceeds t(level, n-1) > z(level), so a row whose |t| is under z(level) cannot be;
the test checks that shortcut against calling every row. Coverage calls paired_change on every row of the first
--cover-seeds seeds.

    python bench/ab_drift.py [--seeds 1000] [--cover-seeds 100] [--order lengths-inside|blocks-inside] [--no-within]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from scipy import special

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from longctx.analysis import compare, paired  # noqa: E402
from longctx.analysis.compare import FASTER, SLOWER, change, family_level  # noqa: E402

import version_gate  # noqa: E402  (bench/version_gate.py: the noise file and its draws)

CONFIG = ROOT / "config" / "longctx.yaml"
CONFIDENCE = 0.95
MARGIN = 0.05  # the gate's default margin (report.regression_margin)
SLOWDOWN = 1.10  # the true change the A/B must find
RUN_DRIFT = 0.30  # each run's own drift: a factor 1 + U(0, RUN_DRIFT) on every time of the run
TOLERANCE = 0.30  # a drift tolerance a cross-run gate could add to its margin (the suite's own gate test uses 30%)
FIGURES = (("ttft", True), ("decode", False))  # figure, smaller is faster
# Drift inside one run (on a time line of trials from 0 to 1): a random walk of this log-sd over the whole run, a step
# of up to STEP at a random moment, a stretch of contention (its length a share of the run, its slowdown, its effect
# on the trials' noise), and each block's own moment (log-sd as a share of the row's trial noise)
WITHIN = {"walk": 0.10, "step": 0.30, "stretch": (0.05, 0.25), "contention": (0.10, 0.50), "contention_noise": 1.5,
          "block": 0.5}
QUIET = {"walk": 0.0, "step": 0.0, "stretch": (0.0, 0.0), "contention": (0.0, 0.0), "contention_noise": 1.0,
         "block": 0.0}
GRID = {1: (2, 4, 8, 12, 16, 20, 24, 28), 2: (2, 4, 8, 12, 16, 20, 24), 3: (2, 4, 8, 12, 16, 20, 24)}
ORDERS = ("lengths-inside", "blocks-inside")


def family(config_path: str | Path = CONFIG) -> dict:
    """The default workflow's A/B family: the configurations that use a kernel, its lengths, and m = their product x 2
    figures."""
    config = yaml.safe_load(Path(config_path).read_text())
    configs = sorted(c for c, spec in config["configurations"].items() if spec.get("kernel"))
    lengths = list(config["lengths"])
    return {"configurations": configs, "lengths": lengths, "m": len(configs) * len(lengths) * len(FIGURES)}


def noise_table(rows: list[dict]) -> np.ndarray:
    """(rows, 2): each row's trial log-sd of TTFT and of decode rate."""
    return np.array([[r[f] for f, _ in FIGURES] for r in rows], float)


def median_rows(rows: list[dict]) -> list[tuple[int, int]]:
    """Per figure, the row whose noise is the figure's median over the rows (the upper one of an even count)."""
    out = []
    for f, (name, _) in enumerate(FIGURES):
        order = sorted(range(len(rows)), key=lambda r: rows[r][name])
        out.append((order[len(order) // 2], f))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Run to run: two runs of the table, each with its own drift, through compare.change


def run_to_run(rows: list[dict], seeds: int, trials: int = 3, slowed: tuple[int, int] | None = None,
               factor: float = 1.0, tag: int = 7) -> dict:
    """Over `seeds` seeds, two runs of the table (version_gate.draw, then the run's drift on every trial), `slowed`
    (row, figure) made `factor` slower in the second: unchanged (slowed None), the share of seeds whose family calls any
    row a regression (two-sided as changes.compare calls change; one-sided; one-sided with the margin raised by
    TOLERANCE); slowed, the share in which that row is found beyond the margin (each way)."""
    m = 2 * len(rows)
    level = family_level(m, CONFIDENCE)
    ways = {"two-sided": (level, MARGIN), "one-sided": (2 * level - 1, MARGIN),
            "one-sided+tolerance": (2 * level - 1, (1 + MARGIN) * (1 + TOLERANCE) - 1)}
    false_alarm = dict.fromkeys(ways, 0)
    found = dict.fromkeys(ways, 0)
    keys = [(r["configuration"], r["length"]) for r in rows]
    for seed in range(seeds):
        rng = np.random.default_rng([tag, seed])
        drift = 1 + rng.uniform(0, RUN_DRIFT, 2)
        before, now = version_gate.draw(rng, rows, trials), version_gate.draw(rng, rows, trials)
        sides = []
        for r, key in enumerate(keys):
            for f, (name, smaller) in enumerate(FIGURES):
                b, n = before[key][name], now[key][name]
                b, n = (b * drift[0], n * drift[1]) if smaller else (b / drift[0], n / drift[1])
                if (r, f) == slowed:
                    n = n * factor if smaller else n / factor
                # slower beyond the margin needs the ratio itself beyond it (the interval holds the ratio)
                slower_by = (np.log(n).mean() - np.log(b).mean()) * (1 if smaller else -1)
                sides.append((slower_by, r, f, b, n, smaller))
        sides.sort(key=lambda s: -s[0])
        for way, (lv, margin) in ways.items():
            for slower_by, r, f, b, n, smaller in sides if slowed is None else ():
                if slower_by <= math.log1p(margin):
                    break
                if change(b, n, smaller, lv, margin)["regression"] and (r, f) != slowed:
                    false_alarm[way] += 1
                    break
            if slowed is not None:
                s = next(s for s in sides if (s[1], s[2]) == slowed)
                found[way] += bool(change(s[3], s[4], s[5], lv, margin)["regression"])
    return {"seeds": seeds, "m": m, "level": level,
            "false_alarm": {w: v / seeds for w, v in false_alarm.items()} if slowed is None else None,
            "found": {w: v / seeds for w, v in found.items()} if slowed is not None else None}


# ---------------------------------------------------------------------------------------------------------------------
# The interleaved A/B: one run, blocks in ABBA order, drift between and within runs


def slots(blocks_per_side: int, trials_per_block: int, configs: int, lengths: int, order: str) -> np.ndarray:
    """Each trial's place on the run's time line (0 to 1), as an array (configs x lengths, 2 b blocks, k trials),
    rows configuration-major as the noise file's. lengths-inside: a configuration's blocks in turn, each measuring
    every length (one server bring-up per block); blocks-inside: a length's blocks back to back."""
    b2, k = 2 * blocks_per_side, trials_per_block
    c, l, j, i = np.meshgrid(np.arange(configs), np.arange(lengths), np.arange(b2), np.arange(k), indexing="ij")
    if order == "lengths-inside":
        slot = ((c * b2 + j) * lengths + l) * k + i
    elif order == "blocks-inside":
        slot = ((c * lengths + l) * b2 + j) * k + i
    else:
        raise ValueError(f"order: one of {ORDERS}")
    return slot.reshape(configs * lengths, b2, k)


def run_drift(rng, total: int, within: dict) -> tuple[np.ndarray, np.ndarray]:
    """One run's log drift at each of `total` trial slots (slower above 0) and each slot's noise factor."""
    t = np.arange(total) / total
    drift = np.full(total, math.log1p(rng.uniform(0, RUN_DRIFT)))  # the run's own: the same on both sides
    if within["walk"]:
        drift += np.cumsum(rng.normal(0, within["walk"] / math.sqrt(total), total))
    if within["step"]:
        drift += (t >= rng.uniform()) * math.log1p(rng.uniform(0, within["step"]))
    noise = np.ones(total)
    if within["stretch"][1]:
        start, span = rng.uniform(), rng.uniform(*within["stretch"])
        inside = (t >= start) & (t < start + span)
        drift += inside * math.log1p(rng.uniform(*within["contention"]))
        noise[inside] = within["contention_noise"]
    return drift, noise


def ab_logs(rows: list[dict], seeds: range, blocks_per_side: int, trials_per_block: int, within: dict = WITHIN,
            order: str = "lengths-inside", slowed: dict | None = None, only: list[tuple[int, int]] | None = None,
            tag: int = 11, sides: list[str] | None = None) -> np.ndarray:
    """The log values of every trial, (seeds, rows, figures, 2 b blocks, k), in schedule order: each seed one run of
    the whole A/B (every configuration, length and block on one time line), its drift hitting both sides; B is
    slowed by slowed[(row, figure)] where given. only: the (row, figure)s to return (others are left NaN). sides: the
    blocks' sides in the order measured (default paired.schedule: ABBA...)."""
    sigma = noise_table(rows)
    n_rows = len(rows)
    lengths = len({r["length"] for r in rows})
    place = slots(blocks_per_side, trials_per_block, n_rows // lengths, lengths, order)
    total = place.size
    side_b = np.array([s == "B" for s in (sides or paired.schedule(blocks_per_side))])
    out = np.full((len(seeds), n_rows, len(FIGURES), 2 * blocks_per_side, trials_per_block), np.nan)
    for s_i, seed in enumerate(seeds):
        rng = np.random.default_rng([tag, seed])
        drift, noisier = run_drift(rng, total, within)
        d, z = drift[place], noisier[place]  # (rows, blocks, k)
        block = rng.normal(0, 1, (n_rows, len(FIGURES), 2 * blocks_per_side, 1)) * within["block"]
        trial = rng.normal(0, 1, (n_rows, len(FIGURES), 2 * blocks_per_side, trials_per_block))
        for f, (_, smaller) in enumerate(FIGURES):
            sign = 1 if smaller else -1  # a slower machine: times up, rates down
            out[s_i, :, f] = sign * d + sigma[:, f, None, None] * (block[:, f] + z * trial[:, f])
    for (r, f), factor in (slowed or {}).items():
        out[:, r, f] += side_b[:, None] * (1 if FIGURES[f][1] else -1) * math.log(factor)
    if only is not None:
        keep = np.zeros(out.shape[1:3], bool)
        for r, f in only:
            keep[r, f] = True
        out[:, ~keep] = np.nan
    return out


def differences(logs: np.ndarray, blocks_per_side: int) -> np.ndarray:
    """pair_differences' arithmetic over all seeds at once: per pair of neighbouring blocks, mean log B - mean log A.
    logs: (..., 2 b, k) in schedule order; returns (..., b)."""
    means = logs.mean(axis=-1).reshape(*logs.shape[:-2], blocks_per_side, 2)
    first_is_a = np.array([s == "A" for s in paired.schedule(blocks_per_side)[::2]])
    return np.where(first_is_a, means[..., 1] - means[..., 0], means[..., 0] - means[..., 1])


def check_differences(logs: np.ndarray, d: np.ndarray, blocks_per_side: int, seeds: int = 3) -> None:
    """The vectorised differences against pair_differences itself on every row of the first seeds."""
    order = paired.schedule(blocks_per_side)
    for s in range(min(seeds, logs.shape[0])):
        for r in range(logs.shape[1]):
            for f in range(logs.shape[2]):
                if np.isnan(logs[s, r, f]).any():
                    continue
                got, dropped = paired.pair_differences([(side, np.exp(logs[s, r, f, j])) for j, side in enumerate(order)])
                if dropped or not np.allclose(got, d[s, r, f], rtol=0, atol=1e-12):
                    raise AssertionError(f"pair_differences {got} != {d[s, r, f]} (seed {s}, row {r}, figure {f})")


def t_statistic(d: np.ndarray) -> np.ndarray:
    """Each row's t statistic of its differences (the last axis), for the shortcut only: no verdict is made here."""
    n = d.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return d.mean(axis=-1) / (d.std(axis=-1, ddof=1) / math.sqrt(n))


def verdicts(d: np.ndarray, level: float, margin: float = MARGIN, every: bool = False) -> dict:
    """paired_change's verdict for every row of d (seeds, rows, figures, b): slower, regression and wrong (slower or
    faster) as boolean arrays. Unless `every`, it is called only on the rows whose |t| exceeds z(level): a row under
    it cannot have a bound on the faster side clear 1 (t(level, n - 1) > z(level)), so it is neither."""
    shape = d.shape[:-1]
    slower, regression, wrong = np.zeros(shape, bool), np.zeros(shape, bool), np.zeros(shape, bool)
    t = t_statistic(d)
    call = np.ones(shape, bool) if every else ~(np.abs(t) <= special.ndtri(level) * (1 - 1e-9))
    for idx in zip(*np.nonzero(call)):
        c = paired.paired_change(d[idx], FIGURES[idx[-1]][1], level, margin)
        slower[idx] = c["verdict"] == SLOWER
        regression[idx] = c["regression"]
        wrong[idx] = c["verdict"] in (SLOWER, FASTER)
    return {"slower": slower, "regression": regression, "wrong": wrong, "called": int(call.sum())}


def coverage(d: np.ndarray, level: float, truth: float = 1.0) -> dict:
    """Over every row of d, the share whose one-sided bounds at `level` (paired_change's ci) hold the true ratio
    B/A: the gate's bound (on the faster side: a time's low, a rate's high), and both at once."""
    gate = both = 0
    rows = 0
    for idx in np.ndindex(*d.shape[:-1]):
        smaller = FIGURES[idx[-1]][1]
        lo, hi = paired.paired_change(d[idx], smaller, level, MARGIN)["ci"]
        truth_f = truth if smaller else 1 / truth
        holds_gate = lo <= truth_f if smaller else hi >= truth_f
        gate += holds_gate
        both += lo <= truth_f <= hi
        rows += 1
    return {"gate": gate / rows, "both": both / rows, "rows": rows}


def interleaved(rows: list[dict], seeds: int, blocks_per_side: int, trials_per_block: int, within: dict = WITHIN,
                order: str = "lengths-inside", cover_seeds: int = 100, factor: float = SLOWDOWN,
                check: bool = True) -> dict:
    """The A/B over `seeds` seeds at b blocks per side and k trials per block: unchanged code (the family's false
    alarms, and coverage over the first cover_seeds), then the median-noise TTFT and decode rows made `factor`
    slower (each row's verdict depends on its own data only, the level being the family's)."""
    m = 2 * len(rows)
    level = family_level(m, CONFIDENCE)
    null = ab_logs(rows, range(seeds), blocks_per_side, trials_per_block, within, order)
    d = differences(null, blocks_per_side)
    if check:
        check_differences(null, d, blocks_per_side)
    v = verdicts(d, level)
    per_seed = {key: v[key].reshape(seeds, -1).any(axis=1).mean() for key in ("slower", "regression", "wrong")}
    cov = coverage(d[:cover_seeds], CONFIDENCE) if cover_seeds else None
    targets = median_rows(rows)
    slow = ab_logs(rows, range(seeds), blocks_per_side, trials_per_block, within, order,
                   slowed={t: factor for t in targets}, only=targets, tag=13)
    ds = differences(slow, blocks_per_side)
    found = {}
    for r, f in targets:
        got = [paired.paired_change(ds[s, r, f], FIGURES[f][1], level, MARGIN) for s in range(seeds)]
        found[FIGURES[f][0]] = {"row": (rows[r]["configuration"], rows[r]["length"]), "noise": rows[r][FIGURES[f][0]],
                                "regression": sum(c["regression"] for c in got) / seeds,
                                "slower": sum(c["verdict"] == SLOWER for c in got) / seeds,
                                "detectable": statistics.median(c["detectable"] for c in got)}
    return {"seeds": seeds, "blocks": blocks_per_side, "trials": trials_per_block, "m": m, "level": level,
            "false_alarm": per_seed, "called": v["called"], "coverage": cov, "found": found}


def recommend(results: list[dict], need: float = 0.8) -> dict[int, int | None]:
    """Per trials per block, the fewest blocks per side in the grid at which both median rows are found beyond the
    margin in `need` of seeds (the family's false alarms are printed beside: they hold at every count, at the
    nominal 4.9% for "slower" at all, which 1,000 seeds measure to about 0.7%)."""
    out: dict[int, int | None] = {}
    for r in results:
        ok = all(f["regression"] >= need for f in r["found"].values())
        if ok and out.get(r["trials"]) is None:
            out[r["trials"]] = r["blocks"]
        out.setdefault(r["trials"], None)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=1000)
    p.add_argument("--cover-seeds", type=int, default=100, help="seeds whose every row's coverage is judged")
    p.add_argument("--order", choices=ORDERS, default="lengths-inside")
    p.add_argument("--no-within", action="store_true", help="no drift inside the run (only the run's own)")
    p.add_argument("--trials-per-block", type=int, nargs="+", default=sorted(GRID))
    a = p.parse_args()
    return report(a)


def report(a) -> int:
    t0 = time.perf_counter()
    rows = version_gate.load_noise()
    fam = family()
    assert fam["m"] == 2 * len(rows), (fam, len(rows))
    level = family_level(fam["m"], CONFIDENCE)
    print(f"family: {len(fam['configurations'])} configurations with a kernel x {len(fam['lengths'])} lengths x 2 figures "
          f"= m {fam['m']}, each at {level:.5f}; margin {MARGIN:.0%}; {a.seeds} seeds; noise: "
          + ", ".join(f"{f} median {statistics.median(r[f] for r in rows):.1%}" for f, _ in FIGURES))
    targets = median_rows(rows)
    slowed = targets[0]
    print(f"\nrun to run, 3 trials a side, each run's drift 0-{RUN_DRIFT:.0%}, unchanged code / {SLOWDOWN - 1:.0%} slower "
          f"TTFT at {rows[slowed[0]]['configuration']} {rows[slowed[0]]['length']:,} (compare.change):")
    null = run_to_run(rows, a.seeds)
    slow = run_to_run(rows, a.seeds, slowed=slowed, factor=SLOWDOWN, tag=8)
    for way in null["false_alarm"]:
        print(f"  {way:>20}: any row a regression in {null['false_alarm'][way]:6.1%} of seeds; the slowed row found in "
              f"{slow['found'][way]:6.1%}")
    within = QUIET if a.no_within else WITHIN
    print(f"\ninterleaved A/B in one run (ABBA, {a.order}; drift: the run's 0-{RUN_DRIFT:.0%}"
          + ("" if a.no_within else f", within it: walk {within['walk']:.0%}, step 0-{within['step']:.0%}, contention "
             f"{within['contention'][0]:.0%}-{within['contention'][1]:.0%} over {within['stretch'][0]:.0%}-"
             f"{within['stretch'][1]:.0%} of the run, block moment {within['block']:g} x noise") + "), paired_change:")
    names = {FIGURES[f][0]: f"{rows[r]['configuration']} {rows[r]['length']:,} ({rows[r][FIGURES[f][0]]:.1%})"
             for r, f in targets}
    print(f"  {SLOWDOWN - 1:.0%} slower: TTFT at {names['ttft']}, decode at {names['decode']}; found = beyond the margin "
          "(slower at all)")
    print(f"  {'k':>2} {'b':>3} {'trials':>6} | {'false alarms: slower  regr  wrong':>33} | {'TTFT found':>15} "
          f"{'decode found':>15} | {'coverage 95%: gate  both':>24}")
    results = []
    for k in a.trials_per_block:
        for b in GRID.get(k, GRID[1]):
            r = interleaved(rows, a.seeds, b, k, within, a.order, a.cover_seeds)
            results.append(r)
            fa, fd, cv = r["false_alarm"], r["found"], r["coverage"]
            print(f"  {k:>2} {b:>3} {b * k:>6} | {fa['slower']:>19.1%} {fa['regression']:>5.1%} {fa['wrong']:>6.1%} | "
                  f"{fd['ttft']['regression']:>6.1%} ({fd['ttft']['slower']:>5.1%}) {fd['decode']['regression']:>6.1%} "
                  f"({fd['decode']['slower']:>5.1%}) | {cv['gate']:>17.1%} {cv['both']:>5.1%}")
    rec = recommend(results)
    print("\nfewest blocks per side for 80% detection of a 10% slowdown beyond the margin at the median noise: "
          + ", ".join(f"{b if b else 'more than ' + str(max(GRID.get(k, GRID[1])))} at {k} trial{'s' * (k > 1)} per "
                      f"block" for k, b in rec.items()))
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
