#!/usr/bin/env python3
"""Decode attention kernels alone: time and effective KV read GB/s, 4k to 128k tokens (issue 7).

Builds the native kernel (CPU twin; CUDA too where PyTorch has CUDA and a GPU), then for each length
times the PyTorch reference on a scattered page_size 1 pool (gather: the baseline), on a contiguous
run, the CPU twin on the scattered pool, and the CUDA kernel where a GPU exists; beside them, the copy
bandwidth of the same bytes on the same device.

    python bench/kernel_decode.py [--lengths 4096 ... 131072] [--heads 2 --kv-lora-rank 64 --rope 16]
                                  [--dtype float32|bfloat16] [--threads N] [--device cuda] [--small-pages]
                                  [--check-lengths 131072 --check-heads 8 128] [--json out.json]
                                  [--checks-json checks.json]

The build checks both kernels against dense float64 attention (longctx.attention.build: a small cell
and the production cell 512 + 64, fp32 and bf16, and the refusal of page ids outside the pool);
--check-lengths adds checks at this run's cell and dtype on every device timed, at long contexts
(decode, and a verify of 4 query tokens) for each of --check-heads (default: --heads), where the
CUDA kernel cuts one request into many splits and merges them.

The CPU pool is allocated as the reference engine's is: on 2 MiB transparent huge pages where the
host allows (longctx.attention.hostmem); --small-pages puts it on 4 KiB pages, for comparison.

Goal: the CPU twin at least 3x the gather baseline at 32k (default model's shape, batch 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.attention import hostmem, kernelbench, build as kernels  # noqa: E402

SOURCES = ["kernels/cpu/paged_mla_decode.cpp", "kernels/cuda/paged_mla_decode.cu", "kernels/cuda/paged_mla_decode_binding.cpp"]


def describe(check: dict) -> str:
    """One line for a check of longctx.attention.build."""
    where = f"{check['device']} {check['dtype']}"
    if "refused" in check:
        return (f"{where}: page ids outside the pool refused in {len(check['refused'])} of {check['cases']} cases, "
                f"next call's error {check['max_rel_error_after']:.1e}")
    heads = sorted({c[1] for c in check["cases"]})
    lengths = sorted({c[3] for c in check["cases"]})
    return (f"{where} cell {check['kv_lora_rank']}+{check['rope']}, heads {heads}, up to {max(lengths)} tokens: "
            f"max relative error {check['max_rel_error']:.1e} (tolerance {kernels.TOLERANCE[check['dtype']]:g})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536, 131072])
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-lora-rank", type=int, default=64)
    ap.add_argument("--rope", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--n-q", type=int, default=1, help="query tokens per request (verify width)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    ap.add_argument("--device", action="append", default=["cpu"], help="add cuda to time the CUDA kernel")
    ap.add_argument("--small-pages", action="store_true",
                    help="CPU pool on 4 KiB pages (default: 2 MiB transparent huge pages where the host allows, as the engine's pool)")
    ap.add_argument("--build-dir", default=str(ROOT / "build" / "bench" / "paged_mla_decode_twin"))
    ap.add_argument("--check-lengths", type=int, nargs="*", default=[],
                    help="also check the kernels at these context lengths (this run's cell and dtype, every device timed)")
    ap.add_argument("--check-heads", type=int, nargs="+", help="heads of those checks (default: --heads)")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--checks-json", help="write the build's checks and the long-context ones here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    manifest = kernels.build("paged_mla_decode_twin", "native", [str(ROOT / s) for s in SOURCES], a.build_dir)
    shape = kernelbench.Shape(a.heads, a.kv_lora_rank, a.rope, a.dtype, a.batch, a.n_q)
    print(f"shape: batch {shape.batch}, {shape.n_q} query token(s), {shape.heads} heads, cell {shape.kv_lora_rank}+{shape.rope} "
          f"{shape.dtype}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    for c in manifest["checks"]:
        print(f"build check: {describe(c)}")
    long_checks = []
    devices = ["cpu"] + (["cuda"] if "cuda" in a.device and torch.cuda.is_available() else [])
    for device in devices if a.check_lengths else []:
        kernel = kernels.load_kernel(a.build_dir, device)
        for heads in a.check_heads or [a.heads]:
            cases = [(1, heads, 1, n, n_q) for n in a.check_lengths for n_q in (1, 4)]
            check = kernels.check_attention(kernel.verify, a.dtype, device, cases, seed=7, lat=a.kv_lora_rank, rope=a.rope)
            long_checks.append(check)
            print(f"long-context check: {describe(check)}", flush=True)
    if a.checks_json:
        Path(a.checks_json).write_text(json.dumps({"build": manifest["checks"], "cuda_paths": manifest.get("cuda_paths"),
                                                   "long": long_checks}, indent=1) + "\n")
    for check in long_checks:  # after the file is written, so that it shows what failed
        kernels.require("paged_mla_decode_twin", check)
    records = kernelbench.run(a.lengths, shape, a.build_dir, tuple(a.device), huge_pages=not a.small_pages)
    print(f"CPU pool pages: {'4 KiB (--small-pages)' if a.small_pages else '2 MiB where the host allows'} "
          f"(transparent huge pages: {hostmem.thp_mode()})")
    print(f"{'L':>7} {'variant':>10} {'device':>6} {'ms':>9} {'KV MB':>8} {'GB/s':>7} {'copy GB/s':>9} {'of copy':>7} {'2M pages':>8}")
    for r in records:
        print(f"{r['length']:>7} {r['variant']:>10} {r['device']:>6} {r['seconds'] * 1e3:>9.3f} {r['kv_bytes'] / 1e6:>8.2f} "
              f"{r['gb_s']:>7.2f} {r['copy_gb_s']:>9.2f} {r['fraction_of_copy']:>7.0%} {r['pool_huge_page_fraction']:>8.0%}")
    by = {(r["variant"], r["length"]): r["seconds"] for r in records}
    for length in a.lengths:
        if ("twin", length) in by:
            print(f"twin speedup over the gather baseline at {length}: {by['gather', length] / by['twin', length]:.2f}x"
                  + ("  (goal at 32768: >= 3x)" if length == 32768 else ""))
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
