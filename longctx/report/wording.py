"""Engine-neutral words for what the data files record: where each configuration's server computes,
what its telemetry measured, what it reported about itself, the model as it served it (with where
each figure came from) and why a KV pool could not be modelled, in sentences a reader can follow
without knowing longctx's own key names.

Every reader here is defensive: a raw file from before a field was recorded reads as "not
recorded", never as a guess of the reference engine's.
"""

from __future__ import annotations

import json
import re

from ..analysis.identity import engine_version
from ..core.net import listen_words
from ..core.numbers import is_number
from ..core.words import listed
from ..engines import get_adapter
from ..measure.prompts import text_words
from ..measure.burst import TTFT_OF_BURST

DEVICES = ("cpu", "gpu", "remote")
DEVICE_WORDS = {"cpu": "the CPU", "gpu": "GPU", "remote": "a remote machine"}
# ModelSpec fields as the appendix names them, in the order it lists them (config.json's field in brackets)
FIELDS = (
    ("model_type", "family", None),
    ("num_hidden_layers", "layers", "num_hidden_layers"),
    ("hidden_size", "hidden size", "hidden_size"),
    ("num_attention_heads", "attention heads", "num_attention_heads"),
    ("num_key_value_heads", "KV heads", "num_key_value_heads"),
    ("head_dim", "head dimension", "head_dim"),
    ("kv_lora_rank", "KV latent rank", "kv_lora_rank"),
    ("qk_rope_head_dim", "rope dimensions of the key", "qk_rope_head_dim"),
    ("qk_nope_head_dim", "non-rope dimensions of the key", "qk_nope_head_dim"),
    ("v_head_dim", "value dimensions", "v_head_dim"),
    ("weight_dtype", "weights' dtype", None),
    ("weight_format", "weights' quantized type", None),
    ("kv_cache_dtype", "KV cache dtype", None),
    ("tp_size", "tensor-parallel ranks", None),
)
ATTENTION_WORDS = {"mla": "MLA (multi-head latent attention)", "gqa": "GQA (grouped-query attention)",
                   "mha": "MHA (multi-head attention)"}
# the planner's inputs (longctx.analysis.memory.memory_model) in words
PLANNER_INPUTS = {"memory_bytes": "the memory size", "weights_bytes": "the weights' size", "cell_bytes": "the KV bytes per token"}
SETTING_CHARS = 2000  # a nested server setting longer than this is cut (the rest counted)


def device(entry: dict, fit: dict | None = None) -> str | None:
    """Where a configuration's server computes: 'cpu', 'gpu' or 'remote'. As recorded (provenance
    device), else as the fits took it (their ceilings' device), else from the engine's flags
    (its adapter's compute_device); None where none of them can tell."""
    recorded = entry.get("device")
    if isinstance(recorded, str) and recorded in DEVICES:
        return recorded
    taken = ((fit or {}).get("ceilings") or {}).get("device")
    if taken in DEVICES:
        return taken
    if not entry.get("engine"):
        return None
    try:
        return get_adapter(entry["engine"]).compute_device(entry.get("args") or {})
    except (KeyError, ValueError, TypeError):
        return None


def managed(entry: dict) -> bool | None:
    """Whether longctx started the server (None: the engine is not one longctx knows)."""
    try:
        return get_adapter(entry["engine"]).managed
    except (KeyError, ValueError, TypeError):
        return None


