"""Diagnosis in words: sentences generated from the numbers (medians, fits.json, planner.json),
each carrying the figure that shows it. The report's summary gives them first, each pointing at its
figure (the PDF, its Markdown twin and a plan's Results section alike).

What is said, per configuration: what bounds decode at the longest length (the fixed per-step
work, or reading the KV cache, and then how far from the memory roof), the prefill's attention
share, crossover and FLOP rate, speculative acceptance, a regime change where the model stops
fitting, what the fits predict at the longest request the deployment could serve, and, per KV
pool, what the memory planner says.

A partial length (fewer successful trials than configured: the medians' `partial`) is not set against
the fits as if it were measured in full: the sentences about the longest length take the longest full
one, and wherever a partial length is named it says by how many trials it was measured.
"""

from __future__ import annotations

import pandas as pd

from .numbers import is_number, rounded
from .wording import partial_text, planner_reason

# The figures (longctx.report.figures) the sentences point at, in the order the summary gives them.
ORDER = ("roofline", "step_time", "ttft", "residuals", "extrapolation", "acceptance", "planner")
ATTENTION_SHARE_BOUND = 0.5  # beta L above this share of the step: the KV cache bounds decode


def _ci(ci, scale: float = 1.0, fmt: str = "{:.3g}", unit: str = "") -> str:
    if not ci or ci[0] is None and ci[1] is None:
        return ""
    lo = fmt.format(ci[0] * scale) if ci[0] is not None else "0"
    hi = fmt.format(ci[1] * scale) if ci[1] is not None else "unbounded"
    return f" (interval {lo} to {hi}{unit})"


def _rate(bps: float) -> str:
    return f"{rounded(bps / 1e9)} GB/s"


def _flops(f: float) -> str:
    return f"{f / 1e12:.3g} TFLOP/s" if f >= 1e12 else f"{f / 1e9:.3g} GFLOP/s"


def _decode(name: str, top, L: int, fit: dict, partial: dict[int, str]) -> list[tuple[str, str]]:
    d = fit.get("decode")
    if not d or not is_number(top.get("tpot_s")):
        return []
    out = []
    step = d["t0_s"] + d["beta_s_per_token"] * L
    share = d["beta_s_per_token"] * L / step if step > 0 else 0.0
    ceil = fit.get("ceilings") or {}
    roof = fit.get("roofline") or {}
    head = f"{name}: decode at {_at(L, partial)} runs at {rounded(top['decode_tok_s'])} tok/s ({rounded(step * 1e3)} ms per step)"
    if share < ATTENTION_SHARE_BOUND:
        out.append(("step_time", f"{head}; it is bound by the fixed per-step work (t0 = {d['t0_s'] * 1e3:.3g} ms), "
                                 f"not by the KV cache: reading {L:,} tokens of it is {share:.0%} of the step."))
        return out
    text = f"{head}; reading the KV cache is {share:.0%} of the step, so decode is bound by the KV reads"
    if d.get("bw_eff_bytes_per_s"):
        text += f": {_rate(d['bw_eff_bytes_per_s'])} effective{_ci(d['ci'].get('bw_eff_GBps'), unit=' GB/s')}"
        parts = []
        ds, ms = ceil.get("datasheet"), ceil.get("measured")
        if ds and d.get("bw_pct_datasheet") is not None:
            parts.append(f"{d['bw_pct_datasheet']:.2g}% of the datasheet's {_rate(ds['bandwidth_Bps'])} ({ds['name']})")
        if ms and d.get("bw_pct_measured") is not None:
            parts.append(f"{d['bw_pct_measured']:.2g}% of the {_rate(ms['bandwidth_Bps'])} copy bandwidth measured on this device")
        if parts:
            text += ", " + " and ".join(parts)
    text += "."
    out.append(("step_time", text))
    for which in ("datasheet", "measured"):
        bound = roof.get(f"bound_{which}")
        if not bound:
            continue
        last = roof["points"][-1]
        width = f" (verify width {roof['query_tokens']})" if roof["query_tokens"] > 1 else ""
        text = (f"{name}: the decode attention's intensity is {roof['intensity']:.3g} FLOP/byte{width}, "
                f"{'below' if bound == 'memory' else 'above'} the {which} ridge of {roof[f'ridge_{which}']:.3g} FLOP/byte: "
                f"{bound}-bound on this hardware; at {_at(int(last['length']), partial)} it achieves {_flops(last['achieved_flops'])}")
        frac = last.get(f"fraction_of_{which}")
        if frac is not None:
            text += f", {100 * frac:.2g}% of the {which} roof at that intensity"
        out.append(("roofline", text + "."))
        break  # the datasheet roof where there is one, else the measured one
    return out


