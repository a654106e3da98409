"""The shape a decode attention kernel is timed at alone (rule bench_kernel): the shape it serves.

A configuration on tp_size tensor-parallel ranks runs, on each rank, num_attention_heads / tp_size
heads against the whole latent cell (MLA replicates the cell on every rank and splits the heads), in
its KV cache's dtype. So a kernel's served shape is, per configuration using it: heads per rank,
kv_lora_rank + qk_rope_head_dim, and the KV cache dtype, from the model as that configuration's
engine runs it (its adapter's model_spec: tp_size and --kv-cache-dtype from the engine's flags),
batch 1, one query token (decode).

The rule: every configuration using a kernel must serve the same shape, and the kernel is timed at
that one. Configurations that serve different shapes (different tensor-parallel sizes or KV dtypes)
are refused with the shapes named: the kernel bench's records (and the roofline points and speedups
drawn from them) are per kernel and length, so each served shape needs its own kernel entry (the same
sources under another key). A kernel no configuration uses serves no shape, and is refused too.
Kept free of torch, so that the workflow can import it while it plans.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import ConfigError
from ..specs.model import ModelSpec

# The KV cache dtypes the kernels take (fp32 and bf16; the query in the same dtype)
KERNEL_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Shape:
    heads: int = 2
    kv_lora_rank: int = 64
    rope: int = 16
    dtype: str = "float32"
    batch: int = 1
    n_q: int = 1  # query tokens per request: 1 decode, K speculative verify

    @property
    def dim(self) -> int:
        return self.kv_lora_rank + self.rope

    def options(self) -> str:
        """The shape as `longctx bench-kernel` options."""
        return f"--heads {self.heads} --kv-lora-rank {self.kv_lora_rank} --rope {self.rope} --dtype {self.dtype}"

    def describe(self) -> str:
        return f"{self.heads} heads, cell {self.kv_lora_rank}+{self.rope}, {self.dtype}"


def spec_shape(configuration: str, spec: ModelSpec) -> Shape:
    """The shape one configuration serves (its model as its engine runs it); ConfigError where the
    kernels cannot run it."""
    if spec.attention != "mla":
        raise ConfigError(f"configuration {configuration!r} serves {spec.attention.upper()} attention; the paged MLA "
                          "decode kernels run MLA only (kv_lora_rank and qk_rope_head_dim)")
    if spec.num_attention_heads % spec.tp_size:
        raise ConfigError(f"configuration {configuration!r}: num_attention_heads {spec.num_attention_heads} does not "
                          f"split over {spec.tp_size} tensor-parallel ranks")
    if spec.kv_cache_dtype not in KERNEL_DTYPES:
        raise ConfigError(f"configuration {configuration!r} serves a {spec.kv_cache_dtype} KV cache "
                          f"({spec.field_sources.get('kv_cache_dtype', 'its KV cache dtype')}); the kernels take "
                          + " or ".join(KERNEL_DTYPES))
    return Shape(heads=spec.num_attention_heads // spec.tp_size, kv_lora_rank=spec.kv_lora_rank,
                 rope=spec.qk_rope_head_dim, dtype=spec.kv_cache_dtype)


def served_shape(kernel: str, served: dict[str, ModelSpec]) -> Shape:
    """The one shape the configurations using `kernel` serve ({configuration: its model spec}, from
    each configuration's engine adapter); ConfigError where there is none or more than one."""
    if not served:
        raise ConfigError(f"kernel {kernel!r} is used by no configuration, so it serves no shape to be timed at "
                          "(rule bench_kernel); name it as a configuration's `kernel`, or remove it from `kernels`")
    shapes: dict[Shape, list[str]] = {}
    for configuration, spec in served.items():
        shapes.setdefault(spec_shape(configuration, spec), []).append(configuration)
    if len(shapes) > 1:
        listed = "; ".join(f"{', '.join(names)}: {shape.describe()}" for shape, names in shapes.items())
        raise ConfigError(f"kernel {kernel!r} serves {len(shapes)} shapes ({listed}); it is timed alone (rule "
                          "bench_kernel) at the one shape its configurations serve: give each shape its own entry "
                          "under `kernels` (the same sources under another key)")
    return next(iter(shapes))
