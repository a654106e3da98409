#!/usr/bin/env python3
"""The what-if grid's speed (issue 35, item 5): the study's example config (config/examples/kimi-k2.6-rtx-pro-6000.yaml)
has a `whatif` grid (max-running-requests 8 and 64, mem-fraction-static 0.85 and 0.94, 1 to 64 requests in flight
and 0.05 to 0.2 arrivals a second, 5k to 185k tokens, 256 output tokens); this simulates the whole grid for one configuration, as `longctx whatif` does
(longctx.analysis.whatif.grid, the frontier bisected), and prints the time, the events (output tokens) simulated and
the events per second.

    python bench/whatif_speed.py [--config config/examples/kimi-k2.6-rtx-pro-6000.yaml] [--repeat 3]

No measurement of that deployment is here, so the serving model's figures are assumed, of the order of Kimi K2.6
(61 layers, MLA, 32B active parameters) on 8 RTX PRO 6000 at TP8: prefill 40 us a token and 1.6 ns a token pair
(a 185k prompt about a minute), decode 30 ms a step plus 2 ms a request and 44 ns a context token (70,272 KV bytes
a token read at 1.6 TB/s), the pool as SGLang sizes it from 96 GB a GPU less 77.2 GB of weights and the rest
(186k tokens at 0.94, 63k at 0.85). The time depends on the events, not on these values' truth.

Goal: the whole grid in under a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx import config as lcfg  # noqa: E402
from longctx.analysis.simulate import Costs, Rules  # noqa: E402
from longctx.analysis.whatif import grid  # noqa: E402
from longctx.engines import get_adapter  # noqa: E402

COSTS = Costs(a=0.05, b=4e-5, c=1.6e-9, t0=0.03, beta=4.4e-8, r=0.002)
MEMORY = {"sizing_rule": "SGLang's (mem-fraction-static)", "memory_bytes": 96 * 10**9, "weights_bytes": 77_200_000_000,
          "cell_bytes": 70_272, "page_size": 1, "max_total_tokens": None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "config" / "examples" / "kimi-k2.6-rtx-pro-6000.yaml"))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    cfg = lcfg.load(a.config)
    name, conf = next(iter(cfg["configurations"].items()))
    said = get_adapter(conf["engine"]).scheduler_rules(conf["args"], {}, 210_000)
    rules = Rules(**{k: v for k, v in said.items() if k in Rules.__dataclass_fields__}, page=int(conf["args"].get("page-size", 1)))
    g = cfg["whatif"]
    slo = cfg["slo"]
    settings = len(g["max_running_requests"] or [1]) * len(g["chunked_prefill_size"] or [1]) * len(g["mem_fraction_static"] or [1])
    print(f"{a.config}: configuration {name}, {settings} settings x ({len(g['concurrency'])} concurrencies + {len(g['rates'])} rates) x "
          f"{len(g['lengths'])} lengths, {g['requests']} requests of {g['output_tokens']} output tokens each")
    times = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        out, events = grid(COSTS, rules, MEMORY, g, slo, 0.95)
        times.append(time.perf_counter() - t)
    for s in out:
        words = "; ".join((f"c={f['concurrency']}" if "concurrency" in f else f"{f['rate']:g}/s") + f": {f['max_length'] or 0:,}"
                          for f in s["frontier"])
        print(f"  max-running {s['max_running_requests']}, mem-fraction {s['mem_fraction_static']} "
              f"(pool {s.get('pool_tokens') or 0:,}): frontier {words}")
    best = min(times)
    print(f"grid: {statistics.median(times):.1f} s median of {a.repeat} (best {best:.1f} s), {events:,} events, "
          f"{events / best:,.0f} events/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
