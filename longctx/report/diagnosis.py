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

import json

import pandas as pd

from ..analysis.fits import FIT_LENGTHS
from ..core.words import listed
from .numbers import is_number, rounded
from .summary import CLASS
from .wording import partial_text, planner_reason



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


def _pct_words(pcts: dict, what: str, ceilings: dict | None = None) -> str:
    """'9.4% of the 17 GB/s measured bandwidth and 0.55% of the datasheet's 1,792 GB/s (its name)': what (bandwidth
    or FLOP rate) against each roof known, with the roof's value where the ceilings are given."""
    key, unit = ("bandwidth_Bps", _rate) if what == "bandwidth" else ("flops", _flops)
    parts = []
    for w in ("measured", "datasheet"):
        if pcts.get(w) is None:
            continue
        roof = ((ceilings or {}).get(w) or {})
        value = unit(roof[key]) if roof.get(key) else None
        if w == "measured" and what != "bandwidth" and roof.get("flops_dtype"):
            # the roof by what was timed: a PyTorch matmul in one dtype, which an engine with other arithmetic
            # (quantized weights) does not run
            where = f" on this {'CPU' if roof.get('kind') == 'cpu' else roof.get('kind') or 'device'}"
            parts.append(f"{pcts[w]:.2g}% of the {value + ' ' if value else ''}{roof['flops_dtype']} matmul PyTorch ran{where}")
        elif w == "measured":
            parts.append(f"{pcts[w]:.2g}% of the {value + ' ' if value else ''}measured {what}")
        else:
            parts.append(f"{pcts[w]:.2g}% of the datasheet's {value or what}" + (f" ({roof['name']})" if value and roof.get("name") else ""))
    return " and ".join(parts)


def _problems(q: dict | None) -> str:
    return "; ".join((q or {}).get("problems") or []) or "it does not pass"


def _decode(name: str, top, L: int, fit: dict, partial: dict[int, str]) -> list[tuple[str, str]]:
    """One sentence on what bounds decode (longctx.analysis.bounds: the one decision the roofline's words
    come from too), then the evidence the run holds for why."""
    b = (fit.get("bounds") or {}).get("decode")
    d = fit.get("decode")
    if not d or not b or not is_number(top.get("tpot_s")):
        return []
    L = b["length"]
    head = f"{name}: decode at {_at(L, partial)} runs at {rounded(top['decode_tok_s'])} tok/s ({rounded(b['step_s'] * 1e3)} ms per step)"
    kind, share = b["class"], b.get("share")
    need = f"{100 * b['thresholds']['roof_share']:.0f}%"
    roof = b.get("roof")
    at = ""
    if roof and b.get("intensity"):
        width = f", verify width {b['query_tokens']}" if b["query_tokens"] > 1 else ""
        at = (f"; at the attention's intensity of {b['intensity']:.3g} FLOP/byte{width}, "
              f"{'below' if roof['roof'] == 'bandwidth' else 'above'} the {'measured' if roof['which'] == 'measured' else 'datasheet'} "
              f"ridge of {roof['ridge']:.3g}, the {roof['roof']} roof is the one that applies")
    if kind == "flat":
        text = (f"{head}; the fit finds no measurable dependence on the length (the KV reads' cost per token is "
                f"{'zero' if d['beta_s_per_token'] <= 0 else 'within its interval of zero'}), so no share of the step, "
                f"bandwidth or bound is stated: every step is the length-independent work, about {rounded(d['t0_s'] * 1e3)} ms")
    elif kind == "fixed":
        text = (f"{head}; it is {CLASS['fixed']} (t0 = {rounded(d['t0_s'] * 1e3)} ms): the KV reads are "
                f"{100 * share:.2g}% of the step, under the {100 * b['thresholds']['dominant_share']:.0f}% that would make them the bound")
    elif b["basis"] == "fit" and b.get("bandwidth"):
        bw = b["bandwidth"]
        text = (f"{head}; the KV reads are {share:.0%} of the step and run at {_rate(bw['Bps'])}{_ci(_gb(bw.get('ci')), unit=' GB/s')}"
                " or faster (the step's length-proportional cost holds the attention's arithmetic too)")
        said = _pct_words(bw["pct"], "bandwidth", fit.get("ceilings"))
        if said:
            text += ", " + said
        if b.get("compute") and b["compute"]["pct"]:
            text += ", and " + _pct_words(b["compute"]["pct"], "FLOP rate", fit.get("ceilings"))
        text += at
        text += f": {b['why']}, so no bound is stated" if b.get("fit_class") else {"bandwidth": f": decode is bandwidth-bound (at least {need} of every known bandwidth roof)",
                 "compute": f": decode is compute-bound (at least {need} of every known FLOP roof)",
                 "latency": f": decode is latency-bound, on neither roof (bound by one needs at least {need} of it)",
                 "unknown": f": no FLOP roof is compared ({b['why']}), so no bound is stated" if b.get("why") else
                 ": no ceilings of this device are known, so no bound is stated"}[kind]
    elif b["basis"] == "medians":
        m = b["medians"]
        span = (f"between {_rate(m['lower_Bps'])} and {_rate(m['upper_Bps'])}" if m.get("upper_Bps")
                else f"at least at {_rate(m['lower_Bps'])}")
        lo, hi = m["lower_pct_bandwidth"], m.get("upper_pct_bandwidth") or {}
        pcts = ", ".join(f"{lo[w]:.2g}" + (f"–{hi[w]:.2g}" if w in hi else " or more") + f"% of the {w if w == 'measured' else 'datasheet' + chr(39) + 's'}"
                         for w in ("measured", "datasheet") if w in lo)
        text = (f"{head}; without a usable fit, the medians alone (every step's KV bytes over its time, and over its growth from "
                f"{m['from_length']:,} tokens) put the KV reads {span}" + (f", {pcts} bandwidth" if pcts else "") +
                (f": {b['why']}, so no bound is stated" if b.get("fit_class") else
                 {"bandwidth": ": bandwidth-bound whatever the fit", "latency": f": latency-bound whatever the fit, under {need} of every roof"}[kind]))
    else:
        why = (_problems(b["quality"]) if not b["quality"]["usable"] else "the KV bytes per token are unknown"
               if not fit.get("kv_bytes_per_token") else "no ceilings of this device are known")
        text = f"{head}; what bounds it is not classified: {why}"
    out = [("step_time", text + ".")]
    ev = _evidence(name, b.get("evidence") or [], kind)
    if ev:
        out.append(("roofline", ev))
    said = _counters(name, top, L, partial, b, fit.get("ceilings"))
    if said:
        out.append(("roofline", said))
    return out