def imported(entry: dict) -> dict | None:
    """Where an imported configuration's rows came from (the provenance's `imported`, longctx.measure.imports):
    the tool and its version, each file with its hash, what the format lacks, how its lengths were grouped
    (per length: each run's placement) and the requests placed at none; None for a measured configuration."""
    imp = entry.get("imported")
    if not imp:
        return None
    version = imp.get("tool_version")
    return {
        "tool": imp["tool"], "format": imp["format"],
        "version_text": f"{version} ({imp['version_source']})" if version else f"version not recorded: {imp['version_source']}",
        "files": [{"path": f["path"], "sha256": f["sha256"], "short": f["sha256"][:12], "runs": len(f["runs"]),
                   "requests": sum(r["requests"] for r in f["runs"]), "failed": sum(r["failed"] for r in f["runs"])}
                  for f in imp["files"]],
        "lacks": [{"key": k, "what": v["what"], "why": v["why"]} for k, v in imp["lacks"].items()],
        "notes": (imp.get("notes") or []) + sorted({n for f in imp["files"] for r in f["runs"] for n in r["notes"]}),
        "unplaced": imp.get("unplaced") or [],
        "models": imp.get("models") or [],
        "grouping": [{"length": int(k), "how": v} for k, v in sorted((imp.get("grouping") or {}).items(), key=lambda kv: int(kv[0]))],
    }


def engine_text(entry: dict) -> str:
    """'reference 0.1.0', 'external (OpenAI API), version not reported', 'imported vllm bench serve results', ..."""
    if entry.get("imported"):
        imp = entry["imported"]
        return f"imported {imp['tool']} results" + (f" ({imp['tool']} {imp['tool_version']})" if imp.get("tool_version") else "")
    name = entry.get("engine") or "not recorded"
    api = entry.get("api")
    if api and managed(entry) is False:
        name += f" ({'OpenAI' if api == 'openai' else api} API)"
    v = engine_version(entry)
    return f"{name} {v}" if v else (f"{name}, version not reported" if entry.get("engine") else name)


def server_settings(info) -> list[tuple[str, str]]:
    """What the server reported about itself, as (setting, value) in its own key order sorted: single
    values as they are, nested ones as compact JSON (cut beyond SETTING_CHARS). longctx's own note of the
    endpoints that answered is not a setting."""
    out = []
    for k, v in sorted((info or {}).items()) if isinstance(info, dict) else []:
        if k == "endpoints":
            continue
        if isinstance(v, str):
            text = v
        else:
            text = json.dumps(v, sort_keys=True, separators=(", ", ": "))
        if len(text) > SETTING_CHARS:
            text = text[:SETTING_CHARS] + f" ... ({len(text) - SETTING_CHARS:,} characters more)"
        out.append((str(k), text))
    return out


def settings_endpoints(info) -> list[str]:
    return [str(p) for p in (info.get("endpoints") or [])] if isinstance(info, dict) else []


def telemetry(description) -> dict:
    """What a telemetry record says it measured: {text, source (nvml | psutil | off | None), scope
    (gpu | process | machine | None)}. description: the provenance's telemetry, a sentence (as
    ProcessSource/NvmlSource.describe write it) or a record with source/scope/description."""
    if isinstance(description, dict):
        text = str(description.get("description") or description.get("text") or description.get("source") or "not recorded")
        source = description.get("source") or description.get("kind")
        scope = description.get("scope") or description.get("over") or description.get("of")
        words = text.lower()
    else:
        text = str(description) if description else "not recorded"
        source = scope = None
        words = text.lower()
    if source is None:
        source = ("nvml" if words.startswith("nvml") else "psutil" if words.startswith("psutil")
                  else "off" if words in ("off", "none", "") else None)
    if scope not in ("gpu", "process", "machine"):
        scope = (("gpu" if source == "nvml" else None) or ("machine" if "machine" in words or "system" in words else None)
                 or ("process" if "process" in words or "pid" in words else None))
    return {"text": text, "source": source, "scope": scope}


def gpm_line(descriptions: list[str]) -> str:
    """The telemetry section's one line on the GPU's own counters (GPM: longctx.measure.gpm), from what the sources
    say: read, or why not (an NVML source's own words; no GPU watched at all)."""
    if any("GPM counters read" in d for d in descriptions):
        return ("The GPU's own counters (GPM) were read: SM activity, SM occupancy, tensor-pipe activity and DRAM "
                "bandwidth over each telemetry sample's interval (results.csv, per window); the diagnosis sets them "
                "beside what the fits infer.")
    said = sorted({m[0] for d in descriptions if (m := re.search(r"GPM counters not read: [^;]*", d))})
    if said:
        return "; ".join(said) + ": the diagnosis stands on the fits alone."
    return "GPM counters not read: no configuration's telemetry watches a GPU; the diagnosis stands on the fits alone."


