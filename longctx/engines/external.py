"""A server someone else runs: measured only, never started or stopped."""

from __future__ import annotations

import sys
from dataclasses import replace

from .api import APIS
from .base import EngineAdapter
from .configuration import ConfigurationSpec
from .sglang import SGLANG_METRICS
from .vllm import VLLM_METRICS


class ExternalAdapter(EngineAdapter):
    name = "external"
    title = "the external server"
    managed = False  # it may run anywhere: configurations.<name>.device says where (default: remote)
    # whatever it is, it may serve SGLang's or vLLM's metrics: each name is looked for in both
    metric_names = {k: SGLANG_METRICS.get(k, ()) + VLLM_METRICS.get(k, ()) for k in sorted({*SGLANG_METRICS, *VLLM_METRICS})}
    chunked_prefill_flag = None  # its flags are not ours to know
    prefix_cache_off_flag = None
    # someone else started it: its flags, so its pool's rule and its KV dtypes, are not known here
    pool_rule = "was started by someone else: its KV pool is sized by its own flags, which longctx does not know"

    def cache_granularity(self, spec: ConfigurationSpec, server_info: dict) -> int | None:
        """Its page or block size is not ours to know: config key prefix.granularity says it, or nothing does."""
        return (spec.prefix or {}).get("granularity")
    devices = ("cpu", "gpu", "remote")  # what configurations.<name>.device may say (config/schema.yaml)

    def api(self, spec: ConfigurationSpec):
        return APIS[spec.api]

    def device(self, spec: ConfigurationSpec) -> str:
        """configurations.<name>.device: 'cpu' or 'gpu' of this machine (the one that runs the bench job),
        or 'remote' (the default: this machine's telemetry and ceilings say nothing about it)."""
        return spec.device or "remote"

    def python(self, spec: ConfigurationSpec) -> str:
        """The Python that calibrates this machine for a local server: `python` as configured (one with a
        CUDA torch for a server on the GPU), else longctx's own."""
        return spec.python or sys.executable

    def model_spec(self, model: dict, args: dict):
        """The config's model; its KV cache dtype is the server's own, which no flag of ours says: taken as the
        weights' (a KV figure the server reports, or model.kv_bytes_per_token, overrides it)."""
        spec = super().model_spec(model, args)
        if spec.field_sources.get("kv_cache_dtype", "").startswith("the weights' dtype"):
            spec = replace(spec, field_sources={**spec.field_sources, "kv_cache_dtype":
                                                "not known (the server's own setting): taken as the weights' dtype"})
        return spec

    def context_length(self, args: dict, server_info: dict) -> int | None:
        """As the server reports it: SGLang's context_length or vLLM's max_model_len (it has no flags here)."""
        value = server_info.get("context_length") or server_info.get("max_model_len")
        return int(value) if value else None

    def check_spec(self, configuration: str, conf: dict, config: dict) -> None:
        from ..core.errors import ConfigError

        where = f"configurations.{configuration}"
        if not conf.get("url"):
            raise ConfigError(f"config key '{where}.url' is required for an external server (e.g. http://127.0.0.1:30000)")
        if conf.get("api") not in APIS:
            raise ConfigError(f"config key '{where}.api': {conf.get('api')!r} is not allowed; allowed values: {', '.join(APIS)}")
        if conf.get("args"):
            raise ConfigError(f"config key '{where}.args': an external server's flags are its owner's; remove them")

    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        raise RuntimeError("an external server is not launched by longctx")