# GPM's counters over each phase's windows (results.csv {phase}_gpm_*_mean; longctx.measure.gpm), medians over the
# trials, and each GPU's ({phase}_gpm_*_by_gpu, longctx.analysis.tables.medians)
GPM_FIGURES = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct", "dram_gbs")
# per GPU, a figure is uneven where its busiest GPU reads UNEVEN_RATIO times its least busy one, and UNEVEN_POINTS
# percentage points more: one GPU's work the others wait for (a tensor-parallel step is as slow as its slowest rank)
UNEVEN_RATIO, UNEVEN_POINTS = 1.5, 5.0
GPU_FIGURES = {"dram_bw_pct": "DRAM", "tensor_active_pct": "tensor pipes", "sm_active_pct": "SM activity"}


def _gpm(top, phase: str = "decode") -> dict:
    return {m: float(top[c]) for m in GPM_FIGURES if (c := f"{phase}_gpm_{m}_mean") in top and is_number(top[c])}


def _uneven(top, phase: str) -> str | None:
    """Where the server's GPUs did not do the same work in a phase, by their counters (each GPU's median over the
    trials): the figures whose busiest GPU read UNEVEN_RATIO times, and UNEVEN_POINTS points more than, its least busy."""
    parts = []
    for m, what in GPU_FIGURES.items():
        raw = top.get(f"{phase}_gpm_{m}_by_gpu") if hasattr(top, "get") else None
        try:
            values = [float(x) for x in json.loads(raw)] if isinstance(raw, str) else []
        except (ValueError, TypeError):
            values = []
        if len(values) < 2:
            continue
        lo, hi = min(values), max(values)
        if hi - lo >= UNEVEN_POINTS and hi >= UNEVEN_RATIO * lo:
            parts.append(f"{what} from {lo:.2g}% (GPU {values.index(lo)}) to {hi:.2g}% (GPU {values.index(hi)}) "
                         f"of the {len(values)} it ran on")
    return ("; per GPU, " + ", ".join(parts) + ": the work is not even over them, and a step waits for the busiest"
            if parts else None)


