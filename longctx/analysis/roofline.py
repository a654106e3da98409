"""The decode attention roofline: per (configuration, length), the attention FLOPs and KV bytes of
one decode step on one GPU (or the CPU), its arithmetic intensity, the rate it achieved and what
the hardware's ceilings allow at that intensity.

One step of a request at context L with q query tokens (1, or the speculative verify width) reads
L x kv_bytes_per_token bytes of KV cache and does L x q x decode_flops_per_kv_token FLOPs, so the
intensity q x flops_per_kv_token / kv_bytes_per_token does not depend on L: the lengths of one
configuration share an x and climb in y as attention takes a larger share of the step. Achieved
rates divide by the whole measured step (attention and everything else), so they are lower bounds
of the attention kernel's own rates.
"""

from __future__ import annotations

from ..specs.model import ModelSpec


def attainable(intensity: float, peak_flops: float | None, bandwidth: float | None) -> float | None:
    """min(compute ceiling, intensity x bandwidth): the roof at this intensity."""
    if not peak_flops or not bandwidth:
        return None
    return min(peak_flops, intensity * bandwidth)


def ridge(peak_flops: float | None, bandwidth: float | None) -> float | None:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof."""
    return peak_flops / bandwidth if peak_flops and bandwidth else None


def bound(intensity: float, peak_flops: float | None, bandwidth: float | None) -> str | None:
    r = ridge(peak_flops, bandwidth)
    if r is None:
        return None
    return "memory" if intensity < r else "compute"


def decode_points(spec: ModelSpec, query_tokens: int, steps: list[tuple[int, float]], ceilings: dict) -> list[dict]:
    """Roofline points of one configuration from (length, median decode step seconds) pairs."""
    out = []
    for length, step_s in steps:
        flops = spec.decode_attention_flops(length, query_tokens)
        nbytes = length * spec.kv_bytes_per_token()
        ai = flops / nbytes
        point = {"length": int(length), "query_tokens": query_tokens, "step_s": step_s, "flops": flops, "bytes": nbytes,
                 "intensity": ai, "achieved_flops": flops / step_s, "achieved_Bps": nbytes / step_s}
        for which in ("datasheet", "measured"):
            c = ceilings.get(which) or {}
            roof = attainable(ai, c.get("flops"), c.get("bandwidth_Bps"))
            point[f"attainable_{which}"] = roof
            point[f"fraction_of_{which}"] = point["achieved_flops"] / roof if roof else None
        out.append(point)
    return out
