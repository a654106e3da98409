"""Command-line flags of the reference engine, named as SGLang names them.

Kept free of heavy imports: the workflow checks configurations against this parser.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

API_KEY_VAR = "REFENGINE_API_KEY"  # the key, where --api-key is not given: longctx passes it so (EngineAdapter.with_api_key)
ALLOC_ORDERS = ("sequential", "random")
ATTENTION_BACKENDS = ("torch", "native")
SPECULATIVE_ALGORITHMS = ("NGRAM",)
DEFAULT_KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels" / "reference"
KERNEL_MODULE = "paged_mla_decode.py"
# The dtype of the weights and the KV cache where model.architecture gives no torch_dtype
# (longctx.refengine.modelconfig builds with it; the adapter describes the model with it).
DEFAULT_TORCH_DTYPE = "float32"


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser_class(prog="python -m longctx.refengine", description="The longctx reference engine: a small MLA decoder behind SGLang's HTTP API.")
    p.add_argument("--model-path", default="refmla", help="model name reported by the server (weights are random)")
    p.add_argument("--json-model-override-args", default="{}", help="JSON of architecture fields (DeepSeek-V3 names)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--context-length", type=int, default=65536)
    p.add_argument("--mem-fraction-static", type=float, default=0.5)
    p.add_argument("--memory-total-gb", type=float, default=None, help="memory free before loading, for pool sizing (default: detected)")
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=8)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--enable-mixed-chunk", action="store_true",
                   help="mix the running requests' decode into each prefill chunk's batch (SGLang's flag); without it a "
                        "prefill, every chunk of it, runs before any decode step, as in SGLang")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="torch",
                   help="decode attention: torch, the PyTorch kernel in --kernel-dir; native, the compiled kernel "
                        "built into --kernel-dir (its CPU twin on a CPU, its CUDA kernel on a GPU)")
    p.add_argument("--kernel-dir", default=str(DEFAULT_KERNEL_DIR),
                   help=f"a kernel build (manifest.json) or a directory holding {KERNEL_MODULE}")
    p.add_argument("--kv-alloc-order", choices=ALLOC_ORDERS, default="sequential")
    p.add_argument("--enable-kv-defrag", action="store_true",
                   help="after prefill, move each request's cells into one run of pages sized for its whole output")
    p.add_argument("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=4, help="drafts verified per step")
    p.add_argument("--speculative-ngram-min-match-window-size", type=int, default=1)
    p.add_argument("--speculative-ngram-max-match-window-size", type=int, default=12)
    p.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="no prefix cache: every prompt is prefilled in full (by default, as in SGLang, a radix tree "
                        "of page-aligned prefixes serves the cached part of a prompt)")
    p.add_argument("--enable-cache-report", action="store_true",
                   help="report the cached prompt tokens in the OpenAI usage (prompt_tokens_details.cached_tokens), "
                        "as SGLang's flag does")
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--api-key", default=os.environ.get(API_KEY_VAR) or None,
                   help="requests must carry it as a Bearer token, as SGLang's flag asks: every path but /health*, "
                        f"/ready* and /metrics* answers 401 without it (default: ${API_KEY_VAR}, which no other user "
                        "of the machine can read, where a command line is in everyone's process list)")
    p.add_argument("--num-threads", type=int, default=None,
                   help="torch CPU threads (default: the usable CPUs but one, left to the client that times the requests)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--log-level", default="info")
    return p