def _counters(name: str, top, L: int, partial: dict[int, str], b: dict, ceilings: dict | None,
              phase: str = "decode") -> str | None:
    """What the GPU's own counters (GPM) read over a phase at L, beside what its fit infers: DRAM's share of its
    bandwidth (and in GB/s, against the datasheet's), SM activity and occupancy, tensor-pipe activity, and where the
    GPUs differ (_uneven); then for decode whether the fit's KV-read bandwidth agrees with the DRAM traffic counted,
    or what their disagreement says, for prefill the tensor pipes beside the fit's attention FLOP rate. None where no
    counter was read (a CPU, a GPU without GPM): the words stand on the inference alone."""
    g = _gpm(top, phase)
    if not g:
        return None
    parts = []
    if "dram_bw_pct" in g:
        peak = ((ceilings or {}).get("datasheet") or {}).get("bandwidth_Bps")
        gbs = f" ({rounded(g['dram_gbs'])} GB/s of the datasheet's {_rate(peak)})" if "dram_gbs" in g and peak else ""
        parts.append(f"DRAM at {g['dram_bw_pct']:.2g}% of its bandwidth{gbs}")
    if "sm_active_pct" in g:
        occ = f" at {g['sm_occupancy_pct']:.2g}% occupancy" if "sm_occupancy_pct" in g else ""
        parts.append(f"SMs busy {g['sm_active_pct']:.3g}% of the time{occ}")
    if "tensor_active_pct" in g:
        parts.append(f"tensor pipes {g['tensor_active_pct']:.2g}% active")
    what = f"decode at {_at(L, partial)}" if phase == "decode" else f"prefill of {_at(L, partial)}"
    text = f"{name}: by the GPU's own counters (GPM), {what} kept " + ", ".join(parts) + (_uneven(top, phase) or "")
    if phase == "prefill":
        c = b.get("compute") if b.get("basis") == "fit" else None
        if c and "tensor_active_pct" in g and c.get("pct"):
            text += (f"; the prefill fit's attention runs at {_pct_words(c['pct'], 'FLOP rate', ceilings)}, its tensor "
                     f"pipes {g['tensor_active_pct']:.2g}% active over the whole prefill (the rest of the model's "
                     "matmuls too)")
        return text + "."
    bw = b.get("bandwidth") if b.get("basis") == "fit" else None
    if bw and bw.get("Bps") and "dram_gbs" in g:
        counted, fitted = g["dram_gbs"] * 1e9, bw["Bps"]
        lo, hi = (bw.get("ci") or [None, None])
        lo, hi = lo if lo is not None else fitted, hi if hi is not None else fitted
        fit_words = f"the decode fit's KV reads at {_rate(fitted)}{_ci(_gb(bw.get('ci')), unit=' GB/s')}"
        if lo <= counted <= hi:
            text += f"; {fit_words} agree with them, within the fit's interval"
        elif counted > hi:
            text += (f"; {fit_words} are {fitted / counted:.0%} of that traffic: the rest is DRAM traffic the model does "
                     f"not count (the weights, activations, or a KV read it did not count)")
        else:
            text += (f"; that is under {fit_words}: the model counts bytes the GPU did not read from DRAM (a cache "
                     f"that held them, or KV bytes per token overstated)")
    return text + "."


def _gb(ci):
    return [x / 1e9 if x is not None else None for x in ci] if ci else None


def _settings_words(differ: dict) -> str:
    words = []
    for k, (mine, theirs) in differ.items():
        if mine is None:
            words.append(f"without {k}")
        elif theirs is None:
            words.append(f"with {k} {mine}")
        else:
            words.append(f"{k} {mine} instead of {theirs}")
    return ", ".join(words)


def _evidence(name: str, evidence: list[dict], kind: str) -> str | None:
    """What the run holds for why decode is as classified, in one sentence; None without any."""
    parts = []
    for e in evidence:
        if e["kind"] == "kernel":
            copy = f" ({100 * e['fraction_of_copy']:.2g}% of the copy bandwidth it measured)" if e.get("fraction_of_copy") else ""
            parts.append(f"its kernel timed alone at the same shape reads {_rate(e['Bps'])} at {e['length']:,} tokens{copy}")
        elif e["kind"] == "settings" and e["differ"]:
            r = e["beta_ratio"]
            if e["separated"]:
                parts.append(f"its KV reads cost {r:.2f}x {e['other']}'s per token ({_settings_words(e['differ'])}; the intervals "
                             f"do not overlap)")
            else:
                parts.append(f"its KV reads cost the same per token as {e['other']}'s within their intervals ({r:.2f}x; "
                             f"{_settings_words(e['differ'])})")
        elif e["kind"] == "verify":
            parts.append(f"each step verifies {e['query_tokens']} tokens, which multiplies the attention's FLOPs per KV byte "
                         f"by {e['query_tokens']}")
    if not parts:
        return None
    apart = any(e["kind"] == "settings" and e["differ"] and e["separated"] for e in evidence)
    return (f"{name}, why decode is {CLASS[kind]}: " + "; ".join(parts)
            + ("; so, on the same hardware, those settings set the KV reads' cost" if apart else "") + ".")


