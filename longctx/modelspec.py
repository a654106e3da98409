"""Architecture facts the analysis needs: KV cache bytes per token."""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


def mla_kv_bytes_per_token(architecture: dict, kv_dtype: str | None = None) -> int:
    """One latent cell (kv_lora_rank + qk_rope_head_dim values) per token per layer."""
    dtype = kv_dtype or architecture.get("torch_dtype", "bfloat16")
    cell = architecture["kv_lora_rank"] + architecture["qk_rope_head_dim"]
    return cell * architecture["num_hidden_layers"] * DTYPE_BYTES[dtype]


def kv_bytes_per_token(model: dict) -> int:
    """The config's explicit figure where given (non-MLA models), else the MLA architecture's."""
    return model.get("kv_bytes_per_token") or mla_kv_bytes_per_token(model["architecture"])
