"""The embedded reference engine, launched as `python -m longctx.refengine`."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

from ..refengine.args import API_KEY_VAR, DEFAULT_TORCH_DTYPE, build_parser
from ..specs.model import ModelSpec
from .base import EngineAdapter, RaisingParser, arg_value, args_to_argv, sglang_scheduler
from .configuration import ConfigurationSpec
from .sglang import SGLANG_METRICS

# the packages whose code is the reference engine's (its identity's "source"): the kernels it runs are not among them
ENGINE_CODE = ("refengine", "attention", "specs")


class ReferenceAdapter(EngineAdapter):
    name = "reference"
    metrics_flag = "enable-metrics"
    metric_names = SGLANG_METRICS  # it serves SGLang's names (longctx.refengine.metrics)
    title = "the reference engine"
    prefill_absorbed = True  # it runs MLA prefill in the latent form, as decode
    managed_args = frozenset({"host", "port", "model-path", "json-model-override-args", "kernel-dir", "random-seed"})
    api_key_var = API_KEY_VAR  # the key in its environment, not on its command line (everyone's process list)

    def parser(self):
        return build_parser(RaisingParser)

    def scheduler_rules(self, args: dict, server_info: dict, pool_tokens: int | None, device: str | None = None) -> dict | None:
        # its own defaults where neither the flag nor its info says (its parser's)
        defaults = vars(build_parser(RaisingParser).parse_args([]))
        info = {**{k: defaults[k] for k in ("max_running_requests", "chunked_prefill_size") if k in defaults}, **server_info}
        rules = sglang_scheduler(self, args, info, pool_tokens, one_prefill=True, reserve=False)
        return {**rules, "source": "the reference engine's (longctx.refengine.scheduler: SGLang's, one "
                "request per prefill batch, admission by the prompt's pages)"}

    def check_spec(self, configuration: str, conf: dict, config: dict) -> None:
        from ..core.errors import ConfigError

        if config["model"].get("hf_config"):
            raise ConfigError(f"config key 'model.hf_config': configuration {configuration!r} runs the reference engine, "
                              "which is built from model.architecture; remove model.hf_config (it describes a real model)")
        arch = config["model"].get("architecture") or {}
        need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim",
                "qk_nope_head_dim", "v_head_dim")
        known = {*need, "intermediate_size", "torch_dtype"}  # what longctx.refengine.modelconfig builds
        missing, extra = [k for k in need if k not in arch], sorted(set(arch) - known)
        if missing or extra:
            raise ConfigError(f"config key 'model.architecture': configuration {configuration!r} runs the reference engine, "
                              "an MLA model built from model.architecture, which must give "
                              + (f"{', '.join(missing)}" if missing else "no other fields")
                              + (f" (not {', '.join(extra)}: the engine does not build them)" if extra else "")
                              + f"; fields given: {', '.join(sorted(arch)) or 'none'}; fields allowed: {', '.join(sorted(known))}")
        kind = config["kernels"][conf["kernel"]]["kind"] if conf.get("kernel") else "torch"
        backend = str(conf["args"].get("attention-backend", "torch"))
        if (kind == "native") != (backend == "native"):
            raise ConfigError(
                f"config key 'configurations.{configuration}.args.attention-backend': {backend!r} does not run "
                f"kernel {conf.get('kernel')!r} of kind {kind!r}; allowed values: "
                f"{'native' if kind == 'native' else 'torch'} (native runs a native kernel, torch a PyTorch one)")

    def python(self, spec: ConfigurationSpec) -> str:
        return spec.python or sys.executable

    def tokenizer(self, spec: ConfigurationSpec):
        """Its byte-level tokenizer (token ids 0-255 are the text's UTF-8 bytes)."""
        from ..refengine.tokenizer import ByteTokenizer

        return ByteTokenizer()

    def installed_build(self, spec: ConfigurationSpec) -> dict | None:
        """Its version, the hash of its own code (the engine and what it runs on: longctx/refengine, attention and
        specs; the kernels under study are the configuration's kernel, not the engine) and the torch it runs on."""
        from .. import __version__

        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for p in sorted(f for d in ENGINE_CODE for f in (root / d).rglob("*.py") if "__pycache__" not in f.parts):
            h.update(f"{p.relative_to(root).as_posix()}\0".encode() + p.read_bytes() + b"\0")
        try:
            torch = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            torch = None
        return {"version": __version__, "source": h.hexdigest()[:16], **({"torch": torch} if torch else {})}

    @staticmethod
    def torch_device(args: dict) -> str:
        """--device as configured (cpu by default): a torch device name."""
        return str(arg_value(args, "device") or "cpu")

    def gpus(self, args: dict) -> int:
        """One GPU where `device` puts the engine on CUDA, else none (it runs on the CPU)."""
        return 1 if self.torch_device(args).startswith("cuda") else 0

    def compute_device(self, args: dict) -> str:
        return "cpu" if self.torch_device(args) == "cpu" else "gpu"

    def cpu_threads(self, args: dict) -> int | None:
        """Its torch threads: --num-threads, or the usable CPUs but one."""
        n = arg_value(args, "num-threads")
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return int(n) if n else max(1, usable - 1)

    def model_spec(self, model: dict, args: dict) -> ModelSpec:
        """The model as the engine builds it: the architecture given, in the engine's default dtype where
        it names none."""
        arch = {"torch_dtype": DEFAULT_TORCH_DTYPE, **(model.get("architecture") or {})}
        return super().model_spec({**model, "architecture": arch}, args)

    def verify_width(self, args: dict) -> int:
        """The last token plus its drafts (speculative-num-draft-tokens, 4 by default) when speculating."""
        if not arg_value(args, "speculative-algorithm"):
            return 1
        drafts = arg_value(args, "speculative-num-draft-tokens")
        return 1 + int(drafts if drafts is not None else 4)

    def launch_command(self, spec: ConfigurationSpec, host: str, port: int, version: str | None) -> list[str]:
        model = spec.model
        cmd = [
            self.python(spec), "-m", "longctx.refengine",
            "--host", host,
            "--port", str(port),
            "--model-path", model["name"],
            "--json-model-override-args", json.dumps(model["architecture"], sort_keys=True),
            "--random-seed", str(model["seed"]),
        ]
        if spec.kernel_build:
            cmd += ["--kernel-dir", spec.kernel_build]
        return cmd + args_to_argv(self.served_args(spec)) + list(spec.extra_args or [])