def _prefill(name: str, top, L: int, fit: dict, partial: dict[int, str]) -> list[tuple[str, str]]:
    """One sentence on what bounds prefill at the longest length (longctx.analysis.bounds)."""
    b = (fit.get("bounds") or {}).get("prefill")
    p = fit.get("prefill")
    if not p or not b:
        return []
    L, share, kind = b["length"], b.get("share"), b["class"]
    need = f"{100 * b['thresholds']['roof_share']:.0f}%"
    head = f"{name}: prefill of {_at(L, partial)} takes {b['ttft_s']:.3g} s"
    coef = b["quality"]["coefficients"]
    if kind == "linear":
        text = (f"{head}; the fit resolves no quadratic (attention) term, so the per-token work bounds it"
                if coef["c_s_per_token2"] not in ("resolved", "no interval") else
                f"{head}; it is {CLASS['linear']} (the linear term): attention, the quadratic term, is {share:.0%} of it")
    elif b["basis"] == "fit":
        text = f"{head}; attention (the quadratic term) is {share:.0%} of it"
        c = b.get("compute")
        if c:
            text += f" and runs at {_flops(c['flops'])}{_ci(_scaled(c.get('ci'), 1e-9), unit=' GFLOP/s')}"
            said = _pct_words(c["pct"], "FLOP rate", fit.get("ceilings"))
            if said:
                text += ", " + said
        text += f": {b['why']}, so no bound is stated" if b.get("fit_class") else {
            "compute": f": prefill is compute-bound (at least {need} of every known FLOP roof)",
            "latency": f": prefill is latency-bound, on no roof (bound by one needs at least {need} of it)",
            "unknown": f": no FLOP roof is compared ({b['why']}), so no bound is stated" if b.get("why") else
            ": no FLOP roof of this device (or no FLOP count of this model) is known, so no bound is stated"}[kind]
        if coef["b_s_per_token"] in ("resolved", "no interval") and coef["c_s_per_token2"] in ("resolved", "no interval") \
                and p.get("crossover_tokens"):
            text += (f"; attention overtakes the per-token work beyond {p['crossover_tokens']:,.0f} tokens"
                     f"{_ci(p['ci'].get('crossover_tokens'), fmt='{:,.0f}')}")
    elif b["basis"] == "medians":
        text = (f"{head}; without a usable fit, the attention's FLOPs over the whole TTFT already reach "
                f"{_pct_words(b['medians']['lower_pct_compute'], 'FLOP rate')}: compute-bound whatever the fit")
    else:
        text = f"{head}; what bounds it is not classified: {_problems(b['quality'])}"
    out = [("ttft", text + ".")]
    said = _counters(name, top, L, partial, b, fit.get("ceilings"), "prefill")
    if said:
        out.append(("ttft", said))
    return out


def _scaled(ci, k):
    return [x * k if x is not None else None for x in ci] if ci else None


def _quality(name: str, fit: dict) -> list[tuple[str, str]]:
    """A fit that may not carry claims, named with why; the medians stand for it."""
    out = []
    for kind, what, figure in (("prefill", "TTFT", "ttft"), ("decode", "decode step", "step_time")):
        q = (fit.get("quality") or {}).get(kind)
        problems = [p for p in (q or {}).get("problems") or [] if "regime change" not in p]  # the regime's own sentence says it
        if q and not q["usable"] and problems:
            out.append((figure, f"{name}: the {what} fit is not used for shares, bandwidths, crossovers or extrapolations: "
                                f"{'; '.join(problems)}; the measured medians stand instead."))
    return out


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
                        f"of the shorter lengths predicts{tail}; so the fit is not used for shares, bandwidths, crossovers "
                        f"or extrapolations, and the measured medians stand instead."))
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
    usable = {k for k in ("prefill", "decode") if ((fit.get("quality") or {}).get(k) or {}).get("usable")}
    if ex:  # a fit that may not carry claims is not extrapolated (longctx.analysis.bounds.quality)
        ex = {k: v for k, v in ex.items() if not (k in ("ttft_s", "ci_ttft_s") and "prefill" not in usable
                                                   or k in ("step_s", "decode_tok_s", "ci_decode_tok_s") and "decode" not in usable)}
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
    return [("", f"{name}: speculative decoding produces {top['spec_accept_length']:.3g} tokens per verify step "
                           f"at {_at(L, partial)}{rate}.")]


