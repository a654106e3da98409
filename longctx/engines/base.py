"""The adapter interface every engine goes through: command, health, server info, KV pool, API, and
what the engine's flags mean (parallelism, KV dtype, speculative width, device, context length)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path
from abc import ABC, abstractmethod
from typing import Any

from ..specs.model import ModelSpec, model_spec
from .api import SGLANG, Api
from .configuration import ConfigurationSpec

# SGLang's KV pool line (0.5.9 to 0.5.23), which the reference engine writes too; its dtype as torch names it
SGLANG_KV_POOL_RE = re.compile(
    r"KV Cache is allocated\.(?: dtype: (?:torch\.)?(?P<dtype>[\w.]+),)? #tokens: (?P<tokens>\d+), "
    r"(?:K size: (?P<k_gb>[\d.]+) GB, V size: (?P<v_gb>[\d.]+) GB|KV size: (?P<kv_gb>[\d.]+) GB)"
)
SGLANG_READY_LINE = "The server is fired up and ready to roll!"


def last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    """The last match of pattern in a server's log (a server that restarted logs its lines again)."""
    found = list(pattern.finditer(text))
    return found[-1] if found else None


class RaisingParser(argparse.ArgumentParser):
    """An engine's parser that raises ValueError where argparse would exit the process."""

    def error(self, message: str):
        raise ValueError(message)


def arg_value(args: dict[str, Any], *names: str, default: Any = None) -> Any:
    """The value of the first of names (flag aliases, with dashes or underscores) set in args."""
    by_flag = {key.replace("_", "-"): value for key, value in args.items()}
    for name in names:
        if by_flag.get(name) is not None:
            return by_flag[name]
    return default


