"""Page one's answer: at most five sentences across all configurations.

1. how prefill scales (TTFT from the shortest to the longest length, its growth exponent) and what
   bounds it (longctx.analysis.bounds' class, grouped over the configurations);
2. the same for decode;
3. the first length where each configuration stops being usable by the stated criterion
   (settings `usable`: TTFT at most ttft_s and decode at least decode_tok_s), or, where every length
   measured meets it, where the fits that may carry claims predict it stops;
4. where a configuration falls off its model (regime changes) or lost lengths;
5. which configuration wins where against the baseline, with the Welch interval of its speedup (analysis.compare),
   and "no measurable difference" where that interval spans 1 (the headline's verdicts).

Where the load workloads were measured (data/load.json, longctx.report.load), two more findings are
candidates: the SLO frontier (the longest context meeting the SLOs at the highest concurrency every
configuration's frontier has) and the interference probe (what the longest injected prompt does to the
running streams). Where the prefix-cache workloads were measured (data/prefix_fits.json,
longctx.report.prefix.sentence), their sentence says what the highest hit rate saves against cold at the
longest length, how well the cost model predicts it and how often the server's cached count matched.
Page one takes the findings by weight (summary._weight: the scaling and where it stops, a measured win,
what load and reuse change, then what only says nothing moved) while they fit five sentences and 150
words, and says them in the order above.

The sentences take the longest length each configuration measured in full, as the diagnosis does.
"""

from __future__ import annotations

import math

import pandas as pd

from ..core.words import listed
from .load import slo_words, time_words
from .prefix import sentence as prefix_sentence
from .numbers import is_number, rounded, sig

USABLE = {"ttft_s": 10.0, "decode_tok_s": 10.0}
CLASS = {"bandwidth": "bandwidth-bound", "compute": "compute-bound", "latency": "latency-bound (on neither roof)",
         "fixed": "bound by the length-independent work of each step", "flat": "flat (no measurable length dependence)",
         "linear": "bound by the per-token work", "unknown": "not classified"}
MEASURED_FIRST = ("measured", "datasheet")
NO_CLIFFS = "No configuration falls off its scaling model within the lengths measured."
LIMITS = {"ttft": "limited by the TTFT", "itl": "limited by the ITL", "tpot": "limited by the TPOT", "pool": "limited by the KV pool"}


def _span(values: list[float], fmt) -> str:
    """'57–90 ms' over the configurations (the unit once where both ends share it), or one value."""
    values = [v for v in values if is_number(v)]
    if not values:
        return "--"
    lo, hi = fmt(min(values)), fmt(max(values))
    if lo == hi:
        return lo
    a, _, unit_a = lo.partition(" ")
    b, _, unit_b = hi.partition(" ")
    if unit_a == unit_b and unit_a:
        return f"{a}–{b} {unit_a}"
    if lo.endswith("%") and hi.endswith("%"):
        return f"{lo[:-1]}–{hi}"
    return f"{lo}–{hi}"


def _time(x: float) -> str:
    return f"{rounded(x * 1e3)} ms" if x < 1 else f"{rounded(x)} s"


def _pcts(x: float) -> str:
    """Two significant digits, never in exponent form (110%, not 1.1e+02%)."""
    return f"{sig(x, 2)}%"


def _whole_pct(x: float) -> str:
    return f"{x:.0f}%"


def _names(names: list[str], total: int) -> str:
    if len(names) == total and total > 1:
        return "every configuration"
    return listed(names)


def _pct(pcts: dict) -> tuple[str, float] | None:
    for w in MEASURED_FIRST:
        if pcts.get(w) is not None:
            return w, pcts[w]
    return None


def _lengths_at(per: dict[str, dict], key: str) -> str:
    ls = sorted({p[key] for p in per.values()})
    return f"{ls[0]:,}" if len(ls) == 1 else "their " + ("shortest" if key in ("L0", "D0") else "longest") + " lengths"


