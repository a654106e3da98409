"""Dense MLA attention in the absorbed form, used for prefill and as the decode reference.

All heads share one latent KV cell per token (like multi-query attention), so the scores of
all heads and queries against the keys are a single matrix product.
"""

from __future__ import annotations

import torch

QUERY_TILE = 1024  # query tokens per tile: bounds the score matrix to heads x 1024 x keys


def mla_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    q_start: int,
    kv_lora_rank: int,
    sm_scale: float,
    tile: int = QUERY_TILE,
) -> torch.Tensor:
    """Causal attention of queries at positions q_start .. q_start+T-1 to kv[0 .. q_start+T-1].

    q: [T, heads, D]; kv: [N >= q_start + T, D]; returns [T, heads, kv_lora_rank].
    """
    t_total, heads, dim = q.shape
    out = torch.empty(t_total, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    for s in range(0, t_total, tile):
        e = min(s + tile, t_total)
        first = q_start + s  # position of the tile's first query
        last = q_start + e  # keys [0, last) are visible to some query of the tile
        keys = kv[:last]
        scores = torch.matmul((q[s:e] * sm_scale).reshape(-1, dim), keys.t()).view(e - s, heads, last)
        # Key j is hidden from query at position p when j > p: only columns past `first` can be.
        cols = torch.arange(first + 1, last, device=q.device)
        rows = torch.arange(first, last, device=q.device)
        hidden = cols[None, :] > rows[:, None]
        scores[:, :, first + 1 :].masked_fill_(hidden[:, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(kv.dtype)
        out[s:e] = torch.matmul(probs.view(-1, last), keys[:, :kv_lora_rank]).view(e - s, heads, -1)
    return out
