"""The model's architecture as the analysis needs it: KV cache bytes and attention FLOPs per token.

A ModelSpec comes from a local Hugging Face ``config.json`` (``model.hf_config``) or from the
config's ``model.architecture`` (DeepSeek-V3 field names), with the deployment's tensor-parallel
size and KV cache dtype (which the engine adapters read from a configuration's flags).

Attention kinds:
- MLA (DeepSeek-V2/V3, Kimi K2): the cache holds one latent vector of kv_lora_rank +
  qk_rope_head_dim values per token per layer, shared by all heads, and *replicated on every
  tensor-parallel rank* (each rank runs its share of the heads against the whole latent).
- MHA / GQA: K and V of num_key_value_heads x head_dim each per token per layer; tensor
  parallelism splits the KV heads (a rank keeps at least one: past num_key_value_heads ranks
  the heads are replicated).

FLOPs (multiply-add = 2), per layer summed over layers:
- decode, per KV token per query token: MLA absorbed 2 x heads x (kv_lora_rank + rope +
  kv_lora_rank) (scores against latent + rope, then the latent-weighted sum); MHA/GQA
  2 x heads x (head_dim + head_dim).
- prefill of L tokens, causal, counted once: L (L + 1) / 2 query-key pairs, each costing the
  per-pair FLOPs of the form the engine runs (MLA prefill usually decompresses K and V:
  2 x heads x (qk_nope + qk_rope + v_head_dim); the reference engine runs the absorbed form).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1, "int8": 1}
# Engine spellings of --kv-cache-dtype (SGLang: auto, fp8_e4m3, fp8_e5m2, bf16; vLLM: auto, fp8, fp8_e4m3, fp8_e5m2)
KV_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "fp32": "float32",
                    "fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3", "fp8_inc": "fp8_e4m3"}
ATTENTION_KINDS = ("mla", "mha", "gqa")


class ModelSpecError(ValueError):
    """An architecture the analysis cannot describe; the message says which field."""


def normalize_dtype(name: str | None, where: str) -> str:
    key = str(name).lower().replace("torch.", "")
    key = KV_DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ModelSpecError(f"{where}: dtype {name!r} is not known; allowed: {', '.join(sorted(set(DTYPE_BYTES) | set(KV_DTYPE_ALIASES)))}")
    return key


@dataclass(frozen=True)
class ModelSpec:
    attention: str  # mla | mha | gqa
    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int | None = None
    num_key_value_heads: int | None = None  # MHA/GQA
    head_dim: int | None = None  # MHA/GQA
    kv_lora_rank: int | None = None  # MLA
    qk_rope_head_dim: int | None = None  # MLA
    qk_nope_head_dim: int | None = None  # MLA
    v_head_dim: int | None = None  # MLA
    weight_dtype: str = "bfloat16"
    kv_cache_dtype: str = "bfloat16"
    tp_size: int = 1
    prefill_absorbed: bool = False  # MLA prefill in the absorbed (latent) form, as the reference engine runs it
    source: str = "config"

    def __post_init__(self):
        if self.attention not in ATTENTION_KINDS:
            raise ModelSpecError(f"attention {self.attention!r}; allowed: {', '.join(ATTENTION_KINDS)}")
        need = ("kv_lora_rank", "qk_rope_head_dim") if self.attention == "mla" else ("num_key_value_heads", "head_dim")
        missing = [f for f in need if not getattr(self, f)]
        if missing:
            raise ModelSpecError(f"{self.attention.upper()} needs {', '.join(missing)} ({self.source})")
        if self.tp_size < 1:
            raise ModelSpecError(f"tp_size must be at least 1, got {self.tp_size}")

    # --- KV cache -----------------------------------------------------------------------------
    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_cache_dtype]

    def kv_values_per_token_layer(self, per_rank: bool = False) -> int:
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim  # the latent: the same on every rank
        heads = self.num_key_value_heads
        if per_rank:
            heads = max(1, heads // self.tp_size)
        return 2 * heads * self.head_dim

    def kv_bytes_per_token(self, per_rank: bool = True) -> int:
        """KV cache bytes per token over all layers: on one tensor-parallel rank (what one GPU
        stores and reads per step), or summed over the ranks' distinct data (per_rank=False)."""
        return self.kv_values_per_token_layer(per_rank) * self.num_hidden_layers * self.kv_dtype_bytes

    def kv_bytes_per_token_all_ranks(self) -> int:
        """Bytes per token held by the whole deployment: the MLA latent once per rank."""
        if self.attention == "mla":
            return self.kv_bytes_per_token() * self.tp_size
        return self.kv_bytes_per_token(per_rank=True) * self.tp_size

    def mha_equivalent_kv_bytes_per_token(self) -> int:
        """For MLA: what the decompressed K (nope + rope) and V of every head would take per token."""
        if self.attention != "mla":
            return self.kv_bytes_per_token(per_rank=False)
        per_head = (self.qk_nope_head_dim or 0) + self.qk_rope_head_dim + (self.v_head_dim or 0)
        return self.num_attention_heads * per_head * self.num_hidden_layers * self.kv_dtype_bytes

    # --- FLOPs --------------------------------------------------------------------------------
    def heads_per_rank(self) -> float:
        return self.num_attention_heads / self.tp_size

    def decode_flops_per_kv_token(self, per_rank: bool = True) -> float:
        """Attention FLOPs per KV token per query token, all layers (MLA in the absorbed form)."""
        heads = self.heads_per_rank() if per_rank else self.num_attention_heads
        if self.attention == "mla":
            per_head = 2 * (self.kv_lora_rank + self.qk_rope_head_dim + self.kv_lora_rank)
        else:
            per_head = 2 * (self.head_dim + self.head_dim)
        return heads * per_head * self.num_hidden_layers

    def prefill_flops_per_pair(self, per_rank: bool = True) -> float:
        """Attention FLOPs per (query, key) pair, all layers, in the form prefill runs."""
        heads = self.heads_per_rank() if per_rank else self.num_attention_heads
        if self.attention != "mla":
            return heads * 2 * (self.head_dim + self.head_dim) * self.num_hidden_layers
        if self.prefill_absorbed or not (self.qk_nope_head_dim and self.v_head_dim):
            return self.decode_flops_per_kv_token(per_rank)
        return heads * 2 * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) * self.num_hidden_layers

    def prefill_attention_flops(self, length: int | float, per_rank: bool = True):
        """Causal attention over a prompt of `length` tokens: L (L + 1) / 2 pairs, counted once."""
        return length * (length + 1) / 2 * self.prefill_flops_per_pair(per_rank)

    def decode_attention_flops(self, length, query_tokens: int = 1, per_rank: bool = True):
        """One decode (or verify) step: query_tokens queries against `length` KV tokens."""
        return length * query_tokens * self.decode_flops_per_kv_token(per_rank)

    def decode_intensity(self, query_tokens: int = 1) -> float:
        """Decode attention FLOPs per KV byte read, on one rank (independent of the length)."""
        return query_tokens * self.decode_flops_per_kv_token() / self.kv_bytes_per_token()

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(kv_bytes_per_token=self.kv_bytes_per_token(), kv_bytes_per_token_all_ranks=self.kv_bytes_per_token_all_ranks(),
                 mha_equivalent_kv_bytes_per_token=self.mha_equivalent_kv_bytes_per_token(),
                 decode_flops_per_kv_token=self.decode_flops_per_kv_token(), prefill_flops_per_pair=self.prefill_flops_per_pair(),
                 decode_intensity_flop_per_byte=self.decode_intensity())
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def _text_config(cfg: dict) -> dict:
    """Multimodal configs (Kimi K2.5+, Llama 4, ...) keep the language model under text_config."""
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(cfg.get(key), dict) and "num_hidden_layers" in cfg[key]:
            merged = {**cfg[key]}
            for k in ("torch_dtype", "dtype", "quantization_config"):
                merged.setdefault(k, cfg.get(k))
            return merged
    return cfg


def from_hf_config(config: dict | str | Path, kv_cache_dtype: str | None = None, tp_size: int = 1) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (a dict, the file, or the directory holding it)."""
    source = "config.json"
    if not isinstance(config, dict):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelSpecError(f"model.hf_config: {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ModelSpecError(f"model.hf_config: {path} is not valid JSON ({exc})") from None
        source = str(path)
    cfg = _text_config(config)
    for key in ("num_hidden_layers", "num_attention_heads"):
        if key not in cfg:
            raise ModelSpecError(f"{source}: no {key!r}; is this a decoder's config.json?")
    weight = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    weight = normalize_dtype(weight, f"{source} torch_dtype")
    kv = normalize_dtype(kv_cache_dtype, "kv-cache-dtype") if kv_cache_dtype not in (None, "auto") else weight
    common = dict(num_hidden_layers=int(cfg["num_hidden_layers"]), num_attention_heads=int(cfg["num_attention_heads"]),
                  hidden_size=cfg.get("hidden_size"), weight_dtype=weight, kv_cache_dtype=kv, tp_size=tp_size, source=source)
    if cfg.get("kv_lora_rank"):
        return ModelSpec(attention="mla", kv_lora_rank=int(cfg["kv_lora_rank"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                         qk_nope_head_dim=cfg.get("qk_nope_head_dim"), v_head_dim=cfg.get("v_head_dim"), **common)
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if cfg.get("hidden_size") else None)
    return ModelSpec(attention="mha" if kv_heads == heads else "gqa", num_key_value_heads=kv_heads,
                     head_dim=int(head_dim) if head_dim else None, **common)


def model_spec(model: dict, tp_size: int = 1, kv_cache_dtype: str | None = None, prefill_absorbed: bool = False) -> ModelSpec:
    """The spec of the config's model (``model`` section) as a deployment runs it: on tp_size
    tensor-parallel ranks, its KV cache in kv_cache_dtype (None or "auto": the weights' dtype), MLA
    prefill absorbed or not. An engine adapter (longctx.engines) reads these from its flags."""
    if model.get("hf_config"):
        spec = from_hf_config(model["hf_config"], kv_cache_dtype, tp_size)
    else:
        spec = replace(from_hf_config(dict(model["architecture"]), kv_cache_dtype, tp_size), source="config model.architecture")
    return replace(spec, prefill_absorbed=True) if prefill_absorbed else spec
