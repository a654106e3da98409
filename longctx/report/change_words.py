"""A comparison of two sides in words: the effect of a row, what could not be seen, the kernel's sentence on page one,
the gate's lines and `longctx compare`'s table.

A comparison (longctx.report.changes for two versions measured in two runs, longctx.report.ab for an A/B measured
in one) is a dict with the family of longctx.analysis.sides.table (rows, tests, level, lost, regressions, margin)
and how its sides are named: before/now {"name"}; "kind" (sides.ACROSS_RUNS or sides.INTERLEAVED); "drift" per
configuration where the runs' metronomes measured it (across runs).
"""

from __future__ import annotations

import math

from ..analysis.ab import CALL
from ..analysis.compare import DETECTION, FASTER, METRICS, SAME, SLOWER
from ..analysis.sides import COMPARED, INTERLEAVED
from ..core.words import listed
from .numbers import rounded, sig

FIGURES = {**METRICS, **CALL}  # every figure a comparison may have, with its words


def figures(r: dict) -> list[str]:
    """The figures of a comparison's row (TTFT and decode; an A/B's kernel level: the call's time)."""
    return r.get("figures") or list(METRICS)


def times(x: float) -> str:
    return f"{sig(x, 2) if x < 10 else rounded(x)}x"


def pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _n(r: dict, c: dict) -> str:
    """'n=3/3' (trials before/now) or '8 pairs' (an A/B's unit)."""
    return f"{c['pairs']} pairs" if "pairs" in c else f"n={c['trials_before']}/{c['trials']}"


def effect_words(r: dict, figure: str) -> str:
    """'decode in page1-twin 1.8x [1.6, 2.0] faster at 16,384 tokens, n=3/3' (a slower one by the factor it
    slowed by)."""
    c = r[figure]
    s, ci = c["speedup"], c["speedup_ci"]
    slower = c["verdict"] == SLOWER
    factor, lo, hi = (1 / s, 1 / ci[1], 1 / ci[0]) if slower else (s, ci[0], ci[1])
    digits = 2 if sig(lo, 2) != sig(hi, 2) else 3  # a narrow interval is not written as a point
    return (f"{FIGURES[figure].words} in {r['configuration']} {times(factor)} [{sig(lo, digits)}, {sig(hi, digits)}] "
            f"{'slower' if slower else 'faster'} at {r['length']:,} tokens, {_n(r, c)}")


def _drift_note(cmp: dict, configuration: str) -> str:
    d = (cmp.get("drift") or {}).get(configuration)
    return f"; the machine moved by up to {pct(d['drift'])} between the runs" if d and d["drift"] > 0 else ""


def detectable_words(cmp: dict) -> list[dict]:
    """Per configuration compared: the smallest change its rows could have shown, in words ('in page64, a change under
    31% could go unseen (decode at 16,384 tokens, 3/3 trials; the machine moved by up to 12% between the runs)'), from
    the row and figure that could show least, and the best of its rows beside it."""
    by: dict[str, list[tuple[float, dict, str]]] = {}
    for r in cmp["rows"]:
        for f in figures(r):
            c = r[f]
            if c and c["detectable"] is not None:
                by.setdefault(r["configuration"], []).append((c["detectable"], r, f))
    out = []
    for name, items in by.items():
        worst, r, f = max(items, key=lambda x: x[0])
        best = min(x[0] for x in items)
        c = r[f]
        unit = f"{c['pairs']} pairs" if "pairs" in c else f"{c['trials_before']}/{c['trials']} trials"
        out.append({"configuration": name, "worst": worst, "best": best, "length": r["length"], "figure": f,
                    "text": f"in {name}, a change under {pct(worst)} could go unseen ({FIGURES[f].words} at {r['length']:,} "
                            f"tokens, {unit}{_drift_note(cmp, name)})"
                            + (f", under {pct(best)} at its best length" if pct(best) != pct(worst) else "")})
    return out


