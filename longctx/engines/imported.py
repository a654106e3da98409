"""Results another benchmark tool measured (vLLM's `bench serve`, SGLang's `bench_serving`, AIPerf,
GuideLLM): no server to start, stop or send to; the files are read by longctx.measure.imports."""

from __future__ import annotations

from typing import Any

from .base import EngineAdapter
from .configuration import ConfigurationSpec

# the result formats longctx reads (config key configurations.<name>.format; readers in longctx.measure.imports)
FORMATS = ("vllm-bench", "sglang-bench", "aiperf", "guidellm")
# keys only an imported configuration has, and those it must not have (a running server's)
IMPORTED_KEYS = ("format", "files", "hardware", "kv_pool_tokens", "context_length", "tool_version", "bins", "model")
SERVER_KEYS = ("url", "api", "args", "extra_args", "env", "python", "command", "kernel", "startup_timeout_s")


class ImportedAdapter(EngineAdapter):
    name = "imported"
    title = "the imported runs' server"
    managed = False  # nothing runs: the tool measured a server longctx never saw
    measures = False  # its raw files come from the tool's result files (rule import_results), not from a server
    devices = ("cpu", "gpu", "remote")  # configurations.<name>.device: what the imported runs' server computed on
    chunked_prefill_flag = None
    prefix_cache_off_flag = None

    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        raise RuntimeError("imported results have no server for longctx to launch")

    def device(self, spec: ConfigurationSpec) -> str:
        """Not this machine: telemetry and calibration here say nothing about the runs' machine."""
        return "remote"

    def compute_device(self, args: dict[str, Any]) -> str:
        return "gpu"

    def context_length(self, args: dict[str, Any], server_info: dict) -> int | None:
        value = server_info.get("context_length")
        return int(value) if value else None

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
                              + ", ".join((*IMPORTED_KEYS, "device", "description")))
        gpu = (conf.get("hardware") or {}).get("gpu")
        if conf.get("device") == "gpu" and not gpu:
            raise ConfigError(f"config key '{where}.hardware.gpu' is required with device: gpu: the GPU the imported "
                              "runs' server computed on (a name such as 'NVIDIA H200'), for its datasheet ceilings")
