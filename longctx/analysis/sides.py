"""Two sides compared, configuration by configuration and length by length, as one family.

The sides are a version and an earlier one, measured in two runs (longctx.report.changes), or the baseline and the
candidate of an A/B, measured in one run, interleaved in blocks (longctx.analysis.ab). Each cell (a configuration
and length) holds the figures of both sides (compare.METRICS: TTFT and decode rate):
- across runs, the trials of each side: Welch's interval on the logs (compare.change), one-sided, with a tolerance
  for what the machine did between the two runs (the drift the metronome measured, longctx.analysis.drift): a
  length is slower beyond the margin only where its bound clears (1 + margin)(1 + drift), so a machine that moved
  makes the row say what it could not see, never calls an untouched length slower;
- interleaved, the differences of pairs of neighbouring blocks (longctx.analysis.paired): the drift hits both sides
  of a pair, and no tolerance is taken.

The table is one family for the question "did anything get slower": its m testable row-figures are each taken at
the one-sided level 1 - (1 - confidence) / m (Bonferroni: compare.family_level), so that unchanged code is called
slower anywhere in it in at most 1 - confidence of reruns (and faster, likewise). A cell whose candidate side lost
what the baseline had (fewer successful trials, or pairs, than an interval needs where the baseline had enough) is
"lost", with why: the worst regression is one that measured nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import paired
from .compare import METRICS, MIN_TRIALS, change, family_level

COMPARED, SAME_MEASUREMENTS = "compared", "same measurements"
ACROSS_RUNS, INTERLEAVED = "across runs", "interleaved"
MINIMUM = {ACROSS_RUNS: MIN_TRIALS, INTERLEAVED: paired.MIN_PAIRS}  # a side's successful trials (pairs) for an interval
UNIT = {ACROSS_RUNS: "trial", INTERLEAVED: "pair of neighbouring blocks"}


@dataclass
class Cell:
    """One configuration and length, both sides. before/now: per figure the values of the successful trials
    (interleaved: every value of each side); pairs: interleaved, per figure the pair differences
    (paired.pair_differences), and possible: per figure the pairs whose baseline block has a value (what the
    candidate could have matched); n_before/n_now: the successful trials (across runs) or the pairs with both sides
    (interleaved); same: the very same trials on both sides (nothing measured again); tolerance: the drift allowed
    for; why_lost: per figure, why the candidate side has fewer values than it needs (its failures' reasons)."""

    configuration: str
    length: int
    n_before: int
    n_now: int
    before: dict[str, list[float]] = field(default_factory=dict)
    now: dict[str, list[float]] = field(default_factory=dict)
    pairs: dict[str, list[float]] | None = None
    possible: dict[str, int] | None = None
    same: bool = False
    tolerance: float = 0.0
    why_lost: dict[str, str] = field(default_factory=dict)


def _kind(cell: Cell) -> str:
    return INTERLEAVED if cell.pairs is not None else ACROSS_RUNS


def _counts(cell: Cell, figure: str) -> tuple[int, int]:
    """(what the baseline had, what the candidate has) of a figure: trials a side, or pairs."""
    if cell.pairs is not None:
        return (cell.possible or {}).get(figure, 0), len(cell.pairs.get(figure) or [])
    return len(cell.before.get(figure) or []), len(cell.now.get(figure) or [])


def lost(cell: Cell, metrics: dict = METRICS) -> list[str]:
    """The figures the candidate lost at this length: the baseline had what an interval needs, the candidate not
    (every trial failed, or too few are left; a decode rate gone where only the first token came)."""
    need = MINIMUM[_kind(cell)]
    return [] if cell.same else [f for f in metrics if _counts(cell, f)[0] >= need > _counts(cell, f)[1]]


def _testable(cell: Cell, figure: str) -> bool:
    if cell.same:
        return False
    return min(_counts(cell, figure)) >= MINIMUM[_kind(cell)] if cell.pairs is None else \
        _counts(cell, figure)[1] >= paired.MIN_PAIRS


def _row_change(cell: Cell, figure: str, smaller: bool, level: float, margin: float) -> dict | None:
    if cell.pairs is not None:
        return paired.paired_change(cell.pairs.get(figure) or [], smaller, level, margin,
                                    trials=(len(cell.now.get(figure) or []), len(cell.before.get(figure) or [])))
    return change(cell.before.get(figure) or [], cell.now.get(figure) or [], smaller, level, margin, cell.tolerance,
                  one_sided=True)


def table(cells: list[Cell], confidence: float, margin: float, metrics: dict = METRICS) -> dict:
    """The family over the figures of `metrics` (compare.METRICS: TTFT and decode rate): {rows (per cell:
    configuration, length, key, status, n_before, n_now, tolerance, unit, figures, and per figure its change or
    None), tests (m), level (each row's one-sided level), lost ([{configuration, length, n_before, n_now, unit,
    why}]), regressions ([{configuration, length, figure, ratio, low, high, n_before, n_now, threshold, unit}]),
    compared (rows with an interval)}."""
    tests = sum(_testable(c, f) for c in cells for f in metrics)
    level = family_level(tests, confidence)
    rows, lost_rows, regressions = [], [], []
    for c in cells:
        row = {"configuration": c.configuration, "length": c.length, "key": f"{c.configuration}:{c.length}",
               "status": SAME_MEASUREMENTS if c.same else COMPARED, "n_before": c.n_before, "n_now": c.n_now,
               "tolerance": c.tolerance, "unit": UNIT[_kind(c)], "figures": list(metrics)}
        for f, m in metrics.items():
            row[f] = None if c.same else _row_change(c, f, m.smaller_is_faster, level, margin)
        rows.append(row)
        gone = lost(c, metrics)
        if gone:
            had, has = _counts(c, gone[0])
            lost_rows.append({"configuration": c.configuration, "length": c.length, "figures": gone,
                              "what": " and ".join(metrics[f].words for f in gone), "n_before": had,
                              "n_now": has, "unit": UNIT[_kind(c)],
                              "why": "; ".join(dict.fromkeys(c.why_lost.get(f) or "no reason recorded" for f in gone))})
        for f in metrics:
            x = row[f]
            if x and x["regression"]:
                regressions.append({"configuration": c.configuration, "length": c.length, "figure": f,
                                    "ratio": x["ratio"], "low": x["ci"][0], "high": x["ci"][1], "n_before": c.n_before,
                                    "n_now": c.n_now, "threshold": x["threshold"], "unit": UNIT[_kind(c)]})
    compared = sum(1 for r in rows if r["status"] == COMPARED and any(r[f] and r[f]["ci"] for f in metrics))
    return {"rows": rows, "tests": tests, "level": level, "confidence": confidence, "margin": margin,
            "lost": lost_rows, "regressions": regressions, "compared": compared}
