#!/usr/bin/env python3
"""How often the version comparison (longctx.report.changes.compare, what `longctx gate` fails on) calls unchanged code
slower, and how often it finds a real slowdown, by simulation at the noise a real run shows.

Each seed draws two versions of a table of configurations and lengths: every trial lognormal about a fixed centre,
with the log-sd that row and figure (TTFT, decode rate) showed in a real run (tests/data/default_run_noise.json: the
default workflow, config/longctx.yaml, 4 configurations by 5 lengths, 3 trials each), then compares them through the
very code the report and the gate use. Unchanged: the share of seeds with any wrong verdict (a false "slower" or a false
"faster": two one-sided families, each held at 5%), any "slower", any regression. Slowed by a factor at every row and figure (under Bonferroni a row's verdict does not depend on the other
rows' data, so one pass gives every row's detection rate): the share of seeds where each is found slower beyond the
margin, beside the smallest change each row could show (detectable_change at its true noise) and what the report said.

    python bench/version_gate.py [--seeds 1000] [--trials 3 5] [--slowdown 1.3]
    python bench/version_gate.py --results data/results.csv --write-noise tests/data/default_run_noise.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.analysis.compare import FASTER, MARGIN, METRICS, SLOWER, detectable_change, family_level  # noqa: E402
from longctx.report import changes  # noqa: E402

NOISE = ROOT / "tests" / "data" / "default_run_noise.json"
CENTRES = {"ttft": 0.5, "decode": 400.0}  # any positive centres: the comparison reads ratios


def noise_of(results_csv: str | Path) -> list[dict]:
    """Per configuration and length of a results.csv: the log-sd of its successful single-request trials' TTFT
    and decode rate, and their count."""
    import pandas as pd

    from longctx.analysis.tables import ok_rows

    ok = ok_rows(pd.read_csv(results_csv))
    out = []
    for (c, length), g in ok.groupby(["configuration", "length"], sort=True):
        out.append({"configuration": str(c), "length": int(length), "trials": int(len(g)),
                    "ttft": float(np.log(g["ttft_s"]).std(ddof=1)), "decode": float(np.log(g["decode_tok_s"]).std(ddof=1))})
    return out


def load_noise(path: str | Path = NOISE) -> list[dict]:
    return json.loads(Path(path).read_text())["rows"]


def record(n: int, trials: dict[tuple[str, int], dict[str, np.ndarray]]) -> dict:
    """A version record as longctx.report.versions keeps one, with these trials and one identity for all."""
    identity = {"engine": "reference", "engine_version": "0.1.0", "hardware": {"cpu": "sim"}, "model": {"name": "m"},
                "settings": {"engine": "reference"}, "settings_scheme": 2, "kernel": None, "spec_hash": "h"}
    rows = [{"configuration": c, "length": length, "trial": i, "run_id": f"run{n}", "ttft_s": float(v["ttft"][i]),
             "tpot_s": float(1 / v["decode"][i]), "decode_tok_s": float(v["decode"][i])}
            for (c, length), v in trials.items() for i in range(len(v["ttft"]))]
    return {"n": n, "hash": f"{n:012d}", "measured_at": None, "entry": {},
            "measurements": {"configurations": {c: identity for c, _ in trials}, "trials": rows}}


def draw(rng, noise: list[dict], trials: int, factor: float = 1.0) -> dict:
    """One version's trials: each row and figure lognormal with its log-sd, TTFT times factor, decode over it."""
    out = {}
    for r in noise:
        ttft = CENTRES["ttft"] * factor * np.exp(rng.normal(0, r["ttft"], trials))
        decode = CENTRES["decode"] / factor * np.exp(rng.normal(0, r["decode"], trials))
        out[(r["configuration"], r["length"])] = {"ttft": ttft, "decode": decode}
    return out