def _prefill(name: str, top, L: int, fit: dict, partial: dict[int, str]) -> list[tuple[str, str]]:
    p = fit.get("prefill")
    if not p:
        return []
    quad = p["c_s_per_token2"] * L**2
    total = p["a_s"] + p["b_s_per_token"] * L + quad
    share = quad / total if quad > 0 and total > 0 else 0.0
    text = f"{name}: prefill of {_at(L, partial)} takes {top['ttft_s']:.3g} s; the quadratic (attention) term is {share:.0%} of it"
    if p.get("crossover_tokens"):
        text += (f"; attention overtakes the linear work beyond {p['crossover_tokens']:,.0f} tokens"
                 f"{_ci(p['ci'].get('crossover_tokens'), fmt='{:,.0f}')}")
    if p.get("attention_flops"):
        text += f"; the attention runs at {_flops(p['attention_flops'])}"
        ceil = fit.get("ceilings") or {}
        pcts = [f"{p[f'attention_pct_{w}']:.2g}% of the {w} peak" for w in ("datasheet", "measured")
                if p.get(f"attention_pct_{w}") is not None and ceil.get(w)]
        if pcts:
            text += " (" + ", ".join(pcts) + ")"
    return [("ttft", text + ".")]


def _partial_of(rows: pd.DataFrame) -> dict[int, str]:
    """The partial lengths among a configuration's medians, each with its words ('measured by 1 of 3 trials')."""
    if "partial" not in rows:
        return {}
    return {int(r["length"]): partial_text(r) for r in rows[rows["partial"].eq(True)].to_dict("records")}


def _at(L: int, partial: dict[int, str]) -> str:
    """'{L} tokens', with how many trials measured it where it is a partial length."""
    return f"{L:,} tokens ({partial[L]})" if L in partial else f"{L:,} tokens"


def _regimes(name: str, fit: dict, partial: dict[int, str]) -> list[tuple[str, str]]:
    out = []
    for kind, what in (("prefill", "TTFT"), ("decode", "the decode step")):
        rc = (fit.get(kind) or {}).get("regime_change")
        if rc:
            later = len(rc["deviations"])
            tail = (", and at the longer length measured" if later == 2 else f", and at the {later - 1} longer lengths measured" if later > 2
                    else " (the longest length measured: one length, so check it with a longer one)")
            among = sorted(int(x) for x in rc["deviations"] if int(x) in partial and int(x) != rc["from_length"])
            if among:  # partial lengths in the regime detection (analysis.partial_lengths: include)
                tail += f"; of those, {_lengths(among)} {'was' if len(among) == 1 else 'were'} measured by fewer trials than configured"
            out.append(("residuals", f"{name}: {what} stops following its model beyond {rc['fitted_up_to']:,} tokens: at "
                        f"{_at(rc['from_length'], partial)} it is {abs(rc['deviation']):.0%} {rc['direction']} than the fit "
                        f"of the shorter lengths predicts{tail}."))
    return out


def _partial(name: str, partial: dict[int, str], fit: dict) -> str | None:
    """What became of name's partial lengths, in one sentence; None without any."""
    if not partial:
        return None
    where = "; ".join(f"{L:,} tokens: {text}" for L, text in sorted(partial.items()))
    fitted = {x["length"]: x.get("fitted") or {} for x in (fit.get("partial_lengths") or {}).get("lengths") or []}
    n = len(partial)
    if not fitted:  # fits.json from before partial lengths were recorded
        use = ""
    elif any(any(f.values()) for f in fitted.values()):
        kinds = [k for k in ("prefill", "decode") if any(f.get(k) for f in fitted.values())]
        use = (f"; the {' and '.join(kinds)} fit{'s' if len(kinds) > 1 else ''} include{'' if len(kinds) > 1 else 's'} "
               f"{'it' if n == 1 else 'them'}")
    else:
        use = f"; {'it is' if n == 1 else 'they are'} left out of the fits and of the regime detection"
    return (f"{name}: {n} length{' was' if n == 1 else 's were'} measured by fewer successful trials than configured "
            f"({where}){use}.")


def _extrapolation(name: str, fit: dict) -> list[tuple[str, str]]:
    ex = fit.get("extrapolation")
    if not ex or not ("ttft_s" in ex or "step_s" in ex):
        return []
    where = f"at {ex['length']:,} tokens ({ex['why']})"
    parts = []
    if "ttft_s" in ex:
        parts.append(f"a prefill of {ex['ttft_s']:.3g} s{_ci(ex.get('ci_ttft_s'), unit=' s')}")
    if "step_s" in ex:
        parts.append(f"decode at {rounded(ex['decode_tok_s'])} tok/s{_ci(ex.get('ci_decode_tok_s'), unit=' tok/s')}")
    verb = "the fits predict" if ex["beyond_measured"] else "within the measured range, the fits give"
    tail = (f", extrapolated beyond the longest length measured ({ex['longest_measured']:,})" if ex["beyond_measured"] else "")
    return [("extrapolation", f"{name}: {where} {verb} " + " and ".join(parts) + tail + ".")]


def _speculative(name: str, top, L: int, partial: dict[int, str]) -> list[tuple[str, str]]:
    if not is_number(top.get("spec_accept_length")):
        return []
    rate = f" ({top['spec_accept_rate']:.0%} of drafts accepted)" if is_number(top.get("spec_accept_rate")) else ""
    return [("acceptance", f"{name}: speculative decoding produces {top['spec_accept_length']:.3g} tokens per verify step "
                           f"at {_at(L, partial)}{rate}.")]


def _planner(planner: dict | None) -> list[tuple[str, str]]:
    if not planner:
        return []
    groups: dict = {}
    for name, p in planner.get("configurations", {}).items():
        mm = p["memory"]
        key = (mm.get("memory_bytes"), mm.get("weights_bytes"), mm.get("cell_bytes"), mm.get("page_size"),
               mm.get("max_total_tokens"), mm.get("mem_fraction_static"), mm.get("context_length"), mm.get("max_running_requests"))
        groups.setdefault(key, []).append((name, p))
    out = []
    for members in groups.values():
        names = ", ".join(n for n, _ in members)
        name, p = members[0]
        mm = p["memory"]
        row = next((r for r in p["rows"] if r["configured"]), None)
        if row is None:
            reason = planner_reason(p)
            if reason:
                out.append(("planner", f"{names}: {reason}."))
            continue
        text = (f"{names}: at mem-fraction-static {row['mem_fraction_static']:g} the KV pool holds {row['pool_tokens']:,} tokens "
                f"({row['kv_bytes'] / 1e9:.3g} GB at {mm['cell_bytes']:,} bytes per token)")
        if p.get("check") == "match":
            text += ", as the server allocated"
        elif p.get("check") == "mismatch":
            text += f", but the server allocated {mm['observed_tokens']:,}"
        if mm.get("max_total_tokens") and row["pool_tokens_uncapped"] and row["pool_tokens_uncapped"] > row["pool_tokens"]:
            text += f" (max-total-tokens caps it; memory alone would give {row['pool_tokens_uncapped']:,})"
        if row.get("concurrency_at_context_length") is not None:
            n = row["concurrency_at_context_length"]
            text += (f"; {n:,} request{'' if n == 1 else 's'} of the full context length "
                     f"({int(mm['context_length']):,}) fit{'s' if n == 1 else ''} at once")
        if mm.get("req_to_token_bytes") and p.get("req_to_token_tokens_equivalent") is not None:
            text += (f"; the req-to-token table of {mm['max_running_requests']} running requests costs "
                     f"{mm['req_to_token_bytes'] / 1e6:.3g} MB, as much as {p['req_to_token_tokens_equivalent']:,.0f} tokens of KV cache")
        out.append(("planner", text + "."))
    return out


