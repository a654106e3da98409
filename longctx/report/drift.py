"""What the report says of the machine's drift (longctx.analysis.drift, from each configuration's metronome readings in
provenance.json): the run's drift figure per configuration (the appendix), and the sweep's lone request against the
load stage's, read against the drift around the two (the load section)."""

from __future__ import annotations

import pandas as pd

from ..analysis.drift import QUANTITIES, lone_request

# a lone-request comparison's verdict (longctx.analysis.drift.verdict, no tolerance) in the table's words
VERDICT = {"inconclusive": "within the drift", "fail": "differ", "pass": "agree"}


def run_words(entry: dict | None) -> str:
    """A configuration's run and its drift, in words (provenance.json's `metronome` entry; longctx.analysis.aggregate):
    the figure and the readings it comes from, what they cost, or why there is none."""
    m = entry or {}
    if not m or m.get("status") == "not configured":
        return "no metronome readings (metronome.enabled: false, or a run from before the metronome)"
    readings = m.get("readings") or []
    took = sum(r.get("took_s") or 0 for r in readings)
    cost = f", {took:.2g} s of the run" if took else ""
    figure = m.get("drift")
    reason = f"; {m['reason']}" if m.get("reason") else ""
    if not figure:
        return f"{len(readings)} metronome reading(s){cost}: too few for a drift figure{reason}"
    return f"{figure['words']}; {len(readings)} readings{cost}{reason}"


def _ms(x: float | None) -> str:
    return f"{x * 1e3:.3g}" if x else "--"


def lone_requests(df: pd.DataFrame, load: dict, provenance: dict, order: list[str]) -> dict:
    """Per configuration measured under load, the lone request of the sweep against the load stage's closed loop of
    one at the same length (longctx.analysis.drift.lone_request) as the load section prints it: {"any",
    "configurations": [{"name", "rows": [{"length", per quantity its sweep and load medians (ms), ratio and verdict
    words}], "drift_words": what each row is read against}]}."""
    confs = (load or {}).get("configurations") or {}
    entries = (provenance or {}).get("configurations") or {}
    names = [n for n in order if n in confs] + sorted(n for n in confs if n not in order)
    out = []
    for name in names:
        readings = ((entries.get(name) or {}).get("metronome") or {}).get("readings")
        cmp = lone_request(df[df["configuration"] == name], confs[name], readings)
        if not cmp["rows"]:
            continue
        rows = []
        for r in cmp["rows"]:
            row = {"length": r["length"], "n_sweep": r["sweep"]["n"], "n_load": r["load"]["n"]}
            for q in QUANTITIES:
                v = (r["verdicts"] or {}).get(q)
                row[q] = {"sweep": _ms(r["sweep"].get(q)), "load": _ms(r["load"].get(q)),
                          "ratio": f"{r['ratio'][q]:.2f}" if q in r["ratio"] else "--",
                          "verdict": VERDICT[v["verdict"]] if v else ("--" if q not in r["ratio"] else "no drift measured"),
                          "words": v["words"] if v else None}
            rows.append(row)
        said = [f"at {r['length']:,} tokens, the sweep's lone request sent just before and after the loop of one: "
                + (r["drift"]["words"] if r["drift"] else "too few of them for a drift figure")
                for r in cmp["rows"] if r["interleaved"]]
        if not all(r["interleaved"] for r in cmp["rows"]):
            said.append(("the sweep's own trials, minutes before the loop: " if said else "")
                        + (cmp["drift"]["words"] if cmp["drift"] else "no metronome readings around the two stages: "
                           "the comparison is not read against the machine's drift"))
        out.append({"name": name, "rows": rows, "drift_words": "; ".join(said)})
    return {"any": bool(out), "configurations": out}
