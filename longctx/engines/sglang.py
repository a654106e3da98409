"""SGLang: `python -m sglang.launch_server`, its native /generate API, flags chosen per installed version."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .api import SGLANG
from .base import EngineAdapter, arg_value, args_to_argv, sglang_scheduler
from .configuration import ConfigurationSpec

# (first version with the new name, old flag, new flag). 0.5.23 split --cuda-graph-max-bs and
# --cuda-graph-bs into -decode and -prefill flags; the old names are then "ambiguous" to argparse, and
# 0.5.9 does not know the new ones. A config may use either name for any installed version.
RENAMED_FLAGS = (("0.5.23", "cuda-graph-max-bs", "cuda-graph-max-bs-decode"),
                 ("0.5.23", "cuda-graph-bs", "cuda-graph-bs-decode"))

_PREFLIGHT = """\
import argparse, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
parser.parse_args(sys.argv[1:])
"""


def flags_for_version(args: dict, version: str | None) -> dict:
    """The config's flags under the names the installed SGLang knows."""
    try:
        v = Version(version) if version else None
    except InvalidVersion:
        v = None
    out = {}
    for key, value in args.items():
        flag = key.replace("_", "-")
        for since, old, new in RENAMED_FLAGS:
            if v is not None and v >= Version(since) and flag == old:
                flag = new
            elif v is not None and v < Version(since) and flag == new:
                flag = old
        out[flag] = value
    return out


# What the load workloads read from SGLang's /metrics (python/sglang/srt/metrics/collector.py,
# SchedulerMetricsCollector, 0.5.9 to 0.5.23): canonical name -> sample names, first found wins.
SGLANG_METRICS = {
    "running": ("sglang:num_running_reqs",),
    "queued": ("sglang:num_queue_reqs",),
    "used_tokens": ("sglang:num_used_tokens",),
    "token_usage": ("sglang:token_usage",),
    "cache_hit_rate": ("sglang:cache_hit_rate",),
    "gen_throughput": ("sglang:gen_throughput",),
    "retracted_total": ("sglang:num_retracted_requests_total",),
    "pool_tokens": ("sglang:max_total_num_tokens",),
}


class SGLangAdapter(EngineAdapter):
    name = "sglang"
    metrics_flag = "enable-metrics"
    metric_names = SGLANG_METRICS
    title = "SGLang"
    package = "sglang"
    managed_args = frozenset({"host", "port", "model-path"})
    fp8_kv_dtype = "fp8_e4m3"  # --kv-cache-dtype fp8_e4m3 (and fp8_e5m2, the same size)
    preflight_script = _PREFLIGHT
    # --tp-size and its alias (both in 0.5.9 and 0.5.23), and `tp`, which SGLang's argparse takes for
    # --tp-size (an unambiguous prefix in both: `--tp 8` runs TP8)
    tp_size_flags = ("tp-size", "tensor-parallel-size", "tp")

    def with_api_key(self, command: list[str], env: dict[str, str], key: str | None,
                     private: Path | None = None) -> tuple[list[str], dict[str, str]]:
        """SGLang reads no environment variable for its key: it goes in a YAML file of this user's alone, given by
        SGLang's --config (server_args_config_parser: its keys become flags), so that the process list shows the
        file's path, not the key. SGLang takes one --config: where the command has the user's own (``--config F`` or
        ``--config=F``), the file given is a copy of it with the key added, in the same private directory. Without a
        private directory, the --api-key flag (a caller that has none: not the bench, which always gives one)."""
        if not key or private is None:
            return super().with_api_key(command, env, key)
        import yaml

        from ..core.errors import ConfigError

        command, doc = list(command), {}
        at = next((i for i, w in enumerate(command) if w == "--config" or w.startswith("--config=")), None)
        if at is not None:
            word = command[at]
            given = word.partition("=")[2] if "=" in word else (command[at + 1] if at + 1 < len(command) else "")
            try:
                doc = yaml.safe_load(Path(given).read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"SGLang's --config {given!r} cannot be read to add the API key to it ({exc}); the key "
                                  "is never put on the command line") from None
            if not isinstance(doc, dict):
                raise ConfigError(f"SGLang's --config {given!r} is not a mapping of flags; the API key is never put on "
                                  "the command line")
            del command[at: at + (1 if "=" in word else 2)]
        path = Path(private) / "sglang-config.yaml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({**doc, "api-key": key}) + "\n")  # JSON is YAML
        return [*command, "--config", str(path)], env

    def api(self, spec: ConfigurationSpec):
        # ready means able to generate: /health_generate first, the others for a build without it
        return replace(SGLANG, health_paths=("/health_generate", *(p for p in SGLANG.health_paths if p != "/health_generate")))

    def check_spec(self, configuration: str, conf: dict, config: dict) -> None:
        from ..core.errors import ConfigError

        if not config["model"].get("path"):
            raise ConfigError(f"configuration {configuration!r} runs SGLang: set config key 'model.path' to the model directory")

    def scheduler_rules(self, args: dict, server_info: dict, pool_tokens: int | None, device: str | None = None) -> dict | None:
        rules = sglang_scheduler(self, args, server_info, pool_tokens, one_prefill=False, reserve=True)
        return {**rules, "source": "SGLang's (get_next_batch_to_run, PrefillAdder; 0.5.23): a prefill batch "
                "before any decode, waiting requests filling the chunk, new_token_ratio reserved for running output"}

    def gpus(self, args: dict) -> int:
        """tp x pp, times dp unless DP attention shares the TP ranks, per node (--nnodes)."""
        pp = int(arg_value(args, "pp-size", "pipeline-parallel-size", default=1))
        dp = 1 if arg_value(args, "enable-dp-attention") else int(arg_value(args, "dp-size", "data-parallel-size", default=1))
        return max(1, self.tp_size(args) * pp * dp // int(arg_value(args, "nnodes", default=1)))

    def verify_width(self, args: dict) -> int:
        """speculative-num-draft-tokens (the root among them) when a speculative algorithm is on."""
        if not arg_value(args, "speculative-algorithm"):
            return 1
        drafts = arg_value(args, "speculative-num-draft-tokens")
        return int(drafts) if drafts else 1

    def engine_argv(self, spec: ConfigurationSpec, version: str | None) -> list[str]:
        return args_to_argv(flags_for_version(self.served_args(spec), version)) + list(spec.extra_args or [])

    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        return [self.python(spec), "-m", "sglang.launch_server", "--model-path", spec.model["path"],
                "--host", host, "--port", str(port), *self.engine_argv(spec, version)]

    def preflight_argv(self, spec: ConfigurationSpec, command: list[str]) -> list[str]:
        return command[3:]  # after `python -m sglang.launch_server`
