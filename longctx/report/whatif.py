"""The what-if section's view of data/whatif.json (longctx.analysis.whatif): per configuration the serving model
in words, the prediction against every measured load point with its error, and the what-if grid's predicted
frontier beside the measured one (data/load.json)."""

from __future__ import annotations

import json
from pathlib import Path

from ..analysis.whatif import DRAWS, TOLERANCE

WORKLOAD = {"closed": "closed, c = {level}", "open": "open, {level}/s", "interference": "interference, {level} streams"}
QUANTITY = {"ttft": "TTFT", "tpot": "TPOT", "worst_gap": "worst stall"}


def read(path: str | Path | None) -> dict:
    if not path or not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text())


def _level(x) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)


def _model_words(c: dict) -> str:
    k, r = c["costs"], c["rules"]
    ms = lambda x: f"{x * 1e3:.3g} ms"  # noqa: E731
    us = lambda x: f"{x * 1e6:.3g} us"  # noqa: E731
    parts = [f"prefill chunk {us(k['b'])} per token + {k['c'] * 1e9:.3g} ns x ((p+k)^2 - p^2), {ms(k['a'])} once a step that "
             f"starts a prompt, {ms(k.get('s') or 0)} every further pass (a forward pass's fixed cost: the decode step's t0)",
             f"decode step {ms(k['t0'])} + {ms(k['r'])} per further request + {k['beta'] * 1e9:.3g} ns per context token "
             f"(the per-request cost {c['r_source']})"]
    if k.get("wake"):  # the wake probe's figures (longctx.analysis.load_summary.wake)
        parts.append("the first step after the server idled costs more: " + ", ".join(
            f"+{ms(e)} after {g:.2g} s" for g, e in k["wake"][1:]) + f" (against {k['wake'][0][0]:.2g} s idle)")
    sched = [f"{r['policy'].replace('_', ' ')}", f"chunk {r['chunk']:,}" if r.get("chunk") else "no chunking",
             f"at most {r['max_running']:,} running" if r.get("max_running") else "no running limit",
             f"pool {r['pool_tokens']:,} tokens" if r.get("pool_tokens") else "pool not known", f"page {r['page']}"]
    return "; ".join(parts) + ". Scheduler: " + ", ".join(sched) + f"; its rules: {c['rules_source']}"


def _trade(points: list[dict]) -> str:
    """A setting's TTFT and worst decode stall at its heaviest closed loop (the grid's highest concurrency, longest
    length): where the chunk's trade shows."""
    closed = [p for p in points if "concurrency" in p]
    if not closed:
        return "--"
    p = max(closed, key=lambda p: (p["concurrency"], p["length"]))
    s = lambda x: f"{x:.3g}" if x is not None else "--"  # noqa: E731
    return f"{s(p['ttft_p50'])} / {s(p['stall_max'])}"


def _verdict(row: dict) -> str:
    """A check row's verdict against the machine's drift (longctx.analysis.whatif.quoted); in a whatif.json written
    before the metronome, the error alone against TOLERANCE."""
    return row.get("verdict") or ("fail" if abs(row["error"]) > TOLERANCE else "pass")


def _drift_words(quoted: dict | None) -> dict:
    """The check read against the drift it was measured under (longctx.analysis.whatif.quoted): {"drift_words": what
    the machine moved, in words, or None without a figure; "verdict_words": the headline error against it;
    "verdict"; "anchored": how many rows had their model set to the sweep's lone request beside their point}."""
    figure, head = (quoted or {}).get("drift"), (quoted or {}).get("verdict")
    anchored = int((quoted or {}).get("anchored") or 0)
    if not figure:
        return {"drift_words": None, "verdict_words": None, "verdict": None, "anchored": anchored}
    return {"drift_words": figure["words"], "verdict_words": head["words"] if head else None,
            "verdict": head["verdict"] if head else None, "anchored": anchored}


