"""The kernel A/B's verdicts: per length, B/A with its paired interval, from the raw blocks that
longctx.attention.kernel_ab.alternate measured.

A block enters the pair difference (longctx.analysis.paired.pair_differences) by its median call (STATISTIC), not
by every call: the unit of replication is the pair of neighbouring blocks whatever a block's value is, so any
statistic of a block that both sides get is valid, and the median is the one a shared machine moves least. A
kernel's calls on fixed inputs do the same work; what spreads them is the machine (a neighbour's time slice, an
interrupt, a page the other side evicted), and that spread is one-sided and heavy-tailed: one stalled call among
five moves a block's mean log by a fifth of the stall's log (a 10x stall: 0.46, a 58% change) and its median not
at all. On the shared 2-core machine the CPU twin's A/A pair differences were 1.3 to 10 times noisier with every call
entering than with the medians, most at short lengths (docs/benchmarks.md), so the median gives the same interval
from far fewer blocks. A change that only some calls pay (a slow path taken one call in five) is then not seen; the kernels under
study take one path per input, and `statistic="all"` (every call's time, as pair_differences takes a block's
values) is there for the other case. `statistic="min"` (a block's fastest call, the classic micro-benchmark
figure, kernelbench.best_time's) was a little less noisy still on one thread and much less on two, but it hides
whatever a change does to the calls a neighbour disturbs (a barrier that waits longer, say), so it is not the
default.

The family is the lengths (m = their number): each length's one-sided bounds are at family_level(m, confidence),
so the chance that any length of an unchanged kernel is called slower is at most 1 - confidence (where the t
interval holds; two loads of the same code can differ by a percent or two, memory layout, which the margin is for).
"""

from __future__ import annotations

import statistics

from ..core.interleave import SIDES
from .compare import SLOWER, family_level
from .paired import METHOD, UNIT, pair_differences, paired_change

STATISTIC = "median"
STATISTICS = ("median", "min", "all")
CONFIDENCE = 0.95
MARGIN = 0.05


def block_values(seconds: list[float], statistic: str = STATISTIC) -> list[float]:
    """What one block contributes to its pair's difference (whose mean log is taken): its median call, its fastest
    call, or all its calls."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic {statistic!r}; allowed: {', '.join(STATISTICS)}")
    if statistic == "all" or not seconds:
        return list(seconds)
    return [statistics.median(seconds) if statistic == "median" else min(seconds)]


def length_change(entry: dict, level: float, margin: float = MARGIN, statistic: str = STATISTIC) -> dict:
    """One length of alternate's result ({"length", "blocks": [{"side", "seconds"}]}) as a row: paired_change of the
    pairs' differences at `level` (B/A of the call time: above 1 B is slower), with the length, the pairs left out,
    and each side's median call."""
    blocks = [(b["side"], block_values(b["seconds"], statistic)) for b in entry["blocks"]]
    d, dropped = pair_differences(blocks)
    calls = {s: [t for b in entry["blocks"] if b["side"] == s for t in b["seconds"]] for s in SIDES}
    row = paired_change(d, True, level, margin, trials=(len(calls["B"]), len(calls["A"])))
    if row is None:
        row = {"ratio": None, "ci": None, "verdict": "no interval", "regression": False, "beyond_margin": False, "pairs": 0}
    median = {s: statistics.median(v) if v else None for s, v in calls.items()}
    return {"length": entry["length"], **row, "dropped_pairs": dropped, "a_median_s": median["A"],
            "b_median_s": median["B"]}


def verdicts(result: dict, confidence: float = CONFIDENCE, margin: float = MARGIN, statistic: str = STATISTIC) -> dict:
    """Every length of alternate's result compared, as one family (m = the lengths): {"confidence", "level", "family",
    "margin", "statistic", "method", "unit", "rows": [length_change per length], "slower": [lengths], "regressions":
    [lengths slower beyond the margin], "lost": [{length, why}: B failed where A ran], "no_interval": [lengths without
    one]}."""
    m = len(result["lengths"])
    level = family_level(m, confidence)
    rows = [length_change(e, level, margin, statistic) for e in result["lengths"]]
    return {"confidence": confidence, "level": level, "family": m, "margin": margin, "statistic": statistic,
            "method": METHOD, "unit": UNIT, "rows": rows,
            "slower": [r["length"] for r in rows if r["verdict"] == SLOWER],
            "regressions": [r["length"] for r in rows if r["regression"]],
            # a length whose candidate build failed where the baseline ran (alternate's "failed"): lost, with why
            "lost": [{"length": e["length"], "why": e["failed"]["B"]} for e in result["lengths"]
                     if "B" in (e.get("failed") or {}) and "A" not in e["failed"]],
            "no_interval": [r["length"] for r in rows if r.get("ci") is None]}


def line(row: dict) -> str:
    """One length's row as the terminal shows it."""
    head = f"{row['length']:>7}: B/A "
    if row.get("ci") is None:
        return head + f"{row['ratio']:.3f}, no interval ({row['pairs']} pairs)" if row.get("ratio") else head + "-, no pairs"
    low, high = row["ci"]
    said = row["verdict"] + (f", a regression beyond {row['threshold'] - 1:.0%}" if row["regression"] else "")
    found = f"; detectable {row['detectable']:.1%}" if row.get("detectable") is not None else ""
    return (f"{head}{row['ratio']:.3f} [{low:.3f}, {high:.3f}] ({row['a_median_s'] * 1e3:.3f} -> "
            f"{row['b_median_s'] * 1e3:.3f} ms), {said}, {row['pairs']} pairs{found}")