def telemetry_labels(descriptions: list, gpu: bool) -> dict:
    """The telemetry table's column labels, from what the sources say they measured (the whole machine's
    CPU and memory is not the server's)."""
    scopes = {telemetry(d)["scope"] for d in descriptions} - {None}
    if gpu:
        return {"util": "SM utilisation (%)", "mem": "GPU memory used (GB)"}
    if scopes == {"machine"}:
        return {"util": "whole machine's CPU (% of one core)", "mem": "whole machine's memory used (GB)"}
    if scopes == {"process"}:
        return {"util": "server's CPU (% of one core)", "mem": "server's resident memory (GB)"}
    if "machine" in scopes:  # some of each: the table mixes them, the sources say which
        return {"util": "CPU (% of one core; server or whole machine)", "mem": "memory (GB; server's resident or whole machine's used)"}
    return {"util": "CPU (% of one core)", "mem": "memory (GB)"}


def planner_reason(p: dict) -> str | None:
    """Why the planner has no rows for a configuration, in words: the planner's own reason (a record
    from before it was worded names the planner's inputs by their keys: those become words; one that
    named SGLang's rule for a server without it is said anew), else which of its inputs are unknown."""
    if p.get("rows"):
        return None
    mm = p.get("memory") or {}
    if p.get("reason") and "SGLang" not in str(p["reason"]):
        return _unkey(str(p["reason"]))
    if "sizing_rule" in mm and not mm["sizing_rule"]:  # a record that named SGLang's rule for a server without it
        text = "the pool is not modelled: the server sizes it by a rule of its own, which the planner does not tabulate"
        if mm.get("cell_bytes") is None and mm.get("cell_source"):
            text += f" (KV bytes per token unknown: {mm['cell_source']})"
        a = p.get("allocated") or {}
        if a.get("pool_tokens"):
            text += f"; the pool it allocated holds {a['pool_tokens']:,} tokens"
            if a.get("source"):
                text += f" ({a['source']})"
            if a.get("kv_bytes") is not None and mm.get("cell_bytes"):
                text += f", {a['kv_bytes'] / 2**30:.3g} GiB at {mm['cell_bytes']:,} bytes per token"
        return text
    if p.get("reason"):
        return _unkey(str(p["reason"]))
    missing = [words for key, words in PLANNER_INPUTS.items() if key in mm and mm[key] is None]
    if not missing:
        return None
    text = f"the pool cannot be modelled: {listed(missing)} {'is' if len(missing) == 1 else 'are'} unknown"
    if mm.get("cell_bytes") is None and mm.get("cell_source"):
        text += f" ({mm['cell_source']})"
    return text


def _unkey(text: str) -> str:
    """'unknown memory_bytes, weights_bytes' (a planner.json from before its reasons were worded) in words."""
    import re

    m = re.search(r"unknown ((?:memory_bytes|weights_bytes|cell_bytes)(?:, (?:memory_bytes|weights_bytes|cell_bytes))*)", text)
    if m:
        keys = m.group(1).split(", ")
        words = [PLANNER_INPUTS[k] for k in keys]
        text = text[:m.start()] + f"{listed(words)} {'is' if len(words) == 1 else 'are'} unknown" + text[m.end():]
    for key, words in PLANNER_INPUTS.items():
        text = text.replace(key, words)
    return text


