"""Does the speculative drafter still help at long context? Each drafting configuration against its twin without
drafting, per length: acceptance (tokens per verify step, from the server's own counts), the decode speedup with
its interval, and the length where the drafter stops paying.

A configuration drafts where its trials carry acceptance (the server's spec_* counts: SGLang's meta_info, vLLM's
/metrics counters differenced per trial). Its twin is the configuration measured in the same run that is like with like (longctx.analysis.identity, the
rule a version's comparison uses too) but for the engine's drafting flags (EngineAdapter.drafting_flag): the same
engine, version and code, model, settings and kernel, and no acceptance of its own; none
found, the configuration's acceptance is reported without a speedup, and why.

The speedup at a length is the drafting configuration's decode rate over its twin's (ratio of geometric means of
the successful single-request trials), with Welch's interval on the logs (analysis.compare.change). Every row of
every drafting configuration is one family: each interval is at the Bonferroni level 1 - (1 - confidence) / m
(compare.family_level), so the verdicts of the whole table are right together with probability at least
`confidence`; its cost in width is recorded (width_cost). The drafter "stops paying" at the first length from which
on every interval lies under 1 + MARGIN (no gain worth the name), where a shorter one was faster: the change lies
between that length and the last faster one before it, which is as close as the lengths measured can place it. A
longer length whose interval is too wide to tell (it reaches above 1 + MARGIN without clearing 1) is said as such,
not as the drafter having stopped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..engines import get_adapter
from .compare import FASTER, MARGIN, SLOWER, change, family_level, welch_df, width_cost
from .identity import identity, unlike
from .tables import ok_rows


def _drafting_keys(entry: dict):
    """The settings keys the entry's engine drafts with (its args' drafting flags: EngineAdapter.drafting_flag)."""
    try:
        adapter = get_adapter(entry.get("engine") or "")
    except ValueError:
        return lambda key: False
    return lambda key: key.startswith("args.") and adapter.drafting_flag(key[len("args."):])


def twin(name: str, entries: dict, drafting: set[str]) -> tuple[str | None, str]:
    """The configuration `name` is compared with, and why (or why none): one of this run's that does not draft and
    is like with like but for the drafting flags (longctx.analysis.identity.unlike: the same engine, version and
    code, hardware, model, settings and kernel)."""
    me = entries.get(name) or {}
    if (me.get("settings") or {}).get("shown") is None:
        return None, "its settings are not in the provenance (measured before they were recorded)"
    mine, ignored = identity(me), _drafting_keys(me)
    same = [other for other, e in sorted(entries.items()) if other != name and other not in drafting
            and (e.get("settings") or {}).get("shown") is not None and unlike(mine, identity(e), (), ignored) is None]
    if not same:
        return None, ("no configuration of this run has its settings without drafting (the same engine and version, "
                      "model, flags but the drafting ones, protocol and kernel): add one to measure what drafting buys")
    why = "the same settings without drafting" + (f" (of {len(same)} such configurations, the first by name)" if len(same) > 1 else "")
    return same[0], why


def pays(row: dict, margin: float = MARGIN) -> str | None:
    """What a row's interval says of the drafter: "yes" (faster), "no" (its whole interval under 1 + margin: no gain
    worth the name, slower included), "unclear" (an interval too wide to tell), None without an interval."""
    ci = row.get("ci")
    if not ci:
        return None
    return "yes" if ci[0] > 1 else "no" if ci[1] < 1 + margin else "unclear"


def stops_paying(rows: list[dict], margin: float = MARGIN) -> dict | None:
    """Where the drafter stops paying, from rows sorted by length: {"length": the first length after the last faster
    one, from which on every interval lies under 1 + margin, "after": that last faster length, "slower_from": the
    first slower length from there, if any}. None where no length was faster, the longest still is, or a longer
    length's interval is too wide to tell (pays: "unclear"): a wide interval is no evidence that it stopped."""
    said = [r for r in rows if pays(r, margin) is not None]
    faster = [i for i, r in enumerate(said) if pays(r, margin) == "yes"]
    if not faster or faster[-1] == len(said) - 1:
        return None
    k = faster[-1] + 1
    if any(pays(r, margin) != "no" for r in said[k:]):
        return None
    slower = next((r["length"] for r in said[k:] if r["verdict"] == SLOWER), None)
    return {"length": said[k]["length"], "after": said[faster[-1]]["length"], "slower_from": slower}


