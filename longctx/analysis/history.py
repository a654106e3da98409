"""Change points over a report's history: where a configuration's TTFT or decode rate stepped, across every version.

The gate (longctx.report.changes) compares two versions; drift that stays under its margin at each step is never
caught that way. Here each configuration, length and figure (TTFT, decode rate) is a series over the versions that
measured it like with like (longctx.report.history chooses them), one point per version: the geometric mean of that
version's successful trials. A version whose trials are the very same as an earlier point's (its measurements reused:
nothing was measured again) adds no point, so a rebuild does not count twice.

The steps are found by Apache Otava (apache-otava, the maintained successor of Hunter and of MongoDB's E-divisive
means code; `otava.analysis.compute_change_points`), on the logarithm of each series, so that a step is relative and
its size is the ratio of the geometric means of the versions on either side of it. E-divisive proposes the split that
maximises the energy distance between the two sides; Student's t-test on the two sides decides whether it is a step,
so the threshold comes from the series' own noise; each side is split again, and a merge pass drops the steps that
fail the test once their neighbours are known (Fleming et al., "Hunter: Using Change Point Detection to Hunt for
Performance Regressions", ICPE 2023).

The level. A report holds many series, and each search picks the best of many splits, so the p-value of the chosen
split alone says a step where none is far more often than it states (at 12 points and Otava's default 0.001, about
1.3% of flat series, by simulation). The level is Bonferroni over every (split, end) pair that the search chooses
among, n (n - 1) / 2 in a series of n points, summed over the series: each step must have p at most
(1 - confidence) / that sum. tests/test_history.py checks by simulation that a report of flat series then says a
step in at most 1 - confidence of builds.

A series needs MIN_POINTS points to be analysed: with fewer, a step in the middle leaves two or fewer versions on a
side, whose noise the t-test cannot tell from the step.
"""

from __future__ import annotations

import json
import math

from .compare import METRICS

MIN_POINTS = 6  # versions that measured a configuration and length anew, for its series to be analysed
WINDOW = 50  # Otava's sliding window (its default): longer series are searched 50 points at a time, half overlapping
METHOD = "Apache Otava E-divisive means with Student's t-test (otava.analysis.compute_change_points)"


class OtavaMissing(SystemExit):
    """apache-otava is not installed: the message says how to install it."""


def _compute_change_points():
    try:
        from otava.analysis import compute_change_points
    except ImportError as exc:
        raise OtavaMissing("the change-point analysis needs apache-otava, which is not installed here: run `make setup`, "
                           "or `pip install --no-deps -r envs/otava.txt` in the environment longctx runs in "
                           f"({type(exc).__name__}: {exc})") from None
    return compute_change_points


def otava_version() -> str | None:
    """The installed apache-otava's version, or None."""
    from importlib import metadata

    try:
        return metadata.version("apache-otava")
    except metadata.PackageNotFoundError:
        return None


def _values(trials: list[dict], column: str) -> list[float]:
    return [float(t[column]) for t in trials
            if isinstance(t.get(column), (int, float)) and math.isfinite(t[column]) and t[column] > 0]


def _key(trials: list[dict]) -> str:
    return json.dumps(sorted((dict(sorted(t.items())) for t in trials), key=lambda t: json.dumps(t, sort_keys=True)),
                      sort_keys=True)


def points(versions: list[tuple[int, list[dict]]], column: str) -> list[dict]:
    """One point per version (in version order) of `versions`, [(version number, that version's trials of one
    configuration and length)]: the geometric mean of the trials' `column` (positive, finite values), with the number
    of trials. A version whose trials are the very same as an earlier version's adds no point (counted once, at the
    first); a version without a value adds none either."""
    seen: set[str] = set()
    out = []
    for n, trials in sorted(versions, key=lambda v: v[0]):
        key = _key(trials)
        if key in seen:
            continue
        seen.add(key)
        values = _values(trials, column)
        if values:
            out.append({"version": int(n), "value": math.exp(sum(map(math.log, values)) / len(values)), "trials": len(values)})
    return out


