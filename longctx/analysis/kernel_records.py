"""The records of the kernels timed alone (rule bench_kernel, longctx.attention.kernelbench): read
back, put on the roofline, compared with the gather baseline, for fits.json and the report."""

from __future__ import annotations

import json
from pathlib import Path


def load_records(paths: list[str | Path]) -> list[dict]:
    """The records of bench_kernel outputs (data/kernels/<kernel>.json), each tagged with its kernel."""
    out = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        kernel = Path(path).stem
        out += [{**r, "kernel": kernel} for r in doc["records"]]
    return out


def roofline_points(records: list[dict]) -> dict[str, list[dict]]:
    """Roofline points per variant (gather, contiguous, twin, cuda): the kernel's own attention FLOPs
    and KV bytes, its intensity and the FLOP/s it achieved, labelled by length."""
    points: dict[str, list[dict]] = {}
    for r in records:
        points.setdefault(r["variant"], []).append({
            "length": r["length"], "flops": r["flops"], "bytes": r["kv_bytes"], "intensity": r["flops"] / r["kv_bytes"],
            "achieved_flops": r["flops"] / r["seconds"], "achieved_Bps": r["kv_bytes"] / r["seconds"], "device": r["device"]})
    return points


def huge_page_range(records: list[dict]) -> list[float] | None:
    """[lowest, highest] share of the host (CPU) pools' bytes that were on 2 MiB pages; None without
    CPU records that say (records from before the share was kept do not)."""
    shares = [r["pool_huge_page_fraction"] for r in records if r["device"] == "cpu" and "pool_huge_page_fraction" in r]
    return [min(shares), max(shares)] if shares else None


def speedups(records: list[dict], baseline: str = "gather", variant: str = "twin") -> dict[int, float]:
    """variant's speedup over the baseline variant per length (where both were timed)."""
    base = {r["length"]: r["seconds"] for r in records if r["variant"] == baseline}
    return {r["length"]: base[r["length"]] / r["seconds"] for r in records if r["variant"] == variant and r["length"] in base}


def summary(paths: list[str | Path]) -> dict:
    """fits.json's "kernels" entry: the records, their roofline points per variant, each kernel's
    speedup over the gather baseline ([length, x] pairs) and the host pools' huge-page share."""
    records = load_records(paths)
    return {"records": records, "roofline": roofline_points(records),
            "speedups": {k: sorted(speedups([r for r in records if r["kernel"] == k]).items())
                         for k in sorted({r["kernel"] for r in records})},
            "host_pool_huge_pages": huge_page_range(records)}
