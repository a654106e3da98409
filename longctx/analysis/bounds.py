"""What bounds each phase of a configuration, decided once, and whether a fit may carry a claim.

`quality` says of one fit (fits.json's prefill or decode entry) whether a sentence may use it: its
R^2 against a minimum, a regime change (the model stops fitting the longest lengths), and, per
coefficient, whether the non-negative fit clamped it to zero, its interval reaches zero, or the
interval is wider than a set share of the value. The thresholds are the settings `fit_quality`.

`decode` and `prefill` classify the phase at the longest length measured in full, from the fit
where it passes (else from the medians alone) and the hardware's ceilings (datasheet and measured
where known), with the thresholds of the settings `bounds`:

- decode: a fit that finds no length dependence (beta clamped to 0, or its interval reaching 0) is
  `flat`; where the length-proportional part beta L is under `dominant_share` of the step, the
  length-independent work bounds the step (`fixed`); otherwise the KV reads are classified by the
  rate they reach, kv_bytes_per_token / beta bytes/s and the attention FLOPs with it: `bandwidth`
  where that reaches `roof_share` of every known bandwidth roof, `compute` likewise against the
  FLOP roofs, else `latency` (neither roof). The roof that applies at the attention's intensity
  (below or above the ridge) is recorded with it, so the roofline's words and the decode's come
  from this one decision.
- prefill: the quadratic (attention) term's share of TTFT at that length; under `dominant_share` (or
  no quadratic term found) the per-token work bounds it (`linear`); otherwise the attention's FLOP
  rate (per-pair FLOPs / 2 / c) is `compute`-bound where it reaches `roof_share` of every known FLOP
  roof, else `latency`.

Without a usable fit the medians still bound the rates without any model: the KV reads of a step at
length L run at least at L x kv_bytes / step(L) and (the length-independent work being the same at
every length) at most at L x kv_bytes / (step(L) - step(L_min)); a bound that decides the class
decides it (`basis: medians`), else the class is `unknown` with the fit's problems. `evidence`
(longctx.analysis.fits) adds what the run holds for why: the same engine and model at other
settings, the kernel timed alone at the same shape, the verify width.
"""

from __future__ import annotations

from ..core.fitting import reciprocal_interval
from ..specs.model import ModelSpec

BOUNDS = {"roof_share": 0.5, "dominant_share": 0.5}
FIT_QUALITY = {"min_r2": 0.8, "max_relative_interval": 1.0}
ROOFS = ("measured", "datasheet")
COEFFICIENTS = {"prefill": ("a_s", "b_s_per_token", "c_s_per_token2"), "decode": ("t0_s", "beta_s_per_token")}
USABLE = ("resolved", "no interval")
MAX_SETTINGS_APART = 2  # configurations compared as evidence differ in at most this many server settings  # a coefficient a claim may use (no interval: bootstrap 0, said so)


def coefficient_status(value: float, ci: list | None, max_relative_interval: float) -> str:
    """zero (the non-negative fit clamped it), spans zero (its interval reaches 0), wide (the interval is wider
    than max_relative_interval x the value), unbounded, no interval (no bootstrap), or resolved."""
    if not value or value <= 0:
        return "zero"
    if not ci:
        return "no interval"
    lo, hi = ci
    if lo is None or lo <= 0:
        return "spans zero"
    if hi is None:
        return "unbounded"
    return "wide" if (hi - lo) / value > max_relative_interval else "resolved"


def quality(fit: dict | None, kind: str, settings: dict) -> dict | None:
    """Whether a sentence may use this fit: {usable, problems (words), coefficients: {name: status}, r2}."""
    if not fit:
        return None
    st = {**FIT_QUALITY, **(settings.get("fit_quality") or {})}
    r2 = fit.get("r2")
    problems = []
    if r2 is None:
        problems.append("the times do not vary, so R² is undefined")
    elif r2 < st["min_r2"]:
        problems.append(f"R² is {r2:.2f}, below the {st['min_r2']:g} required")
    rc = fit.get("regime_change")
    if rc:
        problems.append(f"it stops fitting beyond {rc['fitted_up_to']:,} tokens (a regime change)")
    coefficients = {name: coefficient_status(fit.get(name), (fit.get("ci") or {}).get(name), st["max_relative_interval"])
                    for name in COEFFICIENTS[kind]}
    return {"usable": not problems, "problems": problems, "coefficients": coefficients, "r2": r2,
            "thresholds": st, "intervals": bool(fit.get("bootstrap"))}


def resolved(q: dict | None, name: str) -> bool:
    """Whether a claim may use the coefficient name of a fit that passed."""
    return bool(q and q["usable"] and q["coefficients"].get(name) in USABLE)