def _tops(med: pd.DataFrame, fits: dict) -> dict[str, dict]:
    """Per configuration with a usable TTFT: its shortest and longest full lengths and their medians."""
    per = {}
    for name in sorted(fits):
        rows = med[(med["configuration"] == name) & (med["ttft_s"] > 0)].sort_values("length")
        if rows.empty:
            continue
        full = rows[~rows["partial"].eq(True)] if "partial" in rows else rows
        full = full if len(full) else rows
        first, last = full.iloc[0], full.iloc[-1]
        # decode's own shortest and longest: a length whose streams gave no decode figure (one output token, or
        # tokens that arrived together: longctx.measure.burst) has none to set against the others
        rated = full[full["decode_tok_s"] > 0] if "decode_tok_s" in full else full.iloc[:0]
        d0, d1 = (rated.iloc[0], rated.iloc[-1]) if len(rated) else (None, None)
        per[name] = {"L0": int(first["length"]), "L1": int(last["length"]), "ttft0": float(first["ttft_s"]),
                     "ttft1": float(last["ttft_s"]), "rate0": None if d0 is None else float(d0["decode_tok_s"]),
                     "rate1": None if d1 is None else float(d1["decode_tok_s"]),
                     "D0": None if d0 is None else int(d0["length"]), "D1": None if d1 is None else int(d1["length"]),
                     "rows": full, "fit": fits[name]}
    return per