def without_ceilings(fit: dict, where: str | None) -> dict:
    """fit with the hardware's ceilings and every share of them left out: the fits took them for
    another device than the one the server is recorded to compute on (`where`), so they are not its."""
    import copy

    out = copy.deepcopy(fit)
    out["ceilings"] = {"device": where, "device_name": None, "datasheet": None, "measured": None,
                       "datasheet_missing": f"left out: the analysis took the ceilings of another device than {DEVICE_WORDS.get(where, where)}",
                       "measured_missing": "left out (fit again with this record of the device)", "stale": True}
    for kind, keys in (("decode", ("bw_pct_datasheet", "bw_pct_measured")),
                       ("prefill", ("attention_pct_datasheet", "attention_pct_measured"))):
        if out.get(kind):
            for k in keys:
                out[kind][k] = None
                if isinstance(out[kind].get("ci"), dict) and k in out[kind]["ci"]:
                    out[kind]["ci"][k] = None
    roof = out.get("roofline")
    if roof:
        for which in ("datasheet", "measured"):
            roof[f"ridge_{which}"] = roof[f"bound_{which}"] = None
        for point in roof.get("points") or []:
            for k in ("attainable_datasheet", "fraction_of_datasheet", "attainable_measured", "fraction_of_measured"):
                point[k] = None
    return out


def model_served(fit: dict, plan: dict | None, name: str | None = None) -> dict:
    """The model as the configuration's server ran it, for the appendix: attention, each figure with
    where it came from, the KV bytes per token the analysis used and the planner's, and why the
    figures that need the architecture are absent where they are."""
    spec = fit.get("model_spec") or None
    sources = (spec or {}).get("field_sources") or {}
    default = (spec or {}).get("source")
    rows = []
    if spec:
        for key, label, field in FIELDS:
            value = spec.get(key)
            if value is None:
                continue
            rows.append({"figure": label, "field": field, "value": value, "source": sources.get(key) or default or "--"})
    kv = fit.get("kv_bytes_per_token")
    rows.append({"figure": "KV bytes per token (the analysis)", "field": None, "value": kv,
                 "source": fit.get("kv_bytes_source") or ("--" if kv is not None else "unknown")})
    mm = (plan or {}).get("memory") or {}
    if plan is not None:
        rows.append({"figure": "KV bytes per token (the memory planner)", "field": None, "value": mm.get("cell_bytes"),
                     "source": mm.get("cell_source") or "unknown"})
    absent = fit.get("model_spec_absent")
    if spec and not absent:
        rows.append({"figure": "decode attention FLOPs per KV token", "field": None,
                     "value": spec.get("decode_flops_per_kv_token"), "source": "the architecture"})
    attention = spec.get("attention") if spec else None
    return {"name": name, "attention": attention, "attention_text": ATTENTION_WORDS.get(attention, attention) if attention else None,
            "exact": bool(spec) and not absent, "absent": absent, "rows": rows,
            "spec_source": default, "kv_bytes_per_token": kv}


EVENT_RULE_WORDS = {
    "every": "every stream event is one token, empty text included",
    "text": "only stream events with text are tokens",
    "every-but-final": "every stream event but a final empty one (the finish reason alone) is one token",
}


def prompt_probe(plan: dict | None) -> list[str]:
    """What the prompt probe decided about a server (longctx.measure.prompts.PromptPlan), in sentences;
    [] for a record from before the probe."""
    if not isinstance(plan, dict) or "prompt" not in plan:
        return []
    out = []
    if plan["prompt"] == "text":
        lib = f", read with {plan['tokenizer_library']}" if plan.get("tokenizer_library") else ""
        out.append(f"prompts sent as text of exact lengths, built with the model's tokenizer at {plan.get('tokenizer')}{lib}")
    else:
        out.append("prompts sent as token ids")
    out.append(f"their content: {text_words(plan.get('text_source'))}")
    k = plan.get("added_tokens") or 0
    out.append(f"the server adds {k} token{'s' if k != 1 else ''} to every prompt, so a length L was sent as L - {k}"
               if k else "the server adds no tokens to a prompt")
    usage = plan.get("usage")
    out.append({"stream": "its counts come from the usage in the stream",
                "response": "its stream carries no usage: only non-streamed responses do, so each trial's counts were "
                            "taken here, as sent and as received",
                "none": "it reports no counts: each trial's were taken here, as sent and as received, and are estimated"}
               .get(usage, f"its counts: {usage}"))
    rule = EVENT_RULE_WORDS.get(plan.get("events"), str(plan.get("events")))
    out.append(rule + ("" if plan.get("events_exact", True) else
                       " (no rule matched the server's own count, or it gave none: output counts are estimated)"))
    return out