def args_to_argv(args: dict[str, Any]) -> list[str]:
    """{'page-size': 1, 'disable-radix-cache': True, 'cuda-graph-bs': [1, 2]}
    -> ['--page-size', '1', '--disable-radix-cache', '--cuda-graph-bs', '1', '2']."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):  # a flag that takes several values (nargs)
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


_ARGPARSE_ERROR = re.compile(r"^\S.*?: error: (.+)$")


def run_preflight(python: str, script: str, argv: list[str], what: str, env: dict[str, str] | None = None) -> str | None:
    """Run an engine's own argument parser (script, reading sys.argv[1:]) over argv in the engine's
    Python (and the server's environment); its error, or None."""
    try:
        proc = subprocess.run([python, "-c", script, *argv], capture_output=True, text=True, timeout=300, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run {python} to check the {what} command line: {exc}"
    if proc.returncode == 0:
        return None
    err = proc.stderr.strip().splitlines()
    rejected = [m[1] for m in map(_ARGPARSE_ERROR.match, err) if m]
    if rejected:  # argparse's "<prog>: error: <message>"
        return f"{what} rejects the command line: {rejected[-1]}"
    last = err[-1] if err else f"exit {proc.returncode}"
    if any("ModuleNotFoundError" in line or "ImportError" in line for line in err):
        return f"{what} cannot be imported by {python}: {last}"
    return f"{what}'s argument parser failed in {python} before it read the command line: {last}"


class EngineAdapter(ABC):
    """What longctx needs from an engine. A configuration spec (ConfigurationSpec, cut by
    longctx.config.configuration_spec) is passed to every method that depends on the whole
    configuration; the methods that read only its engine flags take them (`args`), as the analysis
    finds them in the provenance."""

    name: str
    title: str  # the engine as messages name it
    managed = True  # longctx starts and stops the server (on this machine)
    measures = True  # a bench job measures it (False: its raw files are imported from another tool's results)
    managed_args: frozenset[str] = frozenset()  # flags longctx sets itself
    package: str | None = None  # distribution whose version is the engine's version
    preflight_script: str | None = None  # Python that runs the engine's own parser over sys.argv[1:]
    tp_size_flags: tuple[str, ...] = ()  # the engine's tensor-parallel size flag and its aliases
    prefill_absorbed = False  # MLA prefill in the absorbed (latent) form
    context_length_flag = "context-length"  # the flag that caps one request's tokens (SGLang's name)
    metrics_flag: str | None = None  # the flag that turns its Prometheus /metrics on (None: always on, or none)
    # what the load workloads read from /metrics: a canonical name -> the server's sample names, first found wins
    metric_names: dict[str, tuple[str, ...]] = {}
    metrics_path = "/metrics"
    chunked_prefill_flag: str | None = "chunked-prefill-size"  # the flag that sets the tokens of one prefill chunk
    max_running_flag: str | None = "max-running-requests"  # the flag that caps the requests running at once
    pool_fraction_flag: str | None = "mem-fraction-static"  # the share of memory the KV pool is sized from (SGLang's rule)
    prefix_cache_off_flag: str | None = "disable-radix-cache"  # the flag that turns the prefix cache off (SGLang's)
    cached_tokens_flag: str | None = None  # the flag without which the server reports no cached count (vLLM's)
    # what an OpenAI request adds for the generated token ids to come back in the stream (vLLM's; SGLang's
    # /generate streams them anyway): a conversation then carries them exactly
    output_ids_request: dict | None = None
    # the KV cache dtype its --kv-cache-dtype offers besides the model's own, which the planner prices (none: it
    # offers no other, or longctx does not know its flags)
    fp8_kv_dtype: str | None = None
    # how its server sizes its KV pool, where the planner does not model it (words after the engine's title)
    pool_rule = "sizes its KV pool by a rule the planner does not model (it has no mem-fraction-static)"
    api_key_flag: str | None = "api-key"  # the flag that makes the server require a Bearer key (SGLang's)
    # the environment variable the engine reads its key from (vLLM's VLLM_API_KEY): used in place of the flag,
    # so that the key is not on the process table (SGLang's server takes the flag only)
    api_key_var: str | None = None

    def api(self, spec: ConfigurationSpec) -> Api:
        return SGLANG

    def for_record(self, record: dict | None) -> "EngineAdapter":
        """The adapter that reads a configuration's flags, given what its record says of them beyond the flags
        (imported results: config key server_engine, the engine whose flags its args are, and tp_size; from
        the configuration's keys or its provenance's `imported`): itself, for every engine that runs or
        reaches its server."""
        return self

    @abstractmethod
    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        """The command line that starts this configuration's server on host:port."""

    def python(self, spec: ConfigurationSpec) -> str:
        return spec.python or "python3"

    def with_api_key(self, command: list[str], env: dict[str, str], key: str | None,
                     private: Path | None = None) -> tuple[list[str], dict[str, str]]:
        """The command and environment that start the server requiring `key` (unchanged without one): in its
        environment where the engine reads it there (api_key_var), else on its command line. `private`: a directory
        only this user can read, for an engine that takes it from a file (SGLang's --config)."""
        if not key:
            return command, env
        if self.api_key_var:
            return command, {**env, self.api_key_var: key}
        return [*command, f"--{self.api_key_flag}", key], env

    def served_args(self, spec: ConfigurationSpec) -> dict[str, Any]:
        """The configuration's flags as the server is started with them: its own, plus the flag that turns
        /metrics on where the load workloads scrape it (configurations that set it themselves keep theirs)."""
        args = dict(spec.args)
        load = spec.load or {}
        if self.metrics_flag and load.get("metrics", {}).get("enabled") and arg_value(args, self.metrics_flag) is None:
            args[self.metrics_flag] = True
        if self.cached_tokens_flag and spec.prefix and arg_value(args, self.cached_tokens_flag) is None:
            args[self.cached_tokens_flag] = True  # the reused-context workloads check every request's cached count
        return args

    @staticmethod
    def run_env(spec: ConfigurationSpec) -> dict[str, str]:
        """The environment the server runs in (ours plus configurations.<name>.env), where its version
        is read and its command line checked too: an env such as PYTHONPATH can choose the engine."""
        return {**os.environ, **{k: str(v) for k, v in (spec.env or {}).items()}}

    def installed_build(self, spec: ConfigurationSpec) -> dict | None:
        """The engine's code as it is installed in the environment that will run it (None when not installed):
        {"version", "distribution", "installed_from": the URL or path it was installed from and its commit or
        whether it is editable (pip's direct_url.json; absent for an index release), "torch": the torch beside it}.
        Part of a configuration's identity (longctx.analysis.identity): two builds of one version (a patched
        checkout, another torch) are not like with like."""
        if not self.package:
            return None
        code = ("import importlib.metadata as m, json\n"
                "out = {}\n"
                f"for d in {self.package!r}.split():\n"
                "    try: dist = m.distribution(d)\n"
                "    except m.PackageNotFoundError: continue\n"
                "    out = {'version': dist.version, 'distribution': d}\n"
                "    try: url = json.loads(dist.read_text('direct_url.json') or 'null')\n"
                "    except ValueError: url = None\n"
                "    if url: out['installed_from'] = {'url': url.get('url'), 'commit': (url.get('vcs_info') or {}).get('commit_id'),\n"
                "                                     'editable': bool((url.get('dir_info') or {}).get('editable'))}\n"
                "    break\n"
                "try: out['torch'] = m.version('torch') if out else None\n"
                "except m.PackageNotFoundError: pass\n"
                "print(json.dumps(out))\n")
        try:
            proc = subprocess.run([self.python(spec), "-c", code], capture_output=True, text=True, timeout=60,
                                  env=self.run_env(spec))
            out = json.loads(proc.stdout.strip() or "{}")
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
        return {k: v for k, v in out.items() if v is not None} or None

    def installed_version(self, spec: ConfigurationSpec) -> str | None:
        """The engine's version in the environment that will run it (None when not installed)."""
        return (self.installed_build(spec) or {}).get("version")

    def parser(self) -> argparse.ArgumentParser | None:
        """The engine's own argument parser where it can be imported here, else None."""
        return None

    def check_spec(self, configuration: str, conf: dict, config: dict) -> None:
        """Raise ConfigError for what this engine needs and the configuration lacks."""

    def check_args(self, configuration: str, args: dict[str, Any]) -> None:
        """Raise ConfigError naming the key and the allowed values for a bad engine flag."""
        from ..core.errors import ConfigError

        where = f"configurations.{configuration}.args"
        for key in args:
            if key.replace("_", "-") in self.managed_args:
                raise ConfigError(f"config key '{where}.{key}' is set by longctx itself; remove it")
            if self.api_key_flag and key.replace("_", "-") == self.api_key_flag:
                raise ConfigError(f"config key '{where}.{key}': give the server's API key by "
                                  f"configurations.{configuration}.api_key_env, the name of an environment variable "
                                  "that holds it (longctx then sends it with every request and writes it nowhere); "
                                  "remove it from args")
        parser = self.parser()
        if parser is None:
            return
        options = {}
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--"):
                    options[opt[2:]] = action
        allowed = sorted(set(options) - self.managed_args - {"help", self.api_key_flag})
        for key, value in args.items():
            flag = key.replace("_", "-")
            action = options.get(flag)
            if action is None or flag == "help":
                raise ConfigError(f"config key '{where}.{key}' is not a {self.name} flag; allowed keys: {', '.join(allowed)}")
            if action.choices is not None and value not in action.choices:
                raise ConfigError(
                    f"config key '{where}.{key}': {value!r} is not allowed; allowed values: "
                    + ", ".join(map(str, action.choices))
                )
            try:
                parser.parse_args(args_to_argv({key: value}))
            except ValueError as exc:
                raise ConfigError(f"config key '{where}.{key}': {exc}") from None

    def preflight_argv(self, spec: ConfigurationSpec, command: list[str]) -> list[str]:
        """The words of the launch command that the engine's parser reads."""
        return command

    def preflight(self, spec: ConfigurationSpec, command: list[str]) -> str | None:
        """Check the command line with the engine's own parser in the engine's environment,
        before a bring-up that can take minutes; the parser's complaint, or None."""
        if self.preflight_script is None:
            return None
        return run_preflight(self.python(spec), self.preflight_script, self.preflight_argv(spec, command), self.title,
                             self.run_env(spec))

    def kv_pool_from_log(self, text: str) -> dict | None:
        """The KV pool the server reported in its log: tokens and GB, or None if not seen."""
        m = last_match(SGLANG_KV_POOL_RE, text)
        if not m:
            return None
        gb = float(m["kv_gb"]) if m["kv_gb"] else float(m["k_gb"]) + float(m["v_gb"])
        return {"tokens": int(m["tokens"]), "size_gb": gb, "line": m.group(0)}

    def server_reports(self, server_info: dict, log_text: str) -> dict:
        """What the server reported of itself that its flags do not say, each {"value", "source"}: kv_cache_dtype
        (a dtype longctx.specs.model knows), kv_bytes_per_token (where the cache's type is none it knows),
        weight_format (quantized weights' type). None here: a managed server's flags say these."""
        return {}

    @staticmethod
    def pool_tokens(server_info: dict) -> int | None:
        value = server_info.get("max_total_num_tokens")
        if value is None and isinstance(server_info.get("internal_states"), list) and server_info["internal_states"]:
            value = server_info["internal_states"][0].get("max_total_num_tokens")
        return int(value) if value is not None else None

    def kv_budget(self, spec: ConfigurationSpec) -> dict | None:
        """The KV cache memory budget as configured, for an engine that sizes its pool from one (vLLM):
        {"bytes", "source", "block_size", "block_source"} (the flag or variable's name, never its
        environment); None where the engine sizes its pool otherwise or the budget is left to run time."""
        return None

    def gpus(self, args: dict[str, Any]) -> int:
        """GPUs a server with these flags takes on the machine that runs its bench job."""
        return 0

    def spec_counters(self, client, base: str) -> dict | None:
        """Server-wide speculative counters (for engines that report acceptance only as metrics)."""
        return None

    def drafting_flag(self, flag: str) -> bool:
        """Whether an engine flag (without its dashes) is one of its speculative decoding's: SGLang's and the
        reference engine's speculative-algorithm and speculative-*, vLLM's speculative-config. Two configurations
        that differ only in these are one server with and without drafting (longctx.analysis.drafting)."""
        return flag.startswith("speculative")

    def tokenizer(self, spec: ConfigurationSpec):
        """The engine's own tokenizer where the engine has one of its own (not the model's), with
        longctx.measure.prompts.Tokenizer's interface (encode, decode, piece, vocab_size, special, path, library);
        None where the model's tokenizer (model.tokenizer, model.path) is the server's, or none is known."""
        return None

    # --- what the engine's flags mean ---------------------------------------------------------
    def tp_size(self, args: dict[str, Any]) -> int:
        """Tensor-parallel ranks (1 for an engine without tensor parallelism)."""
        return int(arg_value(args, *self.tp_size_flags) or 1)

    def kv_cache_dtype(self, args: dict[str, Any]) -> str | None:
        """The KV cache dtype as the flags spell it (None or "auto": the model's)."""
        return arg_value(args, "kv-cache-dtype")

    def model_spec(self, model: dict, args: dict[str, Any]) -> ModelSpec:
        """The config's model (its `model` section) as a server with these flags runs it."""
        return model_spec(model, tp_size=self.tp_size(args), kv_cache_dtype=self.kv_cache_dtype(args),
                          prefill_absorbed=self.prefill_absorbed)

    def verify_width(self, args: dict[str, Any]) -> int:
        """Query tokens per request in one decode step: 1, or the tokens a speculative verify step scores."""
        return 1

    def compute_device(self, args: dict[str, Any]) -> str:
        """'cpu' or 'gpu': where a server with these flags computes, as far as its flags say (the
        analysis reads it from the provenance's args; `device` below also asks the installation)."""
        return "gpu"

    def device(self, spec: ConfigurationSpec) -> str:
        """Where this configuration's server computes: 'cpu' or 'gpu' of the machine that runs its bench
        job, or 'remote' (another machine, whose CPU, GPUs and ceilings longctx cannot see). A managed
        server runs here, on the device its flags (and, where the engine decides by its build, the
        installation in its Python) give."""
        return self.compute_device(spec.args)

    def scheduler_rules(self, args: dict[str, Any], server_info: dict, pool_tokens: int | None,
                        device: str | None = None) -> dict | None:
        """The rules its scheduler follows, as the fields of longctx.analysis.simulate.Rules (policy, chunk,
        max_running, pool_tokens and the policy's own), from its flags as configured or reported (and the device
        the run recorded, where its defaults depend on it), with `source`: where they come from, in words. None where
        longctx does not know its scheduler (a server someone else runs)."""
        return None

    def knob_flags(self, entry: dict) -> dict[str, str | None]:
        """The flags of the server a provenance entry measured that the serving model and the memory planner cover, in
        the engine's own names (None: the engine has no such flag, or it is not modelled): max_running, chunk (a
        prefill chunk, or a step's tokens) and pool_fraction (the share of memory the KV pool is sized from), and
        context, the flag that caps one request's tokens."""
        return {"max_running": self.max_running_flag, "chunk": self.chunked_prefill_flag,
                "pool_fraction": self.pool_fraction_flag, "context": self.context_length_flag}

    def run_rules(self, entry: dict, pool_tokens: int | None) -> dict | None:
        """The scheduler rules of a measured configuration, from its provenance entry: scheduler_rules of the flags it
        ran with, what the server reported of itself and the device the run recorded."""
        return self.scheduler_rules(entry.get("args") or {}, entry.get("server_info") or {}, pool_tokens,
                                    entry.get("device"))

    def cpu_threads(self, args: dict[str, Any]) -> int | None:
        """The threads a server on the CPU computes with (None: the engine does not say)."""
        return None

    def setting(self, args: dict[str, Any], server_info: dict, flag: str) -> Any:
        """A server setting: the flag as configured, else what the server reports under the flag's
        name with underscores (as SGLang's /server_info and the reference engine's do)."""
        value = arg_value(args, flag)
        return value if value is not None else server_info.get(flag.replace("-", "_"))

    def chunked_prefill_size(self, args: dict[str, Any], server_info: dict) -> int | None:
        """Tokens of one prefill chunk, as configured or reported (None: not known, or no chunking)."""
        value = self.setting(args, server_info, self.chunked_prefill_flag) if self.chunked_prefill_flag else None
        try:
            return int(value) if value is not None and int(value) > 0 else None
        except (TypeError, ValueError):
            return None

    def prefix_cache(self, args: dict[str, Any], server_info: dict) -> bool | None:
        """Whether the server's prefix cache is on (None: not known): SGLang's radix cache (and ours) is,
        unless --disable-radix-cache."""
        if self.prefix_cache_off_flag is None:
            return None
        return not self.setting(args, server_info, self.prefix_cache_off_flag)

    def cache_granularity(self, spec: ConfigurationSpec, server_info: dict) -> int | None:
        """Tokens the prefix cache matches by (None: not known): SGLang's page size (--page-size, default 1;
        its radix cache matches whole pages)."""
        value = self.setting(spec.args, server_info, "page-size")
        return int(value) if value else 1

    def context_length(self, args: dict[str, Any], server_info: dict) -> int | None:
        """The most tokens (prompt and output) one request may hold: the engine's context_length_flag,
        else as reported."""
        value = self.setting(args, server_info, self.context_length_flag)
        return int(value) if value else None

    def served_model(self, spec: ConfigurationSpec) -> str:
        """The model name an OpenAI server expects in requests."""
        return str(arg_value(spec.args, "served-model-name") or spec.model.get("path") or spec.model["name"])


# SGLang's scheduler (python/sglang/srt/managers/scheduler.py get_next_batch_to_run, schedule_policy.py PrefillAdder;
# read at 0.5.23): prefill first, the chunk budget, admission reserving new_token_ratio (0.7 to 0.098) of the running
# requests' output; max-running-requests, where neither set nor reported, SGLang's resolve_max_num_reqs of the pool
SGLANG_NEW_TOKEN_RATIO = (0.7, 0.098)
SGLANG_CHUNK_DEFAULT = 8192  # --chunked-prefill-size on a GPU of 60 to 160 GB (4096 where SGLang cannot read its memory)


def sglang_scheduler(adapter: EngineAdapter, args: dict[str, Any], server_info: dict, pool_tokens: int | None,
                     one_prefill: bool, reserve: bool) -> dict:
    """SGLang's scheduler rules (EngineAdapter.scheduler_rules) for an engine that follows them: its flags as
    configured or reported; `one_prefill` (one request per prefill batch) and `reserve` (new_token_ratio) as the
    engine does."""
    notes = []
    chunk = adapter.chunked_prefill_size(args, server_info)
    if chunk is None and adapter.setting(args, server_info, "chunked-prefill-size") is None:
        chunk = SGLANG_CHUNK_DEFAULT
        notes.append(f"chunked-prefill-size not set or reported: SGLang's {chunk:,} for a 60-160 GB GPU")
    max_running = adapter.setting(args, server_info, "max-running-requests")
    if max_running is None and pool_tokens:
        context = adapter.context_length(args, server_info) or pool_tokens
        estimated = max(min(int(pool_tokens / context * 512), 4096), 2048)
        max_running = min(estimated, pool_tokens // 2)
        notes.append(f"max-running-requests not set or reported: SGLang's rule of the pool, {max_running:,}")
    ratio = SGLANG_NEW_TOKEN_RATIO if reserve else (0.0, 0.0)
    return {"policy": "prefill_first", "chunk": chunk, "max_running": int(max_running) if max_running else None,
            "pool_tokens": pool_tokens, "one_prefill": one_prefill,
            "mixed_chunk": bool(adapter.setting(args, server_info, "enable-mixed-chunk")),
            "reserve": ratio[0], "reserve_min": ratio[1], "notes": notes}

