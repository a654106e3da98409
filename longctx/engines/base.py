"""The adapter interface every engine goes through: command, health, server info, KV pool, API."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from abc import ABC, abstractmethod
from typing import Any

from .api import SGLANG, Api

# SGLang's KV pool line (0.5.9 to 0.5.23), which the reference engine writes too.
SGLANG_KV_POOL_RE = re.compile(
    r"KV Cache is allocated\.(?: dtype: \S+,)? #tokens: (\d+), "
    r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)"
)
SGLANG_READY_LINE = "The server is fired up and ready to roll!"


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


class EngineAdapter(ABC):
    """What longctx needs from an engine. A configuration spec (longctx.config.configuration_spec)
    is passed to every method that depends on it."""

    name: str
    managed = True  # longctx starts and stops the server
    managed_args: frozenset[str] = frozenset()  # flags longctx sets itself
    package: str | None = None  # distribution whose version is the engine's version

    def api(self, spec: dict) -> Api:
        return SGLANG

    @abstractmethod
    def launch_command(self, spec: dict, host: str, port: int, version: str | None) -> list[str]:
        """The command line that starts this configuration's server on host:port."""

    def python(self, spec: dict) -> str:
        return spec.get("python") or "python3"

    @staticmethod
    def run_env(spec: dict) -> dict[str, str]:
        """The environment the server runs in (ours plus configurations.<name>.env), where its version
        is read and its command line checked too: an env such as PYTHONPATH can choose the engine."""
        return {**os.environ, **{k: str(v) for k, v in (spec.get("env") or {}).items()}}

    def installed_version(self, spec: dict) -> str | None:
        """The engine's version in the environment that will run it (None when not installed)."""
        if not self.package:
            return None
        code = ("import importlib.metadata as m\n"
                f"for d in {self.package!r}.split():\n"
                "    try: print(m.version(d)); break\n"
                "    except m.PackageNotFoundError: pass\n")
        try:
            out = subprocess.run([self.python(spec), "-c", code], capture_output=True, text=True, timeout=60,
                                 env=self.run_env(spec))
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() or None

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
        parser = self.parser()
        if parser is None:
            return
        options = {}
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--"):
                    options[opt[2:]] = action
        allowed = sorted(set(options) - self.managed_args - {"help"})
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

    def preflight(self, spec: dict, command: list[str]) -> str | None:
        """Check the command line with the engine's own parser in the engine's environment,
        before a bring-up that can take minutes; the parser's complaint, or None."""
        return None

    def kv_pool_from_log(self, text: str) -> dict | None:
        """The KV pool the server reported in its log: tokens and GB, or None if not seen."""
        matches = list(SGLANG_KV_POOL_RE.finditer(text))
        if not matches:
            return None
        m = matches[-1]
        gb = float(m.group(4)) if m.group(4) else float(m.group(2)) + float(m.group(3))
        return {"tokens": int(m.group(1)), "size_gb": gb, "line": m.group(0)}

    @staticmethod
    def pool_tokens(server_info: dict) -> int | None:
        value = server_info.get("max_total_num_tokens")
        if value is None and isinstance(server_info.get("internal_states"), list) and server_info["internal_states"]:
            value = server_info["internal_states"][0].get("max_total_num_tokens")
        return int(value) if value is not None else None

    def gpus(self, conf: dict) -> int:
        """GPUs the configuration's server takes on the machine that runs its bench job."""
        return 0

    def spec_counters(self, client, base: str) -> dict | None:
        """Server-wide speculative counters (for engines that report acceptance only as metrics)."""
        return None