def view(doc: dict, order: list[str], load: dict) -> dict:
    """What the templates print: `any` (a section at all), per configuration its model, check rows, errors and
    what-if settings; configurations not simulated with the reason."""
    confs = doc.get("configurations") or {}
    names = [n for n in order if n in confs] + [n for n in confs if n not in order]
    out, skipped = [], []
    for name in names:
        c = confs[name]
        if c.get("reason"):
            skipped.append({"name": name, "reason": c["reason"]})
            continue
        rows = [{**r, "workload": WORKLOAD[r["kind"]].format(level=_level(r["level"])),
                 "what": f"{QUANTITY[r['quantity']]} {r['which']}"}
                for r in c.get("check") or [] if r["measured"] is not None]
        # where the model does not hold: more than TOLERANCE off even with the machine's drift allowed for (the row's
        # verdict, longctx.analysis.whatif.quoted; a file without one: more than TOLERANCE off), the measured figure
        # outside the model's interval; where the drift leaves it open, inconclusive
        judged = [(r, _verdict(r)) for r in rows if r["error"] is not None and not r.get("excluded")
                  and not (r["low"] is not None and r["low"] <= r["measured"] <= r["high"])]
        said = lambda r: f"{r['workload']} at {r['length']:,}, {r['what']} ({r['error']:+.0%})"  # noqa: E731
        misses = [said(r) for r, v in judged if v == "fail"]
        inconclusive = [said(r) for r, v in judged if v == "inconclusive"]
        for r in rows:
            r["inconclusive"] = r.get("verdict") == "inconclusive" and not r.get("excluded")
        measured = {f["concurrency"]: f.get("max_length") for f in ((load.get("configurations") or {}).get(name) or {}).get("frontier") or []}
        settings = []
        for s in c.get("whatif") or []:
            if s.get("reason"):
                settings.append({**s, "frontier_words": s["reason"]})
                continue
            words = []
            for f in s["frontier"]:
                at = f"c={f['concurrency']}" if "concurrency" in f else f"{f['rate']:g}/s"
                rate = f", {f['goodput_rate_s']:.3g} req/s" if f.get("goodput_rate_s") else ""
                above = " or more" if f.get("open_above") else ""
                words.append(f"{at}: {f['max_length']:,}{above}{rate}" if f["max_length"] else f"{at}: none")
            same = next((x for x in settings if x.get("points") == s["points"] and x.get("frontier") == s["frontier"]
                         and (x["max_running_requests"], x["mem_fraction_static"])
                         == (s["max_running_requests"], s["mem_fraction_static"])), None)
            if same is not None:  # only the chunk differs, and nothing it predicts: one row, its chunks listed
                same["chunk_words"] += f", {s['chunked_prefill_size']:,}" if s["chunked_prefill_size"] else ", none"
                continue
            settings.append({**s, "frontier_words": "; ".join(words), "trade": _trade(s["points"]),
                             "chunk_words": f"{s['chunked_prefill_size']:,}" if s["chunked_prefill_size"] else "none"})
        excluded = sorted({f"{r['workload']} at {r['length']:,} ({r['excluded']})" for r in rows if r.get("excluded")})
        out.append({"name": name, "model": _model_words(c), "rows": rows, "misses": misses, "inconclusive": inconclusive,
                    **_drift_words(c.get("drift")), "excluded": excluded, "errors": c["errors"], "settings": settings,
                    "measured_frontier": "; ".join(f"c={k}: {v:,}" if v else f"c={k}: none" for k, v in sorted(measured.items())),
                    "notes": [n[:1].upper() + n[1:] for n in c.get("rules_notes") or []], "events": c.get("events"), "seconds": c.get("seconds"),
                    "chunk_effect": (c.get("chunk_effect") or "")[:1].upper() + (c.get("chunk_effect") or "")[1:],
                    "draws": c.get("draws")})
    grid = doc.get("grid") or {}
    heaviest = (max(grid.get("concurrency") or [0]), max(grid.get("lengths") or [0]))
    return {"any": bool(out), "configurations": out, "skipped": skipped, "grid": grid, "heaviest": heaviest,
            "draws": min([DRAWS, *(c["draws"] for c in out)]) if out else 0,
            "asked": bool((grid.get("concurrency") or grid.get("rates")) and grid.get("lengths"))}
