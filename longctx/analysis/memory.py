"""KV memory planner: how many tokens the KV pool holds as mem-fraction-static varies, the largest
context and the concurrency that fit, and what the req-to-token table of max-running-requests
costs, per configuration, from what its server reported (data/provenance.json).

The pool the server allocated is read from its report (SGLang's max_total_num_tokens in its server
info) or else from its log line (vLLM's "GPU KV cache size: N tokens"), as the engine adapter
recorded them in the provenance (kv_pool); longctx.specs.pool.observed_pool says which.

Where the server has a mem-fraction-static (SGLang, the reference engine, an external SGLang
server), the pool follows SGLang's sizing rule (longctx.specs.pool.PoolSizing, which the reference
engine itself allocates by), per GPU: tokens = ((M - weights) - M (1 - f)) // cell bytes, capped
by max-total-tokens and rounded down to the page size. M and the weights come from the server
where it reports them (the reference engine); otherwise M is the GPU's memory as NVML reports it (for
a GPU the config names, imported results' hardware.gpu: its datasheet memory, longctx/specs/hardware.yaml)
and the weights (everything SGLang subtracts before the pool) are backed out of the pool the
server allocated at its mem-fraction-static. For a server without one (vLLM sizes its pool from
gpu-memory-utilization or VLLM_CPU_KVCACHE_SPACE by a rule of its own) nothing is tabulated: the
plan says so and gives the pool as allocated (`allocated`). Where such a server was given its KV budget
(vLLM's VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes, kv_pool.budget in the provenance, from the
adapter's kv_budget), its own rule predicts the pool (`budget_rule`, budget_pool), set beside the pool it
logged (predicted_tokens_at_configured and check, as for SGLang's rule).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..core.errors import write_atomic
from ..core.words import listed
from ..engines import EngineAdapter, get_adapter
from ..specs import hardware
from ..specs.model import ModelSpec, ModelSpecError
from ..specs.pool import PoolError, PoolSizing, observed_pool

SGLANG_REQ_TO_TOKEN_BYTES = 4  # int32 entries, max_context_len = context_len + 4 (SGLang ReqToTokenPool)
SGLANG_RULE = "SGLang's (mem-fraction-static)"


def adapter_of(entry: dict) -> EngineAdapter:
    """The adapter of the engine that served a provenance entry, bound to what the entry says of its flags
    (imported results: the engine whose flags their args are, and their tp_size)."""
    return get_adapter(entry["engine"]).for_record(entry.get("imported"))


def spec_of(entry: dict) -> ModelSpec | None:
    """The model as the entry's server ran it: as recorded when it was measured, else from its flags;
    model.kv_bytes_per_token overriding its KV figure (a record from before the spec carried it too)."""
    model = entry.get("model") or {}
    if entry.get("model_spec"):
        spec = ModelSpec.from_dict(entry["model_spec"])
        given = model.get("kv_bytes_per_token")
        if "kv_bytes_override" not in entry["model_spec"] and given and int(given) != spec.kv_bytes_per_token():
            spec = replace(spec, kv_bytes_override=int(given),
                           field_sources={**spec.field_sources, "kv_bytes_per_token": "model.kv_bytes_per_token"})
        return spec
    if "model_spec_absent" in entry:  # recorded at measurement: the config described no model the spec can
        return None
    try:
        return adapter_of(entry).model_spec(model, entry.get("args") or {})
    except (ModelSpecError, KeyError, TypeError):
        return None


def spec_absent_reason(entry: dict, spec: ModelSpec | None) -> str | None:
    """Why the figures that need the architecture (attention FLOPs, intensity, roofline) are left
    out for this entry: no spec, or one that does not describe the model exactly; None: they are not."""
    if spec is None:
        return entry.get("model_spec_absent") or "the config describes no architecture (model.hf_config or model.architecture)"
    return None if spec.exact else spec.inexact_reason


def kv_bytes(entry: dict, spec: ModelSpec | None) -> tuple[int | None, str | None]:
    """KV cache bytes per token on one GPU and where the figure came from: model.kv_bytes_per_token
    over everything, else an exact spec's, else what the server reported; (None, why) otherwise."""
    given = (entry.get("model") or {}).get("kv_bytes_per_token")
    if spec and spec.kv_bytes_override:
        return int(spec.kv_bytes_override), "model.kv_bytes_per_token"
    if spec is None and given:
        return int(given), "model.kv_bytes_per_token"
    if spec and spec.exact:
        return spec.kv_bytes_per_token(), f"the architecture ({spec.source})"
    reported = (entry.get("server_info") or {}).get("kv_bytes_per_token")
    if reported:
        return int(reported), "the server"
    return None, spec_absent_reason(entry, spec)