def _failed(name: str, rows: pd.DataFrame) -> str | None:
    """What became of the lengths of name with no successful trial, each reason with its lengths;
    None when every length has one."""
    failed = rows[rows["ttft_s"].isna()]
    if failed.empty:
        return None
    reasons: dict[str, list[int]] = {}
    for length, reason in zip(failed["length"], failed["reason"]):
        why = reason.strip().rstrip(".") if isinstance(reason, str) and reason.strip() else "no trial returned a first token"
        reasons.setdefault(why, []).append(int(length))
    where = "; ".join(f"at {_lengths(ls)} tokens: {why}" for why, ls in reasons.items())
    if len(failed) == len(rows):
        return f"{name}: no length was measured successfully ({where})."
    return f"{name}: {len(failed)} of {len(rows)} lengths failed ({where})."


def _unusable(name: str, rows: pd.DataFrame) -> list[str]:
    """What the successful trials of name did not measure: a time to first token at or below 0, no decode rate."""
    out = []
    bad = rows[rows["ttft_s"] <= 0]
    if len(bad):
        out.append(f"{name}: the time to first token reads at or below 0 at {_lengths(bad['length'].tolist())} tokens, "
                   "which no fit or figure can use.")
    if not (rows["decode_tok_s"] > 0).any():
        out.append(f"{name}: no decode rate was measured (no trial decoded a second token).")
    return out


def _lengths(ls: list[int]) -> str:
    text = [f"{x:,}" for x in sorted(ls)]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]


def diagnose(med: pd.DataFrame, fits: dict, planner: dict | None = None) -> list[dict]:
    """[{text, figure, configuration, headline}], in report order: by figure (ORDER), then configuration.
    headline marks each configuration's decode sentence (what bounds it, how far from the ceiling): the
    front-page summary shows those, the diagnosis section all of them."""
    items: list[tuple[str, str, str]] = []
    for name, fit in sorted(fits.items()):
        rows = med[(med["configuration"] == name) & med["ttft_s"].notna()]
        failed = _failed(name, med[med["configuration"] == name])
        if rows.empty:
            items.append(("", name, failed or f"{name}: no length was measured successfully.", True))
            continue
        if failed:  # the lengths that failed, before what the others say
            items.append(("", name, failed, False))
        partial = _partial_of(rows)
        said = _partial(name, partial, fit)
        if said:
            items.append(("", name, said, False))
        # the longest length measured in full: a partial one's few trials are not set against the fits
        full = rows[~rows["length"].astype(int).isin(partial)]
        top = (full if len(full) else rows).iloc[-1]
        L = int(top["length"])
        decode = _decode(name, top, L, fit, partial)
        for text in _unusable(name, rows):
            items.append(("", name, text, not decode))
        for i, (figure, text) in enumerate(decode + _prefill(name, top, L, fit, partial) + _speculative(name, top, L, partial)
                                           + _regimes(name, fit, partial) + _extrapolation(name, fit)):
            items.append((figure, name, text, i == 0 and bool(decode)))
    for name in sorted(set(med["configuration"]) - set(fits)):
        rows = med[med["configuration"] == name]
        items.append(("", name, _failed(name, rows) or f"{name}: no length was measured successfully.", True))
    for figure, text in _planner(planner):
        items.append((figure, "", text, False))
    rank = {f: i for i, f in enumerate(ORDER)}
    items.sort(key=lambda t: (rank.get(t[0], -1), t[1]))
    return [{"text": text, "figure": figure or None, "configuration": name or None, "headline": headline}
            for figure, name, text, headline in items]
