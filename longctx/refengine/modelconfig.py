"""Architecture of the reference model, with DeepSeek-V3's (Hugging Face) field names."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

import torch

from .args import DEFAULT_TORCH_DTYPE
from .tokenizer import VOCAB_SIZE

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    num_hidden_layers: int = 2
    hidden_size: int = 256
    num_attention_heads: int = 2
    kv_lora_rank: int = 64
    qk_rope_head_dim: int = 16
    qk_nope_head_dim: int = 32
    v_head_dim: int = 32
    intermediate_size: int = 512
    vocab_size: int = VOCAB_SIZE
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 262144
    torch_dtype: str = DEFAULT_TORCH_DTYPE

    @property
    def cell_dim(self) -> int:
        """Values per token per layer in the latent KV cache."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.torch_dtype]

    @property
    def sm_scale(self) -> float:
        return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5

    def kv_bytes_per_token(self) -> int:
        return self.cell_dim * self.num_hidden_layers * self.dtype.itemsize

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_overrides(cls, overrides: dict | str | None) -> "ModelConfig":
        if isinstance(overrides, str):
            overrides = json.loads(overrides) if overrides.strip() else {}
        overrides = dict(overrides or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(
                f"unknown model field(s) {unknown}; allowed: {sorted(known)}"
            )
        if "torch_dtype" in overrides and overrides["torch_dtype"] not in DTYPES:
            raise ValueError(f"torch_dtype {overrides['torch_dtype']!r}; allowed: {sorted(DTYPES)}")
        cfg = cls(**overrides)
        if cfg.qk_rope_head_dim % 2:
            raise ValueError("qk_rope_head_dim must be even")
        if cfg.vocab_size < VOCAB_SIZE:
            raise ValueError(f"vocab_size must be at least {VOCAB_SIZE} (bytes, BOS, EOS)")
        return cfg
