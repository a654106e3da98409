"""Two builds of one kernel timed in one process, calls alternated: the raw blocks of the kernel A/B.

The cheap path of an A/B (issue 53, item 2) where a server takes minutes to start: the baseline build (A) and the
candidate (B) of the same kernel are loaded side by side (longctx.attention.build.load_kernel of two build
directories gives two kernels: a PyTorch build is a module loaded from its own copy, a native build an extension
module named after the hash of its source, so two different sources never share one) and timed at each KV length
on ONE set of inputs (kernelbench.inputs: the same query, KV pool and scattered page_size 1 table for both).

Per length: both kernels warmed (and their outputs compared, `max_abs_difference`), then the blocks in ABBA order
(longctx.core.interleave.schedule), each block `calls_per_block` calls of one side after one untimed call (what
the switch from the other side left in the caches is paid there, not in a timed call; microbench.timed), each call
timed alone with the device synchronised around it. Whatever the machine does over a pair of neighbouring blocks
(a neighbour busy on the same cores, clocks that move) hits both sides.

This module only measures: the paired interval over the blocks (which statistic of a block enters, the family's
level, the verdict) is longctx.analysis.kernel_ab's, as the stage order wants (attention may not import analysis).
`alternate` returns JSON-ready data:

    {"shape": {...}, "device", "threads", "blocks_per_side", "calls_per_block", "warmup_calls", "order": [A, B, B, A..],
     "sides": {"A": identity, "B": identity}, "wall_s",
     "lengths": [{"length", "blocks": [{"side": "A"|"B", "seconds": [...]}, ...], "max_abs_difference", "wall_s",
                  "failed": {side: why} where a build refused the length's inputs (its blocks then hold no call)}]}

identity: {"name", "target" (torch, cpu, cuda), "build_hash" (the manifest's; of the source for a source
directory), "kernel_dir"}.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from ..core.interleave import schedule
from . import microbench
from .build import Kernel, load_kernel
from .kernelbench import call, inputs, synchronizer
from .shapes import Shape

BLOCKS_PER_SIDE = 16  # default: 16 pairs of neighbouring blocks per length (15 degrees of freedom)
CALLS_PER_BLOCK = 5
WARMUP_CALLS = 3  # per side and length, before the first block


def identity(kernel: Kernel) -> dict:
    """What names one side: the kernel's name, target, build hash and the directory it was loaded from."""
    return {"name": kernel.name, "target": kernel.target, "build_hash": kernel.build_hash, "kernel_dir": kernel.kernel_dir}


def load_pair(dir_a: str | Path, dir_b: str | Path, device: str = "cpu") -> tuple[Kernel, Kernel]:
    """Both builds, loaded side by side for `device` (load_kernel)."""
    return load_kernel(dir_a, device), load_kernel(dir_b, device)


def alternate(kernel_a: Kernel, kernel_b: Kernel, shape: Shape, lengths: list[int], blocks_per_side: int = BLOCKS_PER_SIDE,
              calls_per_block: int = CALLS_PER_BLOCK, device: str = "cpu", warmup_calls: int = WARMUP_CALLS,
              huge_pages: bool = True, seed: int = 0, progress=None) -> dict:
    """A (baseline) and B (candidate) timed at each length in blocks of calls_per_block calls, ABBA order,
    blocks_per_side blocks of each side, on one set of inputs per length shared by both (see the module's docstring
    for what it returns). progress, if given, is called with one line per length as it finishes."""
    import torch

    if blocks_per_side < 1 or calls_per_block < 1:
        raise ValueError(f"blocks_per_side ({blocks_per_side}) and calls_per_block ({calls_per_block}) must be at least 1")
    if kernel_a.target != kernel_b.target:
        raise ValueError(f"A and B run on different targets ({kernel_a.target}, {kernel_b.target}): an A/B compares two "
                         "builds of one kernel on one device")
    sync = synchronizer(device)
    order = schedule(blocks_per_side)
    start = time.perf_counter()
    per_length = []
    for length in lengths:
        t0 = time.perf_counter()
        q, pool, table, lens = inputs(shape, length, device, contiguous=False, seed=seed, huge_pages=huge_pages)
        fns = {"A": call(kernel_a, shape, q, pool, table, lens), "B": call(kernel_b, shape, q, pool, table, lens)}
        outs, failed = {}, {}
        for side, fn in fns.items():
            try:
                for _ in range(max(1, warmup_calls)):
                    outs[side] = fn()
                sync()
            except Exception as exc:  # the build refuses these inputs: no call of this side at this length, and why
                failed[side] = f"{type(exc).__name__}: {exc}"
        diff = None if failed else float((outs["A"].float() - outs["B"].float()).abs().max())
        blocks = [{"side": side, "seconds": [] if side in failed else microbench.timed(fns[side], sync, calls_per_block)}
                  for side in order]
        per_length.append({"length": int(length), "blocks": blocks, "max_abs_difference": diff,
                           "wall_s": time.perf_counter() - t0, **({"failed": failed} if failed else {})})
        del q, pool, table, lens, fns, outs
        if progress is not None:
            medians = {}
            for side in ("A", "B"):
                calls = sorted(s for b in blocks if b["side"] == side for s in b["seconds"])
                medians[side] = f"{calls[len(calls) // 2] * 1e3:.3f} ms" if calls else f"failed ({failed.get(side)})"
            progress(f"{length:>7}: A {medians['A']}, B {medians['B']} (median call), "
                     f"{len(blocks)} blocks in {per_length[-1]['wall_s']:.1f} s")
    return {"shape": asdict(shape), "device": device, "threads": torch.get_num_threads() if device == "cpu" else None,
            "blocks_per_side": int(blocks_per_side), "calls_per_block": int(calls_per_block),
            "warmup_calls": int(warmup_calls), "order": order,
            "sides": {"A": identity(kernel_a), "B": identity(kernel_b)},
            "lengths": per_length, "wall_s": time.perf_counter() - start}
