"""The reference engine itself: model, KV pool, scheduler and attention kernel, built from its flags."""

from __future__ import annotations

import argparse
import logging
import os

import psutil
import torch

from .. import __version__
from ..attention import build as kernels
from ..attention import hostmem
from ..specs.pool import PoolSizing
from .kvpool import KVPool
from .metrics import EngineMetrics
from .model import MLAModel
from .modelconfig import ModelConfig
from .radix import RadixCache
from .scheduler import Scheduler
from .speculative import SpecConfig

log = logging.getLogger("longctx.refengine")

ENGINE_NAME = "longctx-refengine"


def load_kernel(kernel_dir: str, backend: str, device: str) -> kernels.Kernel:
    try:
        kernel = kernels.load_kernel(kernel_dir, device)
    except FileNotFoundError as exc:
        raise SystemExit(f"attention kernel not loaded: {exc} (build it or pass --kernel-dir)") from None
    if (backend == "native") != (kernel.target != "torch"):
        raise SystemExit(f"--attention-backend {backend} does not match the kernel in {kernel_dir} ({kernel.name}, "
                         f"{kernel.target}): native needs a native kernel build, torch a PyTorch kernel")
    log.info("Attention kernel: %s (%s) from %s", kernel.name, kernel.target, kernel_dir)
    return kernel


def _free_memory(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


class Engine:
    def __init__(self, args: argparse.Namespace):
        # A client timing the stream on a busy core sees late tokens, and OpenMP threads that share
        # a core with it stall each other: by default one CPU is left free.
        torch.set_num_threads(args.num_threads or max(1, len(os.sched_getaffinity(0)) - 1))
        for name in ("page_size", "chunked_prefill_size", "max_running_requests", "context_length"):
            if getattr(args, name) < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
        self.args = args
        self.cfg = ModelConfig.from_overrides(args.json_model_override_args)
        self.model = MLAModel(self.cfg, seed=args.random_seed, device=args.device)
        # SGLang sizes the pool from the memory free before loading (torch.cuda.mem_get_info); here:
        # the given total, or the device's free memory, or the host's available memory
        memory_total = int(args.memory_total_gb * 2**30) if args.memory_total_gb else _free_memory(args.device)
        self.sizing = PoolSizing(
            memory_total_bytes=memory_total,
            mem_fraction_static=args.mem_fraction_static,
            weights_bytes=self.model.weights_bytes(),
            cell_bytes=self.cfg.kv_bytes_per_token(),
            page_size=args.page_size,
            max_total_tokens=args.max_total_tokens,
        )
        self.pool = KVPool(
            num_layers=self.cfg.num_hidden_layers,
            cell_dim=self.cfg.cell_dim,
            dtype=self.cfg.dtype,
            num_tokens=self.sizing.tokens(),
            page_size=args.page_size,
            max_running_requests=args.max_running_requests,
            context_length=args.context_length,
            alloc_order=args.kv_alloc_order,
            seed=args.random_seed,
            device=args.device,
        )
        log.info(
            "KV Cache is allocated. dtype: %s, #tokens: %d, KV size: %.2f GB",
            self.cfg.torch_dtype, self.pool.num_tokens, self.pool.bytes() / 1e9,
        )
        if args.device == "cpu":
            log.info("KV pool on 2 MiB pages: %.0f%% (transparent huge pages: %s)",
                     100 * self.pool.huge_page_bytes() / max(1, self.pool.bytes()), hostmem.thp_mode())
        self.kernel = load_kernel(args.kernel_dir, args.attention_backend, args.device)
        self.spec = None
        if args.speculative_algorithm:
            if args.speculative_num_draft_tokens < 1:
                raise ValueError("--speculative-num-draft-tokens must be at least 1")
            self.spec = SpecConfig(args.speculative_algorithm, args.speculative_num_draft_tokens,
                                   args.speculative_ngram_min_match_window_size, args.speculative_ngram_max_match_window_size)
            if args.enable_mixed_chunk:  # as SGLang's server_args does for NGRAM (the flag reads False from then on)
                log.warning("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
                args.enable_mixed_chunk = False
        self.metrics = EngineMetrics(args.model_path, self.pool.num_tokens) if args.enable_metrics else None
        # on by default, as SGLang's radix cache
        self.cache = None if args.disable_radix_cache else RadixCache(args.page_size, self.pool.free)
        self.scheduler = Scheduler(self.model, self.pool, self.kernel, args.chunked_prefill_size, args.max_running_requests,
                                   spec=self.spec, defrag=args.enable_kv_defrag, metrics=self.metrics,
                                   mixed_chunk=args.enable_mixed_chunk, cache=self.cache)

    def server_info(self) -> dict:
        return {
            **vars(self.args),
            "engine": ENGINE_NAME,
            "version": __version__,
            "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "max_total_num_tokens": self.pool.num_tokens,
            "max_req_input_len": min(self.args.context_length - 1, self.pool.num_tokens - 1),
            "kv_cache_dtype": self.cfg.torch_dtype,
            "kv_cache_bytes": self.pool.bytes(),
            "kv_cache_huge_page_bytes": self.pool.huge_page_bytes(),
            "kv_bytes_per_token": self.cfg.kv_bytes_per_token(),
            "weights_bytes": self.model.weights_bytes(),
            "memory_total_bytes": self.sizing.memory_total_bytes,
            "req_to_token_bytes": self.pool.req_to_token_bytes(),
            "model_config": self.cfg.to_dict(),
            "sampling": "greedy",
            "random_weights": True,
            "kv_defrag": {"moves": self.pool.defrag_moves, "misses": self.pool.defrag_misses},
            "malloc": getattr(self, "malloc", None),  # glibc's thresholds the server fixed (server.hold_freed_memory)
            "radix_cache": None if self.cache is None else {
                "cached_tokens": self.cache.total_tokens(), "evictable_tokens": self.cache.evictable_tokens(),
                "evicted_tokens": self.cache.evicted_tokens},
        }

    def validate(self, input_ids: list[int], max_new_tokens: int) -> str | None:
        n = len(input_ids)
        if n == 0:
            return "the request has no input tokens"
        if min(input_ids) < 0 or max(input_ids) >= self.cfg.vocab_size:
            return f"input token ids must lie in [0, {self.cfg.vocab_size})"
        if n >= self.args.context_length:
            return f"The input ({n} tokens) is longer than the model's context length ({self.args.context_length} tokens)."
        if n + 1 > self.pool.num_tokens:
            return f"The input ({n} tokens) does not fit in the KV cache pool ({self.pool.num_tokens} tokens)."
        if max_new_tokens < 1:
            return "sampling_params.max_new_tokens must be at least 1"
        return None
