#!/usr/bin/env python3
"""Decode step time and effective KV read bandwidth of the reference engine, per KV layout.

For each layout and context length: one request of L tokens in the pool (cells filled with
random values: decode cost does not depend on them), then timed decode steps of the engine's
model, and the attention kernel alone over all layers. Beside them, copy and read bandwidth
measured the same way (torch, same process, a buffer of the same size as the KV read per step).

    python bench/engine_decode.py [--lengths 4096 8192 16384 32768 65536] [--steps 20]

Effective KV read GB/s = L x kv_bytes_per_token / time. Goal (issue 3): the contiguous layout at
32k reaches at least 50% of the copy bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.attention import microbench  # noqa: E402
from longctx.attention.build import load_module  # noqa: E402
from longctx.refengine.kvpool import KVPool  # noqa: E402
from longctx.refengine.model import MLAModel  # noqa: E402
from longctx.refengine.modelconfig import ModelConfig  # noqa: E402

LAYOUTS = {  # name: (page_size, alloc_order, defragment after allocation)
    "page1-scattered": (1, "random", False),
    "page64-scattered": (64, "random", False),
    "page1-defrag": (1, "random", True),  # scattered, then --enable-kv-defrag's move
    "contiguous": (1, "sequential", False),
}


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    cfg = ModelConfig()
    model = MLAModel(cfg)
    kernel = load_module(ROOT / "kernels" / "reference" / "paged_mla_decode.py").paged_mla_decode
    kv_bytes = cfg.kv_bytes_per_token()
    print(f"model: {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads, latent {cfg.kv_lora_rank}+{cfg.qk_rope_head_dim}, "
          f"{cfg.torch_dtype}: {kv_bytes} KV bytes/token; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'L':>7} {'layout':>17} {'step ms':>8} {'attn ms':>8} {'KV MB':>7} {'GB/s attn':>9} {'GB/s step':>9} "
          f"{'copy GB/s':>9} {'read GB/s':>9} {'attn/copy':>9}")
    for length in a.lengths:
        nbytes = length * kv_bytes
        # the calibrate step's measurements (longctx.attention.microbench), on a buffer of the KV read's size
        copy_bw = 2 * nbytes / statistics.median(microbench.copy_seconds(nbytes, "cpu", lambda: None, a.steps)) / 1e9
        src = torch.randn(nbytes // 4)
        read_bw = nbytes / statistics.median(microbench.timed(lambda: src.sum(), lambda: None, a.steps)) / 1e9
        for name, (page_size, order, defrag) in LAYOUTS.items():
            pool = KVPool(cfg.num_hidden_layers, cfg.cell_dim, cfg.dtype, length + 1024, page_size, 1, length + 1024, order, seed=0)
            row, pages = pool.alloc_row(), []
            assert pool.reserve(row, pages, length)
            if defrag:
                assert pool.defragment(row, pages, length, length)
            pool.kv.normal_()
            ids = torch.tensor([65])
            step = median_time(lambda: model.decode(pool, [row], ids, [length - 1], kernel), a.steps)
            table = pool.page_table([row], [length])
            lens = torch.tensor([length])
            q = torch.randn(1, cfg.num_attention_heads, cfg.cell_dim)

            def attention():
                for layer in range(cfg.num_hidden_layers):
                    kernel(q, pool.kv[layer], table, lens, page_size, cfg.kv_lora_rank, cfg.sm_scale)

            attn = median_time(attention, a.steps)
            print(f"{length:>7} {name:>17} {step * 1e3:>8.2f} {attn * 1e3:>8.2f} {nbytes / 1e6:>7.1f} {nbytes / attn / 1e9:>9.2f} "
                  f"{nbytes / step / 1e9:>9.2f} {copy_bw:>9.2f} {read_bw:>9.2f} {nbytes / attn / 1e9 / copy_bw:>9.0%}")


if __name__ == "__main__":
    main()
