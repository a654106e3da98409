#!/usr/bin/env python3
"""The kernel A/B against itself (A/A): what the micro-benchmark's paired interval says of no change, and its cost.

For each kernel kind (the PyTorch reference, kind torch; the CPU twin, kind native), the same sources are built
twice into two directories (longctx.attention.build.build; the twin's second build is the compiler cache's) and
timed against each other by longctx.attention.kernel_ab.alternate at the default config's shape and lengths
(config/longctx.yaml: 2 heads, cell 64 + 16, float32; 1k to 16k tokens), calls alternated in ABBA blocks. Per
length it prints B/A with its one-sided bounds at the family's level (m = the lengths), the verdict, the noise of
the pair differences (log sd) and the change found beyond the margin in 80% of reruns (detectable), with a block's
median call entering each pair (longctx.analysis.kernel_ab.STATISTIC) and, for comparison, the noise and detectable
change with its fastest call and with every call entering instead; then the wall time of the A/B (and of the two
builds). One CPU thread by default, as `longctx ab-kernel` (--threads 2 shows why).

    python bench/kernel_ab.py [--kinds torch native] [--lengths 1024 ... 16384] [--blocks 16] [--calls 5]
                              [--confidence 0.95] [--margin 0.05] [--threads 1] [--repeat 1] [--json out.json]

--repeat N runs the A/A N times over, to count how often a length is called slower (at most 1 - confidence of
the runs, over all lengths together).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.analysis import kernel_ab as verdicts  # noqa: E402
from longctx.attention import build as kernels, kernel_ab  # noqa: E402
from longctx.attention.shapes import Shape  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "config" / "longctx.yaml").read_text())
SOURCES = {name: entry for name, entry in CONFIG["kernels"].items()}
KIND_KERNEL = {entry["kind"]: name for name, entry in CONFIG["kernels"].items()}


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def built_twice(kind: str, workdir: Path) -> tuple[Path, Path, float]:
    name = KIND_KERNEL[kind]
    sources = [str(ROOT / s) for s in SOURCES[name]["sources"] if kind == "torch" or not s.endswith((".cu", "_binding.cpp"))]
    t = time.perf_counter()
    dirs = []
    for side in ("A", "B"):
        out = workdir / f"{name}-{side}"
        kernels.build(name, kind, sources, out, ())
        dirs.append(out)
    return dirs[0], dirs[1], time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", nargs="+", default=["torch", "native"], choices=["torch", "native"])
    ap.add_argument("--lengths", type=int, nargs="+", default=CONFIG["lengths"])
    ap.add_argument("--blocks", type=int, default=kernel_ab.BLOCKS_PER_SIDE, help="blocks per side and length")
    ap.add_argument("--calls", type=int, default=kernel_ab.CALLS_PER_BLOCK, help="timed calls per block")
    ap.add_argument("--confidence", type=float, default=verdicts.CONFIDENCE)
    ap.add_argument("--margin", type=float, default=verdicts.MARGIN)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1, as longctx ab-kernel's; 0: PyTorch's)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", help="write every run's raw blocks and verdicts here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    shape = Shape()  # the default config's model on one rank: 2 heads, 64 + 16, float32
    print(f"shape: {shape.describe()}; lengths {a.lengths}; {a.blocks} blocks a side of {a.calls} calls; "
          f"{torch.get_num_threads()} threads; confidence {a.confidence} over the {len(a.lengths)} lengths", flush=True)
    dump = []
    with tempfile.TemporaryDirectory(prefix="kernel_ab_") as tmp:
        for kind in a.kinds:
            dir_a, dir_b, build_s = built_twice(kind, Path(tmp))
            ka, kb = kernel_ab.load_pair(dir_a, dir_b)
            print(f"\n{kind} ({ka.name}, build {ka.build_hash} twice: {build_s:.1f} s)", flush=True)
            flagged = {"slower": 0, "regression": 0}
            for rep in range(a.repeat):
                result = kernel_ab.alternate(ka, kb, shape, a.lengths, a.blocks, a.calls)
                by = {st: verdicts.verdicts(result, a.confidence, a.margin, statistic=st) for st in verdicts.STATISTICS}
                median = by[verdicts.STATISTIC]
                flagged["slower"] += bool(median["slower"])
                flagged["regression"] += bool(median["regressions"])
                dump.append({"kind": kind, "run": rep, "result": result, "verdicts": by})
                each = ", ".join(f"{e['length']}: {e['wall_s']:.1f}" for e in result["lengths"])
                print(f"run {rep + 1}: A/B {result['wall_s']:.1f} s ({each})", flush=True)
                for i, row in enumerate(median["rows"]):
                    others = "; ".join(f"{st}: noise {_f(by[st]['rows'][i].get('noise'), '.3f')}, detectable "
                                       f"{_f(by[st]['rows'][i].get('detectable'), '.1%')}" for st in verdicts.STATISTICS
                                       if st != verdicts.STATISTIC)
                    print(f"  {verdicts.line(row)}; noise {_f(row.get('noise'), '.3f')} ({others})", flush=True)
            if a.repeat > 1:
                print(f"{kind}: some length called slower in {flagged['slower']} of {a.repeat} A/A runs, a regression "
                      f"in {flagged['regression']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(dump, indent=1) + "\n")


if __name__ == "__main__":
    main()