def trial_flags(rows, entry: dict | None = None, fit: dict | None = None) -> list[str]:
    """What a configuration's trials that succeeded were flagged with (results.csv rows), in sentences: a failed
    trial is counted with the failures, never here; from its provenance entry, whether another job's contention
    could be checked at all (longctx.analysis.aggregate.flag_contended); and from its fits.json entry, the lengths
    at which a fit stands on flagged trials, too few others being left (longctx.analysis.fits._trusted)."""
    out = []
    why_not = ((entry or {}).get("contention") or {}).get("why_not")
    if why_not:
        out.append(f"Whether another job took the server's device during its trials could not be checked ({why_not}): "
                   "its figures are taken as measured")
    rows = rows[rows["status"].eq("ok")] if "status" in rows else rows
    n = len(rows)

    def count(column: str) -> int:
        return int(rows[column].eq(True).sum()) if column in rows else 0

    estimated, early = count("tokens_estimated"), count("early_stop")
    client = int(rows["usage_source"].eq("client").sum()) if "usage_source" in rows else 0
    if estimated:
        out.append(f"{estimated} of {n} trials have estimated token counts; they are left out of the fits unless "
                   "too few lengths are left without them")
    if client:
        out.append(f"{client} of {n} trials' prompt counts were not checked: the server gave no count, so each is "
                   "taken as the length asked (the output tokens were counted here)")
    if early:
        out.append(f"{early} of {n} trials stopped before the output tokens asked (an early stop); they are left out "
                   "of the decode fit")
    held = rows[rows["burst"].eq(True)] if "burst" in rows else rows.iloc[:0]
    if len(held):  # longctx.measure.burst: the first one's reason says how and why
        r = held.iloc[0]
        trial = f", trial {int(r['trial'])}" if is_number(r.get("trial")) else ""
        out.append(f"{len(held)} of {n} trials' tokens did not arrive apart, so their decode was not measured (at "
                   f"{int(r['length']):,} tokens{trial}: {r['decode_unmeasured']}); they have no TPOT, decode rate or "
                   f"inter-token gaps in the tables, the figures or the fits, and {TTFT_OF_BURST}")
    contended = rows[rows["contended"].eq(True)] if "contended" in rows else rows.iloc[:0]
    if len(contended):
        named = "; ".join(f"at {int(r['length']):,} tokens, trial {int(r['trial'])}: {r['contended_reason']}"
                          for r in contended.head(4).to_dict("records"))
        more = f"; and {len(contended) - 4} more" if len(contended) > 4 else ""
        out.append(f"{len(contended)} of {n} trials ran while the server got markedly less of its device than in its "
                   f"other trials ({named}{more}); they are left out of the medians, the speedups and their verdicts "
                   "unless nothing else was measured at their length, and out of the fits unless too few lengths are "
                   "left without them")
    stood = [f"the {kind} fit stands on those at {listed([f'{x:,}' for x in lengths])} tokens"
             for kind in ("prefill", "decode") if (lengths := ((fit or {}).get(kind) or {}).get("on_flagged_lengths"))]
    if stood:
        out.append(f"Without the flagged trials too few lengths are left for a fit: {listed(stood)}, where nothing "
                   "else was measured")
    return out


def no_fit(fit: dict, rows) -> dict[str, str | None]:
    """Why a configuration has no prefill or no decode model, in the words of the fits' tables (rows: its medians,
    longctx.analysis.tables.medians), None for a phase fitted: fewer measured lengths than the fit needs, or, for
    decode, none at all: no trial decoded a second token, or its tokens did not arrive apart (the diagnosis and the
    failures section say how: longctx.measure.burst)."""
    def lengths(column: str) -> int:
        return int(rows.loc[rows[column] > 0, "length"].nunique()) if column in rows and len(rows) else 0

    words = {"prefill": "fewer than three measured lengths: no fit", "decode": "fewer than two measured lengths: no fit"}
    out: dict[str, str | None] = {k: None if fit.get(k) else words[k] for k in words}
    if not fit.get("decode") and not lengths("decode_tok_s") and lengths("ttft_s"):
        held = "burst" in rows and bool((rows["burst"] > 0).any())
        out["decode"] = ("not measured: its tokens did not arrive apart (see the diagnosis): no fit" if held else
                         "no trial decoded a second token: no fit")
    return out


