"""What the report shows of the prefix cache (issue 19): data/prefix_fits.json (longctx.analysis.prefix_model)
read into rows the LaTeX section and its Markdown twin print alike, and page one's sentence.

`read` gives prefix_fits.json as a dict (an absent file, or none given, is an empty one); `view` shapes it for
the templates: per configuration the cost model's coefficients with their intervals beside the cold fit's, the
hit-rate points (median TTFT, the model's prediction, the saving against cold measured and predicted), the
conversations turn by turn (with the cache and the control), the cached-count check (mismatches with both
numbers) and the failures with their reasons. A configuration with nothing measured says so with its reason;
one whose prefix workloads were "not configured" is not in the file at all (longctx.analysis.prefix).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..core.numbers import is_number
from ..measure.prefix import UNKNOWN_SPAN
from .load import time_words

NAMES = ("a_s", "b_s_per_token", "c_s_per_token2")
WORDS = {"a_s": "a (s)", "b_s_per_token": "b (µs per token)", "c_s_per_token2": "c (ns per token²)"}
SCALE = {"a_s": 1.0, "b_s_per_token": 1e6, "c_s_per_token2": 1e9}
# a check's tallies (longctx.analysis.prefix_model._check_counts) where a record has none
CHECK_BLANK = {"ok": 0, "mismatch": 0, "unreported": 0, "loose": 0, "controls": 0, "hit_mismatch": 0, "hit_expected": 0,
               "n": 0, "mismatches": []}
MISMATCHES_SHOWN = 12  # mismatches listed per configuration; the rest are counted


def read(path: str | Path | None) -> dict:
    """prefix_fits.json as a dict; {} where there is no file."""
    if not path or not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text())


def _est(x: dict | None) -> dict | None:
    return x if isinstance(x, dict) and is_number(x.get("value")) else None


def saving(s: dict | None) -> dict | None:
    """A saving {ratio, low, high, seconds} as an estimate {value, low, high} of the ratio."""
    if not isinstance(s, dict) or not is_number(s.get("ratio")):
        return None
    return {"value": s["ratio"], "low": s.get("low"), "high": s.get("high"), "seconds": s.get("seconds")}


def _yes(x) -> str:
    return "--" if x is None else "yes" if x else "no"


def _coefficients(model: dict | None, cold: dict | None) -> list[dict]:
    rows = []
    for name in NAMES:
        chk = (cold or {}).get(name) or {}
        rows.append({"name": name, "words": WORDS[name], "scale": SCALE[name],
                     "value": (model or {}).get(name), "ci": ((model or {}).get("ci") or {}).get(name),
                     "cold": chk.get("cold"), "cold_ci": chk.get("cold_ci"), "ratio": chk.get("ratio"),
                     "inside_cold": _yes(chk.get("prefix_inside_cold")), "cold_inside": _yes(chk.get("cold_inside_prefix"))})
    return rows


def _point(p: dict) -> dict:
    cold = p.get("cold") or None
    check = {**CHECK_BLANK, **(p.get("check") or {})}
    return {**p, "hit_pct": 100 * float(p["hit_rate"]), "ttft": _est(p.get("ttft")), "predicted": _est(p.get("predicted")),
            "cold": cold, "cold_value": _est(cold), "cold_basis": (cold or {}).get("basis"),
            "saving": saving(p.get("saving")), "saving_predicted": saving(p.get("saving_predicted")),
            "deviation_pct": 100 * p["deviation"] if is_number(p.get("deviation")) else None, "check": check,
            "reason": "; ".join(p.get("reasons") or []) or None}


def _turn(t: dict) -> dict:
    return {**t, "predicted": _est(t.get("predicted")),
            "deviation_pct": 100 * t["deviation"] if is_number(t.get("deviation")) else None}


def _conversation(c: dict) -> dict:
    turns = [_turn(t) for t in sorted(c.get("turns") or [], key=lambda t: t.get("turn") or 0)]
    mad = c.get("median_abs_deviation")
    return {**c, "turns": turns, "label": "with the cache" if c.get("cache") else "control (cache flushed)",
            "median_abs_deviation_pct": 100 * mad if is_number(mad) else None, "reason": "; ".join(c.get("reasons") or []) or c.get("reason")}


def view(doc: dict, order: list[str] | None = None) -> dict:
    """What the prefix section shows; {'any': False, ...} without a configuration in the file. order: the
    configurations' order (the config's), the rest by name."""
    confs = (doc or {}).get("configurations") or {}
    names = [n for n in (order or []) if n in confs] + sorted(n for n in confs if n not in (order or []))
    out = []
    for name in names:
        c = confs[name] or {}
        points = sorted((_point(p) for p in c.get("points") or []), key=lambda p: (p["length"], p["hit_rate"]))
        convs = sorted((_conversation(x) for x in c.get("conversations") or []), key=lambda x: (not x.get("cache"), x.get("index") or 0))
        checks = {**CHECK_BLANK, **(c.get("checks") or {})}
        mism = [{**m, "where": _where(m)} for m in checks["mismatches"]]
        failures = [{"where": f"L = {p['length']:,}, h = {p['hit_rate']:g}", "failed": p["failed"], "n": p["n"], "reason": p["reason"]}
                    for p in points if p.get("failed")]
        failures += [{"where": f"conversation, {x['label']}", "failed": x["failed"], "n": x["n"], "reason": x["reason"]}
                     for x in convs if x.get("failed")]
        failures += [{"where": "the run", "failed": None, "n": None, "reason": r} for r in c.get("failed") or []]
        out.append({"name": name, "granularity": c.get("granularity"), "cache": c.get("cache"), "model": c.get("model"),
                    "model_reason": c.get("model_reason"), "coefficients": _coefficients(c.get("model"), c.get("cold_check")),
                    "cold_checked": bool(c.get("cold_check")), "points": points, "conversations": convs,
                    "checks": {**checks, "checked": checks["ok"] + checks["mismatch"], "mismatches": mism[:MISMATCHES_SHOWN],
                               "more": max(0, len(mism) - MISMATCHES_SHOWN)},
                    "failures": failures, "measured": bool(points or convs)})
    has = {"points": any(c["points"] for c in out), "conversations": any(c["conversations"] for c in out),
           "model": any(c["model"] for c in out), "mismatches": any(c["checks"]["mismatch"] for c in out)}
    return {"any": any(c["measured"] or c["failures"] for c in out), "configurations": out, "has": has, "loose_span": UNKNOWN_SPAN,
            "model_words": (doc or {}).get("model"), "level": ((doc or {}).get("settings") or {}).get("confidence"),
            "failures": [{"configuration": c["name"], **f} for c in out for f in c["failures"]],
            "unmeasured": [{"name": c["name"], "reason": "; ".join(f["reason"] for f in c["failures"] if f["reason"]) or "nothing measured"}
                           for c in out if not c["measured"]]}


def _where(m: dict) -> str:
    if m.get("kind") == "conversation":
        return f"conversation ({'with the cache' if m.get('cache') else 'control'}), turn {m.get('turn')}"
    h = m.get("hit_rate")
    return f"L = {int(m['length']):,}, h = {h:g}, trial {m.get('trial')}" if is_number(m.get("length")) and is_number(h) else "--"


def _x(r: float) -> str:
    return f"{r:.2g}x" if r < 100 else f"{r:,.0f}x"


def _one(name: str, c: dict) -> str | None:
    """'at 16,384 tokens a 90% prefix hit cuts TTFT from 3.6 s to 0.45 s (8x), as the model predicts within 5%'."""
    points = [p for p in c.get("points") or [] if _est(p.get("ttft")) and _est(p.get("cold")) and p.get("hit_rate", 0) > 0]
    if not points:
        return None
    p = max(points, key=lambda p: (p["length"], p["hit_rate"]))
    hit, cold = float(p["ttft"]["value"]), float(p["cold"]["value"])
    ratio = cold / hit
    frm = f"from {time_words(cold)}" if p["cold"].get("basis") != "cold fit" else f"from the {time_words(cold)} the cold fit predicts"
    verb = "cuts" if ratio >= 1 else "raises"
    text = f"at {int(p['length']):,} tokens a {100 * p['hit_rate']:.0f}% prefix hit {verb} TTFT {frm} to {time_words(hit)} ({_x(ratio)})"
    pred = _est(p.get("predicted"))
    if pred and is_number(p.get("deviation")):
        pct = max(1, math.ceil(abs(p["deviation"]) * 100 - 1e-9))
        text += (f", as the model predicts within {pct}%" if pct <= 10 else
                 f", where the model predicts {time_words(float(pred['value']))} ({pct}% off)")
    return text


def sentence(doc: dict | None) -> str | None:
    """Page one's sentence: per configuration with the cache on, what its longest length's highest hit rate
    saves against cold and how well the model predicts it; then the server's cached count over every trial
    and turn. None without a hit-rate point measured."""
    confs = sorted(((doc or {}).get("configurations") or {}).items())
    parts = [(n, t) for n, c in confs if (c or {}).get("cache") is not False for t in [_one(n, c or {})] if t]
    if not parts:
        return None
    text = parts[0][1] if len(parts) == 1 else "; ".join(f"in {n}, {t}" for n, t in parts)
    def total(key: str) -> int:
        return sum(((c or {}).get("checks") or {}).get(key) or 0 for _, c in confs)

    # only trials that expected a hit at a known granularity count as matches (a control's 0 = 0 cannot fail)
    ok, bad, loose, silent, controls_bad = (total("ok"), total("hit_mismatch"), total("loose"), total("unreported"),
                                            total("mismatch") - total("hit_mismatch"))
    if ok + bad:
        text += f"; the server's cached count matched in {ok:,} of {ok + bad:,} trials that expected a hit"
        if bad:
            where = [n for n, c in confs if ((c or {}).get("checks") or {}).get("hit_mismatch")]
            text += f" (mismatches in {', '.join(where)})" if len(confs) > 1 else ""
    if loose:
        text += (f"{',' if ok + bad else ';'} {loose:,} {'more ' if ok + bad else ''}within {UNKNOWN_SPAN} tokens of "
                 "the shared prefix, the cache's granularity not being known")
    if controls_bad:
        text += f"; {controls_bad:,} requests that expected no cached tokens got some"
    if silent:
        text += (f", and {silent:,} more did not report it" if ok + bad + loose else
                 f"; the server reported no cached count in {silent:,} trials")
    return text[0].upper() + text[1:] + "."
