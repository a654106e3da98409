"""A server someone else runs: measured only, never started or stopped."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from urllib.parse import urlsplit

from .api import APIS
from ..core.secrets import mask_url
from .base import SGLANG_KV_POOL_RE, EngineAdapter, last_match
from .configuration import ConfigurationSpec
from .sglang import SGLANG_METRICS
from .llamacpp import RULES as LLAMACPP_RULES
from .reference import ReferenceAdapter
from .sglang import SGLangAdapter
from .vllm import VLLM_METRICS, VLLMAdapter, read_spec_counters

# the schedulers an external configuration may say its server runs (configurations.<name>.scheduler.engine): the
# managed engines' adapters' rules and llama.cpp's servers'
SCHEDULERS = {"sglang": SGLangAdapter().scheduler_rules, "vllm": VLLMAdapter().scheduler_rules,
              "reference": ReferenceAdapter().scheduler_rules, **LLAMACPP_RULES}

# What servers write of themselves at start-up, read from configurations.<name>.server_log (an external server's log
# on this machine). llama.cpp (b6xxx, llama-cpp-python 0.3.x): its KV cache, cells (tokens) and each of K and V's
# ggml type, and its weights' type
LLAMACPP_KV_RE = re.compile(r"llama_kv_cache(?:_unified)?: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,[^)]*\),"
                            r" K \((\w+)\):\s*[\d.]+ MiB, V \((\w+)\):\s*[\d.]+ MiB")
LLAMACPP_FILE_TYPE_RE = re.compile(r"^(?:print_info|llm_load_print_meta): (?:file type|model ftype)\s*=\s*(.+?)\s*$", re.M)
GGML_PLAIN_TYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}  # ggml's names of the dtypes longctx knows
PLAIN_FILE_TYPES = {"F16", "BF16", "F32", "all F32"}


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
    _without_spec_counters: set[tuple[int, str]] = set()  # (client, base URL) whose /metrics had no speculative counters

    def api(self, spec: ConfigurationSpec):
        return APIS[spec.api]

    def knob_flags(self, entry: dict) -> dict[str, str | None]:
        """The flags of the scheduler its configuration says it runs (configurations.<name>.scheduler), in that
        engine's names; none where it says none (someone else's flags are not ours to know)."""
        declared = (entry.get("scheduler") or {}).get("engine")
        adapter = {"sglang": SGLangAdapter, "vllm": VLLMAdapter, "reference": ReferenceAdapter}.get(declared)
        if adapter is None:
            return {"max_running": None, "chunk": None, "pool_fraction": None, "context": None}
        return adapter().knob_flags(entry)

    def run_rules(self, entry: dict, pool_tokens: int | None) -> dict | None:
        """The rules of the scheduler the configuration says its server runs (configurations.<name>.scheduler: an
        engine of SCHEDULERS and its flags as the server was started with them), or None: someone else's server is
        not simulated unless its configuration says what it runs ({"not_simulated": why} where those rules are not
        the simulation's)."""
        declared = entry.get("scheduler")
        if not declared:
            return None
        said = SCHEDULERS[declared["engine"]](declared.get("args") or {}, entry.get("server_info") or {}, pool_tokens,
                                              entry.get("device"))
        if said is None or said.get("not_simulated"):
            return said
        return {**said, "source": f"{said['source']}; the server runs it, as its configuration's scheduler key says"}

    def spec_counters(self, client, base: str) -> dict | None:
        """vLLM's speculative counters, where the server's /metrics serves them (whatever the server is; vLLM serves
        them, at 0, from its start, drafting or not). A server that answered /metrics without them (or without a
        /metrics) is not asked again by the same client: nothing is sent between a run's requests that the run does
        not need. A GET that failed (a timeout) is tried again at the next trial."""
        key = (id(client), base)
        if key in self._without_spec_counters:
            return None
        answered, found = read_spec_counters(client, base)
        if answered and found is None:
            self._without_spec_counters.add(key)
        return found

    def device(self, spec: ConfigurationSpec) -> str:
        """configurations.<name>.device: 'cpu' or 'gpu' of this machine (the one that runs the bench job),
        or 'remote' (the default: this machine's telemetry and ceilings say nothing about it)."""
        return spec.device or "remote"

    def python(self, spec: ConfigurationSpec) -> str:
        """The Python that calibrates this machine for a local server: `python` as configured (one with a
        CUDA torch for a server on the GPU), else longctx's own."""
        return spec.python or sys.executable

    def kv_pool_from_log(self, text: str) -> dict | None:
        """The pool its log reports, whatever the server: llama.cpp's cells (tokens) and MiB, SGLang's or vLLM's line."""
        m = last_match(LLAMACPP_KV_RE, text)
        if m:
            return {"tokens": int(m.group(2)), "size_gb": float(m.group(1)) * 2**20 / 1e9, "line": m.group(0)}
        return super().kv_pool_from_log(text) or VLLMAdapter.kv_pool_from_log(self, text)

    def server_reports(self, server_info: dict, log_text: str) -> dict:
        """What the server said of itself, in its log (configurations.<name>.server_log) or its info endpoint:
        llama.cpp's K/V types (its KV bytes per token from its cache's size over its cells, where the types are
        quantized) and its weights' file type; SGLang's KV dtype (its pool line, or /server_info's kv_cache_dtype)."""
        out: dict = {}
        m = last_match(LLAMACPP_KV_RE, log_text)
        if m:
            k, v = m.group(4), m.group(5)
            said = f"the server's log: K ({k}), V ({v})"
            if k == v and k in GGML_PLAIN_TYPES:
                out["kv_cache_dtype"] = {"value": GGML_PLAIN_TYPES[k], "source": said}
            else:
                out["kv_bytes_per_token"] = {"value": round(float(m.group(1)) * 2**20 / int(m.group(2))),
                                             "source": f"{said}: {m.group(1)} MiB over {int(m.group(2)):,} cells"}
        elif (m := last_match(SGLANG_KV_POOL_RE, log_text)) and m["dtype"]:
            out["kv_cache_dtype"] = {"value": m["dtype"], "source": "the server's log (KV Cache is allocated)"}
        elif str(server_info.get("kv_cache_dtype") or "auto") != "auto":
            out["kv_cache_dtype"] = {"value": str(server_info["kv_cache_dtype"]), "source": "the server's info (kv_cache_dtype)"}
        ft = last_match(LLAMACPP_FILE_TYPE_RE, log_text)
        if ft and ft.group(1) not in PLAIN_FILE_TYPES:
            out["weight_format"] = {"value": ft.group(1), "source": f"the server's log (file type = {ft.group(1)})"}
        return out

    def model_spec(self, model: dict, args: dict):
        """The config's model; its KV cache dtype is the server's own, which no flag of ours says: taken as the
        weights' (a KV figure the server reports, or model.kv_bytes_per_token, overrides it)."""
        spec = super().model_spec(model, args)
        if spec.field_sources.get("kv_cache_dtype", "").startswith("the weights' dtype"):
            spec = replace(spec, field_sources={**spec.field_sources, "kv_cache_dtype":
                                                "not reported by the server (configurations.<name>.server_log, its log, would say it):"
                                                " taken as the weights' dtype"})
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
        parts = urlsplit(conf["url"])
        if parts.query or parts.fragment:
            raise ConfigError(f"config key '{where}.url': {mask_url(conf['url'])} carries a query or fragment; longctx "
                              "appends its paths to the URL, so it cannot carry one: send a token with api_key_env "
                              "(the name of the environment variable that holds it)")
        if (parts.username or parts.password) and conf.get("api_key_env"):
            raise ConfigError(f"config key '{where}.url': {mask_url(conf['url'])} carries a user and password, and "
                              f"'{where}.api_key_env' a key: a request carries one Authorization header; keep one")

    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        raise RuntimeError("an external server is not launched by longctx")
