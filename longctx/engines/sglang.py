"""SGLang: `python -m sglang.launch_server`, its native /generate API, flags chosen per installed version."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace

from packaging.version import InvalidVersion, Version

from .api import SGLANG
from .base import EngineAdapter, arg_value, args_to_argv

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


_ARGPARSE_ERROR = re.compile(r"^\S.*?: error: (.+)$")


def run_preflight(python: str, script: str, argv: list[str], what: str, env: dict[str, str] | None = None) -> str | None:
    """Run an engine's own argument parser over argv in the engine's Python (and the server's
    environment); its error, or None."""
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


class SGLangAdapter(EngineAdapter):
    name = "sglang"
    package = "sglang"
    managed_args = frozenset({"host", "port", "model-path"})

    def api(self, spec: dict):
        return replace(SGLANG, health_path="/health_generate")  # ready means able to generate

    def check_spec(self, configuration: str, conf: dict, config: dict) -> None:
        from ..core.errors import ConfigError

        if not config["model"].get("path"):
            raise ConfigError(f"configuration {configuration!r} runs SGLang: set config key 'model.path' to the model directory")

    def gpus(self, conf: dict) -> int:
        """tp x pp, times dp unless DP attention shares the TP ranks, per node (--nnodes)."""
        a = conf["args"]
        tp = int(arg_value(a, "tp-size", "tensor-parallel-size", default=1))
        pp = int(arg_value(a, "pp-size", "pipeline-parallel-size", default=1))
        dp = 1 if arg_value(a, "enable-dp-attention") else int(arg_value(a, "dp-size", "data-parallel-size", default=1))
        return max(1, tp * pp * dp // int(arg_value(a, "nnodes", default=1)))

    def engine_argv(self, spec: dict, version: str | None) -> list[str]:
        return args_to_argv(flags_for_version(spec["args"], version)) + list(spec.get("extra_args") or [])

    def launch_command(self, spec: dict, host: str, port: int, version: str | None) -> list[str]:
        return [self.python(spec), "-m", "sglang.launch_server", "--model-path", spec["model"]["path"],
                "--host", host, "--port", str(port), *self.engine_argv(spec, version)]

    def preflight(self, spec: dict, command: list[str]) -> str | None:
        return run_preflight(self.python(spec), _PREFLIGHT, command[3:], "SGLang", self.run_env(spec))