def memory_model(entry: dict) -> dict:
    """What the pool size depends on, for one configuration, with where each figure came from."""
    info = entry.get("server_info") or {}
    args = entry.get("args") or {}
    adapter = adapter_of(entry)
    spec = spec_of(entry)
    cell, cell_source = kv_bytes(entry, spec)
    if spec and spec.exact and not spec.kv_bytes_override and info.get("kv_bytes_per_token"):
        cell, cell_source = int(info["kv_bytes_per_token"]), "the server"

    def setting(flag: str):  # SGLang's flags, which the reference engine shares; None where the server has none
        return adapter.setting(args, info, flag)

    observed, observed_source = observed_pool(entry)
    fraction = setting("mem-fraction-static")
    mm = {
        "cell_bytes": int(cell) if cell else None, "cell_source": cell_source,
        # SGLang's rule applies where the server has SGLang's mem-fraction-static (as configured or as it reports it)
        "sizing_rule": SGLANG_RULE if fraction is not None else None,
        "page_size": int(setting("page-size") or 1),
        "max_total_tokens": setting("max-total-tokens"),
        "context_length": adapter.context_length(args, info),
        "max_running_requests": setting("max-running-requests"),
        "mem_fraction_static": fraction,
        "observed_tokens": observed, "observed_source": observed_source,
        "observed_line": ((entry.get("kv_pool") or {}).get("log") or {}).get("line"),  # the server's own words, where it logged them
        "memory_bytes": None, "memory_source": None, "weights_bytes": None, "weights_source": None,
    }
    budget = (entry.get("kv_pool") or {}).get("budget") or {}
    mm.update(kv_budget_bytes=int(budget["bytes"]) if budget.get("bytes") is not None else None,
              kv_budget_source=budget.get("source"),
              kv_block_size=int(budget["block_size"]) if budget.get("block_size") else None,
              kv_block_source=budget.get("block_source"))
    gpus = (entry.get("hardware") or {}).get("gpus") or []
    if info.get("memory_total_bytes"):
        mm["memory_bytes"], mm["memory_source"] = int(info["memory_total_bytes"]), "the server (memory free before loading)"
    elif gpus and adapter.compute_device(args) == "gpu" and entry.get("device") != "cpu":
        mm["memory_bytes"], mm["memory_source"] = gpu_memory(gpus[0])
    if info.get("weights_bytes") is not None:
        mm["weights_bytes"], mm["weights_source"] = int(info["weights_bytes"]), "the server"
    elif mm["memory_bytes"] and mm["observed_tokens"] and mm["cell_bytes"] and mm["mem_fraction_static"] \
            and mm["observed_tokens"] != mm["max_total_tokens"]:
        m, f = mm["memory_bytes"], float(mm["mem_fraction_static"])
        mm["weights_bytes"] = int(m * f - mm["observed_tokens"] * mm["cell_bytes"])
        # backed out, the rest lands on the edge of a whole token, where floating point can lose that token: a byte
        # less of weights makes the configured fraction give back the pool the server allocated, not one token less
        for _ in range(2):
            if mm["weights_bytes"] > 0 and (pool_tokens(mm, f, capped=False) or 0) < mm["observed_tokens"]:
                mm["weights_bytes"] -= 1
        mm["weights_source"] = "backed out of the pool the server allocated (weights, activations and all else SGLang sets aside)"
    if info.get("req_to_token_bytes") is not None:
        mm["req_to_token_bytes"], mm["req_to_token_source"] = int(info["req_to_token_bytes"]), "the server (int64 table)"
    elif mm["sizing_rule"] and mm["max_running_requests"] and mm["context_length"]:
        mm["req_to_token_bytes"] = int(mm["max_running_requests"]) * (int(mm["context_length"]) + 4) * SGLANG_REQ_TO_TOKEN_BYTES
        mm["req_to_token_source"] = "SGLang's int32 table of max-running-requests x (context-length + 4)"
    else:
        mm["req_to_token_bytes"], mm["req_to_token_source"] = None, None
    return mm


def gpu_memory(gpu: dict) -> tuple[int | None, str | None]:
    """A GPU's memory and where the figure came from: NVML's reading where the machine that measured was read,
    else the datasheet's for its name (a GPU named in the config: imported results); (None, None) for neither."""
    if gpu.get("memory_total_bytes"):
        return int(gpu["memory_total_bytes"]), f"NVML: {gpu.get('name')}, GPU 0"
    sheet = hardware.match(gpu.get("name"))
    if sheet is None:
        return None, None
    return int(sheet["memory_si"]), (f"the datasheet: {sheet['name']}, {sheet['memory']['value']:g} {sheet['memory']['unit']} "
                                     f"({hardware.TABLE_PATH.name}; no NVML reading of that machine)")


