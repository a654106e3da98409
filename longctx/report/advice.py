"""The advice's section of the report and its twin (report/advice.json, longctx.analysis.advise): per configuration
the flags to restart with, the figures predicted there with their intervals, the runner-up, what the pick changes
against the setting measured, and which constraint binds; where no searched setting meets the goal, the no and the
nearest setting. Nothing where no goal was set (no `advise` in the config: the file is not an input)."""

from __future__ import annotations

import json
from pathlib import Path

from ..analysis.advise import flag_words

__all__ = ["read", "view"]

# the predicted figures the section prints: (key in `predicted`, what, unit, scale)
FIGURES = (("ttft_s_p50", "TTFT p50", "s", 1.0), ("tpot_s_p50", "TPOT p50", "ms", 1e3),
           ("goodput_rps", "goodput", "req/s", 1.0))


def read(path: str | Path | None) -> dict:
    if not path or not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text())


def _figure(predicted: dict, key: str, what: str, unit: str, scale: float) -> dict:
    f = predicted.get(key) or {}
    v, iv = f.get("value"), f.get("interval")
    return {"what": what, "unit": unit, "value": None if v is None else v * scale,
            "low": iv[0] * scale if iv else None, "high": iv[1] * scale if iv else None}


def _setting(ans: dict | None, device: str | None) -> dict | None:
    if not ans:
        return None
    reserve = ans.get("reserve_bytes_per_gpu")
    gives = [f"a KV pool of {ans['pool_tokens']:,} tokens" if ans.get("pool_tokens") else None,
             f"the longest request {ans['largest_context']:,} tokens" if ans.get("largest_context") else None,
             f"{ans['concurrency_fits']:,} of the workload's requests at once" if ans.get("concurrency_fits") else None,
             f"{reserve / 1e9:.3g} GB{' per GPU' if device == 'gpu' else ''} of memory left beside the pool"
             if reserve is not None else None]
    return {"flags": flag_words(ans["flags"]), "gives": ", ".join(g for g in gives if g),
            "figures": [_figure(ans.get("predicted") or {}, *f) for f in FIGURES] if ans.get("predicted") else []}


def _changes(searched: dict, measured: dict, ans: dict | None) -> list[dict]:
    """What the pick changes against the setting measured: each flag whose value moves (the one not searched is the
    context length, set to the goal's), the KV pool and the memory left beside it."""
    if not ans:
        return []
    out = []
    for flag, v in ans["flags"].items():  # a flag's value as it is typed: 8192, not 8,190
        was = measured.get(flag) if flag in searched.values() else measured.get("context_length")
        if was != v:
            out.append({"what": f"--{flag}", "measured": "--" if was is None else f"{was:g}", "advised": f"{v:g}"})
    for key, what, shown in (("pool_tokens", "KV pool (tokens)", "{:,}"), ("reserve_bytes_per_gpu", "memory reserve (GB)", "{:.3g}")):
        if measured.get(key) and ans.get(key) and measured[key] != ans[key]:
            scale = 1e-9 if key == "reserve_bytes_per_gpu" else 1
            out.append({"what": what, "measured": shown.format(measured[key] * scale), "advised": shown.format(ans[key] * scale)})
    return out


MAXIMISE = {"goodput": "maximising goodput (requests a second that meet the SLO)", "concurrency": "maximising concurrency",
            "context": "maximising the longest context", "reserve": "leaving the most memory beside the pool"}


def _goal(goal: dict, maximise: str) -> str:
    w, slo = goal.get("workload") or {}, goal.get("slo") or {}
    parts = [f"a {goal['context']:,}-token request fits" if goal.get("context") else None]
    if w:
        load = f"a closed loop of {w['concurrency']:g}" if w.get("concurrency") else f"Poisson arrivals at {w['rate']:g}/s"
        parts.append(f"{load}, {w['prompt']:,}-token prompts and {w['output']:,} output tokens")
    bounds = [f"TTFT {slo['ttft_s']:g} s" if slo.get("ttft_s") else None, f"TPOT {slo['tpot_s'] * 1e3:g} ms"
              if slo.get("tpot_s") else None]
    if any(bounds):
        parts.append(f"within {' and '.join(b for b in bounds if b)} at p{slo.get('percentile', 50):g}")
    return "; ".join(p for p in parts if p) + f"; {MAXIMISE.get(maximise, maximise)}"


