"""Synthetic measurements for the report tests: results.csv, fits.json, provenance.json,
itl_depth.csv and planner.json as the workflow writes them, from known scaling laws, with strings
that need escaping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from longctx.analysis.aggregate import COLUMNS, ITL_DEPTH_COLUMNS
from longctx.analysis.fits import fit_file
from longctx.analysis.memory import plan_file
from longctx.report.context import ReportInputs

# Every character TeX or Markdown would read as markup, in the strings a user or a server can write.
NASTY = r"50% of {pool} & $x_1 #2 ~ ^3 \path <a|b> *c* [d] `e`"
LAWS = {  # configuration: (a, b, c, t0, beta)
    "base": (0.02, 2e-5, 4e-10, 2e-3, 4e-8),
    "fast_kv": (0.02, 2e-5, 2e-10, 2e-3, 1e-8),
}


def write_data(out: Path, lengths=(1000, 4000, 16000, 64000), trials: int = 3, seed: int = 0, scale: float = 1.0,
               configs: dict | None = None) -> dict:
    """Write the data files under out/ (scale multiplies every time: a slower run); return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    configs = configs or LAWS
    rows = []
    for name, (a, b, c, t0, beta) in configs.items():
        for L in lengths:
            for t in range(trials):
                noise = 1 + rng.normal(0, 0.02, 2)
                ttft = (a + b * L + c * L * L) * noise[0] * scale
                tpot = (t0 + beta * L) * noise[1] * scale
                rows.append({"configuration": name, "engine": "reference", "length": L, "concurrency": 1, "trial": t,
                             "request": 0, "status": "ok", "ttft_s": ttft, "tpot_s": tpot, "decode_tok_s": 1 / tpot,
                             "e2e_s": ttft + 31 * tpot, "prompt_tokens": L, "completion_tokens": 32,
                             "kv_bytes_per_token": 160, "kv_pool_tokens": 200000, "needle": "not applicable"})
    name = next(iter(configs))
    rows.append({"configuration": name, "engine": "reference", "length": lengths[-1], "concurrency": 1, "trial": trials,
                 "request": 0, "status": "failed", "reason": f"timeout: {NASTY}", "kv_bytes_per_token": 160})
    results = out / "results.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(results, index=False)
    hardware = {"host": "host_1", "cpu": "Test CPU (R) @ 3GHz", "logical_cpus": 4, "usable_cpus": 2,
                "memory_total_bytes": 16 * 2**30, "gpus": [], "os": "Linux-test"}
    prov = {"configurations": {n: {
        "engine": "reference", "engine_version": "0.1.0", "installed_version": "0.1.0", "spec_hash": "abc123",
        "args": {"page-size": 1, "weird-flag": NASTY},
        "launch_command": ["python", "-m", "longctx.refengine", "--page-size", "1", "--weird-flag", NASTY],
        "base_url": "http://127.0.0.1:1", "startup_s": 1.5, "starts": 1,
        "server_info": {"page_size": 1, "note": NASTY, "nested": {"x": 1}, "mem_fraction_static": 0.5,
                        "memory_total_bytes": 10**9, "weights_bytes": 468 * 10**6, "context_length": 65536},
        "kv_pool": {"tokens": 200000, "log": {"line": "KV Cache is allocated. #tokens: 200000, KV size: 0.03 GB"}},
        "kernel": {"name": "paged_mla_decode_torch", "build_hash": "feedbeef"},
        "hardware": hardware,
        "model": {"name": "refmla", "architecture": {
            "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 2, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16, "v_head_dim": 16, "intermediate_size": 128, "torch_dtype": "float32"}, "kv_bytes_per_token": 160},
        "protocol": {"warmup": 1, "trials": trials, "output_tokens": 32, "flush_cache": True},
        "telemetry": "psutil (server process tree: CPU, RSS)",
        "last_finished_at": "2026-01-02T03:04:05+00:00",
    } for n in configs}}
    provenance = out / "provenance.json"
    provenance.write_text(json.dumps(prov, indent=1, sort_keys=True) + "\n")
    fits = out / "fits.json"
    fit_file(results, fits, provenance, settings={"bootstrap": 200})
    planner = out / "planner.json"
    plan_file(provenance, results, planner, [0.5, 0.9])
    depth = out / "itl_depth.csv"
    d = [{"configuration": n, "length": 300, "status": "ok", "token": i + 1, "depth": 300 + i, "itl_s": 1e-3 + 1e-7 * i}
         for n in configs for i in range(40)]
    pd.DataFrame(d, columns=ITL_DEPTH_COLUMNS).to_csv(depth, index=False)
    return {"results_csv": results, "fits_json": fits, "provenance_json": provenance, "itl_depth_csv": depth,
            "planner_json": planner}


def inputs(paths: dict, **options) -> ReportInputs:
    """The report's inputs from write_data's paths; options: baseline, config."""
    return ReportInputs(results=paths["results_csv"], fits=paths["fits_json"], provenance=paths["provenance_json"],
                        itl_depth=paths["itl_depth_csv"], planner=paths["planner_json"], **options)


def config(configs=tuple(LAWS), baseline=None) -> dict:
    """A validated-looking configuration for the appendix, with a secret in a server's environment."""
    return {"lengths": [1000], "report": {"baseline": baseline, "plans": []},
            "configurations": {n: {"engine": "reference", "description": f"{n}: {NASTY}",
                                   "env": {"HF_TOKEN": "hf_secret_value"}} for n in configs}}