def lengths_words(items: list[tuple[dict, str]]) -> str:
    """'decode in page16 at 1,024 and 2,048 tokens, and TTFT in page1 at 512 tokens': rows and figures, by
    configuration and figure in their order."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r, f in items:
        groups.setdefault((r["configuration"], f), []).append(r["length"])
    parts = [f"{FIGURES[f].words} in {c} at {listed([f'{n:,}' for n in ns])} tokens" for (c, f), ns in groups.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]


def _source(cmp: dict) -> str:
    """Where the verdict comes from, in words."""
    if cmp.get("kind") == INTERLEAVED:
        return cmp.get("source") or "measured against it in one run, interleaved"
    return "measured in another run"


def kernel_sentence(cmp: dict) -> str | None:
    """Page one's sentence where a kernel's sources differ from the baseline's: per kernel, the largest measured
    effect in the configurations that use it, and which lengths got slower (beyond the margin or within it) or were
    lost; where nothing changed measurably, the smallest change that could have been seen. It says where the verdict
    comes from (another run, with the drift between; or an A/B in one run). None without a kernel change."""
    if not cmp["kernels"]:
        return None
    by_kernel: dict[str, list[str]] = {}
    for k in cmp["kernels"]:
        by_kernel.setdefault(k["kernel"] or "none", []).append(k["configuration"])
    against, margin = cmp["before"]["name"], pct(cmp["margin"])
    sentences = []
    for kernel, names in by_kernel.items():
        rows = [r for r in cmp["rows"] if r["configuration"] in names and r["status"] == COMPARED]
        lost = [x for x in cmp.get("lost") or [] if x["configuration"] in names]
        told = [(r, f) for r in rows for f in figures(r) if r[f] and r[f]["verdict"] in (FASTER, SLOWER)]
        head = f"The change to kernel {kernel} since {against} ({_source(cmp)})"
        gone = "; lost: " + listed([f"{x['configuration']} at {x['length']:,} tokens" for x in lost]) if lost else ""
        if not rows:
            sentences.append(f"{head} was not measured again like with like in {listed(names)}.")
            continue
        if not told:
            worst = max((r[f]["detectable"] for r in rows for f in figures(r) if r[f] and r[f]["detectable"] is not None),
                        default=None)
            drift = max((d["drift"] for n, d in (cmp.get("drift") or {}).items() if n in names), default=0.0)
            moved = f", with the {pct(drift)} the machine moved between the runs" if drift else ""
            could = (f" (a change under {pct(worst)} could go unseen: found in fewer than {DETECTION:.0%} of reruns at "
                     f"this noise and these trials{moved})") if worst is not None else ""
            sentences.append(f"{head} made no measurable change in {listed(names)} at any length{could}{gone}.")
            continue
        r, f = max(told, key=lambda x: abs(math.log(x[0][x[1]]["ratio"])))
        slow = [(r, f) for r, f in told if r[f]["verdict"] == SLOWER]
        beyond = [(r, f) for r, f in slow if r[f]["regression"]]
        if not slow:
            tail = "no length got slower"
        else:
            said = lengths_words(beyond or slow)
            tail = f"slower beyond the {margin} margin: {said}" if beyond else f"slower but within the {margin} margin: {said}"
        sentences.append(f"{head} made {effect_words(r, f)}; {tail}{gone}.")
    return " ".join(sentences)


def regression_line(g: dict, against: str, margin: float) -> str:
    """One regression as the gate prints it (with the drift it cleared where one was allowed for)."""
    beyond = f"the {pct(margin)} margin"
    if g.get("threshold") and g["threshold"] > 1 + margin + 1e-9:
        beyond += f" and the machine's drift between the runs ({pct(g['threshold'] / (1 + margin) - 1)})"
    return (f"{g['configuration']} at {g['length']:,} tokens: {FIGURES[g['figure']].words} now/before {sig(g['ratio'], 3)} "
            f"[{sig(g['low'], 3)}, {sig(g['high'], 3)}], {_count(g)}, slower beyond {beyond} against {against}")


def _count(g: dict) -> str:
    return f"n={g['n_before']}/{g['n_now']}" if g.get("unit", "trial") == "trial" else f"{g['n_now']} pairs"


def lost_line(x: dict, against: str) -> str:
    """A length lost since the baseline, as the gate prints it."""
    unit = "successful trials" if x.get("unit", "trial") == "trial" else "pairs with both sides measured"
    what = listed([FIGURES[f].words for f in x["figures"]]) if x.get("figures") else "it"
    return (f"{x['configuration']} at {x['length']:,} tokens: {what} lost since {against} ({x['n_before']} then "
            f"{x['n_now']} {unit}): {x['why']}")


def pass_line(cmp: dict) -> str:
    """The gate's line where nothing got slower and nothing was lost: what it compared and what it could not see
    ("no regression beyond the 5% margin against v3: 38 rows compared (...); a slowdown under 12% at page64 16,384
    tokens could go unseen")."""
    against = cmp["before"]["name"]
    n = cmp["compared"]
    head = (f"no regression beyond the {pct(cmp['margin'])} margin against {against}: {n} configuration and "
            f"length{'s' if n != 1 else ''} compared ({cmp['tests']} one-sided bounds, {cmp['correction']} over the table"
            f"{', ' + cmp['source'] if cmp.get('source') else ''})")
    worst = max(cmp.get("detectable") or [], key=lambda d: d["worst"], default=None)
    if worst is not None:
        head += (f"; a slowdown under {pct(worst['worst'])} at {worst['configuration']} {worst['length']:,} tokens "
                 f"({FIGURES[worst['figure']].words}) could go unseen")
    drifts = cmp.get("drift") or {}
    if drifts:
        d = max(drifts.values(), key=lambda d: d["drift"])
        head += f"; {d['words']}"
    if cmp.get("drift_unmeasured"):
        head += f"; the machine's drift between the runs was not measured for {listed(cmp['drift_unmeasured'])}"
    return head


def table_lines(cmp: dict) -> list[str]:
    """`longctx compare`'s table, one line per row: the ratios now/before with their bounds, n and verdicts."""
    family = (f"one-sided bounds at {cmp['level']:.3%} each, {cmp['correction']} over the table's {cmp['tests']}: no "
              f"false 'slower' anywhere in it in {cmp['confidence']:.0%} of reruns" if cmp["tests"] else "no interval")
    lines = [f"{cmp['now']['name']} against {cmp['before']['name']}: ratios now/before (TTFT above 1 and decode below 1 "
             f"are slower), {family}, margin {pct(cmp['margin'])}"]
    for r in cmp["rows"]:
        if r["status"] != COMPARED:
            lines.append(f"{r['configuration']:>20} {r['length']:>8,}  {r['status']}")
            continue
        parts = []
        for f in figures(r):
            c = r[f]
            if c is None:
                parts.append(f"{FIGURES[f].words} --")
                continue
            ci = f" [{sig(c['ci'][0], 3)}, {sig(c['ci'][1], 3)}]" if c["ci"] else ""
            verdict = ("no measurable change" if c["verdict"] == SAME else c["verdict"]) + \
                (", beyond the margin" if c["beyond_margin"] else "")
            seen = f", under {pct(c['detectable'])} could go unseen" if c["detectable"] is not None else ""
            parts.append(f"{FIGURES[f].words} {sig(c['ratio'], 3)}{ci} {verdict}{seen}")
        count = f"{r['n_now']} pairs" if r.get("unit") != "trial" else f"n={r['n_before']}/{r['n_now']}"
        lines.append(f"{r['configuration']:>20} {r['length']:>8,}  {count}  " + "; ".join(parts))
    for x in cmp.get("lost") or []:
        lines.append(lost_line(x, cmp["before"]["name"]))
    for u in cmp.get("unlike") or []:
        lines.append(f"{u['configuration']}: not compared, {u['why']}")
    for c, d in (cmp.get("drift") or {}).items():
        lines.append(f"{c}: {d['words']}")
    return lines