def pairs(n: int) -> int:
    """The (split, end) pairs E-divisive chooses a series' first step among: n (n - 1) / 2 for n points."""
    return n * (n - 1) // 2


def family_level(sizes: list[int], confidence: float) -> float | None:
    """The p-value a step must reach in a family of series of these sizes (Bonferroni over their pairs); None
    without a series to analyse."""
    total = sum(pairs(n) for n in sizes if n >= MIN_POINTS)
    return (1 - confidence) / total if total else None


def steps(pts: list[dict], level: float, smaller_is_faster: bool) -> list[dict]:
    """The steps Otava finds in the log of the points' values at p <= level, in version order. Each: the version it
    came in, the point before it, the ratio after/before of the geometric means of the versions on either side (up to
    the neighbouring steps), its time factor (above 1: slower; a TTFT ratio, the inverse of a decode rate ratio),
    its p-value and the points on either side."""
    if len(pts) < 2:
        return []
    logs = [math.log(p["value"]) for p in pts]
    # a list, not an ndarray: Otava 0.8.0 cuts its windows out of a list only (an ndarray is searched whole per window)
    found, _weak = _compute_change_points()(logs, window_len=WINDOW, max_pvalue=level)
    found = sorted(found, key=lambda c: int(c.index))
    bounds = [0] + [int(c.index) for c in found] + [len(pts)]
    out = []
    for i, c in enumerate(found):
        at = bounds[i + 1]
        ratio = math.exp(float(c.stats.mean_2) - float(c.stats.mean_1))
        factor = ratio if smaller_is_faster else 1 / ratio
        out.append({"version": pts[at]["version"], "after": pts[at - 1]["version"], "ratio": ratio,
                    "factor": factor, "slower": factor > 1, "pvalue": float(c.stats.pvalue),
                    "points_before": bounds[i + 1] - bounds[i], "points_after": bounds[i + 2] - bounds[i + 1]})
    return out


def overall(pts: list[dict], found: list[dict], smaller_is_faster: bool) -> dict | None:
    """Where a series has steps: from its first segment (the points before its first step) to its last (from its last
    step on), the ratio of their geometric means and its time factor (above 1: slower); None without a step."""
    if not found:
        return None
    index = {p["version"]: i for i, p in enumerate(pts)}
    first, last = pts[:index[found[0]["version"]]], pts[index[found[-1]["version"]]:]

    def mean_log(ps):
        return sum(math.log(p["value"]) for p in ps) / len(ps)

    ratio = math.exp(mean_log(last) - mean_log(first))
    factor = ratio if smaller_is_faster else 1 / ratio
    return {"from": first[0]["version"], "to": last[-1]["version"], "steps": len(found), "ratio": ratio, "factor": factor,
            "slower": factor > 1}


def analyse(histories: dict[tuple[str, int], list[tuple[int, list[dict]]]], confidence: float = 0.95) -> dict:
    """Every series of `histories` ({(configuration, length): [(version, its trials)]}), per figure of
    compare.METRICS: its points, whether it was analysed (at least MIN_POINTS points) and its steps, at one level for
    the family of the series analysed (family_level)."""
    series = []
    for (name, length), versions in sorted(histories.items()):
        for figure, (column, smaller, _) in METRICS.items():
            series.append({"configuration": name, "length": int(length), "figure": figure, "smaller_is_faster": smaller,
                           "points": points(versions, column)})
    level = family_level([len(s["points"]) for s in series], confidence)
    for s in series:
        s["analysed"] = len(s["points"]) >= MIN_POINTS
        s["steps"] = steps(s["points"], level, s["smaller_is_faster"]) if s["analysed"] else []
        s["overall"] = overall(s["points"], s["steps"], s["smaller_is_faster"])
    return {"method": METHOD, "otava": otava_version(), "window": WINDOW, "min_points": MIN_POINTS,
            "confidence": confidence, "level": level, "series": series}
