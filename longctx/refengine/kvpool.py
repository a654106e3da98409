"""Latent KV pool, page allocator and req-to-token table, with SGLang's sizing rule.

The pool is allocated once at start from a memory budget. Page 0 is reserved as padding, as in
SGLang, so slot 0 never holds a token. The allocator hands out pages from a free list; with
``alloc_order="random"`` the free list starts shuffled, which is what a long-running server's
list looks like after churn: a page_size 1 request then gets scattered slots.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from typing import Callable

import numpy as np
import torch

from ..attention import hostmem
from .args import ALLOC_ORDERS
from ..specs.pool import PoolError

log = logging.getLogger("longctx.refengine")


class KVPool:
    def __init__(
        self,
        num_layers: int,
        cell_dim: int,
        dtype: torch.dtype,
        num_tokens: int,
        page_size: int,
        max_running_requests: int,
        context_length: int,
        alloc_order: str = "sequential",
        seed: int = 0,
        device: str = "cpu",
    ):
        if alloc_order not in ALLOC_ORDERS:
            raise ValueError(f"alloc_order {alloc_order!r}; allowed: {list(ALLOC_ORDERS)}")
        self.page_size = page_size
        self.num_tokens = num_tokens
        self.num_pages = num_tokens // page_size + 1  # + the padding page 0
        # zeros, not empty: the memory is really committed, as on a GPU; on the host, on 2 MiB pages
        # where the kernel allows, as a GPU's pool is (longctx.attention.hostmem says why it matters)
        shape = (num_layers, self.num_pages * page_size, cell_dim)
        self.kv = hostmem.zeros(shape, dtype) if device == "cpu" else torch.zeros(shape, dtype=dtype, device=device)
        pages = list(range(1, self.num_pages))
        if alloc_order == "random":
            random.Random(seed).shuffle(pages)
        self.free_pages: deque[int] = deque(pages)
        self.req_to_token = torch.zeros(max_running_requests, context_length, dtype=torch.int64, device=device)
        self.free_rows: deque[int] = deque(range(max_running_requests))
        self.defrag_moves = 0  # requests compacted
        self.defrag_misses = 0  # requests for which no contiguous run was free
        # the prefix cache's eviction (radix.RadixCache.evict, in tokens), called before an allocation says
        # "full", as SGLang's alloc_token_slots evicts from the tree cache first; None without a cache
        self.evict: Callable[[int], int] | None = None

    def req_to_token_bytes(self) -> int:
        return self.req_to_token.numel() * self.req_to_token.element_size()

    def bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def huge_page_bytes(self) -> int:
        """Bytes of the pool the host backs with 2 MiB pages (0 on a GPU, where the driver decides)."""
        return hostmem.huge_page_bytes(self.kv) if self.kv.device.type == "cpu" else 0

    def free_tokens(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc_row(self) -> int:
        if not self.free_rows:
            raise PoolError("no free req-to-token row (max_running_requests reached)")
        return self.free_rows.popleft()

    def reserve(self, row: int, pages: list[int], n_tokens: int) -> bool:
        """Give the request in ``row`` enough pages for ``n_tokens``; False when the pool is full."""
        need = -(-n_tokens // self.page_size) - len(pages)
        if need <= 0:
            return True
        if need > len(self.free_pages) and self.evict is not None:
            self.evict((need - len(self.free_pages)) * self.page_size)
        if need > len(self.free_pages):
            return False
        new = [self.free_pages.popleft() for _ in range(need)]
        self.point(row, len(pages), new)
        pages.extend(new)
        return True

    def point(self, row: int, first: int, pages: list[int]) -> None:
        """Point the request's row at ``pages`` from its page ``first`` on (cells first*page_size onwards)."""
        if not pages:
            return
        start = first * self.page_size
        slots = (torch.tensor(pages, dtype=torch.int64)[:, None] * self.page_size + torch.arange(self.page_size)).flatten()
        end = min(start + slots.numel(), self.req_to_token.shape[1])
        self.req_to_token[row, start:end] = slots[: end - start]

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)

    def release(self, row: int, pages: list[int]) -> None:
        self.free_pages.extend(pages)
        pages.clear()
        self.free_rows.append(row)

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.req_to_token[row, start:end]

    def page_table(self, rows: list[int], seq_lens: list[int]) -> torch.Tensor:
        """[batch, max_pages] page ids of each request, derived from its req-to-token row."""
        ps = self.page_size
        max_pages = -(-max(seq_lens) // ps)
        table = torch.zeros(len(rows), max_pages, dtype=torch.int64, device=self.kv.device)
        for i, (row, n) in enumerate(zip(rows, seq_lens)):
            n_pages = -(-n // ps)
            table[i, :n_pages] = self.req_to_token[row, 0 : n_pages * ps : ps] // ps
        return table

    def defragment(self, row: int, pages: list[int], n_valid: int, n_total: int, first: int = 0) -> bool:
        """Move a request's cells into one run of consecutive pages, sized for n_total tokens.

        The run may reuse the request's own pages. The first n_valid cells are copied (every
        layer), the req-to-token row is rewritten and the pages left over go back to the free
        list. False, with nothing moved, when no run is long enough.

        With ``first`` > 0 only the pages from the request's page ``first`` on move: the ones before
        it are shared (the prefix cache's) and stay where they are.
        """
        ps = self.page_size
        own = pages[first:]
        need = -(-n_total // ps) - first
        if need <= 0 or (len(own) >= need and own == list(range(own[0], own[0] + len(own)))):
            return True  # already one run
        candidates = np.sort(np.fromiter([*self.free_pages, *own], dtype=np.int64))
        starts = np.flatnonzero(candidates[need - 1 :] - candidates[: max(0, len(candidates) - need + 1)] == need - 1) \
            if len(candidates) >= need else np.empty(0, dtype=np.int64)
        if starts.size == 0:
            self.defrag_misses += 1
            log.warning("KV defrag: no run of %d free pages; request row %d stays scattered", need, row)
            return False
        run = int(candidates[starts[0]])
        chosen = set(range(run, run + need))
        lo = first * ps
        cells = self.kv[:, self.req_to_token[row, lo:n_valid]]  # a copy: the run may overlap the old slots
        new = torch.arange(run * ps, (run + need) * ps, dtype=torch.int64, device=self.kv.device)
        self.kv[:, new[: n_valid - lo]] = cells
        end = min(lo + new.numel(), self.req_to_token.shape[1])
        self.req_to_token[row, lo:end] = new[: end - lo]
        self.free_pages = deque(p for p in [*self.free_pages, *own] if p not in chosen)
        pages[first:] = list(range(run, run + need))
        self.defrag_moves += 1
        return True