NAMES = {key: (what, unit, scale) for key, what, unit, scale in FIGURES} | {
    "ttft_s_p90": ("TTFT p90", "s", 1.0), "tpot_s_p90": ("TPOT p90", "ms", 1e3)}


def _verified(v: dict | None) -> dict | None:
    """The verifying run's figures against the advice's, as printed: each predicted with its interval, measured with
    its, the error and whether it held; the pool, the request at the goal's context, the SLO and the verdict."""
    if not v:
        return None
    rows = []
    for f in v["figures"]:
        what, unit, scale = NAMES[f["key"]]
        p, m = f["predicted"] or {}, f["measured"]
        iv = p.get("interval")
        rows.append({"what": what, "unit": unit,
                     "predicted": None if p.get("value") is None else p["value"] * scale,
                     "predicted_low": iv[0] * scale if iv else None, "predicted_high": iv[1] * scale if iv else None,
                     "measured": None if m.get("value") is None else m["value"] * scale,
                     "measured_low": None if m.get("low") is None else m["low"] * scale,
                     "measured_high": None if m.get("high") is None else m["high"] * scale,
                     "error": f["error"], "held": f["held"], "inconclusive": bool(f.get("inconclusive"))})
    said = []
    pool = v.get("pool")
    if pool:
        said.append(f"the server allocated a KV pool of {pool['measured']:,} tokens, {pool['error']:+.1%} from the "
                    f"{pool['predicted']:,} predicted ({'within' if pool['held'] else 'beyond'} the planner's 5%)")
    ctx = v.get("context")
    if ctx:
        said.append(f"a {ctx['length']:,}-token request " + ("was answered" if ctx["fits"] else f"failed: {ctx['reason']}")
                    if ctx.get("length") else f"no request at the goal's context: {ctx['reason']}")
    if "slo_held" in v:
        said.append("the measured workload met the SLO" if v["slo_held"] else "the measured workload missed the SLO")
    if (v.get("workload") or {}).get("reason"):
        said.append(v["workload"]["reason"])
    if not v["flags_match"]:
        said.append("the run's flags are not the ones recommended")
    other = {"pool_tokens": "the KV pool", "context": "the request at the goal's context", "flags": "the flags",
             "workload": "the workload"}
    moved = v.get("drift")
    if moved:
        said.append(moved["words"])
    verdict = ("proven: every prediction held" if v["proven"] else
               "unproven: " + ", ".join(other.get(k) or NAMES[k][0] for k in v["missed"]) + " missed" if v["missed"] else
               "inconclusive: " + ", ".join(NAMES[k][0] for k in v.get("inconclusive") or []) + " missed by less than the "
               f"{moved['drift']:.0%} the machine moved between the two runs could explain")
    said = "; ".join(said)
    return {"configuration": v["configuration"], "rows": rows, "said": said[:1].upper() + said[1:], "verdict": verdict,
            "proven": v["proven"]}


def view(doc: dict, order: list[str]) -> dict:
    """What the templates print: `any` (a section at all), the goal in words, and per configuration its advice."""
    confs = doc.get("configurations") or {}
    names = [n for n in order if n in confs] + [n for n in confs if n not in order]
    rows = []
    for name in names:
        a = confs[name]
        if a.get("reason"):
            rows.append({"name": name, "reason": a["reason"]})
            continue
        ans = a.get("recommended") if a["feasible"] else a.get("nearest")
        rows.append({"name": name, "reason": None, "engine": a["engine"], "feasible": a["feasible"],
                     "binding": a["binding"], "setting": _setting(ans, a.get("device")),
                     "runner_up": _setting(a.get("runner_up"), a.get("device")), "settings": a.get("settings"),
                     "changes": _changes(a.get("flags") or {}, a.get("measured") or {}, ans), "extrapolates": a.get("extrapolates") or [],
                     "verified": _verified(a.get("verified"))})
    # what is maximised as the search took it (with a context to fit and no workload: the reserve)
    maximise = next((c["maximise"] for c in confs.values() if c.get("maximise")), (doc.get("goal") or {}).get("maximise"))
    return {"any": bool(rows), "goal": _goal(doc["goal"], maximise or "goodput") if doc.get("goal") else None,
            "configurations": rows}
