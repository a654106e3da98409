"""Dense MLA attention in the absorbed form, used for prefill and as the decode reference.

All heads share one latent KV cell per token (like multi-query attention), so the scores of
all heads and queries against the keys are a single matrix product.
"""

from __future__ import annotations

import torch

QUERY_TILE = 1024  # query tokens per tile: bounds the score matrix to heads x 1024 x keys


class Workspace:
    """A scratch buffer reused across calls: a fresh score matrix per tile would cost the OS
    page faults (hundreds of MB zeroed per tile at 32k) about as much time as the arithmetic."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        if self.buf is None or self.buf.numel() < n or self.buf.dtype != dtype or self.buf.device != torch.device(device):
            self.buf = torch.empty(n, dtype=dtype, device=device)
        return self.buf[:n].view(shape)


def mla_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    q_start: int,
    kv_lora_rank: int,
    sm_scale: float,
    tile: int = QUERY_TILE,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """Causal attention of queries at positions q_start .. q_start+T-1 to kv[0 .. q_start+T-1].

    q: [T, heads, D]; kv: [N >= q_start + T, D]; returns [T, heads, kv_lora_rank].
    """
    t_total, heads, dim = q.shape
    ws = workspace or Workspace()
    ws.get((min(tile, t_total) * heads, q_start + t_total), torch.float32, q.device)  # the largest tile, first
    out = torch.empty(t_total, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    for s in range(0, t_total, tile):
        e = min(s + tile, t_total)
        first = q_start + s  # position of the tile's first query
        last = q_start + e  # keys [0, last) are visible to some query of the tile
        keys = kv[:last]
        scores = ws.get(((e - s) * heads, last), torch.float32, q.device)
        torch.matmul((q[s:e] * sm_scale).reshape(-1, dim).float(), keys.t().float(), out=scores)
        # Key j is hidden from the query at position p when j > p: only columns past `first` can be.
        cols = torch.arange(first + 1, last, device=q.device)
        rows = torch.arange(first, last, device=q.device)
        hidden = cols[None, :] > rows[:, None]
        scores.view(e - s, heads, last)[:, :, first + 1 :].masked_fill_(hidden[:, None, :], float("-inf"))
        # softmax in place; the normalisation is applied to the small output, not the scores
        scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
        denom = scores.sum(dim=-1, keepdim=True)
        o = torch.matmul(scores.to(kv.dtype), keys[:, :kv_lora_rank]).float().div_(denom)
        out[s:e] = o.view(e - s, heads, -1).to(out.dtype)
    return out