def _roofs(ceilings: dict, key: str) -> dict[str, float]:
    return {w: (ceilings.get(w) or {}).get(key) for w in ROOFS if (ceilings.get(w) or {}).get(key)}


def _pcts(rate: float | None, roofs: dict[str, float]) -> dict[str, float]:
    return {w: 100.0 * rate / roof for w, roof in roofs.items()} if rate else {}


def _reaches(pcts: dict[str, float], share: float) -> bool:
    return bool(pcts) and all(p >= 100.0 * share for p in pcts.values())


def _below(pcts: dict[str, float], share: float) -> bool:
    return bool(pcts) and all(p < 100.0 * share for p in pcts.values())


def _roof_at(intensity: float | None, ceilings: dict) -> dict | None:
    """Which roof applies at this intensity, by the ridge of the measured ceilings (else the datasheet's)."""
    if not intensity:
        return None
    for w in ROOFS:
        c = ceilings.get(w) or {}
        if c.get("flops") and c.get("bandwidth_Bps"):
            ridge = c["flops"] / c["bandwidth_Bps"]
            return {"which": w, "ridge": ridge, "roof": "bandwidth" if intensity < ridge else "compute"}
    return None


def decode(fit: dict | None, steps: dict[int, float], length: int, kv_bytes: float | None, flops_per_kv_token: float | None,
           query_tokens: int, ceilings: dict, settings: dict, counters: dict | None = None) -> dict | None:
    """The decode phase's class at `length` (see the module's words). steps: median step seconds per length
    (the lengths the fit stood on); flops_per_kv_token: the attention FLOPs per KV token of one step, all its
    query tokens included (None where the model is not described exactly); counters: the GPU's own (GPM) over
    decode at `length` where they were read, {dram_bw_pct, tensor_active_pct} (medians over the trials): a class
    they contradict is not stated (`unknown`, with `fit_class` and `why`), since a bound needs both where both exist."""
    out = _decode(fit, steps, length, kv_bytes, flops_per_kv_token, query_tokens, ceilings, settings)
    if out is None or not counters:
        return out
    out["counters"] = counters
    share = 100 * out["thresholds"]["roof_share"]
    dram, tensor, cls = counters.get("dram_bw_pct"), counters.get("tensor_active_pct"), out["class"]
    why = None
    if cls == "bandwidth" and dram is not None and dram < share:
        why = f"the GPU's counters read DRAM at {dram:.2g}% of its bandwidth, under the {share:.0f}% the bandwidth roof needs"
    elif cls == "compute" and tensor is not None and tensor < share:
        why = f"the GPU's counters read its tensor pipes {tensor:.2g}% active, under the {share:.0f}% the FLOP roof needs"
    elif cls == "latency" and dram is not None and dram >= share:
        why = f"the GPU's counters read DRAM at {dram:.2g}% of its bandwidth, on the roof the fit puts decode under"
    return {**out, "class": "unknown", "fit_class": cls, "why": why} if why else out


def _decode(fit: dict | None, steps: dict[int, float], length: int, kv_bytes: float | None, flops_per_kv_token: float | None,
            query_tokens: int, ceilings: dict, settings: dict) -> dict | None:
    if not fit or length not in steps:
        return None
    st = {**BOUNDS, **(settings.get("bounds") or {})}
    q = quality(fit, "decode", settings)
    bw_roofs, flop_roofs = _roofs(ceilings, "bandwidth_Bps"), _roofs(ceilings, "flops")
    intensity = flops_per_kv_token / kv_bytes if flops_per_kv_token and kv_bytes else None
    out = {"phase": "decode", "length": length, "step_s": steps[length], "quality": q, "query_tokens": query_tokens,
           "intensity": intensity, "roof": _roof_at(intensity, ceilings), "thresholds": st, "share": None,
           "bandwidth": None, "compute": None, "basis": None, "medians": _median_bounds(steps, length, kv_bytes, intensity,
                                                                                      bw_roofs, flop_roofs)}
    beta_status = q["coefficients"]["beta_s_per_token"]
    withheld = ceilings.get("flops_withheld")  # no FLOP roof compares with this engine's arithmetic: no class that needs one
    if withheld:
        out["why"] = withheld
    if beta_status in ("zero", "spans zero") and not fit.get("regime_change"):
        return {**out, "class": "flat", "basis": "fit"}
    if not q["usable"] or beta_status not in USABLE:
        m = out["medians"]
        if m and _reaches(m["lower_pct_bandwidth"], st["roof_share"]):
            return {**out, "class": "bandwidth", "basis": "medians"}
        if m and m.get("upper_pct_bandwidth") and _below(m["upper_pct_bandwidth"], st["roof_share"]) and (
                not m.get("upper_pct_compute") or _below(m["upper_pct_compute"], st["roof_share"])) and not withheld:
            return {**out, "class": "latency", "basis": "medians"}
        return {**out, "class": "unknown"}
    beta, t0 = fit["beta_s_per_token"], fit["t0_s"]
    step = t0 + beta * length
    out["share"] = beta * length / step if step > 0 else None
    out["basis"] = "fit"
    if out["share"] is not None and out["share"] < st["dominant_share"]:
        return {**out, "class": "fixed"}
    if not kv_bytes:
        return {**out, "class": "unknown"}
    rate = kv_bytes / beta
    ci = (fit.get("ci") or {}).get("beta_s_per_token")
    rate_ci = reciprocal_interval(kv_bytes, ci)
    out["bandwidth"] = {"Bps": rate, "ci": rate_ci, "pct": _pcts(rate, bw_roofs),
                        "pct_ci": {w: [100 * x / roof if x else None for x in rate_ci] for w, roof in bw_roofs.items()} if rate_ci else None}
    if intensity:
        out["compute"] = {"flops": rate * intensity, "pct": _pcts(rate * intensity, flop_roofs)}
    if not bw_roofs and not flop_roofs:
        return {**out, "class": "unknown"}
    if _reaches(out["bandwidth"]["pct"], st["roof_share"]):
        return {**out, "class": "bandwidth"}
    if out["compute"] and _reaches(out["compute"]["pct"], st["roof_share"]):
        return {**out, "class": "compute"}
    if withheld:  # under the bandwidth roof; whether on a compute roof is not known
        return {**out, "class": "unknown"}
    return {**out, "class": "latency"}


