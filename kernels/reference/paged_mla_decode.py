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

A request whose pages form one run (a fresh pool, or after KV defragmentation) is read in
place; scattered pages are gathered first. Both give the same values in the same order.
"""

from __future__ import annotations

import torch

KERNEL_NAME = "paged_mla_decode_torch"


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
    batch, heads, dim = q.shape
    if kv_pool.shape[-1] != dim:
        raise ValueError(f"q has {dim} dims per head but the KV pool cells have {kv_pool.shape[-1]}")
    if out is None:
        out = torch.empty(batch, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    pages = kv_pool.view(-1, page_size, dim)
    for b, n in enumerate(seq_lens.tolist()):
        n_pages = -(-n // page_size)
        ids = page_table[b, :n_pages]
        first = int(ids[0])
        if n_pages == 1 or bool((ids[1:] - ids[:-1] == 1).all()):
            kv = pages[first : first + n_pages].view(-1, dim)[:n]  # one run of pages: read in place
        else:
            kv = pages.index_select(0, ids).view(-1, dim)[:n]  # scattered: gather
        scores = torch.matmul(q[b], kv.t())  # [heads, n]
        probs = torch.softmax(scores.float() * sm_scale, dim=-1).to(kv.dtype)
        out[b] = torch.matmul(probs, kv[:, :kv_lora_rank])
    return out