def simulate(noise: list[dict], seeds: int, trials: int, factor: float = 1.0, margin: float = MARGIN,
             confidence: float = 0.95) -> dict:
    """The comparison of two drawn versions (the later one slowed by `factor`), over `seeds` seeds: the share of
    seeds with any wrong verdict, any "slower", any regression, and per row and figure the share found slower
    beyond the margin and the smallest detectable change the report said (each seed's)."""
    wrong = slower = regression = 0
    found: dict[tuple[str, int, str], int] = {}
    said: dict[tuple[str, int, str], list[float]] = {}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        cmp = changes.compare(record(1, draw(rng, noise, trials)), record(2, draw(rng, noise, trials, factor)),
                              margin, confidence)
        verdicts = [(r, f) for r in cmp["rows"] for f in METRICS if r[f]]
        truth = FASTER if factor < 1 else SLOWER if factor > 1 else None
        wrong += any(r[f]["verdict"] in (FASTER, SLOWER) and r[f]["verdict"] != truth for r, f in verdicts)
        slower += any(r[f]["verdict"] == SLOWER for r, f in verdicts)
        regression += bool(cmp["regressions"])
        for r, f in verdicts:
            key = (r["configuration"], r["length"], f)
            found[key] = found.get(key, 0) + r[f]["regression"]
            said.setdefault(key, []).append(r[f]["detectable"])
    level = family_level(2 * len(noise), confidence)
    rows = [{"configuration": c, "length": length, "figure": f, "noise": next(r[f] for r in noise
                                                                               if (r["configuration"], r["length"]) == (c, length)),
             "found": found[(c, length, f)] / seeds, "said_median": statistics.median(said[(c, length, f)]),
             "detectable": detectable_change(next(r[f] for r in noise if (r["configuration"], r["length"]) == (c, length)),
                                             trials, trials, 2 * level - 1, margin)}
            for c, length, f in sorted(found)]
    return {"seeds": seeds, "trials": trials, "factor": factor, "tests": 2 * len(noise), "level": level,
            "wrong": wrong / seeds, "slower": slower / seeds, "regression": regression / seeds, "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=1000)
    p.add_argument("--trials", type=int, nargs="+", default=[3, 5])
    p.add_argument("--slowdown", type=float, default=1.3)
    p.add_argument("--noise", default=str(NOISE), help="the noise file (default: tests/data/default_run_noise.json)")
    p.add_argument("--results", help="a results.csv to take the noise from instead")
    p.add_argument("--write-noise", help="write the noise of --results here (the test's file) and stop")
    a = p.parse_args()
    if a.results:
        rows = noise_of(a.results)
        if a.write_noise:
            Path(a.write_noise).write_text(json.dumps({
                "source": f"{a.results}: the default workflow (config/longctx.yaml) on a 2-core machine",
                "command": f"python bench/version_gate.py --results {a.results} --write-noise {a.write_noise}",
                "rows": rows}, indent=1) + "\n")
            print(f"{a.write_noise}: {len(rows)} rows")
            return 0
    else:
        rows = load_noise(a.noise)
    for key in ("ttft", "decode"):
        values = [r[key] for r in rows]
        print(f"{key} log-sd over {len(rows)} rows: median {statistics.median(values):.4f}, "
              f"from {min(values):.4f} to {max(values):.4f}")
    for trials in a.trials:
        t0 = time.perf_counter()
        null = simulate(rows, a.seeds, trials)
        slow = simulate(rows, a.seeds, trials, a.slowdown)
        spent = time.perf_counter() - t0
        found = [r["found"] for r in slow["rows"]]
        print(f"\n{trials} trials a side, {null['tests']} one-sided bounds, each at {null['level']:.5f} (Bonferroni), "
              f"{a.seeds} seeds ({spent:.1f} s):")
        print(f"  unchanged: any wrong verdict in {null['wrong']:.1%} of seeds, any 'slower' in {null['slower']:.1%}, "
              f"any regression in {null['regression']:.1%}")
        print(f"  {a.slowdown:.2f}x slower everywhere: found beyond the margin in {statistics.median(found):.1%} of seeds "
              f"at the median row (from {min(found):.1%} to {max(found):.1%}); rows found in at least 80%: "
              f"{sum(f >= 0.8 for f in found)} of {len(found)}")
        for r in slow["rows"]:
            print(f"    {r['configuration']:>16} {r['length']:>6} {r['figure']:>6}: noise {r['noise']:.3f}, found "
                  f"{r['found']:6.1%}, detectable at its noise {r['detectable']:.0%}, the report said {r['said_median']:.0%} "
                  f"(median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