def _median_bounds(steps: dict[int, float], length: int, kv_bytes: float | None, intensity: float | None,
                   bw_roofs: dict, flop_roofs: dict) -> dict | None:
    """The KV reads' rate at `length` bounded by the medians alone (no model): at least L kv / step(L), at most
    L kv / (step(L) - step(L_min)) where the step grew from the shortest length."""
    if not kv_bytes or length not in steps or steps[length] <= 0:
        return None
    shortest = min(steps)
    lower = length * kv_bytes / steps[length]
    growth = steps[length] - steps[shortest] if shortest < length else 0.0
    upper = length * kv_bytes / growth if growth > 0 else None
    out = {"from_length": shortest, "lower_Bps": lower, "upper_Bps": upper, "lower_pct_bandwidth": _pcts(lower, bw_roofs),
           "upper_pct_bandwidth": _pcts(upper, bw_roofs) if upper else None}
    if intensity:
        out["upper_pct_compute"] = _pcts(upper * intensity, flop_roofs) if upper else None
    return out


def attention_rate(flops_per_pair: float, c: float, ci) -> tuple[float, list | None]:
    """The attention's FLOP rate that the prefill fit's quadratic term c (> 0) stands for, with its interval from c's:
    a prompt of L tokens holds L (L + 1) / 2 (query, key) pairs, so c L^2 seconds buy flops_per_pair / 2 FLOP per L^2."""
    per_token2 = flops_per_pair / 2
    return per_token2 / c, reciprocal_interval(per_token2, ci)


def prefill(fit: dict | None, ttft: dict[int, float], length: int, spec: ModelSpec | None, ceilings: dict,
            settings: dict, counters: dict | None = None) -> dict | None:
    """The prefill phase's class at `length` (see the module's words). ttft: median TTFT per length;
    spec: the model spec, for the attention's FLOPs (None where it does not describe the model exactly); counters:
    the GPU's own (GPM) over prefill at `length` where they were read ({tensor_active_pct, ...}, medians over the
    trials): a compute bound whose tensor pipes the counters read under the roof's share is not stated (`unknown`,
    with `fit_class` and `why`), as for decode."""
    out = _prefill(fit, ttft, length, spec, ceilings, settings)
    if out is None or not counters:
        return out
    out["counters"] = counters
    share = 100 * out["thresholds"]["roof_share"]
    tensor = counters.get("tensor_active_pct")
    if out["class"] == "compute" and tensor is not None and tensor < share:
        return {**out, "class": "unknown", "fit_class": "compute",
                "why": f"the GPU's counters read its tensor pipes {tensor:.2g}% active, under the {share:.0f}% the "
                       "FLOP roof needs"}
    return out


