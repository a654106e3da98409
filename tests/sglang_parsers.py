"""SGLang's own argument parsers of both eras, for the tests of the command lines longctx emits.

`make parsers` installs SGLang 0.5.23 into the test venv (envs/parsers.txt) and SGLang 0.5.9 into
<venv>/parsers/sglang-0.5.9 (envs/parsers-sglang-0.5.9.txt), which is put first on PYTHONPATH so that it
shadows 0.5.23. Each parser runs in a subprocess, as it would in the engine's own environment, and
parses a batch of command lines in one import (importing SGLang takes seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ERAS = ("0.5.9", "0.5.23")  # the oldest and newest SGLang the adapter knows
HOMES = {"0.5.9": Path(sys.prefix) / "parsers" / "sglang-0.5.9", "0.5.23": None}  # None: the venv's own
REQUIRED = bool(os.environ.get("LONGCTX_REQUIRE_ENGINE_PARSERS"))

# sglang.launch_server's parser over each argv (JSON on stdin): None where it accepts, else argparse's
# message. The installed version is printed too, so a wrong PYTHONPATH cannot pass unnoticed.
# Only here, not in the adapter's preflight: the CPU torch of the tests cannot load the ops library of
# torchvision's (CUDA) PyPI wheel, which SGLang 0.5.9 imports; torchvision then fails registering fake
# kernels for two of those ops. Declaring the two ops (torchvision's own schemas) lets it import.
_SCRIPT = """\
import argparse, importlib.metadata, json, sys
import torch
try:
    import torchvision
except ImportError:
    pass  # SGLang 0.5.23's parser does not need it
except RuntimeError as exc:
    if "torchvision::" not in str(exc):
        raise
    for op in ("nms", "qnms"):
        torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    import torchvision
from sglang.srt.server_args import ServerArgs

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)

parser = Parser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
errors = []
for argv in json.load(sys.stdin):
    try:
        parser.parse_args(argv)
        errors.append(None)
    except ValueError as exc:
        errors.append(str(exc))
print("LONGCTX-PARSED " + json.dumps({"version": importlib.metadata.version("sglang"), "errors": errors}))
"""


def env(version: str) -> dict[str, str]:
    """What a configuration's `env` sets so that the test venv's Python runs this SGLang."""
    home = HOMES[version]
    return {"PYTHONPATH": str(home)} if home else {}


def installed(version: str) -> bool:
    home = HOMES[version]
    if home is not None:
        return (home / "sglang" / "srt" / "server_args.py").is_file()
    from importlib.util import find_spec

    return find_spec("sglang") is not None


def require(version: str) -> None:
    """Skip where this parser is not installed, unless `make test` said it must be (then fail)."""
    if not installed(version):
        (pytest.fail if REQUIRED else pytest.skip)(f"SGLang {version}'s parser is not installed here: run `make parsers`")


def parse(version: str, argvs: list[list[str]]) -> list[str | None]:
    """SGLang `version`'s own verdict on each argv (without `python -m sglang.launch_server`)."""
    require(version)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], input=json.dumps(argvs), capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env(version)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("LONGCTX-PARSED ")]
    assert proc.returncode == 0 and lines, f"SGLang {version}'s parser did not run:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1].split(" ", 1)[1])
    assert result["version"] == version, f"PYTHONPATH={env(version)} gave SGLang {result['version']}, not {version}"
    return result["errors"]
