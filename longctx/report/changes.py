"""A version against an earlier one: which lengths got faster or slower, by how much, how sure, and the gate.

Two kept versions (longctx.report.versions: each keeps its trials and what identifies them) are compared per
configuration and length that both measured, as configurations are against the baseline (longctx.analysis.compare):
the ratio now/before of TTFT and of decode rate, ratios of the geometric means of the trials, with Welch's
interval on the logs. The table is one family: its m intervals are each at level 1 - (1 - confidence) / m
(Bonferroni), so a rerun of unchanged code gives a wrong verdict anywhere in the table in at most 1 - confidence
of reruns. A change is a regression only where the whole interval lies beyond the margin (report.
regression_margin, 5% by default) on the slower side; each row also says the smallest change its noise and
trial counts would find (in 4 reruns of 5: compare.detectable_change).

Like with like: a configuration is compared only where the engine and its version, the hardware, the model and
its settings other than the kernel (ConfigurationSpec.settings) are the same in both versions; else it says which
differ. A length whose trials are the very same in both (the edit did not touch the configuration, so its
measurements were reused) is "same measurements", not a ratio of 1 with an interval.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..analysis.compare import (CORRECTION, DETECTION, FASTER, METHOD, MIN_TRIALS, SAME, SLOWER, change, family_level,
                                welch_df, width_cost)
from ..core.words import listed
from . import versions
from .numbers import rounded, sig

PREVIOUS = "previous"
MARGIN = 0.05
# figure: (trial column, whether a smaller value is faster, its name in words)
FIGURES = {"ttft": ("ttft_s", True, "TTFT"), "decode": ("decode_tok_s", False, "decode")}
COMPARED, SAME_MEASUREMENTS = "compared", "same measurements"


class VersionError(SystemExit):
    """Nothing can be compared: the message says why, in one line."""


def version_number(text: str) -> int:
    """'v3' (or '3') -> 3; a VersionError names what is allowed."""
    t = str(text).strip().lower().removeprefix("v")
    if not t.isdigit() or int(t) < 1:
        raise VersionError(f"{text!r} is not a version: name one as v1, v2, ... (report/versions/log.json lists them)")
    return int(t)


def baseline_of(versions_dir: str | Path, record: dict, against: str | None) -> tuple[dict | None, str | None]:
    """The record of the version `record` is compared with: `against` is 'previous' (or None: the version
    numbered just below this one) or 'vN'; None and why where there is none or it cannot be read."""
    if against in (None, PREVIOUS):
        if not record.get("previous"):
            return None, f"v{record['n']} is the first version: nothing to compare with"
        n = record["previous"]["n"]
    else:
        n = version_number(against)
        if n == record["n"]:
            return None, f"v{n} is this version: name an earlier one to compare with"
    return versions.find(versions_dir, n)


def entry(record: dict) -> dict:
    """How a version is named in a comparison: its number, hash, when it was measured and its commit."""
    e = record.get("entry") or {}
    return {"n": record["n"], "name": f"v{record['n']}", "hash": record["hash"],
            "measured_at": record.get("measured_at"), "commit": e.get("commit")}


def _differ(a, b) -> str:
    return f"{json.dumps(a)} then {json.dumps(b)}"


def unlike(before: dict, now: dict) -> str | None:
    """Why a configuration's measurements in two versions are not like with like (identities from
    versions.identity), or None where they are: the engine, its version, the hardware, the model, the settings
    other than the kernel."""
    if before.get("engine") != now.get("engine"):
        return f"the engine differs ({before.get('engine')} then {now.get('engine')})"
    if before.get("engine_version") != now.get("engine_version"):
        return f"the engine's version differs ({before.get('engine_version') or 'not reported'} then " \
               f"{now.get('engine_version') or 'not reported'})"
    if before.get("hardware") != now.get("hardware"):
        a, b = before.get("hardware") or {}, now.get("hardware") or {}
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        return "the hardware differs (" + "; ".join(f"{k}: {_differ(a.get(k), b.get(k))}" for k in keys) + ")"
    sa, sb = before.get("settings"), now.get("settings")
    if sa is None or sb is None:  # measured before the settings were recorded: the whole spec must be the same
        if before.get("spec_hash") and before.get("spec_hash") == now.get("spec_hash"):
            return None
        return "its settings were not recorded in " + ("either version" if sa is None and sb is None else
                                                       "the earlier version" if sa is None else "this version") + \
            " and its specs differ"
    keys = [k for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
    model = [k for k in keys if k.startswith("model.")]
    if model:
        return "the model differs (" + "; ".join(f"{k}: {_differ(sa.get(k), sb.get(k))}" for k in model[:3]) + ")"
    if keys:
        more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
        return "its settings differ (" + "; ".join(f"{k}: {_differ(sa.get(k), sb.get(k))}" for k in keys[:3]) + more + ")"
    if before.get("settings_hash") != now.get("settings_hash"):
        return "its settings differ (the server's environment, URL or command: values not shown)"
    return None


def _trials(record: dict) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = {}
    for t in (record.get("measurements") or {}).get("trials") or []:
        out.setdefault((t["configuration"], int(t["length"])), []).append(t)
    return out


def _values(trials: list[dict], column: str) -> list[float]:
    return [t[column] for t in trials if isinstance(t.get(column), (int, float)) and t[column] > 0 and math.isfinite(t[column])]


def kernel_changed(before: dict, now: dict) -> bool:
    """Whether a configuration's kernel (its name or any source's content) differs between two identities."""
    a, b = before.get("kernel") or {}, now.get("kernel") or {}
    return (a.get("name"), a.get("sources")) != (b.get("name"), b.get("sources"))


def compare(before: dict, now: dict, margin: float = MARGIN, confidence: float = 0.95) -> dict:
    """Version record `now` against `before` (both with measurements: versions.measurements): the table (one row
    per configuration and length both measured, its figures' changes as compare.change gives them at the family's
    level), the configurations not compared and why, the lengths only one measured, the regressions, the kernels
    whose sources differ, and page one's sentence about them."""
    if "measurements" not in before:
        raise VersionError(f"v{before['n']} kept only its medians (it was built before versions kept their trials): "
                           "no interval can be had against it; compare with a later version")
    ids_b, ids_n = before["measurements"]["configurations"], now["measurements"]["configurations"]
    tb, tn = _trials(before), _trials(now)
    why_not = {c: unlike(ids_b[c], ids_n[c]) for c in sorted(ids_b.keys() & ids_n.keys())}

    def alike(c: str) -> bool:
        return c in why_not and not why_not[c]

    keys = sorted(k for k in tb.keys() & tn.keys() if alike(k[0]))
    rows: list[dict] = []
    for c, length in keys:
        a, b = tb[(c, length)], tn[(c, length)]
        same = [dict(sorted(t.items())) for t in a] == [dict(sorted(t.items())) for t in b]
        values = {f: (_values(a, col), _values(b, col)) for f, (col, _, _) in FIGURES.items()}
        rows.append({"configuration": c, "length": length, "key": f"{c}:{length}", "status": SAME_MEASUREMENTS if same else COMPARED,
                     "n_before": len(a), "n_now": len(b), "values": values})
    tests = sum(1 for r in rows if r["status"] == COMPARED for vb, vn in r["values"].values() if min(len(vb), len(vn)) >= MIN_TRIALS)
    level = family_level(tests, confidence)
    for r in rows:
        values = r.pop("values")
        for f, (col, smaller, _) in FIGURES.items():
            r[f] = change(*values[f], smaller, level, margin) if r["status"] == COMPARED else None
    compared = [r for r in rows if r["status"] == COMPARED]
    counts = sorted(((r["n_before"], r["n_now"]) for r in compared if min(r["n_before"], r["n_now"]) >= MIN_TRIALS),
                    key=lambda n: welch_df(*n))
    typical = counts[len(counts) // 2] if counts else (MIN_TRIALS, MIN_TRIALS)  # the median row's trials: the width's cost
    regressions = [{"configuration": r["configuration"], "length": r["length"], "figure": f, "ratio": r[f]["ratio"],
                    "low": r[f]["ci"][0], "high": r[f]["ci"][1], "n_before": r[f]["trials_before"], "n_now": r[f]["trials"]}
                   for r in compared for f in FIGURES if r[f] and r[f]["regression"]]
    by_config: dict[str, list[dict]] = {}
    for r in rows:
        by_config.setdefault(r["configuration"], []).append(r)
    out = {
        "missing": None, "before": entry(before), "now": entry(now), "margin": margin, "confidence": confidence,
        "method": METHOD, "correction": CORRECTION, "detection": DETECTION,
        "tests": tests, "level": level, "typical_trials": list(typical),
        "width_cost": width_cost(level, confidence, welch_df(*typical)) if tests > 1 else 1.0,
        "rows": rows, "compared": len([r for r in compared if any(r[f] and r[f]["ci"] for f in FIGURES)]),
        "same": [c for c, rs in by_config.items() if all(r["status"] == SAME_MEASUREMENTS for r in rs)],
        "unlike": [{"configuration": c, "why": w} for c, w in why_not.items() if w],
        "only_now": sorted(ids_n.keys() - ids_b.keys()), "only_before": sorted(ids_b.keys() - ids_n.keys()),
        "lengths_only_now": [{"configuration": c, "length": n} for c, n in sorted(tn.keys() - tb.keys()) if alike(c)],
        "lengths_only_before": [{"configuration": c, "length": n} for c, n in sorted(tb.keys() - tn.keys()) if alike(c)],
        "regressions": regressions,
        "kernels": [{"configuration": c, "kernel": (ids_n[c].get("kernel") or {}).get("name"),
                     "before": (ids_b[c].get("kernel") or {}).get("name"),
                     "files": _changed_files(ids_b[c].get("kernel"), ids_n[c].get("kernel"))}
                    for c in why_not if kernel_changed(ids_b[c], ids_n[c])],
    }
    out["detectable"] = detectable_words(out)
    out["sentence"] = kernel_sentence(out)
    return out


def _changed_files(a: dict | None, b: dict | None) -> list[str]:
    sa, sb = (a or {}).get("sources") or {}, (b or {}).get("sources") or {}
    return sorted(f for f in set(sa) | set(sb) if sa.get(f) != sb.get(f))


def _times(x: float) -> str:
    return f"{sig(x, 2) if x < 10 else rounded(x)}x"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def effect_words(r: dict, figure: str) -> str:
    """'decode in page1-twin 1.8x [1.6, 2.0] faster at 16,384 tokens, n=3/3' (a slower one by the factor it
    slowed by)."""
    c = r[figure]
    s, ci = c["speedup"], c["speedup_ci"]
    slower = c["verdict"] == SLOWER
    factor, lo, hi = (1 / s, 1 / ci[1], 1 / ci[0]) if slower else (s, ci[0], ci[1])
    return (f"{FIGURES[figure][2]} in {r['configuration']} {_times(factor)} [{sig(lo, 2)}, {sig(hi, 2)}] "
            f"{'slower' if slower else 'faster'} at {r['length']:,} tokens, n={c['trials_before']}/{c['trials']}")


def detectable_words(cmp: dict) -> list[dict]:
    """Per configuration compared: the smallest change its rows could have shown, in words ('a change under 31%
    (decode at 16,384 tokens, 3/3 trials) could go unseen'), from the row and figure that could show least, and
    the best of its rows beside it."""
    by: dict[str, list[tuple[float, dict, str]]] = {}
    for r in cmp["rows"]:
        for f in FIGURES:
            c = r[f]
            if c and c["detectable"] is not None:
                by.setdefault(r["configuration"], []).append((c["detectable"], r, f))
    out = []
    for name, items in by.items():
        worst, r, f = max(items, key=lambda x: x[0])
        best = min(x[0] for x in items)
        out.append({"configuration": name, "worst": worst, "best": best,
                    "text": f"in {name}, a change under {_pct(worst)} could go unseen ({FIGURES[f][2]} at {r['length']:,} "
                            f"tokens, {r[f]['trials_before']}/{r[f]['trials']} trials)"
                            + (f", under {_pct(best)} at its best length" if _pct(best) != _pct(worst) else "")})
    return out


def lengths_words(items: list[tuple[dict, str]]) -> str:
    """'decode in page16 at 1,024 and 2,048 tokens, and TTFT in page1 at 512 tokens': rows and figures, by
    configuration and figure in their order."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r, f in items:
        groups.setdefault((r["configuration"], f), []).append(r["length"])
    parts = [f"{FIGURES[f][2]} in {c} at {listed([f'{n:,}' for n in ns])} tokens" for (c, f), ns in groups.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]


def kernel_sentence(cmp: dict) -> str | None:
    """Page one's sentence where a kernel's sources differ from the baseline version's: per kernel, the largest
    measured effect in the configurations that use it, and which lengths got slower (beyond the margin or within
    it); where nothing changed measurably, the smallest change that could have been seen. None without a kernel
    change."""
    if not cmp["kernels"]:
        return None
    by_kernel: dict[str, list[str]] = {}
    for k in cmp["kernels"]:
        by_kernel.setdefault(k["kernel"] or "none", []).append(k["configuration"])
    against, margin = f"v{cmp['before']['n']}", _pct(cmp["margin"])
    sentences = []
    for kernel, names in by_kernel.items():
        rows = [r for r in cmp["rows"] if r["configuration"] in names and r["status"] == COMPARED]
        told = [(r, f) for r in rows for f in FIGURES if r[f] and r[f]["verdict"] in (FASTER, SLOWER)]
        head = f"The change to kernel {kernel} since {against}"
        if not rows:
            sentences.append(f"{head} was not measured again like with like in {listed(names)}.")
            continue
        if not told:
            worst = max((r[f]["detectable"] for r in rows for f in FIGURES if r[f] and r[f]["detectable"] is not None), default=None)
            could = (f" (a change under {_pct(worst)} could go unseen: found in fewer than {DETECTION:.0%} of reruns at "
                     "this noise and these trials)") if worst is not None else ""
            sentences.append(f"{head} made no measurable change in {listed(names)} at any length{could}.")
            continue
        r, f = max(told, key=lambda x: abs(math.log(x[0][x[1]]["ratio"])))
        slow = [(r, f) for r, f in told if r[f]["verdict"] == SLOWER]
        beyond = [(r, f) for r, f in slow if r[f]["regression"]]
        if not slow:
            tail = "no length got slower"
        else:
            said = lengths_words(beyond or slow)
            tail = f"slower beyond the {margin} margin: {said}" if beyond else f"slower but within the {margin} margin: {said}"
        sentences.append(f"{head} made {effect_words(r, f)}; {tail}.")
    return " ".join(sentences)


def regression_line(g: dict, against: str, margin: float) -> str:
    """One regression as the gate prints it."""
    return (f"{g['configuration']} at {g['length']:,} tokens: {FIGURES[g['figure']][2]} now/before {sig(g['ratio'], 3)} "
            f"[{sig(g['low'], 3)}, {sig(g['high'], 3)}], n={g['n_before']}/{g['n_now']}, slower beyond the "
            f"{_pct(margin)} margin against {against}")


def against_record(before: dict, record: dict, margin: float | None = None) -> dict:
    """compare(before, record) with the margin and confidence `record` was made with (its "compare": report.
    regression_margin, the fits' confidence), or `margin` where given."""
    settings = record.get("compare") or {}
    return compare(before, record, settings.get("margin", MARGIN) if margin is None else margin,
                   settings.get("confidence", 0.95))


def gate(version_json: str | Path, versions_dir: str | Path | None = None, against: str | None = None,
         margin: float | None = None) -> tuple[int, dict, list[str]]:
    """`longctx gate`: this version (version_json, the record the report was built from) against `against`
    (default: the version the report compares with, report.compare_to), regressions beyond `margin` (default:
    the report's, report.regression_margin). Returns (exit status, the JSON answer, the lines to print): 1 with a
    line per regression, 0 without, 2 with one line where nothing can be compared."""
    path = Path(version_json)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return 2, {"error": f"{path}: {exc}"}, [f"nothing to compare: {path} cannot be read ({type(exc).__name__}); "
                                                "build the report first (snakemake --cores 1 report/longctx.pdf)"]
    against = against or (record.get("compare") or {}).get("against") or PREVIOUS
    versions_dir = Path(versions_dir) if versions_dir else path.parent / "versions"
    try:
        before, why = baseline_of(versions_dir, record, against)
        if before is None:
            return 2, {"error": why}, [f"nothing to compare: {why}"]
        cmp = against_record(before, record, margin)
    except SystemExit as exc:  # VersionError, or a version log that cannot be read
        return 2, {"error": str(exc.code)}, [f"nothing to compare: {exc.code}"]
    name = f"v{before['n']}"
    margin = cmp["margin"]
    answer = {"against": name, "version": f"v{record['n']}", "margin": margin, "regressions": cmp["regressions"],
              "compared": cmp["compared"], "same_measurements": cmp["same"], "not_compared": cmp["unlike"]}
    if not cmp["compared"]:
        if cmp["same"] and not cmp["unlike"] and all(r["status"] == SAME_MEASUREMENTS for r in cmp["rows"]):
            return 0, answer, [f"no regression: v{record['n']} has the same measurements as {name} (nothing was measured again)"]
        why = "; ".join(f"{u['configuration']}: {u['why']}" for u in cmp["unlike"]) or (
            f"fewer than {MIN_TRIALS} successful trials a side wherever both measured" if cmp["rows"] else
            f"no configuration and length was measured by both v{before['n']} and v{record['n']}")
        answer["error"] = why
        return 2, answer, [f"nothing to compare with {name}: {why}"]
    if cmp["regressions"]:
        return 1, answer, [regression_line(g, name, margin) for g in cmp["regressions"]]
    return 0, answer, [f"no regression beyond the {_pct(margin)} margin against {name}: {cmp['compared']} "
                       f"configuration and length{'s' if cmp['compared'] != 1 else ''} compared ({cmp['tests']} intervals, "
                       f"{cmp['correction']} over the table)"]


def table_lines(cmp: dict) -> list[str]:
    """`longctx compare`'s table, one line per row: the ratios now/before with their intervals, n and verdicts."""
    family = (f"Welch intervals holding together at {cmp['confidence']:.0%} over the table's {cmp['tests']} "
              f"({cmp['correction']}: each at {cmp['level']:.3%}, {sig(cmp['width_cost'], 2)}x as wide as one alone)"
              if cmp["tests"] else "no interval")
    lines = [f"v{cmp['now']['n']} against v{cmp['before']['n']}: ratios now/before (TTFT above 1 and decode below 1 are "
             f"slower), {family}, margin {_pct(cmp['margin'])}"]
    for r in cmp["rows"]:
        if r["status"] != COMPARED:
            lines.append(f"{r['configuration']:>20} {r['length']:>8,}  {r['status']}")
            continue
        parts = []
        for f in FIGURES:
            c = r[f]
            if c is None:
                parts.append(f"{FIGURES[f][2]} --")
                continue
            ci = f" [{sig(c['ci'][0], 3)}, {sig(c['ci'][1], 3)}]" if c["ci"] else ""
            verdict = ("no measurable change" if c["verdict"] == SAME else c["verdict"]) + \
                (", beyond the margin" if c["beyond_margin"] else "")
            seen = f", under {_pct(c['detectable'])} could go unseen" if c["detectable"] is not None else ""
            parts.append(f"{FIGURES[f][2]} {sig(c['ratio'], 3)}{ci} {verdict}{seen}")
        lines.append(f"{r['configuration']:>20} {r['length']:>8,}  n={r['n_before']}/{r['n_now']}  " + "; ".join(parts))
    for u in cmp["unlike"]:
        lines.append(f"{u['configuration']}: not compared, {u['why']}")
    return lines