PARTIAL_LISTED = 6  # partial lengths named on page one; the others are counted


def partial_text(row) -> str:
    """One partial length in words: 'measured by 1 of 3 trials'."""
    return f"measured by {int(row['ok'])} of {int(row['configured'])} trials"


def exposed(configs: list[dict]) -> dict | None:
    """Page one's word on servers longctx started on an address other than loopback (server.allow_remote; each
    configuration's remote_listen): {names, text}, or None where every server listened on loopback only."""
    shown = [c for c in configs if c.get("remote_listen")]
    if not shown:
        return None
    said = listed([f"{c['name']}'s server listened on {listen_words(c['remote_listen'], 'its machine')}" for c in shown])
    return {"names": [c["name"] for c in shown],
            "text": f"{said}, not on loopback only, while measured (server.allow_remote: true)."}


def partial_lengths(med, analysis: dict) -> dict:
    """The partial lengths (longctx.analysis.tables.medians' `partial` rows: fewer successful single-request
    trials than configured) and what the fits did with them (fits.json's partial_lengths), for the tables'
    marks and page one: {count, rows: [{configuration, length, ok, configured, key, text}], keys, said, use}.
    `said` counts them (naming the first few), `use` says whether the fits and the regime detection left
    them out; the templates write "<said>; <it> marked <the mark><use>"."""
    rows = []
    if len(med) and "partial" in med:
        for r in med[med["partial"].eq(True)].sort_values(["configuration", "length"]).to_dict("records"):
            rows.append({"configuration": r["configuration"], "length": int(r["length"]), "ok": int(r["ok"]),
                         "configured": int(r["configured"]), "key": f"{r['configuration']}:{int(r['length'])}",
                         "text": partial_text(r)})
    out = {"count": len(rows), "rows": rows, "keys": [r["key"] for r in rows], "said": None, "it": None, "use": None}
    if not rows:
        return out
    named = [f"{r['configuration']} at {r['length']:,} tokens: {r['ok']} of {r['configured']} trials" for r in rows[:PARTIAL_LISTED]]
    if len(rows) > PARTIAL_LISTED:
        named.append(f"{len(rows) - PARTIAL_LISTED} more")
    n = len(rows)
    out["said"] = (f"{n} length{' was' if n == 1 else 's were'} measured by fewer successful trials than configured "
                   f"({listed(named)})")
    out["it"] = "it is" if n == 1 else "they are"
    mode = (analysis.get("settings") or {}).get("partial_lengths", "exclude")
    configs = analysis.get("configurations") or {}
    if mode == "include":
        out["use"] = (" and fitted like every other length (analysis.partial_lengths is include), in the regime "
                      "detection too.")
        return out
    recorded = any("partial_lengths" in (configs.get(r["configuration"]) or {}) for r in rows)
    if not recorded:  # fits.json from before partial lengths were recorded: what the fits did is not known
        out["use"] = "."
        return out
    fell = [f"{name}'s {kind} fit" for name in sorted({r["configuration"] for r in rows})
            for kind in ("prefill", "decode") if ((configs.get(name) or {}).get(kind) or {}).get("on_partial_lengths")]
    out["use"] = " and left out of the fits and of the regime detection" + (
        f", but for {listed(fell)}, which stand{'s' if len(fell) == 1 else ''} on {'it' if n == 1 else 'them'}: "
        "too few other lengths were measured." if fell else ".")
    return out


PREDICTED_WORDS = {"prefill": "TTFT", "decode": "decode rate"}


