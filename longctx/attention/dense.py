"""Dense MLA attention in the absorbed form, used for prefill and as the decode reference.

All heads share one latent KV cell per token (like multi-query attention), so the scores of
all heads and queries against the keys are a single matrix product.

On the CPU, PyTorch's fused flash attention does the work (scores never materialised: 1.8x
faster than the explicit form at 32k, one thread). It takes one head size for keys and values, so
the latent cell serves as both and the output keeps its first kv_lora_rank values; its causal mask
is aligned top-left, so a chunk whose queries follow earlier keys is two calls, the earlier keys
unmasked and the chunk's own keys causal, merged by their log-sum-exps. Elsewhere (and with
fused=False) the explicit form: scores per query tile, masked, softmax, times the values.
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


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def mla_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    q_start: int,
    kv_lora_rank: int,
    sm_scale: float,
    tile: int = QUERY_TILE,
    workspace: Workspace | None = None,
    fused: bool | None = None,
) -> torch.Tensor:
    """Causal attention of queries at positions q_start .. q_start+T-1 to kv[0 .. q_start+T-1].

    q: [T, heads, D]; kv: [N >= q_start + T, D]; returns [T, heads, kv_lora_rank]. fused: the
    fused CPU kernel (default: where it exists, for CPU tensors) or the explicit form.
    """
    if fused is None:
        fused = _FLASH_CPU is not None and q.device.type == "cpu"
    if fused:
        return _flash_cpu(q, kv, q_start, kv_lora_rank, sm_scale)
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


def _flash_cpu(q: torch.Tensor, kv: torch.Tensor, q_start: int, kv_lora_rank: int, sm_scale: float) -> torch.Tensor:
    t, heads, dim = q.shape
    qh = q.transpose(0, 1)[None]  # [1, heads, T, D]
    keys = kv[: q_start + t][None, None].expand(1, heads, q_start + t, dim)  # one cell for all heads
    own, lse_own = _FLASH_CPU(qh, keys[:, :, q_start:], keys[:, :, q_start:], 0.0, True, scale=sm_scale)
    if q_start == 0:
        o = own
    else:
        past, lse_past = _FLASH_CPU(qh, keys[:, :, :q_start], keys[:, :, :q_start], 0.0, False, scale=sm_scale)
        m = torch.maximum(lse_own, lse_past)
        w_own, w_past = (lse_own - m).exp_()[..., None], (lse_past - m).exp_()[..., None]
        o = (own.float() * w_own + past.float() * w_past).div_(w_own + w_past)
    return o[0, :, :, :kv_lora_rank].transpose(0, 1).to(q.dtype).contiguous()
