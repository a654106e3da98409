"""KV memory planner: how many tokens the KV pool holds as mem-fraction-static varies, the largest
context and the concurrency that fit, and what the req-to-token table of max-running-requests
costs, per configuration, from what its server reported (data/provenance.json).

The pool follows SGLang's sizing rule (longctx.specs.pool.PoolSizing, which the reference
engine itself allocates by), per GPU: tokens = ((M - weights) - M (1 - f)) // cell bytes, capped
by max-total-tokens and rounded down to the page size. M and the weights come from the server
where it reports them (the reference engine); otherwise M is the GPU's memory as NVML reports it
and the weights (everything SGLang subtracts before the pool) are backed out of the pool the
server allocated at its mem-fraction-static.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..engines import EngineAdapter, get_adapter
from ..specs.model import ModelSpec, ModelSpecError
from ..specs.pool import PoolError, PoolSizing

SGLANG_REQ_TO_TOKEN_BYTES = 4  # int32 entries, max_context_len = context_len + 4 (SGLang ReqToTokenPool)


def adapter_of(entry: dict) -> EngineAdapter:
    """The adapter of the engine that served a provenance entry."""
    return get_adapter(entry["engine"])


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

    def setting(flag: str):  # SGLang's flags, which the reference engine shares
        return adapter.setting(args, info, flag)

    mm = {
        "cell_bytes": int(cell) if cell else None, "cell_source": cell_source,
        "page_size": int(setting("page-size") or 1),
        "max_total_tokens": setting("max-total-tokens"),
        "context_length": setting("context-length"),
        "max_running_requests": setting("max-running-requests"),
        "mem_fraction_static": setting("mem-fraction-static"),
        "observed_tokens": (entry.get("kv_pool") or {}).get("tokens"),
        "memory_bytes": None, "memory_source": None, "weights_bytes": None, "weights_source": None,
    }
    gpus = (entry.get("hardware") or {}).get("gpus") or []
    if info.get("memory_total_bytes"):
        mm["memory_bytes"], mm["memory_source"] = int(info["memory_total_bytes"]), "the server (memory free before loading)"
    elif gpus and adapter.compute_device(args) == "gpu":
        mm["memory_bytes"], mm["memory_source"] = int(gpus[0]["memory_total_bytes"]), f"NVML: {gpus[0]['name']}, GPU 0"
    if info.get("weights_bytes") is not None:
        mm["weights_bytes"], mm["weights_source"] = int(info["weights_bytes"]), "the server"
    elif mm["memory_bytes"] and mm["observed_tokens"] and mm["cell_bytes"] and mm["mem_fraction_static"] \
            and mm["observed_tokens"] != mm["max_total_tokens"]:
        m, f = mm["memory_bytes"], float(mm["mem_fraction_static"])
        mm["weights_bytes"] = int(m * f - mm["observed_tokens"] * mm["cell_bytes"])
        mm["weights_source"] = "backed out of the pool the server allocated (weights, activations and all else SGLang sets aside)"
    if info.get("req_to_token_bytes") is not None:
        mm["req_to_token_bytes"], mm["req_to_token_source"] = int(info["req_to_token_bytes"]), "the server (int64 table)"
    elif mm["max_running_requests"] and mm["context_length"]:
        mm["req_to_token_bytes"] = int(mm["max_running_requests"]) * (int(mm["context_length"]) + 4) * SGLANG_REQ_TO_TOKEN_BYTES
        mm["req_to_token_source"] = "SGLang's int32 table of max-running-requests x (context-length + 4)"
    else:
        mm["req_to_token_bytes"], mm["req_to_token_source"] = None, None
    return mm


def pool_tokens(mm: dict, fraction: float, capped: bool = True) -> int | None:
    """Tokens the pool holds at this mem-fraction-static (0 when not one page fits)."""
    if not (mm["memory_bytes"] and mm["weights_bytes"] is not None and mm["cell_bytes"]):
        return None
    sizing = PoolSizing(memory_total_bytes=mm["memory_bytes"], mem_fraction_static=fraction, weights_bytes=mm["weights_bytes"],
                        cell_bytes=mm["cell_bytes"], page_size=mm["page_size"],
                        max_total_tokens=int(mm["max_total_tokens"]) if capped and mm["max_total_tokens"] else None)
    try:
        return sizing.tokens()
    except PoolError:
        return 0


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
    if mm["req_to_token_bytes"] is not None and mm["cell_bytes"]:
        out["req_to_token_tokens_equivalent"] = mm["req_to_token_bytes"] / mm["cell_bytes"]
    spec = spec_of(entry)
    if spec and (spec.exact or spec.kv_bytes_override):
        arch = spec.exact and not spec.kv_bytes_override  # the other figures follow from the architecture
        out["kv_bytes_per_token"] = {
            "served": spec.kv_bytes_per_token(), "served_dtype": spec.kv_cache_dtype, "attention": spec.attention,
            "tp_size": spec.tp_size, "all_ranks": spec.kv_bytes_per_token_all_ranks(), "source": mm["cell_source"],
            "fp8": replace(spec, kv_cache_dtype="fp8_e4m3").kv_bytes_per_token() if arch else None,
            "mha_equivalent": spec.mha_equivalent_kv_bytes_per_token() if arch and spec.attention == "mla" else None,
        }
    if not rows:
        missing = [k for k in ("memory_bytes", "weights_bytes", "cell_bytes") if mm[k] is None]
        out["reason"] = f"the pool cannot be modelled: unknown {', '.join(missing)}"
        if mm["cell_bytes"] is None and mm["cell_source"]:
            out["reason"] += f" ({mm['cell_source']})"
    return out


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
    Path(out_json).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc
