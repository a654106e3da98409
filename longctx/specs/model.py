"""The model's architecture as the analysis needs it: KV cache bytes and attention FLOPs per token.

A ModelSpec comes from a local Hugging Face ``config.json`` (``model.hf_config``) or from the
config's ``model.architecture`` (the same field names), with the deployment's tensor-parallel
size and KV cache dtype (which the engine adapters read from a configuration's flags), and
``model.kv_bytes_per_token``, which overrides the KV figure the architecture gives.

Families (``model_type``) it reads: Llama, Mistral, Qwen2, Qwen3, GPT-OSS (GQA, ``head_dim``
where the config gives one) and DeepSeek-V2/V3, Kimi K2 (MLA). A field a config.json leaves out
takes the default of that family's own Hugging Face config class (FAMILIES); a description without
``model_type`` (a hand-written ``model.architecture``) must give num_key_value_heads, or the MLA
fields, itself. Nothing is filled in for a model nobody described (ModelNotDescribed). A model it
describes only roughly (sliding-window or hybrid layers, which it does not model; an unknown
family) has exact=False and the reason: the figures that need the architecture are then left out.

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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1, "int8": 1}
# Engine spellings of --kv-cache-dtype (SGLang: auto, fp8_e4m3, fp8_e5m2, bf16; vLLM: auto, fp8, fp8_e4m3, fp8_e5m2)
KV_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "fp32": "float32",
                    "fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3", "fp8_inc": "fp8_e4m3",
                    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}  # torch's names, as SGLang's log prints them
ATTENTION_KINDS = ("mla", "mha", "gqa")


class ModelSpecError(ValueError):
    """An architecture the analysis cannot describe; the message says which field."""


class ModelNotDescribed(ModelSpecError):
    """The config describes no architecture (or too little of an unknown one): there is no spec,
    and the figures that need one are absent with this reason (not an error in the config)."""


# Per Hugging Face model_type: what its config class takes for a field config.json leaves out
# (transformers' LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, GptOssConfig, DeepseekV2/V3Config).
# "heads": num_attention_heads; "hidden/heads": hidden_size // num_attention_heads.
_GQA = {"head_dim": "hidden/heads"}
FAMILIES: dict[str, dict] = {
    "llama": {**_GQA, "num_key_value_heads": "heads"},
    "mistral": {**_GQA, "num_key_value_heads": 8, "sliding_window": 4096},
    "qwen2": {**_GQA, "num_key_value_heads": 32, "use_sliding_window": False},
    "qwen3": {"head_dim": 128, "num_key_value_heads": 32, "use_sliding_window": False},
    "gpt_oss": {"head_dim": 64, "num_key_value_heads": 8, "sliding_window": 128, "layer_types": "alternating"},
    "deepseek_v2": {"mla": True}, "deepseek_v3": {"mla": True}, "kimi_k2": {"mla": True},
}


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
    model_type: str | None = None
    exact: bool = True  # False: the architecture is more than the spec models (inexact_reason says what)
    inexact_reason: str | None = None
    kv_bytes_override: int | None = None  # model.kv_bytes_per_token: per GPU, wins over the architecture's figure
    # quantized weights (the config's quantization_config, or the type the server reported: llama.cpp's "Q4_1"):
    # the engine's arithmetic is then not the plain-dtype matmul a FLOP roof times (None: plain weights)
    weight_format: str | None = None
    field_sources: dict = field(default_factory=dict)  # figure -> where it came from

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
        stores and reads per step; model.kv_bytes_per_token where the config gives it), or
        summed over the ranks' distinct data as the architecture gives it (per_rank=False)."""
        if per_rank and self.kv_bytes_override:
            return int(self.kv_bytes_override)
        return self.kv_values_per_token_layer(per_rank) * self.num_hidden_layers * self.kv_dtype_bytes

    def kv_bytes_per_token_all_ranks(self) -> int:
        """Bytes per token held by the whole deployment: one GPU's figure on every rank."""
        return self.kv_bytes_per_token() * self.tp_size

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
        return self.prefill_flops_per_pair(per_rank) * length * (length + 1) / 2

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


def _inexact(cfg: dict, family: dict, model_type: str | None) -> str | None:
    """Why the spec does not describe this model exactly (None: it does)."""
    layers = cfg.get("layer_types", family.get("layer_types"))
    window = cfg.get("sliding_window", family.get("sliding_window"))
    if layers == "alternating":
        return (f"{model_type} alternates sliding-window ({window} tokens) and full-attention layers (its default "
                "layer_types); the spec models full attention on every layer")
    if isinstance(layers, list) and any(t != "full_attention" for t in layers):
        kinds = sorted(set(layers) - {"full_attention"})
        return (f"hybrid layers: {sum(t != 'full_attention' for t in layers)} of {len(layers)} are {', '.join(kinds)}"
                f"{f' (window {window} tokens)' if window else ''}; the spec models full attention on every layer")
    if isinstance(layers, list):
        return None
    if window and cfg.get("use_sliding_window", family.get("use_sliding_window", True)):
        return f"a sliding window of {window} tokens; the spec models full attention over the whole context"
    if model_type and model_type not in FAMILIES:
        return (f"model_type {model_type!r} is not a family the spec knows ({', '.join(sorted(FAMILIES))}); "
                "its figures from the standard fields are not checked")
    return None


def from_hf_config(config: dict | str | Path, kv_cache_dtype: str | None = None, tp_size: int = 1,
                   source: str = "config.json") -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (a dict, the file, or the directory holding it)."""
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
    if not cfg:
        raise ModelNotDescribed("the config describes no model (neither model.hf_config nor model.architecture)")
    for key in ("num_hidden_layers", "num_attention_heads"):
        if key not in cfg:
            raise ModelSpecError(f"{source}: no {key!r}; is this a decoder's config.json?")
    model_type = cfg.get("model_type")
    family = FAMILIES.get(model_type, {})
    given = f"{source}"
    srcs = {k: given for k in ("num_hidden_layers", "num_attention_heads")}
    weight = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    srcs["weight_dtype"] = given if (cfg.get("torch_dtype") or cfg.get("dtype")) else "not in the model's config: taken as bfloat16"
    weight = normalize_dtype(weight, f"{source} torch_dtype")
    if kv_cache_dtype not in (None, "auto"):
        kv, srcs["kv_cache_dtype"] = normalize_dtype(kv_cache_dtype, "kv-cache-dtype"), "the engine's --kv-cache-dtype"
    else:
        kv, srcs["kv_cache_dtype"] = weight, "the weights' dtype (no --kv-cache-dtype)"
    srcs["tp_size"] = "the engine's tensor-parallel flag" if tp_size > 1 else "no tensor-parallel flag: 1"
    quant = config.get("quantization_config") or cfg.get("quantization_config")
    weight_format = None
    if isinstance(quant, dict) and quant:
        bits = quant.get("bits") or quant.get("w_bit") or quant.get("weight_bits")
        weight_format = " ".join(str(x) for x in (quant.get("quant_method") or "quantized", f"{bits}-bit" if bits else None) if x)
        srcs["weight_format"] = f"{source} (quantization_config)"
    heads = int(cfg["num_attention_heads"])
    common = dict(num_hidden_layers=int(cfg["num_hidden_layers"]), num_attention_heads=heads,
                  hidden_size=cfg.get("hidden_size"), weight_dtype=weight, kv_cache_dtype=kv, tp_size=tp_size, source=source,
                  model_type=model_type, weight_format=weight_format)
    reason = _inexact(cfg, family, model_type)
    common.update(exact=reason is None, inexact_reason=reason)
    if cfg.get("kv_lora_rank"):
        srcs.update(kv_lora_rank=given, qk_rope_head_dim=given)
        if not cfg.get("qk_rope_head_dim"):
            raise ModelSpecError(f"{source}: MLA (kv_lora_rank) needs qk_rope_head_dim")
        return ModelSpec(attention="mla", kv_lora_rank=int(cfg["kv_lora_rank"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                         qk_nope_head_dim=cfg.get("qk_nope_head_dim"), v_head_dim=cfg.get("v_head_dim"),
                         field_sources=srcs, **common)
    if family.get("mla"):
        raise ModelSpecError(f"{source}: model_type {model_type!r} is MLA but kv_lora_rank is not given")

    def default(name: str):
        rule = family.get(name)
        if rule == "heads":
            return heads, f"not given: num_attention_heads, as {model_type}'s config class takes it"
        if rule == "hidden/heads" and cfg.get("hidden_size"):
            return int(cfg["hidden_size"]) // heads, f"not given: hidden_size / num_attention_heads, as {model_type}'s config class takes it"
        if isinstance(rule, int):
            return rule, f"not given: {rule}, {model_type}'s config class default"
        return None, None

    values = {}
    for name in ("num_key_value_heads", "head_dim"):
        if cfg.get(name):
            values[name], srcs[name] = int(cfg[name]), given
        elif name == "head_dim" and "head_dim" not in family and cfg.get("hidden_size"):
            values[name], srcs[name] = int(cfg["hidden_size"]) // heads, "not given: hidden_size / num_attention_heads"
        else:
            values[name], srcs[name] = default(name)
    missing = [n for n in ("num_key_value_heads", "head_dim") if not values[n]]
    if missing:
        what = (f"model_type {model_type!r} is not a family the spec knows" if model_type and not family
                else "no model_type says what a missing field defaults to" if not model_type else f"{model_type}")
        err = ModelNotDescribed if model_type and not family else ModelSpecError
        raise err(f"{source}: {', '.join(missing)} not given and {what} (give them, or the MLA fields "
                  "kv_lora_rank and qk_rope_head_dim; MHA: num_key_value_heads = num_attention_heads)")
    kv_heads = values["num_key_value_heads"]
    return ModelSpec(attention="mha" if kv_heads == heads else "gqa", num_key_value_heads=kv_heads,
                     head_dim=values["head_dim"], field_sources=srcs, **common)


def model_spec(model: dict, tp_size: int = 1, kv_cache_dtype: str | None = None, prefill_absorbed: bool = False) -> ModelSpec:
    """The spec of the config's model (``model`` section) as a deployment runs it: on tp_size
    tensor-parallel ranks, its KV cache in kv_cache_dtype (None or "auto": the weights' dtype), MLA
    prefill absorbed or not, its KV bytes per token model.kv_bytes_per_token where that is given.
    An engine adapter (longctx.engines) reads these from its flags. ModelNotDescribed where the
    config describes no architecture."""
    if model.get("hf_config"):
        spec = from_hf_config(model["hf_config"], kv_cache_dtype, tp_size)
    else:
        spec = from_hf_config(dict(model.get("architecture") or {}), kv_cache_dtype, tp_size, source="model.architecture")
    if model.get("kv_bytes_per_token"):
        spec = replace(spec, kv_bytes_override=int(model["kv_bytes_per_token"]),
                       field_sources={**spec.field_sources, "kv_bytes_per_token": "model.kv_bytes_per_token"})
    else:
        spec.field_sources["kv_bytes_per_token"] = "the architecture"
    return replace(spec, prefill_absorbed=True) if prefill_absorbed else spec


def as_reported(spec: ModelSpec, reports: dict) -> ModelSpec:
    """The spec as its server reported itself (an engine adapter's server_reports: each {"value", "source"}): its KV
    cache's dtype, its KV bytes per token where the cache's type is none the spec knows (model.kv_bytes_per_token
    still wins), its weights' quantized type; each figure's source the server's words."""
    srcs, changes = dict(spec.field_sources), {}
    kv = reports.get("kv_cache_dtype")
    if kv:
        try:
            changes["kv_cache_dtype"] = normalize_dtype(kv["value"], kv["source"])
            srcs["kv_cache_dtype"] = kv["source"]
        except ModelSpecError:
            srcs["kv_cache_dtype"] = f"{spec.field_sources.get('kv_cache_dtype')} ({kv['source']}: {kv['value']}, a dtype not known here)"
    per_token = reports.get("kv_bytes_per_token")
    if per_token and srcs.get("kv_bytes_per_token") != "model.kv_bytes_per_token":
        changes["kv_bytes_override"] = int(per_token["value"])
        srcs["kv_bytes_per_token"] = per_token["source"]
    fmt = reports.get("weight_format")
    if fmt:
        changes["weight_format"] = str(fmt["value"])
        srcs["weight_format"] = fmt["source"]
    return replace(spec, field_sources=srcs, **changes) if changes or srcs != spec.field_sources else spec