def _planner(planner: dict | None) -> list[tuple[str, str]]:
    """One sentence per distinct memory plan: configurations whose sentences would read alike (the free
    memory at start may differ where max-total-tokens caps the pool) share one, the uncapped figure as a span."""
    if not planner:
        return []
    groups: dict[str, list] = {}
    for name, p in planner.get("configurations", {}).items():
        text, uncapped = _plan_text(p)
        if text:
            groups.setdefault(text, []).append((name, uncapped))
    out = []
    for text, members in groups.items():
        names = ", ".join(n for n, _ in members)
        spans = [u for _, u in members if u is not None]
        shown = "" if not spans else f"{spans[0]:,}" if min(spans) == max(spans) else f"{min(spans):,} to {max(spans):,}"
        out.append(("planner", f"{names}: " + text.replace("{uncapped}", shown)))
    return out


def _plan_text(p: dict) -> tuple[str | None, int | None]:
    """A configuration's memory plan in words (without its name; '{uncapped}' where the pool memory alone
    would give goes), and that uncapped figure; (None, None) where there is nothing to say."""
    mm = p["memory"]
    row = next((r for r in p["rows"] if r["configured"]), None)
    if row is None:
        reason = planner_reason(p)
        return (f"{reason}.", None) if reason else (None, None)
    text = (f"at mem-fraction-static {row['mem_fraction_static']:g} the KV pool holds {row['pool_tokens']:,} tokens "
            f"({row['kv_bytes'] / 1e9:.3g} GB at {mm['cell_bytes']:,} bytes per token)")
    if p.get("check") == "match":
        text += ", as the server allocated"
    elif p.get("check") == "mismatch":
        text += f", but the server allocated {mm['observed_tokens']:,}"
    uncapped = None
    if mm.get("max_total_tokens") and row["pool_tokens_uncapped"] and row["pool_tokens_uncapped"] > row["pool_tokens"]:
        text += " (max-total-tokens caps it; memory alone would give {uncapped})"
        uncapped = int(row["pool_tokens_uncapped"])
    if row.get("concurrency_at_context_length") is not None:
        n = row["concurrency_at_context_length"]
        text += (f"; {n:,} request{'' if n == 1 else 's'} of the full context length "
                 f"({int(mm['context_length']):,}) fit{'s' if n == 1 else ''} at once")
    if mm.get("req_to_token_bytes") and p.get("req_to_token_tokens_equivalent") is not None:
        text += (f"; the req-to-token table of {mm['max_running_requests']} running requests costs "
                 f"{mm['req_to_token_bytes'] / 1e6:.3g} MB, as much as {p['req_to_token_tokens_equivalent']:,.0f} tokens of KV cache")
    return text + ".", uncapped


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
    held = rows[rows["burst"] > 0] if "burst" in rows else rows.iloc[:0]
    if len(held):  # trials whose tokens did not arrive apart (longctx.measure.burst): the first's reason
        first, k, n = held.iloc[0], int(held["burst"].sum()), int(rows["ok"].sum())
        why = f"at {int(first['length']):,} tokens: {first['decode_unmeasured']}"
        if (rows["decode_tok_s"] > 0).any():
            out.append(f"{name}: {k} of {n} trials' tokens did not arrive apart, at {_lengths(held['length'].tolist())} "
                       f"tokens: their decode is not measured, the other trials' decode stands ({why}).")
        else:
            out.append(f"{name}: no decode rate was measured: {k} of {n} trials' tokens did not arrive apart ({why}).")
    elif not (rows["decode_tok_s"] > 0).any():
        out.append(f"{name}: no decode rate was measured (no trial decoded a second token).")
    return out


