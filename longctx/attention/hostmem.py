"""Host tensors on transparent huge pages (2 MiB), for KV pools.

A GPU's KV pool lives in memory mapped with large pages (CUDA allocations use 2 MiB pages), so a
scattered page_size 1 read costs a memory access and nothing more. A CPU pool on 4 KiB pages does
not: a 10 MB pool spans 2,560 of them, more than a core's TLB holds, so nearly every scattered cell
also costs a page walk, which the core overlaps with other work far less well than a cache miss
(measured: the CPU twin at 32k tokens, 0.36 ms on 4 KiB pages, 0.30 ms on 2 MiB ones). The reference
engine's pool and the kernel microbenchmark's pool are therefore allocated here: an anonymous
mapping aligned to 2 MiB and advised MADV_HUGEPAGE, where the kernel's transparent huge pages are
"always" or "madvise"; ordinary pages elsewhere. `huge_page_bytes` says what the kernel really gave.
"""

from __future__ import annotations

import mmap
import re
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), or "unavailable"."""
    try:
        m = re.search(r"\[(\w+)\]", THP_ENABLED.read_text())
    except OSError:
        return "unavailable"
    return m.group(1) if m else "unavailable"


def zeros(shape: int | tuple[int, ...] | list[int], dtype: torch.dtype, huge_pages: bool = True) -> torch.Tensor:
    """A zeroed, committed CPU tensor, on transparent huge pages where the kernel allows them.

    The memory is touched (zeroed) here, so it is really committed, as a GPU pool is; it is
    unmapped when the last tensor viewing it is freed."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = 1
    for d in shape:
        numel *= int(d)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if not huge_pages or nbytes < HUGE_PAGE or thp_mode() not in ("always", "madvise") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # holds a reference to the mapping
    skip = -raw.data_ptr() % HUGE_PAGE  # the first 2 MiB boundary
    t = raw[skip : skip + nbytes].view(dtype).view(shape)
    t.zero_()
    return t


def huge_page_bytes(t: torch.Tensor) -> int:
    """Bytes of the mapping holding t that the kernel backs with huge pages (/proc/self/smaps'
    AnonHugePages of that mapping; 0 where the file cannot be read)."""
    addr = t.data_ptr()
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    inside = False
    for line in lines:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= addr < int(m.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0
