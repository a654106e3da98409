"""What the gate's exit status means, for a version against an earlier one (`longctx gate`) and for an A/B
(`longctx ab`): one verdict over a comparison (longctx.report.changes or longctx.report.ab).

- 1: a configuration and length got slower beyond the margin (and, across runs, beyond the drift the metronome
  measured between them), or was lost: it had trials (pairs) enough for an interval in the baseline and has not
  now, which is the worst regression there is. A line each, naming why.
- 0: nothing of that; the line says what was compared and the smallest slowdown that could have gone unseen.
  A configuration that could not be compared (not like with like) is listed on a line of its own.
- 2: nothing could be compared (the first version, no configuration alike, no length in common), with why.

The JSON answer (--json, --out) holds the same: against, regressions, lost, not_compared (with reasons), compared,
and each row's ratios, bounds and detectable change.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..analysis.sides import ACROSS_RUNS, INTERLEAVED, MINIMUM
from . import changes
from .change_words import figures, lost_line, pass_line, regression_line


def _rows(cmp: dict) -> list[dict]:
    out = []
    for r in cmp["rows"]:
        row = {"configuration": r["configuration"], "length": r["length"], "status": r["status"],
               "n_before": r["n_before"], "n_now": r["n_now"], "unit": r.get("unit")}
        for f in figures(r):
            c = r.get(f)
            row[f] = None if not c else {"ratio": c["ratio"], "low": c["ci"][0] if c["ci"] else None,
                                         "high": c["ci"][1] if c["ci"] else None, "verdict": c["verdict"],
                                         "regression": c["regression"], "detectable": c["detectable"],
                                         "threshold": c.get("threshold")}
        out.append(row)
    return out


def verdict(cmp: dict) -> tuple[int, dict, list[str]]:
    """(exit status, the JSON answer, the lines to print) for a comparison (changes.compare, or an A/B's)."""
    against = cmp["before"]["name"]
    margin = cmp["margin"]
    answer = {"against": against, "version": cmp["now"]["name"], "kind": cmp.get("kind"), "source": cmp.get("source"),
              "margin": margin, "confidence": cmp.get("confidence"), "level": cmp.get("level"), "tests": cmp.get("tests"),
              "regressions": cmp["regressions"], "lost": cmp.get("lost") or [], "compared": cmp["compared"],
              "same_measurements": cmp.get("same") or [], "not_compared": cmp.get("unlike") or [],
              "drift": cmp.get("drift") or {}, "rows": _rows(cmp), "detectable": cmp.get("detectable") or []}
    if cmp.get("cost") is not None:  # an A/B's: server starts, wall time
        answer["cost"] = cmp["cost"]
    listed = [f"not compared: {u['configuration']}: {u['why']}" for u in cmp.get("unlike") or []]
    bad = [regression_line(g, against, margin) for g in cmp["regressions"]] + \
          [lost_line(x, against) for x in cmp.get("lost") or []]
    if bad:
        return 1, answer, bad + listed
    if not cmp["compared"]:
        rows = cmp["rows"]
        if rows and all(r["status"] == changes.SAME_MEASUREMENTS for r in rows) and not cmp.get("unlike"):
            return 0, answer, [f"no regression: {cmp['now']['name']} has the same measurements as {against} (nothing was "
                               "measured again)"]
        unit = "pairs" if cmp.get("kind") == INTERLEAVED else "trials"
        why = "; ".join(f"{u['configuration']}: {u['why']}" for u in cmp.get("unlike") or []) or (
            f"fewer than {MINIMUM[cmp.get('kind') or ACROSS_RUNS]} successful {unit} a side wherever both measured" if rows
            else f"no configuration and length was measured by both {against} and {cmp['now']['name']}")
        answer["error"] = why
        return 2, answer, [f"nothing to compare with {against}: {why}"]
    return 0, answer, [pass_line(cmp)] + listed


def gate(version_json: str | Path, versions_dir: str | Path | None = None, against: str | None = None,
         margin: float | None = None) -> tuple[int, dict, list[str]]:
    """`longctx gate`: this version (version_json, the record the report was built from) against `against`
    (default: the version the report compares with, report.compare_to), with the margin `margin` (default: the
    report's, report.regression_margin): verdict() of their comparison, or 2 with one line where nothing can be
    compared."""
    path = Path(version_json)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return 2, {"error": f"{path}: {exc}"}, [f"nothing to compare: {path} cannot be read ({type(exc).__name__}); "
                                                "build the report first (snakemake --cores 1 report/longctx.pdf)"]
    against = against or (record.get("compare") or {}).get("against") or changes.PREVIOUS
    versions_dir = Path(versions_dir) if versions_dir else path.parent / "versions"
    try:
        before, why = changes.baseline_of(versions_dir, record, against)
        if before is None:
            return 2, {"error": why}, [f"nothing to compare: {why}"]
        cmp = changes.against_record(before, record, margin)
    except SystemExit as exc:  # VersionError, or a version log that cannot be read
        return 2, {"error": str(exc.code)}, [f"nothing to compare: {exc.code}"]
    return verdict(cmp)