def _prefill(fit: dict | None, ttft: dict[int, float], length: int, spec: ModelSpec | None, ceilings: dict,
             settings: dict) -> dict | None:
    if not fit or length not in ttft:
        return None
    flops_per_pair = spec.prefill_flops_per_pair() if spec else None
    st = {**BOUNDS, **(settings.get("bounds") or {})}
    q = quality(fit, "prefill", settings)
    flop_roofs = _roofs(ceilings, "flops")
    out = {"phase": "prefill", "length": length, "ttft_s": ttft[length], "quality": q, "thresholds": st, "share": None,
           "compute": None, "basis": None, "medians": None}
    if flops_per_pair and ttft[length] > 0:  # the attention's FLOPs over the whole TTFT: a lower bound of its rate
        lower = spec.prefill_attention_flops(length) / ttft[length]
        out["medians"] = {"lower_flops": lower, "lower_pct_compute": _pcts(lower, flop_roofs)}
    if not q["usable"]:
        if out["medians"] and _reaches(out["medians"]["lower_pct_compute"], st["roof_share"]):
            return {**out, "class": "compute", "basis": "medians"}
        return {**out, "class": "unknown"}
    out["basis"] = "fit"
    c = fit["c_s_per_token2"]
    total = fit["a_s"] + fit["b_s_per_token"] * length + c * length**2
    out["share"] = c * length**2 / total if total > 0 else None
    if q["coefficients"]["c_s_per_token2"] not in USABLE or (out["share"] is not None and out["share"] < st["dominant_share"]):
        return {**out, "class": "linear"}
    if not flops_per_pair:
        return {**out, "class": "unknown"}
    rate, ci = attention_rate(flops_per_pair, c, (fit.get("ci") or {}).get("c_s_per_token2"))
    out["compute"] = {"flops": rate, "pct": _pcts(rate, flop_roofs), "ci": ci}
    if not flop_roofs:
        return {**out, "class": "unknown", **({"why": ceilings["flops_withheld"]} if ceilings.get("flops_withheld") else {})}
    return {**out, "class": "compute" if _reaches(out["compute"]["pct"], st["roof_share"]) else "latency"}


def _interval(fit: dict, name: str) -> list | None:
    ci = (fit.get("ci") or {}).get(name)
    return ci if ci and ci[0] is not None and ci[1] is not None else None


def evidence(name: str, fits: dict[str, dict], entries: dict[str, dict], kernels: dict | None) -> list[dict]:
    """What the run holds for why configuration name's decode is as it is classified: the same engine and
    model (KV bytes per token) on the same device at other settings, with the ratio of their KV reads' cost per
    token (beta) and whether the intervals separate them; the kernel it serves with, timed alone at the same
    shape (its own read rate at the longest length timed up to this one); and the verify width."""
    me, entry = fits[name], entries.get(name) or {}
    b = (me.get("bounds") or {}).get("decode")
    if not b:
        return []
    out: list[dict] = []
    if resolved(b["quality"], "beta_s_per_token"):
        for other in sorted(fits):
            f, e = fits[other], entries.get(other) or {}
            ob = (f.get("bounds") or {}).get("decode")
            if other == name or not ob or not resolved(ob["quality"], "beta_s_per_token"):
                continue
            if (e.get("engine"), f.get("kv_bytes_per_token"), (f.get("ceilings") or {}).get("device")) != (
                    entry.get("engine"), me.get("kv_bytes_per_token"), (me.get("ceilings") or {}).get("device")):
                continue
            mine, theirs = me["decode"], f["decode"]
            a, o = entry.get("args") or {}, e.get("args") or {}
            differ = {k: [a.get(k), o.get(k)] for k in sorted(set(a) | set(o)) if a.get(k) != o.get(k)}
            if not differ or len(differ) > MAX_SETTINGS_APART:  # another deployment altogether: no evidence of one setting's effect
                continue
            ci_a, ci_o = _interval(mine, "beta_s_per_token"), _interval(theirs, "beta_s_per_token")
            out.append({"kind": "settings", "other": other, "differ": differ,
                        "beta_ratio": mine["beta_s_per_token"] / theirs["beta_s_per_token"],
                        "separated": bool(ci_a and ci_o and (ci_a[1] < ci_o[0] or ci_o[1] < ci_a[0]))})
    kernel = (entry.get("kernel") or {}).get("name")
    device = (me.get("ceilings") or {}).get("device")
    timed = [r for r in (kernels or {}).get("records") or [] if r.get("kernel") == kernel and r.get("device") == device
             and r.get("variant") not in ("gather", "contiguous") and r.get("n_q", 1) == 1]
    if timed:
        upto = [r for r in timed if r["length"] <= b["length"]] or timed
        r = max(upto, key=lambda r: (r["length"] if r["length"] <= b["length"] else -r["length"], -r["seconds"]))
        out.append({"kind": "kernel", "kernel": kernel, "variant": r["variant"], "length": int(r["length"]),
                    "Bps": r["kv_bytes"] / r["seconds"], "fraction_of_copy": r.get("fraction_of_copy"),
                    "copy_Bps": r["copy_gb_s"] * 1e9 if r.get("copy_gb_s") else None})
    if b.get("query_tokens", 1) > 1:
        out.append({"kind": "verify", "query_tokens": b["query_tokens"]})
    return out