def _class_groups(per: dict, phase: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name, p in per.items():
        b = (p["fit"].get("bounds") or {}).get(phase)
        if b:
            groups.setdefault(b["class"], []).append(name)
    return groups


def _prefill(per: dict) -> str | None:
    if not per:
        return None
    exps = [math.log(p["ttft1"] / p["ttft0"]) / math.log(p["L1"] / p["L0"]) for p in per.values() if p["L1"] > p["L0"]]
    if all(p["L1"] == p["L0"] for p in per.values()):  # one length each: nothing grows
        text = (f"Prefill: TTFT is {_span([p['ttft0'] for p in per.values()], _time)} at {_lengths_at(per, 'L0')} tokens, "
                "the one length measured")
    else:
        text = (f"Prefill: TTFT grows from {_span([p['ttft0'] for p in per.values()], _time)} at {_lengths_at(per, 'L0')} "
                f"tokens to {_span([p['ttft1'] for p in per.values()], _time)} at {_lengths_at(per, 'L1')}")
    if exps:
        text += f", as L to the power {_span(exps, lambda x: f'{x:.2g}')}"
    clauses = []
    for kind, names in _class_groups(per, "prefill").items():
        bs = [per[n]["fit"]["bounds"]["prefill"] for n in names]
        detail = ""
        shares = [b["share"] for b in bs if b.get("share") is not None]
        if kind in ("compute", "latency") and shares:
            rates = [_pct((b.get("compute") or {}).get("pct") or {}) for b in bs]
            rates = [r for r in rates if r]
            detail = f" (attention {_span([100 * x for x in shares], _whole_pct)} of it"
            if rates:
                detail += f", at {_span([r[1] for r in rates], _pcts)} of the {rates[0][0]} FLOP rate"
            detail += ")"
        elif kind == "linear" and shares:
            detail = f" (attention {_span([100 * x for x in shares], _whole_pct)} of it)"
        clauses.append(_clause(kind, names, len(per), detail, bs))
    if clauses:
        text += "; it is " + "; ".join(clauses)
    return text + "."


def _clause(kind: str, names: list[str], total: int, detail: str, bs: list[dict]) -> str:
    """'compute-bound in every configuration (...)', or for the unclassified 'not classified in x (why)'."""
    if kind != "unknown":
        return f"{CLASS[kind]} in {_names(names, total)}{detail}"
    return f"not classified in {_names(names, total)}"


def _decode(per: dict) -> str | None:
    rated = {n: p for n, p in per.items() if is_number(p["rate1"])}
    if not rated:
        return None
    if all(p["D1"] == p["D0"] for p in rated.values()):  # one length each with a decode rate
        whose = "the" if len(rated) == 1 else "each configuration's"
        text = (f"Decode: the rate is {_span([p['rate0'] for p in rated.values()], rounded)} tok/s at "
                f"{_lengths_at(rated, 'D0')} tokens, {whose} only length with a decode rate")
    else:
        text = (f"Decode: the rate falls from {_span([p['rate0'] for p in rated.values()], rounded)} tok/s at "
                f"{_lengths_at(rated, 'D0')} tokens to {_span([p['rate1'] for p in rated.values()], rounded)} tok/s at "
                f"{_lengths_at(rated, 'D1')}")
    clauses = []
    for kind, names in _class_groups(rated, "decode").items():
        bs = [rated[n]["fit"]["bounds"]["decode"] for n in names]
        detail = ""
        if kind in ("bandwidth", "compute", "latency"):
            shares = [b["share"] for b in bs if b.get("share") is not None]
            pcts = [_pct((b.get("bandwidth") or {}).get("pct") or {}) for b in bs if b["basis"] == "fit"]
            pcts += [_pct(b["medians"]["upper_pct_bandwidth"] or {}) for b in bs if b["basis"] == "medians" and kind == "latency"]
            pcts = [x for x in pcts if x]
            if shares:
                detail = f"the KV reads are {_span([100 * x for x in shares], _whole_pct)} of the step"
            if pcts:
                verb = "reach" if kind != "latency" else ("reach only" if shares else "reach at most")
                detail += (" and " if detail else "the KV reads ") + (
                    f"{verb} {_span([x[1] for x in pcts], _pcts)} of the {pcts[0][0]} bandwidth")
            detail = f" ({detail})" if detail else ""
        clauses.append(_clause(kind, names, len(rated), detail, bs))
    if clauses:
        text += "; it is " + "; ".join(clauses)
    return text + "."


def _first_unusable(rows: pd.DataFrame, crit: dict) -> tuple[int, str] | None:
    for r in rows.sort_values("length").to_dict("records"):
        why = []
        if is_number(r.get("ttft_s")) and r["ttft_s"] > crit["ttft_s"]:
            why.append(f"TTFT {_time(r['ttft_s'])}")
        if is_number(r.get("decode_tok_s")) and r["decode_tok_s"] < crit["decode_tok_s"]:
            why.append(f"decode {rounded(r['decode_tok_s'])} tok/s")
        if why:
            return int(r["length"]), " and ".join(why)
    return None


def _why_span(per: dict, members: list[tuple[str, str]], L: int) -> str:
    """What the configurations that stop at L miss the criterion by, as spans ('TTFT 11.1–13.4 s')."""
    rows = [per[n]["rows"].set_index("length").loc[L] for n, _ in members]
    said = []
    if any("TTFT" in why for _, why in members):
        said.append(f"TTFT {_span([float(r['ttft_s']) for r, (_, why) in zip(rows, members) if 'TTFT' in why], _time)}")
    if any("decode" in why for _, why in members):
        said.append(f"decode {_span([float(r['decode_tok_s']) for r, (_, why) in zip(rows, members) if 'decode' in why], rounded)} tok/s")
    return " and ".join(said)


def _predicted_limit(fit: dict, crit: dict) -> tuple[int, str] | None:
    """The shortest length where the fits that may carry claims predict the criterion fails, up to the
    longest request the deployment could serve (the extrapolation's length); None where none does there."""
    ex = fit.get("extrapolation") or {}
    limit = ex.get("length")
    quality = fit.get("quality") or {}
    found = []
    p = fit.get("prefill")
    if p and (quality.get("prefill") or {}).get("usable"):
        a, b, c = p["a_s"] - crit["ttft_s"], p["b_s_per_token"], p["c_s_per_token2"]
        L = (-b + math.sqrt(b * b - 4 * c * a)) / (2 * c) if c > 0 else (-a / b if b > 0 else None)
        if L and L > 0:
            found.append((int(L), "TTFT"))
    d = fit.get("decode")
    if d and (quality.get("decode") or {}).get("usable") and d["beta_s_per_token"] > 0:
        k = ex.get("tokens_per_step") or 1.0
        L = (k / crit["decode_tok_s"] - d["t0_s"]) / d["beta_s_per_token"]
        if L > 0:
            found.append((int(L), "decode"))
    found = [f for f in found if limit and f[0] <= limit]
    return min(found) if found else None


def _usable(per: dict, crit: dict) -> str | None:
    if not per:
        return None
    words = f"TTFT at most {_time(crit['ttft_s'])} and decode at least {rounded(crit['decode_tok_s'])} tok/s"
    stops: dict[int, list[tuple[str, str]]] = {}
    through, predicted = [], []
    for name, p in per.items():
        first = _first_unusable(p["rows"], crit)
        if first:
            stops.setdefault(first[0], []).append((name, first[1]))
        else:
            through.append(name)
            limit = _predicted_limit(p["fit"], crit)
            if limit:
                predicted.append((name, limit))
    parts = []
    for L, members in sorted(stops.items()):
        who = _names([n for n, _ in members], len(per))
        singular = len(members) == 1 or who == "every configuration"
        why = members[0][1] if len(members) == 1 else _why_span(per, members, L)
        parts.append(f"{who} stop{'s' if singular else ''} being usable at {L:,} tokens ({why})")
    if through:
        longest = max(per[n]["L1"] for n in through)
        who = _names(through, len(per))
        singular = len(through) == 1 or who == "every configuration"
        parts.append(f"{who} meet{'s' if singular else ''} it at every length measured, "
                     f"up to {longest:,} tokens" + (f", and the fits predict {_limits(predicted)} as the limit" if predicted else ""))
    return f"By the stated criterion ({words}), " + "; ".join(parts) + "."


def _limits(predicted: list[tuple[str, tuple[int, str]]]) -> str:
    """'page64 at about 30,058 tokens (TTFT)', or for several that the same criterion limits, one span of them."""
    if len(predicted) > 1 and len({why for _, (_, why) in predicted}) == 1:
        return f"about {_span([L for _, (L, _) in predicted], lambda x: f'{rounded(x)} tokens')} ({predicted[0][1][1]})"
    return "; ".join(f"{name} at about {rounded(L)} tokens ({why})" for name, (L, why) in predicted)


def _cliffs(per: dict, fits: dict, med: pd.DataFrame) -> str:
    said = []
    for kind, what in (("prefill", "TTFT"), ("decode", "decode step")):
        changes = {n: (f.get(kind) or {}).get("regime_change") for n, f in fits.items()}
        changes = {n: rc for n, rc in changes.items() if rc}
        by: dict[tuple[int, int], list[tuple[str, dict]]] = {}
        for n, rc in changes.items():
            by.setdefault((rc["fitted_up_to"], rc["from_length"]), []).append((n, rc))
        for (upto, at), members in sorted(by.items()):
            devs = _span([100 * abs(rc["deviation"]) for _, rc in members], _whole_pct)
            dirs = {rc["direction"] for _, rc in members}
            said.append(f"the {what} of {_names([n for n, _ in members], len(fits))} stops following its model beyond "
                        f"{upto:,} tokens ({devs} {dirs.pop() if len(dirs) == 1 else 'off'} at {at:,} than the shorter lengths predict)")
    lost = sorted(set(med.loc[med["ttft_s"].isna(), "configuration"]) & set(per)) if len(med) else []
    if lost:  # (a configuration that lost every length has its own sentence)
        said.append(f"{_names(lost, len(fits))} lost {'a length' if len(lost) == 1 else 'lengths'} (the Failures section says why)")
    if not said:
        return NO_CLIFFS
    text = "; ".join(said)
    return text[0].upper() + text[1:] + "."


def _speedup(r: dict, key: str) -> tuple[str, str]:
    """('1.46x', 'interval 1.09–1.88, n=3/3') of a headline row's speedup (n: its trials and the baseline's); the
    interval '' where there is none."""
    ci, n = r.get(f"{key}_speedup_ci"), r.get(f"{key}_speedup_n")
    interval = f"interval {ci[0]:.2f}–{ci[1]:.2f}" if ci and ci[0] is not None and ci[1] is not None else ""
    if interval and n:
        interval += f", n={n[0]}/{n[1]}"
    return f"{r[f'{key}_speedup']:.2f}x", interval


def _trials_words(r: dict, key: str) -> str:
    n = r.get(f"{key}_speedup_n")
    return f"n={n[0]}/{n[1]}, too few trials" if n else "too few trials"


def _winners(headline: dict | None) -> str | None:
    """Against the baseline at the longest length it shares with the others: the best for TTFT and for
    decode, and from which length on its difference is measurable; 'no measurable difference' where none is."""
    if not headline or not headline.get("baseline"):
        return None
    rows = [r for r in headline["rows"] if not r["is_baseline"] and r.get("ttft_speedup") is not None]
    if not rows:
        return None
    base = headline["baseline"]
    L = max(r["length"] for r in rows)
    at = [r for r in rows if r["length"] == L]
    parts = []
    for key, verb in (("ttft", "prefills"), ("decode", "decodes")):
        cands = [r for r in at if is_number(r.get(f"{key}_speedup"))]
        if not cands:
            continue
        best = max(cands, key=lambda r: r[f"{key}_speedup"])
        verdict = best.get(f"{key}_verdict")
        value, interval = _speedup(best, key)
        if verdict in ("faster", "slower"):
            since = _since(rows, best["configuration"], key, verdict, L)
            parts.append(f"{best['configuration']} {verb} fastest ({value}, {interval}{since})" if verdict == "faster" else
                         f"every configuration {verb} slower (the closest, {best['configuration']}: {value}, {interval}{since})")
        else:
            parts.append(f"none {verb} measurably faster (best {best['configuration']}: {value}, "
                         + (f"{interval}, spanning 1)" if interval else f"no interval: {_trials_words(best, key)})"))
    if not parts:
        return None
    return f"Against {base} at {L:,} tokens, " + "; ".join(parts) + "."


def _since(rows: list[dict], name: str, key: str, verdict: str, L: int) -> str:
    """' (measurably so from 8,192 tokens on)': the run of lengths up to L where name's verdict holds."""
    mine = sorted((r for r in rows if r["configuration"] == name), key=lambda r: r["length"], reverse=True)
    start = None
    for r in mine:
        if r.get(f"{key}_verdict") != verdict:
            break
        start = r["length"]
    if start is None or start == L:
        return ""
    return f"; from {start:,} tokens on"


def _frontier(load: dict | None) -> str | None:
    """'At 4 concurrent requests, TTFT at most 10 s holds to 41,000 tokens (measured, limited by the TTFT)': at
    the highest concurrency every configuration's frontier has (else at each one's highest), per configuration."""
    confs = {n: c["frontier"] for n, c in sorted(((load or {}).get("configurations") or {}).items()) if (c or {}).get("frontier")}
    if not confs:
        return None
    slo = (load or {}).get("slo") or {}
    words = slo_words(slo)
    said = listed(words) if words else "the SLOs"
    if is_number(slo.get("attainment")) and slo["attainment"] < 1:
        said += f" (for {slo['attainment']:.0%} of requests)"
    verb = "holds" if len(words) == 1 else "hold"
    common = set.intersection(*({r["concurrency"] for r in rows} for rows in confs.values()))
    groups: dict[tuple, list[tuple[str, dict]]] = {}  # (length, concurrency) -> the configurations there
    for name, rows in confs.items():
        at = max(common) if common else max(r["concurrency"] for r in rows)
        r = next(r for r in rows if r["concurrency"] == at)
        L = r.get("max_length")
        groups.setdefault((int(L) if is_number(L) and L > 0 else None, at), []).append((name, r))
    parts = []
    for (L, at), members in groups.items():
        text = f"to {L:,} tokens" if L else "at no length measured"
        if len(confs) > 1:
            text += f" in {listed([n for n, _ in members])}"
        if not common:
            text += f" at {_requests(at)}"
        bases = sorted({r.get("basis") for _, r in members if r.get("basis")})
        limits = [LIMITS[k] for k in dict.fromkeys(r.get("limited_by") for _, r in members) if k in LIMITS]
        how = ", ".join(w for w in (" and ".join(bases), " and ".join(limits).replace(" and limited by", " and")) if w)
        parts.append(text + (f" ({how})" if how else ""))
    lead = f"At {_requests(max(common))}, {said} {verb} " if common else f"{said[0].upper()}{said[1:]} {verb} "
    return lead + listed(parts) + "."


def _requests(c) -> str:
    return f"{int(c):,} concurrent request{'s' if c != 1 else ''}"


def _interference(load: dict | None) -> str | None:
    """'A 16,384-token prompt stalls 2 running streams for 3.4 s (worst gap), the whole of its prefill (TTFT
    3.4 s: its 2 chunks run back to back, 1.7 s each on average)': per configuration, its longest injected
    length with a worst gap, and how much of the prefill the streams waited through (where it is known)."""
    parts, chosen = [], []
    confs = sorted(((load or {}).get("configurations") or {}).items())
    for name, c in confs:
        inter = (c or {}).get("interference") or {}
        pts = [p for p in inter.get("points") or [] if is_number((p.get("worst_gap") or {}).get("value"))]
        if not pts:
            continue
        p = max(pts, key=lambda p: p["length"])
        chosen.append({**p, "background": p.get("background", inter.get("background"))})
        L, gap = int(p["length"]), float(p["worst_gap"]["value"])
        b = p.get("background", inter.get("background"))
        who = (f"{int(b)} running stream{'s' if int(b) != 1 else ''}" if is_number(b) else "the running streams")
        text = f"a {L:,}-token prompt stalls {who} for {time_words(gap)} (worst gap)"
        share, n, ttft = p.get("stalled_share"), p.get("chunks"), p.get("injected_ttft_s")
        if is_number(share) and is_number(ttft):
            if share >= 0.8:  # the streams waited through the whole prefill
                text += f", the whole of its prefill (TTFT {time_words(float(ttft))}"
                if is_number(n) and n > 1 and is_number(p.get("mean_chunk_s")):
                    text += (f": its {int(n):,} chunks run back to back, {time_words(float(p['mean_chunk_s']))} "
                             "each on average")
                text += ")"
            elif is_number(n) and n > 1:
                text += f", {share:.0%} of its prefill (TTFT {time_words(float(ttft))}, {int(n):,} chunks)"
        parts.append((name, text))
    if not parts:
        return None
    if len(parts) == 1 and len([1 for _, c in confs if ((c or {}).get("interference") or {}).get("points")]) <= 1:
        text = parts[0][1]
    elif len({(p["length"], str(p.get("background"))) for p in chosen}) == 1:  # one length, as many streams: one span
        p = chosen[0]
        b = p.get("background")
        who = f"{int(b)} running stream{'s' if int(b) != 1 else ''}" if is_number(b) else "the running streams"
        gaps = [float(c["worst_gap"]["value"]) for c in chosen]
        shares = [c.get("stalled_share") for c in chosen]
        text = (f"a {int(p['length']):,}-token prompt stalls {who} for {_span(gaps, time_words)} (worst gap) in "
                f"{listed([n for n, _ in parts])}")
        if all(is_number(x) for x in shares):
            text += (", the whole of its prefill" if min(shares) >= 0.8 else f", {_span([100 * x for x in shares], _whole_pct)} of its prefill")
    else:
        text = "; ".join(f"in {n}, {t}" for n, t in parts)
    return text[0].upper() + text[1:] + "."


WORDS = 150  # page one's sentences, at most (the budget; the title block, figure and table beside them)


def _weight(kind: str, text: str) -> int:
    """How much a finding weighs on page one: the scaling and where it stops first, then what load and reuse change
    and a cliff, then the winners (the compact table beside the sentences gives every speedup with its interval),
    then what only says nothing moved (no measurable difference, no cliff)."""
    if kind == "winners":  # page one's compact table shows every speedup with its interval: the sentence adds less
        return 4 if ("fastest" in text or "every configuration" in text) else 2
    if kind == "cliffs":
        return 7 if text != NO_CLIFFS else 1
    return {"prefill": 10, "decode": 9, "usable": 9, "frontier": 7, "prefix": 6, "interference": 5}[kind]


def summary(med: pd.DataFrame, fits: dict, headline: dict | None, settings: dict, faults: list[str] | None = None,
            load: dict | None = None, prefix: dict | None = None) -> list[dict]:
    """Page one's sentences ({text, figure}): first what could not be measured at all (faults: the diagnosis'
    sentences of configurations with no length, or no usable time, measured), then the findings chosen by weight
    (_weight) while they fit five sentences and WORDS words, said in this order: prefill, decode, usability, the SLO
    frontier, the interference probe, the prefix cache, regime changes, the winners (load: load.json's contents;
    prefix: prefix_fits.json's)."""
    crit = {**USABLE, **(settings.get("usable") or {})}
    per = _tops(med, fits)
    said = [(t, None) for t in faults or []]
    found = [("frontier", _frontier(load), "frontier"), ("interference", _interference(load), "interference"),
             ("prefix", prefix_sentence(prefix), "prefix_ttft")]
    if per:
        found = ([("prefill", _prefill(per), "overview"), ("decode", _decode(per), "overview"),
                  ("usable", _usable(per, crit), "overview")] + found
                 + [("cliffs", _cliffs(per, fits, med), "residuals"), ("winners", _winners(headline), None)])
    found = [(i, kind, text, fig) for i, (kind, text, fig) in enumerate(found) if text]
    budget, room = WORDS - sum(len(t.split()) for t, _ in said), 5 - len(said)
    chosen, skipped = [], False
    for i, kind, text, fig in sorted(found, key=lambda f: (-_weight(f[1], f[2]), f[0])):
        words = len(text.split())
        if _weight(kind, text) <= 1 and skipped:  # a sentence that only says nothing moved, in place of a finding
            continue
        if room > 0 and (words <= budget or not chosen):  # the weightiest finding, whatever its length
            chosen.append((i, text, fig))
            budget, room = budget - words, room - 1
        else:
            skipped = True
    said += [(text, fig) for _, text, fig in sorted(chosen)]
    return [{"text": t, "figure": f} for t, f in said][:5]
