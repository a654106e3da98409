"""A version against an earlier one: which lengths got faster or slower, by how much, how sure.

Two kept versions (longctx.report.versions: each keeps its trials, the status of each length and what identifies
each configuration) are compared per configuration and length, like with like (longctx.analysis.identity: the
engine, its version and code, the hardware, the model and the settings the same; the kernel is what is compared),
as one family (longctx.analysis.sides): the ratio now/before of TTFT and of decode rate, ratios of the geometric
means of the trials, with Welch's one-sided bounds on the logs at the family's level. The two versions were
measured in two runs, hours or days apart, on a machine that moves: the drift the metronome measured between the two
runs (longctx.analysis.drift) is the tolerance a row must clear beyond the margin before it is called a regression,
and each row says the smallest change its noise, trials and that drift would let it see. A verdict that the drift
cannot move comes from an A/B (longctx.analysis.ab): both builds in one run, interleaved.

A length whose trials are the very same in both (the edit did not touch the configuration, so its measurements were
reused) is "same measurements", not a ratio of 1 with an interval. A length that had trials enough for an interval
before and has not now (every trial failed, a crash, too few left) is "lost", with why: the gate fails on it
(longctx.report.gate). "previous" is the newest earlier version whose kept trials differ from this one's, so that a
rebuild after a regressed version (a template edit: a new version with the same measurements) is still compared
with the version before the regression.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..analysis import drift, sides
from ..analysis.compare import CORRECTION, DETECTION, MARGIN, METRICS, MIN_TRIALS, welch_df, width_cost
from ..analysis.identity import changed_files, kernel_changed, unlike
from . import change_words, versions

PREVIOUS = "previous"
METHOD = "welch-log, one-sided"  # across runs; an A/B's is longctx.analysis.paired.METHOD
COMPARED, SAME_MEASUREMENTS = sides.COMPARED, sides.SAME_MEASUREMENTS


class VersionError(SystemExit):
    """Nothing can be compared: the message says why, in one line."""


def version_number(text: str) -> int:
    """'v3' (or '3') -> 3; a VersionError names what is allowed."""
    t = str(text).strip().lower().removeprefix("v")
    if not t.isdigit() or int(t) < 1:
        raise VersionError(f"{text!r} is not a version: name one as v1, v2, ... (report/versions/log.json lists them)")
    return int(t)


def _kept_trials(record: dict) -> list[dict]:
    return sorted((dict(sorted(t.items())) for t in (record.get("measurements") or {}).get("trials") or []),
                  key=lambda t: (t["configuration"], t["length"], str(t.get("trial")), str(t.get("run_id"))))


def baseline_of(versions_dir: str | Path, record: dict, against: str | None) -> tuple[dict | None, str | None]:
    """The record of the version `record` is compared with: `against` is 'previous' (or None: the newest earlier
    version whose kept trials differ from this one's; where every earlier one kept the very same, the one just
    below) or 'vN'; None and why where there is none or it cannot be read."""
    if against in (None, PREVIOUS):
        history = sorted((e for e in versions.read_log(versions_dir) if e["n"] < record["n"]), key=lambda e: e["n"])
        if not history:
            if record.get("previous"):
                return versions.find(versions_dir, record["previous"]["n"])
            return None, f"v{record['n']} is the first version: nothing to compare with"
        mine = _kept_trials(record)
        first = None
        for e in reversed(history):
            before, why = versions.find(versions_dir, e["n"])
            if before is None:
                return None, why
            first = first or before
            if "measurements" not in before or _kept_trials(before) != mine:
                return before, None
        return first, None
    n = version_number(against)
    if n == record["n"]:
        return None, f"v{n} is this version: name an earlier one to compare with"
    return versions.find(versions_dir, n)


def entry(record: dict) -> dict:
    """How a version is named in a comparison: its number, hash, when it was measured and its commit."""
    e = record.get("entry") or {}
    return {"n": record["n"], "name": f"v{record['n']}", "hash": record["hash"],
            "measured_at": record.get("measured_at"), "commit": e.get("commit")}


def _trials(record: dict) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = {}
    for t in (record.get("measurements") or {}).get("trials") or []:
        out.setdefault((t["configuration"], int(t["length"])), []).append(t)
    return out


def _statuses(record: dict) -> dict[tuple[str, int], dict]:
    """Per configuration and length the version measured: {ok, tried, why} (kept since versions kept them)."""
    return {(s["configuration"], int(s["length"])): s for s in (record.get("measurements") or {}).get("lengths") or []}


def _values(trials: list[dict], column: str) -> list[float]:
    return [t[column] for t in trials if isinstance(t.get(column), (int, float)) and t[column] > 0 and math.isfinite(t[column])]


def _why_lost(status: dict, trials: list[dict]) -> dict[str, str]:
    """Per figure, why this version has fewer values than an interval needs at a length (its kept status: the
    failures' reason; for decode, what left the decode rate out of the trials that succeeded)."""
    tried = f"{len(trials)} successful trial(s) of {status['tried']}" if status.get("tried") else None
    ttft = status.get("why") or tried
    return {k: v for k, v in (("ttft", ttft), ("decode", status.get("why_decode") or ttft)) if v}


def drift_between(before: dict, now: dict, configuration: str, same_code: bool) -> dict | None:
    """What the machine did between the two versions' runs of a configuration, from their metronomes
    (longctx.analysis.drift.between); None where either version kept none (the comparison then says the drift was
    not measured)."""
    a = ((before.get("measurements") or {}).get("metronome") or {}).get(configuration)
    b = ((now.get("measurements") or {}).get("metronome") or {}).get(configuration)
    return drift.between(a, b, same_code) if a and b else None


def compare(before: dict, now: dict, margin: float = MARGIN, confidence: float = 0.95) -> dict:
    """Version record `now` against `before` (both with measurements: versions.measurements): the family
    (sides.table: rows, tests, level, lost, regressions), the configurations not compared and why (`unlike`, also
    as `not_compared`), the lengths only one measured, the drift per configuration and the tolerance it set, the
    kernels whose sources differ, what could not be seen, and page one's sentence."""
    if "measurements" not in before:
        raise VersionError(f"v{before['n']} kept only its medians (it was built before versions kept their trials): "
                           "no interval can be had against it; compare with a later version")
    ids_b, ids_n = before["measurements"]["configurations"], now["measurements"]["configurations"]
    tb, tn = _trials(before), _trials(now)
    sb, sn = _statuses(before), _statuses(now)
    why_not = {c: unlike(ids_b[c], ids_n[c]) for c in sorted(ids_b.keys() & ids_n.keys())}

    def alike(c: str) -> bool:
        return c in why_not and not why_not[c]

    drifts = {c: drift_between(before, now, c, not kernel_changed(ids_b[c], ids_n[c])) for c in why_not if alike(c)}
    # a length this version tried and kept no trial of, where the earlier one had trials: lost, not only before
    failed_now = {k for k, s in sn.items() if not s.get("ok")}
    keys = sorted(k for k in (tb.keys() & tn.keys()) | (tb.keys() & failed_now) if alike(k[0]))
    cells = []
    for c, length in keys:
        a, b = tb[(c, length)], tn.get((c, length), [])
        same = bool(b) and [dict(sorted(t.items())) for t in a] == [dict(sorted(t.items())) for t in b]
        d = drifts.get(c)
        status = sn.get((c, length)) or {}
        cells.append(sides.Cell(c, length, len(a), len(b), before={f: _values(a, m.column) for f, m in METRICS.items()},
                                now={f: _values(b, m.column) for f, m in METRICS.items()}, same=same,
                                tolerance=d["drift"] if d else 0.0, why_lost=_why_lost(status, b)))
    family = sides.table(cells, confidence, margin)
    rows = family["rows"]
    compared = [r for r in rows if r["status"] == COMPARED]
    counts = sorted(((r["n_before"], r["n_now"]) for r in compared if min(r["n_before"], r["n_now"]) >= MIN_TRIALS),
                    key=lambda n: welch_df(*n))
    typical = counts[len(counts) // 2] if counts else (MIN_TRIALS, MIN_TRIALS)  # the median row's trials: the width's cost
    by_config: dict[str, list[dict]] = {}
    for r in rows:
        by_config.setdefault(r["configuration"], []).append(r)
    lost_keys = {(x["configuration"], x["length"]) for x in family["lost"]}
    out = {
        "missing": None, "kind": sides.ACROSS_RUNS, "before": entry(before), "now": entry(now), "margin": margin,
        "confidence": confidence, "method": METHOD, "correction": CORRECTION, "detection": DETECTION,
        **{k: family[k] for k in ("rows", "tests", "level", "lost", "regressions", "compared")},
        "typical_trials": list(typical),
        "width_cost": width_cost(2 * family["level"] - 1, 2 * confidence - 1, welch_df(*typical)) if family["tests"] > 1 else 1.0,
        "same": [c for c, rs in by_config.items() if all(r["status"] == SAME_MEASUREMENTS for r in rs)],
        "unlike": [{"configuration": c, "why": w} for c, w in why_not.items() if w],
        "drift": {c: d for c, d in drifts.items() if d},
        "drift_unmeasured": sorted(c for c, d in drifts.items() if not d and c in by_config),
        "only_now": sorted(ids_n.keys() - ids_b.keys()), "only_before": sorted(ids_b.keys() - ids_n.keys()),
        "lengths_only_now": [{"configuration": c, "length": n} for c, n in sorted(tn.keys() - tb.keys()) if alike(c)],
        "lengths_only_before": [{"configuration": c, "length": n} for c, n in sorted(tb.keys() - tn.keys())
                                if alike(c) and (c, n) not in lost_keys],
        "kernels": [{"configuration": c, "kernel": (ids_n[c].get("kernel") or {}).get("name"),
                     "before": (ids_b[c].get("kernel") or {}).get("name"),
                     "files": changed_files(ids_b[c].get("kernel"), ids_n[c].get("kernel"))}
                    for c in why_not if kernel_changed(ids_b[c], ids_n[c])],
    }
    out["not_compared"] = out["unlike"]
    out["detectable"] = change_words.detectable_words(out)
    out["sentence"] = change_words.kernel_sentence(out)
    return out


def against_record(before: dict, record: dict, margin: float | None = None) -> dict:
    """compare(before, record) with the margin and confidence `record` was made with (its "compare": report.
    regression_margin, the fits' confidence), or `margin` where given."""
    settings = record.get("compare") or {}
    return compare(before, record, settings.get("margin", MARGIN) if margin is None else margin,
                   settings.get("confidence", 0.95))
