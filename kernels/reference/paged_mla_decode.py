"""PyTorch reference of paged MLA decode attention, absorbed form.

This is the kernel under study in its plainest form: for every request, gather the latent
KV cells through the page table and attend to them with all heads at once. The compiled
kernels (CPU twin, CUDA) must agree with it.

Shapes (one layer):
    q          [batch, heads, kv_lora_rank + rope]   absorbed query (q_nope @ W_UK, then rope part)
    kv_pool    [num_pages * page_size, kv_lora_rank + rope]   latent cells, one per token slot
    page_table [batch, max_pages] int64   page ids; token t of request b lives in slot
               page_table[b, t // page_size] * page_size + t % page_size
    seq_lens   [batch] int64              tokens in the KV cache per request
    out        [batch, heads, kv_lora_rank]

paged_mla_verify is the speculative-decoding variant: q [batch, n_q, heads, dim] holds the n_q
newest tokens of each request (their cells already in the cache, counted in seq_lens); query j
sees cells 0 .. seq_len - n_q + j. out is [batch, n_q, heads, kv_lora_rank].

A request whose pages form one run (a fresh pool, or after KV defragmentation) is read in
place; scattered pages are gathered first. Both give the same values in the same order.
"""

from __future__ import annotations

import torch

KERNEL_NAME = "paged_mla_decode_torch"


def _cells(pages: torch.Tensor, ids: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """The request's n cells in token order: read in place when its pages form one run, else gathered."""
    first = int(ids[0])
    if ids.numel() == 1 or bool((ids[1:] - ids[:-1] == 1).all()):
        return pages[first : first + ids.numel()].view(-1, dim)[:n]
    return pages.index_select(0, ids).view(-1, dim)[:n]


def paged_mla_decode(
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    kv_lora_rank: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request: q [batch, heads, dim] -> [batch, heads, kv_lora_rank]."""
    if out is None:
        out = torch.empty(*q.shape[:2], kv_lora_rank, dtype=q.dtype, device=q.device)
    paged_mla_verify(q[:, None], kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale, out=out[:, None])
    return out


def paged_mla_verify(
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    kv_lora_rank: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    batch, n_q, heads, dim = q.shape
    if kv_pool.shape[-1] != dim:
        raise ValueError(f"q has {dim} dims per head but the KV pool cells have {kv_pool.shape[-1]}")
    if out is None:
        out = torch.empty(batch, n_q, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    pages = kv_pool.view(-1, page_size, dim)
    for b, n in enumerate(seq_lens.tolist()):
        kv = _cells(pages, page_table[b, : -(-n // page_size)], n, dim)
        scores = torch.matmul(q[b], kv.t()).float() * sm_scale  # [n_q, heads, n]
        if n_q > 1:  # query j sees cells [0, n - n_q + j]
            future = torch.arange(n, device=q.device)[None, :] > (n - n_q + torch.arange(n_q, device=q.device))[:, None]
            scores.masked_fill_(future[:, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(kv.dtype)
        out[b] = torch.matmul(probs, kv[:, :kv_lora_rank])
    return out
