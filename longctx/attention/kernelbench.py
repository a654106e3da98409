"""Microbenchmark of the decode attention kernels: time and effective KV read bandwidth per length.

One request of L cells (batch 1 by default), one layer, the kernel alone, at a Shape (the workflow's:
the shape the configurations using the kernel serve, longctx.attention.shapes). Variants:
  gather      the PyTorch reference on a page_size 1 pool with scattered slots (the baseline)
  contiguous  the PyTorch reference on one run of cells (read in place)
  twin        the native kernel's CPU twin on the same scattered page_size 1 pool
  cuda        the native kernel's CUDA build on a GPU, scattered page_size 1 (where one exists)
Effective GB/s = L x cell bytes / time (the KV cells each step must read). Beside them, the copy
bandwidth of a buffer of the same size on the same device (bytes read + written / time), so the
figure reads as a fraction of what the memory system delivers.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from . import hostmem, microbench
from .build import Kernel, load_kernel
from .shapes import Shape

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "kernels/reference"


def synchronizer(device: str):
    """What waits for the device to finish its queued work: torch.cuda.synchronize on a GPU, nothing on the CPU."""
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def best_time(fn, device: str = "cpu", repeats: int = 20, min_total_s: float = 0.25) -> float:
    """Fastest run, of batches of `repeats` runs (after a warm-up, the device synchronised around each)
    repeated until they span min_total_s: a short call's batch alone can fall inside one stall of a
    shared machine."""
    times: list[float] = []
    while sum(times) < min_total_s and len(times) < 100 * repeats:
        times += microbench.timed(fn, synchronizer(device), repeats)
    return min(times)


def copy_bandwidth(nbytes: int, device: str, repeats: int = 20) -> float:
    """Bytes read + written per second copying a buffer of nbytes on device (the calibrate step's copy)."""
    return 2 * max(4, nbytes // 4 * 4) / min(microbench.copy_seconds(nbytes, device, synchronizer(device), repeats))


def inputs(shape: Shape, length: int, device: str, contiguous: bool, seed: int = 0, huge_pages: bool = True):
    """q, pool, page table and lengths of one request of `length` cells at `shape` (page_size 1; contiguous: one
    run of slots, else scattered by a permutation from `seed`); a CPU pool is allocated as the reference engine's
    is (on 2 MiB pages where the host allows, see longctx.attention.hostmem) unless huge_pages is False."""
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, shape.dtype)
    slots = shape.batch * length
    values = torch.randn(slots + 1, shape.dim, generator=g).to(dtype)
    pool = hostmem.zeros(values.shape, dtype, huge_pages).copy_(values) if device == "cpu" else values.to(device)
    order = torch.arange(slots) if contiguous else torch.randperm(slots, generator=g)
    table = (order + 1).view(shape.batch, length).to(device)  # page_size 1; slot 0 unused
    lens = torch.full((shape.batch,), length, dtype=torch.int64)
    q = torch.randn(shape.batch, shape.n_q, shape.heads, shape.dim, generator=g).to(dtype).to(device)
    return q, pool, table, lens


def measure(kernel: Kernel, shape: Shape, length: int, device: str, contiguous: bool, huge_pages: bool = True) -> tuple[float, int]:
    """Best seconds per call, and the bytes of the pool on huge pages."""
    q, pool, table, lens = inputs(shape, length, device, contiguous, huge_pages=huge_pages)
    huge = hostmem.huge_page_bytes(pool) if device == "cpu" else 0
    return best_time(call(kernel, shape, q, pool, table, lens), device), huge


def call(kernel: Kernel, shape: Shape, q, pool, table, lens):
    """One call of the kernel on inputs (from `inputs`), as the engine makes it: decode where the shape has one query
    token (q [batch, 1, heads, dim] taken as [batch, heads, dim]), else verify; page_size 1, scale 0.1."""
    if shape.n_q == 1:
        q1 = q[:, 0]
        return lambda: kernel.decode(q1, pool, table, lens, 1, shape.kv_lora_rank, 0.1)
    return lambda: kernel.verify(q, pool, table, lens, 1, shape.kv_lora_rank, 0.1)


def run(lengths: list[int], shape: Shape, native_dir: str | Path | None, devices: tuple[str, ...] = ("cpu",),
        huge_pages: bool = True) -> list[dict]:
    """One record per (variant, length): seconds, KV bytes, GB/s, copy GB/s, the fraction, and how
    much of a CPU pool the host put on 2 MiB pages (huge_pages=False: 4 KiB pages throughout)."""
    import torch

    reference = load_kernel(REFERENCE_DIR)
    variants: list[tuple[str, Kernel, str, bool]] = [("gather", reference, "cpu", False), ("contiguous", reference, "cpu", True)]
    if native_dir is not None:
        variants.append(("twin", load_kernel(native_dir, "cpu"), "cpu", False))
        if "cuda" in devices and torch.cuda.is_available():
            variants.append(("cuda", load_kernel(native_dir, "cuda"), "cuda", False))
    itemsize = torch.empty((), dtype=getattr(torch, shape.dtype)).element_size()
    records = []
    copy = {}
    for length in lengths:
        nbytes = shape.batch * length * shape.dim * itemsize
        for name, kernel, device, contiguous in variants:
            if device not in copy or copy[device][0] != nbytes:
                copy[device] = (nbytes, copy_bandwidth(nbytes, device))
            seconds, huge = measure(kernel, shape, length, device, contiguous, huge_pages)
            records.append({"variant": name, "device": device, "length": length, "seconds": seconds, "kv_bytes": nbytes,
                            "gb_s": nbytes / seconds / 1e9, "copy_gb_s": copy[device][1] / 1e9,
                            "fraction_of_copy": nbytes / seconds / copy[device][1],
                            "pool_huge_page_fraction": min(1.0, huge / nbytes),
                            # absorbed MLA: 2 x heads x (lat + rope + lat) FLOPs per cell per query token
                            "flops": 2 * shape.batch * shape.n_q * shape.heads * (2 * shape.kv_lora_rank + shape.rope) * length,
                            "threads": torch.get_num_threads(), **asdict(shape)})
    return records