def _median(values) -> float | None:
    v = pd.Series(values, dtype=float).dropna()
    return float(v.median()) if len(v) else None


def drafting(df: pd.DataFrame, provenance: dict | None, confidence: float) -> dict:
    """{"configurations": {name: {"baseline", "why", "rows": [per length], "stops_paying", "model", "text"}},
    "family": {"tests", "level", "confidence", "correction", "width_cost"}}; empty configurations where none drafts."""
    entries = (provenance or {}).get("configurations", {})
    ok = ok_rows(df)
    has = "spec_accept_length" in ok
    drafts = sorted({str(n) for n, g in ok.groupby("configuration") if has and g["spec_accept_length"].notna().any()})
    pairs = {name: twin(name, entries, set(drafts)) for name in drafts}
    groups = {(str(n), int(L)): g for (n, L), g in ok.groupby(["configuration", "length"])}
    compared = [(name, L) for name, (base, _) in pairs.items() if base for (n, L) in groups if n == name and (base, L) in groups]
    level = family_level(len(compared), confidence)
    # what the correction costs in width, at the fewest trials a side of the table (Welch's df as if the noise were equal)
    few = min((min(len(groups[(n, L)]), len(groups[(pairs[n][0], L)])) for n, L in compared), default=0)
    out: dict = {"configurations": {}, "family": {
        "tests": len(compared), "confidence": confidence, "level": level, "correction": "bonferroni", "width_trials": few,
        "margin": MARGIN,
        "width_cost": width_cost(level, confidence, welch_df(few, few)) if few >= 2 else None}}
    for name in drafts:
        base, why = pairs[name]
        entry = entries.get(name) or {}
        rows = []
        for (n, L), g in sorted(groups.items()):
            if n != name:
                continue
            row = {"length": L, "acceptance": _median(g["spec_accept_length"]),
                   "acceptance_range": [float(g["spec_accept_length"].min()), float(g["spec_accept_length"].max())]
                   if g["spec_accept_length"].notna().any() else None,
                   "accept_rate": _median(g["spec_accept_rate"]) if "spec_accept_rate" in g else None,
                   "trials": int(len(g)), "speedup": None, "ci": None, "verdict": None, "pays": None, "n": None, "n_baseline": None,
                   "decode_tok_s": None, "baseline_decode_tok_s": None}
            ref = groups.get((base, L)) if base else None
            if ref is not None:
                c = change(ref["decode_tok_s"], g["decode_tok_s"], smaller_is_faster=False, level=level, margin=0.0)
                if c is not None:
                    row.update(speedup=c["speedup"], ci=c["speedup_ci"], verdict=c["verdict"], n=c["trials"],
                               pays=pays({"ci": c["speedup_ci"]}),
                               n_baseline=c["trials_before"],
                               decode_tok_s=float(np.exp(np.log(g["decode_tok_s"]).mean())),
                               baseline_decode_tok_s=float(np.exp(np.log(ref["decode_tok_s"]).mean())))
            rows.append(row)
        probe = entry.get("prompt_probe") or {}
        drafts_with = _drafting_keys(entry)
        flags = {k: v for k, v in ((entry.get("settings") or {}).get("shown") or {}).items() if drafts_with(k)}
        out["configurations"][name] = {
            "baseline": base, "why": why, "rows": rows, "stops_paying": stops_paying(rows),
            "model": (entry.get("model") or {}).get("name") if isinstance(entry.get("model"), dict) else entry.get("model"),
            "text": probe.get("text_source"), "flags": flags,
            "method": next((str(v) for k, v in flags.items() if k.endswith(("algorithm", "method"))), None),
        }
    return out