def _miss(kind: str, h: dict, fit: dict) -> str:
    """Where a prediction fell: inside its interval, or outside it and by how much, tied to the regime change
    the fits detected (longctx.core.fitting.regime_change_in) where there is one at or before that length."""
    dev = h["deviation"] if kind == "prefill" else h["rate_deviation"]
    if h["inside"] is not False:
        return "inside its interval"
    if kind == "prefill":
        how = f"{abs(dev):.0%} {'slower' if dev > 0 else 'faster'} than predicted"
    else:
        how = f"{abs(dev):.0%} {'faster' if dev > 0 else 'slower'} than predicted"
    rc = (fit.get(kind) or {}).get("regime_change")
    if rc and rc["from_length"] <= h["length"]:
        return f"outside its interval, {how}: the regime change detected from {rc['from_length']:,} tokens"
    return f"outside its interval, {how}, with no regime change detected (a length off the model, not a trend)"


def prediction(fit: dict) -> dict | None:
    """The prediction check of one configuration (fits.json's `prediction`: the models fitted to the first half of
    the lengths against the longest) in one sentence, and the rows of that cut's predictions of every longer length."""
    check = fit.get("prediction") or {}
    check = {k: check[k] for k in ("prefill", "decode") if k in check}
    heads = {k: v["headline"] for k, v in check.items() if v.get("headline")}
    if not heads:
        return None
    parts = []
    for kind, h in heads.items():
        dev = h["deviation"] if kind == "prefill" else h["rate_deviation"]
        parts.append((kind, h, f"{h['length']:,}'s {PREDICTED_WORDS[kind]} within {abs(dev):.0%} ({_miss(kind, h, fit)})"))
    cuts = {h["fitted_up_to"] for h in heads.values()}
    if len(cuts) == 1:
        sentence = f"fitted up to {cuts.pop():,} tokens, the models predicted " + " and ".join(p for _, _, p in parts)
    else:
        sentence = "; ".join(f"fitted up to {h['fitted_up_to']:,} tokens, the {kind} model predicted {p}" for kind, h, p in parts)
    rows = []
    for kind, v in check.items():
        cut = next((c for c in v["cuts"] if v.get("headline") and c["lengths_fitted"] == v["headline"]["lengths_fitted"]), None)
        for r in (cut or {}).get("predictions", []):
            rows.append({"kind": kind, "quantity": "TTFT (ms)" if kind == "prefill" else "step (ms)", "fitted_up_to": cut["fitted_up_to"],
                         **r, "shown_deviation": r["deviation"] if kind == "prefill" else r["rate_deviation"]})
    return {"sentence": sentence[0].upper() + sentence[1:] + ".", "rows": rows,
            "missed": [k for k, h in heads.items() if h["inside"] is False]}


def sweep_confirmation(sweep: dict) -> str | None:
    """An adaptive sweep's confirming measurement at max, in words: each model's measured median against its
    prediction and the prediction's interval for that many trials (longctx.measure.adaptive)."""
    out = sweep.get("outcome") or {}
    checks = out.get("checks") or {}
    if not checks:
        return sweep.get("reason")

    def ms(x):
        return f"{x * 1e3:.3g}" if isinstance(x, (int, float)) else "--"

    parts = [f"{'TTFT' if k == 'prefill' else 'decode step'} {ms(v.get('measured'))} ms measured against {ms(v.get('predicted'))} "
             f"ms predicted, {'inside' if v.get('inside') else 'outside'} [{ms(v.get('prediction_lo'))}, {ms(v.get('prediction_hi'))}]"
             for k, v in sorted(checks.items())]
    n = int(out.get("confirmations") or 1)
    text = (f"The last of {n} confirmations at {sweep['settings']['max']:,} (each more trials there, the intervals still "
            f"wider than the target): " if n > 1 else f"The confirmation at {sweep['settings']['max']:,}: ") + "; ".join(parts)
    if out.get("around_skipped"):
        text += f"; a length around the miss was not measured: {out['around_skipped']}"
    return text
