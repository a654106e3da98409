"""Results another benchmark tool measured (vLLM's `bench serve`, SGLang's `bench_serving`, AIPerf,
GuideLLM): no server to start, stop or send to; the files are read by longctx.measure.imports.

What the config says of the runs' server: its flags (args) in the names of the engine it was (server_engine:
that engine's adapter reads them: tensor-parallel size, KV dtype, context length, speculative width) and its
tensor-parallel size (tp_size, where args do not give it). for_record binds the adapter to them, from the
configuration's keys or its provenance's `imported`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..specs.model import ModelSpec, model_spec
from .base import EngineAdapter
from .configuration import ConfigurationSpec
from .sglang import SGLangAdapter
from .vllm import VLLMAdapter

# the result formats longctx reads (config key configurations.<name>.format; readers in longctx.measure.imports)
FORMATS = ("vllm-bench", "sglang-bench", "aiperf", "guidellm")
# keys only an imported configuration has, and those it must not have (a running server's)
IMPORTED_KEYS = ("format", "files", "hardware", "kv_pool_tokens", "context_length", "tool_version", "bins", "model",
                 "server_engine", "tp_size")
# the engines whose flags an imported configuration's args may be (config key server_engine): their adapters read them
SERVED = {a.name: a for a in (SGLangAdapter(), VLLMAdapter())}
SERVER_ENGINES = tuple(SERVED)
SERVER_KEYS = ("url", "api", "extra_args", "env", "python", "command", "kernel", "startup_timeout_s", "api_key_env",
               "server_log")


class ImportedAdapter(EngineAdapter):
    name = "imported"
    title = "the imported runs' server"
    managed = False  # nothing runs: the tool measured a server longctx never saw
    measures = False  # its raw files come from the tool's result files (rule import_results), not from a server
    devices = ("cpu", "gpu", "remote")  # configurations.<name>.device: what the imported runs' server computed on
    chunked_prefill_flag = None
    prefix_cache_off_flag = None

    def __init__(self, served: EngineAdapter | None = None, tp: int | None = None):
        # the adapter of the engine the runs' server was (config key server_engine), which reads the flags the
        # server ran with (config key args), and the tensor-parallel size the config states (config key tp_size)
        self.served, self.tp = served, tp
        if served is not None:
            self.title = f"the imported runs' server ({served.title})"
            self.fp8_kv_dtype = served.fp8_kv_dtype  # the KV dtype its --kv-cache-dtype offers, priced by the planner

    def for_record(self, record: dict | None) -> EngineAdapter:
        """Bound to the engine whose flags the args are and to the stated tp_size: from the configuration's keys
        (spec.imported, or the config's configurations.<name>) or its provenance's `imported`."""
        record = record or {}
        served = record.get("server_engine")
        tp = record.get("tp_size")
        return ImportedAdapter(SERVED.get(served) if served else None, int(tp) if tp else None)

    # --- what the flags mean: the served engine's adapter reads them (an adapter never duplicates another's) ---
    def tp_size(self, args: dict[str, Any]) -> int:
        """The config's tp_size, else the served engine's tensor-parallel flag in args, else 1."""
        if self.tp:
            return self.tp
        return self.served.tp_size(args) if self.served else 1

    def kv_cache_dtype(self, args: dict[str, Any]) -> str | None:
        return self.served.kv_cache_dtype(args) if self.served else super().kv_cache_dtype(args)

    def model_spec(self, model: dict, args: dict[str, Any]) -> ModelSpec:
        prefill_absorbed = self.served.prefill_absorbed if self.served else self.prefill_absorbed
        spec = model_spec(model, tp_size=self.tp_size(args), kv_cache_dtype=self.kv_cache_dtype(args),
                          prefill_absorbed=prefill_absorbed)
        if self.tp:
            spec = replace(spec, field_sources={**spec.field_sources, "tp_size": "config key tp_size"})
        return spec

    def verify_width(self, args: dict[str, Any]) -> int:
        return self.served.verify_width(args) if self.served else 1

    def knob_flags(self, entry: dict) -> dict[str, str | None]:
        """The served engine's flags (server_engine), in its names; none where the runs do not say which it was."""
        if self.served:
            return self.served.knob_flags(entry)
        return {"max_running": None, "chunk": None, "pool_fraction": None, "context": None}

    def chunked_prefill_size(self, args: dict[str, Any], server_info: dict) -> int | None:
        return self.served.chunked_prefill_size(args, server_info) if self.served else None

    def prefix_cache(self, args: dict[str, Any], server_info: dict) -> bool | None:
        return self.served.prefix_cache(args, server_info) if self.served else None

    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        raise RuntimeError("imported results have no server for longctx to launch")

    def device(self, spec: ConfigurationSpec) -> str:
        """Not this machine: telemetry and calibration here say nothing about the runs' machine."""
        return "remote"

    def compute_device(self, args: dict[str, Any]) -> str:
        return "gpu"

    def context_length(self, args: dict[str, Any], server_info: dict) -> int | None:
        """The config's context_length (recorded as the server's), else the served engine's flag in args."""
        value = server_info.get("context_length")
        if value:
            return int(value)
        return self.served.context_length(args, server_info) if self.served else None

    def cache_granularity(self, spec: ConfigurationSpec, server_info: dict) -> int | None:
        return None

    def check_spec(self, configuration: str, conf: dict, config: dict) -> None:
        from ..core.errors import ConfigError

        where = f"configurations.{configuration}"
        if conf.get("format") not in FORMATS:
            raise ConfigError(f"config key '{where}.format': {conf.get('format')!r} is not allowed; allowed values: "
                              + ", ".join(FORMATS))
        if not conf.get("files"):
            raise ConfigError(f"config key '{where}.files' is required for imported results: the result files "
                              "(globs, relative to the working directory), e.g. [results/vllm-*.json]")
        given = [k for k in SERVER_KEYS if conf.get(k)]
        if given:
            raise ConfigError(f"config key '{where}.{given[0]}' is for a server longctx runs or reaches; imported results "
                              f"have none (remove it); an imported configuration's keys: engine, "
                              + ", ".join((*IMPORTED_KEYS, "args", "device", "description")))
        self._check_flags(where, conf)
        gpu = (conf.get("hardware") or {}).get("gpu")
        if conf.get("device") == "gpu" and not gpu:
            raise ConfigError(f"config key '{where}.hardware.gpu' is required with device: gpu: the GPU the imported "
                              "runs' server computed on (a name such as 'NVIDIA H200'), for its datasheet ceilings")

    def _check_flags(self, where: str, conf: dict) -> None:
        """args need server_engine (whose flags they are); a tensor-parallel flag in args must agree with tp_size."""
        from ..core.errors import ConfigError

        args, served = conf.get("args") or {}, conf.get("server_engine")
        if served is not None and served not in SERVER_ENGINES:
            raise ConfigError(f"config key '{where}.server_engine': {served!r} is not allowed; allowed values: "
                              + ", ".join(SERVER_ENGINES))
        if args and not served:
            raise ConfigError(f"config key '{where}.server_engine' is required with args: the engine whose flags the args "
                              f"are; allowed values: {', '.join(SERVER_ENGINES)}")
        if not served:
            return
        adapter = self.for_record(conf).served
        flag = next((k for k in args if k.replace("_", "-") in adapter.tp_size_flags and args[k] is not None), None)
        if flag is None:
            return
        try:
            flagged = adapter.tp_size(args)
            if flagged < 1:
                raise ValueError
        except (TypeError, ValueError):
            raise ConfigError(f"config key '{where}.args.{flag}': {args[flag]!r} is not allowed; allowed values: a whole "
                              "number of tensor-parallel ranks, 1 or more") from None
        if conf.get("tp_size") and int(conf["tp_size"]) != flagged:
            raise ConfigError(f"config key '{where}.tp_size': {conf['tp_size']} disagrees with args.{flag} ({args[flag]}); "
                              f"allowed values: {flagged} (or leave one of them out)")
