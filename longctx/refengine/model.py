"""A small decoder with multi-head latent attention (DeepSeek-V2/V3 style), absorbed form.

Per layer the KV cache keeps one latent cell per token, [c_kv (kv_lora_rank) | k_rope (rope)],
shared by every head. Queries are absorbed into the latent space (q_nope @ W_UK) so attention
reads the cells directly; the attention output is expanded with W_UV. Weights are random from
a fixed seed; nothing is downloaded.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..attention.dense import Workspace, mla_attention
from .kvpool import KVPool
from .modelconfig import ModelConfig

DecodeKernel = Callable[..., torch.Tensor]  # q [batch, heads, dim] -> [batch, heads, kv_lora_rank]
VerifyKernel = Callable[..., torch.Tensor]  # q [batch, n_q, heads, dim] -> [batch, n_q, heads, kv_lora_rank]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class MLAModel:
    def __init__(self, cfg: ModelConfig, seed: int = 0, device: str = "cpu"):
        self.cfg = cfg
        self.device = device
        g = torch.Generator().manual_seed(seed)
        dt = cfg.dtype
        h, nh = cfg.hidden_size, cfg.num_attention_heads
        nope, rope, lat, vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim

        def rand(*shape: int, fan_in: int | None = None) -> torch.Tensor:
            std = 1.0 if fan_in is None else fan_in**-0.5
            return (torch.randn(*shape, generator=g) * std).to(dt).to(device)

        self.embed = rand(cfg.vocab_size, h)
        self.layers = []
        for _ in range(cfg.num_hidden_layers):
            self.layers.append(
                {
                    "attn_norm": torch.ones(h, dtype=dt, device=device),
                    "w_q": rand(h, nh * (nope + rope), fan_in=h),
                    "w_kv_a": rand(h, lat + rope, fan_in=h),
                    "kv_norm": torch.ones(lat, dtype=dt, device=device),
                    "w_uk": rand(nh, nope, lat, fan_in=lat),  # latent -> per-head key (nope part)
                    "w_uv": rand(nh, lat, vd, fan_in=lat),  # latent -> per-head value
                    "w_o": rand(nh * vd, h, fan_in=nh * vd),
                    "mlp_norm": torch.ones(h, dtype=dt, device=device),
                    "w_gate": rand(h, cfg.intermediate_size, fan_in=h),
                    "w_up": rand(h, cfg.intermediate_size, fan_in=h),
                    "w_down": rand(cfg.intermediate_size, h, fan_in=cfg.intermediate_size),
                }
            )
        self.final_norm = torch.ones(h, dtype=dt, device=device)
        self.lm_head = rand(h, cfg.vocab_size, fan_in=h)
        self.workspace = Workspace()  # prefill score scratch, reused across chunks and layers
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rope, 2, dtype=torch.float32, device=device) / rope))

    def weights_bytes(self) -> int:
        tensors = [self.embed, self.final_norm, self.lm_head] + [t for layer in self.layers for t in layer.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary embedding on the last dim (half-split); x: [T, ..., rope], positions: [T]."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (angles.shape[-1],)
        cos, sin = angles.cos().view(shape).to(x.dtype), angles.sin().view(shape).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def _qkv(self, layer: dict, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Absorbed queries [T, heads, D] and latent cells [T, D] for tokens x at positions."""
        cfg = self.cfg
        t = x.shape[0]
        h = _rms_norm(x, layer["attn_norm"], cfg.rms_norm_eps)
        q = (h @ layer["w_q"]).view(t, cfg.num_attention_heads, -1)
        q_nope, q_rope = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q_latent = torch.einsum("thn,hnl->thl", q_nope, layer["w_uk"])
        kv_a = h @ layer["w_kv_a"]
        c_kv = _rms_norm(kv_a[:, : cfg.kv_lora_rank], layer["kv_norm"], cfg.rms_norm_eps)
        k_rope = self._rope(kv_a[:, cfg.kv_lora_rank :], positions)
        return torch.cat((q_latent, self._rope(q_rope, positions)), dim=-1), torch.cat((c_kv, k_rope), dim=-1)

    def _finish_layer(self, layer: dict, x: torch.Tensor, o_latent: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        o = torch.einsum("thl,hlv->thv", o_latent, layer["w_uv"]).reshape(x.shape[0], -1)
        x = x + o @ layer["w_o"]
        h = _rms_norm(x, layer["mlp_norm"], cfg.rms_norm_eps)
        return x + (F.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.final_norm, self.cfg.rms_norm_eps) @ self.lm_head

    @torch.inference_mode()
    def prefill_chunk(self, pool: KVPool, row: int, ids: torch.Tensor, start: int, all_logits: bool = False) -> torch.Tensor:
        """Run tokens ids (positions start..start+T-1) of one request; returns logits [1 or T, vocab].

        The chunk's latent cells are written into the request's slots, then the chunk attends
        to every cell of the request read back through the req-to-token table (causally). This
        is prefill, and with all_logits the verify pass of speculative decoding.
        """
        cfg = self.cfg
        t = ids.shape[0]
        positions = torch.arange(start, start + t, device=self.device)
        slots_all = pool.slots(row, 0, start + t)
        slots_new = slots_all[start:]
        x = self.embed[ids]
        for i, layer in enumerate(self.layers):
            q, cells = self._qkv(layer, x, positions)
            pool.kv[i].index_copy_(0, slots_new, cells)
            kv = pool.kv[i].index_select(0, slots_all)
            o = mla_attention(q, kv, start, cfg.kv_lora_rank, cfg.sm_scale, workspace=self.workspace)
            x = self._finish_layer(layer, x, o)
        return self._logits(x if all_logits else x[-1:])

    @torch.inference_mode()
    def forward_dense(self, ids: torch.Tensor) -> torch.Tensor:
        """The whole sequence at once, no KV cache, no pages: the reference the engine must match."""
        positions = torch.arange(ids.shape[0], device=self.device)
        x = self.embed[ids]
        for layer in self.layers:
            q, cells = self._qkv(layer, x, positions)
            x = self._finish_layer(layer, x, mla_attention(q, cells, 0, self.cfg.kv_lora_rank, self.cfg.sm_scale))
        return self._logits(x)

    @torch.inference_mode()
    def verify(self, pool: KVPool, row: int, ids: torch.Tensor, start: int, kernel: VerifyKernel) -> torch.Tensor:
        """Speculative verify of one request: tokens ids at positions start.., through the kernel's
        verify variant (all of them query the paged cache at once); returns logits [T, vocab]."""
        cfg = self.cfg
        t = ids.shape[0]
        positions = torch.arange(start, start + t, device=self.device)
        slots = pool.slots(row, start, start + t)
        page_table = pool.page_table([row], [start + t])
        seq_lens = torch.tensor([start + t], dtype=torch.int64)
        x = self.embed[ids]
        for i, layer in enumerate(self.layers):
            q, cells = self._qkv(layer, x, positions)
            pool.kv[i].index_copy_(0, slots, cells)
            o = kernel(q[None], pool.kv[i], page_table, seq_lens, pool.page_size, cfg.kv_lora_rank, cfg.sm_scale)[0]
            x = self._finish_layer(layer, x, o)
        return self._logits(x)

    @torch.inference_mode()
    def decode(self, pool: KVPool, rows: list[int], ids: torch.Tensor, positions: list[int], kernel: DecodeKernel) -> torch.Tensor:
        """One decode step for a batch: token ids[b] at positions[b]; returns logits [B, vocab]."""
        cfg = self.cfg
        pos = torch.tensor(positions, device=self.device)
        seq_lens = [p + 1 for p in positions]
        slots = torch.stack([pool.req_to_token[r, p] for r, p in zip(rows, positions)])
        page_table = pool.page_table(rows, seq_lens)
        seq_lens_t = torch.tensor(seq_lens, dtype=torch.int64)
        x = self.embed[ids]
        for i, layer in enumerate(self.layers):
            q, cells = self._qkv(layer, x, pos)
            pool.kv[i].index_copy_(0, slots, cells)
            o = kernel(q, pool.kv[i], page_table, seq_lens_t, pool.page_size, cfg.kv_lora_rank, cfg.sm_scale)
            x = self._finish_layer(layer, x, o)
        return self._logits(x)