def _unfitted(name: str, rows: pd.DataFrame, fit: dict) -> list[str]:
    """A phase measured but not fitted (too few lengths: longctx.analysis.fits.FIT_LENGTHS), in words: what it would
    need, what was measured, and that nothing that needs the fit (a bound, a share, an extrapolation) is stated.
    Nothing where no length measured the phase (_unusable says that)."""
    out = []
    for kind, column, what in (("prefill", "ttft_s", "prefill"), ("decode", "decode_tok_s", "decode")):
        measured = sorted(int(x) for x in rows.loc[rows[column] > 0, "length"]) if column in rows else []
        if fit.get(kind) or not measured:
            continue
        n = FIT_LENGTHS[kind]
        out.append(f"{name}: no {what} model is fitted: it needs {n} measured lengths, and {what} was measured at "
                   f"{_lengths(measured)} tokens{' only' if len(measured) == 1 else ''}; so what bounds {what}, its shares "
                   "and its extrapolation are not stated, and the medians stand alone.")
    return out


def _lengths(ls: list[int]) -> str:
    return listed([f"{x:,}" for x in sorted(ls)])


def diagnose(med: pd.DataFrame, fits: dict, planner: dict | None = None, headline: dict | None = None,
             settings: dict | None = None, load: dict | None = None, prefix: dict | None = None) -> dict:
    """{summary, configurations, planner}: page one's sentences across all configurations (longctx.report.summary:
    at most five), then every sentence of each configuration, grouped by configuration and without repeats
    (failures, partial lengths, what bounds decode and why, prefill, the fits that may not carry claims,
    speculative acceptance, regime changes, the extrapolation), then the memory planner's; load: load.json's
    contents, for page one's frontier and interference sentences; prefix: prefix_fits.json's, for its sentence. Each sentence is
    {text, figure}: the figure that shows it (longctx.report.figures), or None."""
    from .summary import summary

    groups: list[dict] = []
    faults: list[str] = []  # page one's: what could not be measured at all
    for name, fit in sorted(fits.items()):
        rows = med[(med["configuration"] == name) & med["ttft_s"].notna()]
        failed = _failed(name, med[med["configuration"] == name])
        items: list[tuple[str, str]] = []
        if rows.empty:
            faults.append(failed or f"{name}: no length was measured successfully.")
            groups.append({"name": name, "items": _items([("", faults[-1])], name)})
            continue
        if failed:  # the lengths that failed, before what the others say
            items.append(("", failed))
        partial = _partial_of(rows)
        said = _partial(name, partial, fit)
        if said:
            items.append(("", said))
        # the longest length measured in full: a partial one's few trials are not set against the fits
        full = rows[~rows["length"].astype(int).isin(partial)]
        top = (full if len(full) else rows).iloc[-1]
        L = int(top["length"])
        unusable = _unusable(name, rows)
        faults += unusable
        items += [("", text) for text in unusable + _unfitted(name, rows, fit)]
        items += (_decode(name, top, L, fit, partial) + _prefill(name, top, L, fit, partial) + _quality(name, fit)
                  + _speculative(name, top, L, partial) + _regimes(name, fit, partial) + _extrapolation(name, fit))
        groups.append({"name": name, "items": _items(items, name)})
    for name in sorted(set(med["configuration"]) - set(fits)):
        rows = med[med["configuration"] == name]
        faults.append(_failed(name, rows) or f"{name}: no length was measured successfully.")
        groups.append({"name": name, "items": _items([("", faults[-1])], name)})
    return {"summary": summary(med, fits, headline, settings or {}, faults, load, prefix),
            "configurations": groups,
            "planner": _items(_planner(planner))}


def _items(pairs: list[tuple[str, str]], name: str | None = None) -> list[dict]:
    """{text, figure} per sentence; under name's heading, without its 'name: ' (or 'name, ') lead."""
    out = []
    for figure, text in pairs:
        for lead in ((f"{name}: ", f"{name}, ") if name else ()):
            if text.startswith(lead):
                text = text[len(lead)].upper() + text[len(lead) + 1:]
                break
        out.append({"text": text, "figure": figure or None})
    return out


def bound_words(fit: dict) -> dict[str, str | None]:
    """What bounds each phase, in the words every sentence uses ({'decode': 'latency-bound (on neither roof)', ...}):
    both phases always, None where no bound was decided (no fit of that phase, or no fits at all)."""
    bounds = fit.get("bounds") or {}
    return {phase: CLASS[bounds[phase]["class"]] if bounds.get(phase) else None for phase in ("prefill", "decode")}