def pool_tokens(mm: dict, fraction: float, capped: bool = True) -> int | None:
    """Tokens the pool holds at this mem-fraction-static (0 when not one page fits)."""
    if not (mm.get("sizing_rule", SGLANG_RULE) and mm["memory_bytes"] and mm["weights_bytes"] is not None and mm["cell_bytes"]):
        return None
    sizing = PoolSizing(memory_total_bytes=mm["memory_bytes"], mem_fraction_static=fraction, weights_bytes=mm["weights_bytes"],
                        cell_bytes=mm["cell_bytes"], page_size=mm["page_size"],
                        max_total_tokens=int(mm["max_total_tokens"]) if capped and mm["max_total_tokens"] else None)
    try:
        return sizing.tokens()
    except PoolError:
        return 0


def budget_pool(mm: dict) -> dict | None:
    """vLLM's pool from its configured KV budget (vllm/v1/core/kv_cache_utils.py, 0.32, one full-attention
    group): num_blocks = budget // (block_size x bytes per token), the pool num_blocks x block_size
    tokens; it logs int(num_blocks / cdiv(max_model_len, block_size) x max_model_len) tokens (its
    "KV cache size: N tokens", the same figure where max_model_len is a multiple of the block size).
    None without a budget, a block size or the KV bytes per token."""
    budget, block, cell = mm.get("kv_budget_bytes"), mm.get("kv_block_size"), mm.get("cell_bytes")
    if budget is None or not block or not cell:
        return None
    blocks = budget // (block * cell)
    ctx = int(mm["context_length"]) if mm.get("context_length") else None
    logged = int(blocks / -(-ctx // block) * ctx) if ctx else blocks * block
    return {"budget_bytes": budget, "budget_source": mm.get("kv_budget_source"), "block_size": block,
            "block_source": mm.get("kv_block_source"), "blocks": blocks, "pool_tokens": blocks * block, "logged_tokens": logged}


def plan_configuration(entry: dict, fractions: list[float], longest: int | None) -> dict:
    mm = memory_model(entry)
    configured = mm["mem_fraction_static"]
    fracs = sorted({round(float(f), 4) for f in fractions} | ({round(float(configured), 4)} if configured else set()))
    rows = []
    for f in fracs:
        uncapped, tokens = pool_tokens(mm, f, capped=False), pool_tokens(mm, f)
        if tokens is None:
            continue
        ctx = mm["context_length"]
        rows.append({
            "mem_fraction_static": f, "configured": configured is not None and abs(f - float(configured)) < 1e-9,
            "pool_tokens": tokens, "pool_tokens_uncapped": uncapped, "kv_bytes": tokens * mm["cell_bytes"],
            "largest_context": min(tokens, int(ctx)) if ctx else tokens,
            "concurrency_at_context_length": tokens // int(ctx) if ctx else None,
            "concurrency_at_longest": tokens // longest if longest else None,
        })
    out = {"memory": mm, "rows": rows, "longest_measured": longest}
    if configured and mm["observed_tokens"] is not None and rows:
        predicted = pool_tokens(mm, float(configured))
        out["predicted_tokens_at_configured"] = predicted
        out["check"] = ("calibrated" if mm["weights_source"] and mm["weights_source"].startswith("backed out")
                        else ("match" if predicted == mm["observed_tokens"] else "mismatch"))
    by_budget = budget_pool(mm) if not rows else None
    if by_budget:  # predicted by the engine's budget rule beside the pool it allocated
        out["budget_rule"] = by_budget
        out["predicted_tokens_at_configured"] = by_budget["logged_tokens"]
        if mm["observed_tokens"] is not None:
            out["check"] = "match" if by_budget["logged_tokens"] == mm["observed_tokens"] else "mismatch"
    if mm["req_to_token_bytes"] is not None and mm["cell_bytes"]:
        out["req_to_token_tokens_equivalent"] = mm["req_to_token_bytes"] / mm["cell_bytes"]
    spec = spec_of(entry)
    if spec and (spec.exact or spec.kv_bytes_override):
        arch = spec.exact and not spec.kv_bytes_override  # the other figures follow from the architecture
        out["kv_bytes_per_token"] = {
            "served": spec.kv_bytes_per_token(), "served_dtype": spec.kv_cache_dtype, "attention": spec.attention,
            "tp_size": spec.tp_size, "all_ranks": spec.kv_bytes_per_token_all_ranks(), "source": mm["cell_source"],
            # priced only where the engine offers it (SGLang's and vLLM's --kv-cache-dtype; not llama.cpp, not ours)
            "fp8": replace(spec, kv_cache_dtype=fp8).kv_bytes_per_token() if arch and (fp8 := adapter_of(entry).fp8_kv_dtype) else None,
            "mha_equivalent": spec.mha_equivalent_kv_bytes_per_token() if arch and spec.attention == "mla" else None,
        }
    if mm["observed_tokens"]:
        out["allocated"] = allocated(mm, longest)
    if not rows:
        if not mm["sizing_rule"] and by_budget:
            b = by_budget
            out["reason"] = (f"no pool is tabulated over mem-fraction-static: {adapter_of(entry).title} sizes its KV pool "
                             f"from a memory budget, {b['budget_bytes'] / 2**30:.4g} GiB ({b['budget_source']}), in blocks of "
                             f"{b['block_size']} tokens ({b['block_source']}): {b['budget_bytes']:,} bytes over {b['block_size']} x "
                             f"{mm['cell_bytes']:,} bytes per block give {b['blocks']:,} whole blocks, {b['pool_tokens']:,} tokens")
            if b["logged_tokens"] != b["pool_tokens"]:
                out["reason"] += f" ({b['logged_tokens']:,} as it counts them at its context length)"
        elif not mm["sizing_rule"] and mm["kv_budget_bytes"] is not None:
            out["reason"] = (f"no pool is tabulated: {adapter_of(entry).title} sizes its KV pool from a memory budget, "
                             f"{mm['kv_budget_bytes'] / 2**30:.4g} GiB ({mm['kv_budget_source']}), "
                             + (f"in blocks of a size not known here ({mm['kv_block_source']})" if not mm["kv_block_size"]
                                else "at a KV figure not known here"))
        elif not mm["sizing_rule"]:
            out["reason"] = f"no pool is tabulated: {adapter_of(entry).title} {adapter_of(entry).pool_rule}"
            if not mm["observed_tokens"] and not adapter_of(entry).managed and adapter_of(entry).measures:
                out["reason"] += (", and it did not report its pool (configurations.<name>.server_log, the server's own "
                                  "log, is where it would: longctx reads the pool lines of three engines there)")
        else:
            missing = [WHAT[k] for k in ("memory_bytes", "weights_bytes", "cell_bytes") if mm[k] is None]
            out["reason"] = f"the pool cannot be modelled: {listed(missing)} {'is' if len(missing) == 1 else 'are'} unknown"
        if mm["cell_bytes"] is None and mm["cell_source"]:
            out["reason"] += f" (KV bytes per token: {mm['cell_source']})"
        a = out.get("allocated")
        if a:
            out["reason"] += f"; the pool it allocated holds {a['pool_tokens']:,} tokens (from {mm['observed_source']})"
            if a["kv_bytes"] is not None:
                out["reason"] += f", {a['kv_bytes'] / 2**30:.3g} GiB at {mm['cell_bytes']:,} bytes per token"
            if out.get("budget_rule"):
                out["reason"] += (", as its rule predicts" if out.get("check") == "match"
                                  else f", not the {out['predicted_tokens_at_configured']:,} its rule predicts")
    return out


WHAT = {"memory_bytes": "the memory free before loading", "weights_bytes": "the weights' memory",
        "cell_bytes": "the KV bytes per token"}


def allocated(mm: dict, longest: int | None) -> dict:
    """The pool the server allocated, whatever its sizing rule: its tokens, the bytes they take at
    the KV figure, the largest context and the concurrency that fit."""
    tokens, ctx = int(mm["observed_tokens"]), mm["context_length"]
    return {"pool_tokens": tokens, "source": mm["observed_source"],
            "kv_bytes": tokens * mm["cell_bytes"] if mm["cell_bytes"] else None,
            "largest_context": min(tokens, int(ctx)) if ctx else tokens,
            "concurrency_at_context_length": tokens // int(ctx) if ctx else None,
            "concurrency_at_longest": tokens // longest if longest else None}


def plan(provenance: dict, fractions: list[float], longest: dict[str, int] | None = None) -> dict:
    return {"configurations": {name: plan_configuration(entry, fractions, (longest or {}).get(name))
                               for name, entry in sorted(provenance.get("configurations", {}).items())}}


def plan_file(provenance_json: str | Path, results_csv: str | Path | None, out_json: str | Path,
              fractions: list[float]) -> dict:
    prov = json.loads(Path(provenance_json).read_text())
    longest = None
    if results_csv:
        import pandas as pd

        df = pd.read_csv(results_csv)
        ok = df[df["status"] == "ok"]
        longest = {str(k): int(v) for k, v in ok.groupby("configuration")["length"].max().items()}
    doc = plan(prov, fractions, longest)
    write_atomic(out_json, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc
