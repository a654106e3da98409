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


PARTIAL_REASON = "connection reset by the server"


def write_data(out: Path, lengths=(1000, 4000, 16000, 64000), trials: int = 3, seed: int = 0, scale: float = 1.0,
               configs: dict | None = None, partial: dict | None = None, settings: dict | None = None) -> dict:
    """Write the data files under out/ (scale multiplies every time: a slower run); return their paths.
    partial: {(configuration, length): (ok, factor)}: a partial length, whose first `ok` trials succeed,
    `factor` times slower than the law, and whose other trials fail (PARTIAL_REASON). settings: the fits'."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    configs = configs or LAWS
    partial = partial or {}
    rows = []
    for name, (a, b, c, t0, beta) in configs.items():
        for L in lengths:
            ok, factor = partial.get((name, L), (trials, 1.0))
            for t in range(trials):
                noise = 1 + rng.normal(0, 0.02, 2)
                if t >= ok:
                    rows.append({"configuration": name, "engine": "reference", "length": L, "concurrency": 1, "trial": t,
                                 "request": 0, "status": "failed", "reason": PARTIAL_REASON, "kv_bytes_per_token": 160})
                    continue
                ttft = (a + b * L + c * L * L) * noise[0] * scale * factor
                tpot = (t0 + beta * L) * noise[1] * scale * factor
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
        "settings": {"shown": {"engine": "reference", "args.page-size": 1, "protocol.output_tokens": 32}, "hash": "5e771265"},
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
    fit_file(results, fits, provenance, settings={"bootstrap": 200, **(settings or {})})
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


# --- raw files as the sweep writes them, for reports of servers as they are -----------------------
# (data/raw/<configuration>/<length>.json, then the report rules' commands: run_report_chain)
RAW_LENGTHS = (512, 1024, 2048, 4096)
# A small Llama-architecture model with grouped-query attention, as a user's model.architecture gives it:
# K and V of 2 KV heads x 16 dims (64 hidden / 4 heads) x 2 layers in float32: 2 x 2 x 16 x 2 x 4 = 512 bytes
LLAMA_GQA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "torch_dtype": "float32"}
LLAMA_GQA_KV_BYTES = 512
# The reference engine's default model (config/longctx.yaml): MLA, (64 + 16) x 2 layers x 4 bytes = 640
REFMLA = {"hidden_size": 256, "intermediate_size": 512, "kv_lora_rank": 64, "num_attention_heads": 2,
          "num_hidden_layers": 2, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "torch_dtype": "float32", "v_head_dim": 32}
REFMLA_KV_BYTES = 640
MACHINE = {"host": "h", "cpu": "Test CPU", "logical_cpus": 4, "usable_cpus": 2, "memory_total_bytes": 2**34, "gpus": [],
           "os": "Linux"}
PROTOCOL = {"warmup": 1, "trials": 3, "output_tokens": 32, "flush_cache": True, "concurrency": [],
            "needle": {"enabled": False}}
CALIBRATION = {"devices": {"cpu": {"status": "ok", "name": "Test CPU", "copy_Bps": 1.6e10, "copy_Bps_median": 1.5e10,
                                   "read_Bps": 1.8e10, "matmul_flops": 8e10, "dtype": "float32", "matmul_size": 512,
                                   "copy_bytes": 2**26, "threads": 2}}}


def raw_trial(L: int, ttft: float, tpot: float, tokens: int = 32, telemetry: dict | None = None) -> dict:
    t = {"status": "ok", "ttft_s": ttft, "tpot_s": tpot, "decode_tok_s": 1 / tpot, "e2e_s": ttft + (tokens - 1) * tpot,
         "prompt_tokens": L, "completion_tokens": tokens}
    if telemetry:
        t["telemetry"] = telemetry
    return t


def write_raw_configuration(data: Path, name: str, engine: str, provenance: dict, kv_bytes: int,
                            lengths=RAW_LENGTHS, telemetry: dict | None = None, bandwidth: float = 8e9) -> None:
    """Every length of one configuration, three trials each: TTFT quadratic in L, decode reading
    kv_bytes per token of context at `bandwidth` bytes/s."""
    d = data / "raw" / name
    d.mkdir(parents=True, exist_ok=True)
    for L in lengths:
        ttft, tpot = 0.02 + 2e-5 * L + 4e-10 * L * L, 1e-3 + L * kv_bytes / bandwidth
        raw = {"format": "longctx.raw/1", "configuration": name, "engine": engine, "length": L, "status": "ok",
               "reason": None, "warmup": [], "trials": [raw_trial(L, ttft * (1 + 0.01 * i), tpot * (1 + 0.01 * i),
                                                                  telemetry=telemetry) for i in range(3)],
               "run_id": "r1", "spec_hash": "abc", "started_at": "2026-01-02T03:00:00+00:00",
               "finished_at": "2026-01-02T03:04:05+00:00", "provenance": provenance}
        (d / f"{L}.json").write_text(json.dumps(raw))


def external_cpu_gqa(data: Path, name: str = "llama_cpu") -> dict:
    """An external OpenAI-compatible server on this machine's CPU (a stock server: no version endpoint,
    /v1/models only, no flush, no KV pool report) serving a GQA Llama-like model; telemetry of the
    whole machine. Returns the configuration."""
    return external_server(data, name, {"name": "tiny-llama", "architecture": LLAMA_GQA,
                                        "kv_bytes_per_token": LLAMA_GQA_KV_BYTES}, LLAMA_GQA_KV_BYTES)


def external_server(data: Path, name: str, model: dict, kv_bytes: int, device: str | None = "cpu") -> dict:
    """An external OpenAI-compatible server serving `model` (the config's model section), measured with
    kv_bytes per token of context read per decode step; device as its configuration records it (None:
    a record from before devices were recorded). Returns the configuration."""
    from longctx.engines import get_adapter
    from longctx.specs.model import ModelNotDescribed

    try:
        spec, absent = get_adapter("external").model_spec(model, {}).to_dict(), None
    except ModelNotDescribed as exc:
        spec, absent = None, str(exc)
    exact = spec["kv_bytes_per_token"] if spec and (spec["exact"] or spec["kv_bytes_override"]) else None
    prov = {"protocol": PROTOCOL, "model": {**model, "kv_bytes_per_token": model.get("kv_bytes_per_token") or exact},
            "model_spec": spec, "model_spec_absent": absent, "args": {},
            "hardware": MACHINE, "kernel": None, "launch_command": None, "base_url": "http://127.0.0.1:8080",
            "server_pid": None, "startup_s": 0.01, "starts": 1, "health_path": "/v1/models", "api": "openai",
            "flush_path": None, "installed_version": None, "engine_version": None,
            "server_info": {"object": "list", "data": [{"id": model["name"], "object": "model", "owned_by": "llamacpp"}],
                            "endpoints": ["/v1/models"]},
            "kv_pool": {"tokens": None, "log": None},
            "telemetry": "psutil, no GPU telemetry: CPU utilisation (% of one core) and resident memory of the whole machine"}
    if device:
        prov["device"] = device
    window = {"cpu_util_pct_mean": 180.0, "rss_gb_mean": 9.5}
    write_raw_configuration(data, name, "external", prov, kv_bytes, telemetry={"prefill": window, "decode": window})
    conf = {"engine": "external", "api": "openai", "url": "http://127.0.0.1:8080", "description": "a stock OpenAI server"}
    return {"lengths": list(RAW_LENGTHS), "report": {"baseline": None, "plans": []}, "model": model,
            "configurations": {name: {**conf, **({"device": device} if device else {})}}}


def reference_default(data: Path, name: str = "page64", listen: str = "127.0.0.1") -> dict:
    """The embedded reference engine as config/longctx.yaml runs it (MLA on the CPU, SGLang's flags and
    /server_info, a KV pool sized by mem-fraction-static), listening on `listen` (server.host). Returns the
    configuration."""
    from longctx.engines import get_adapter

    args = {"context-length": 40960, "max-running-requests": 4, "max-total-tokens": 40960, "mem-fraction-static": 0.5,
            "page-size": 64}
    model = {"name": "refmla", "architecture": REFMLA, "kv_bytes_per_token": REFMLA_KV_BYTES}
    spec = get_adapter("reference").model_spec(model, args)
    info = {"attention_backend": "torch", "context_length": 40960, "device": "cpu", "endpoints": ["/server_info"],
            "max_total_num_tokens": 40960, "mem_fraction_static": 0.5, "memory_total_bytes": 24073084928, "page_size": 64,
            "weights_bytes": 4236800, "kv_bytes_per_token": REFMLA_KV_BYTES, "max_running_requests": 4,
            "req_to_token_bytes": 1310720, "version": "0.1.0"}
    prov = {"protocol": PROTOCOL, "model": model, "model_spec": spec.to_dict(), "model_spec_absent": None, "args": args,
            "hardware": MACHINE, "kernel": {"name": "paged_mla_decode_torch", "build_hash": "5bac83df9058e605"},
            "launch_command": ["python", "-m", "longctx.refengine", "--page-size", "64"], "base_url": "http://127.0.0.1:1",
            "server_pid": 5725, "startup_s": 1.5, "starts": 1, "listen": listen, "health_path": "/health", "api": "sglang",
            "flush_path": "/flush_cache", "installed_version": "0.1.0", "engine_version": "0.1.0", "server_info": info,
            "kv_pool": {"tokens": 40960, "log": {"line": "KV Cache is allocated. dtype: float32, #tokens: 40960, KV size: 0.03 GB",
                                                 "size_gb": 0.03, "tokens": 40960}},
            "telemetry": "psutil, no GPU telemetry: CPU utilisation (% of one core) and resident memory of the server's "
                         "process tree (pid 5725)"}
    window = {"cpu_util_pct_mean": 95.0, "rss_gb_mean": 0.8}
    write_raw_configuration(data, name, "reference", prov, REFMLA_KV_BYTES, telemetry={"prefill": window, "decode": window})
    return {"lengths": list(RAW_LENGTHS), "report": {"baseline": None, "plans": []},
            "configurations": {name: {"engine": "reference", "args": args, "description": "the reference engine's default"}}}


def run_report_chain(data: Path, out: Path, configuration: dict, calibration: dict | None = None,
                     templates: Path | None = None) -> dict:
    """The report rules' commands (rules/report.smk, bench/report_from_data.sh) over data/raw, in order;
    returns the paths of the PDF and the Markdown twin."""
    from longctx import cli

    templates = templates or Path(__file__).resolve().parents[1] / "templates"
    (data / "calibration.json").write_text(json.dumps(calibration if calibration is not None else CALIBRATION) + "\n")
    raws = sorted(str(p) for p in (data / "raw").glob("*/*.json"))
    f = {n: str(data / n) for n in ("results.csv", "provenance.json", "itl_depth.csv", "fits.json", "planner.json",
                                    "calibration.json")}
    style = str(templates / "plot.mplstyle")
    common = ["--results", f["results.csv"], "--fits", f["fits.json"], "--provenance", f["provenance.json"],
              "--itl-depth", f["itl_depth.csv"], "--planner", f["planner.json"], "--config-json", json.dumps(configuration)]
    steps = [
        ["aggregate", "--out-csv", f["results.csv"], "--out-provenance", f["provenance.json"], "--out-itl-depth",
         f["itl_depth.csv"], *raws],
        ["fit", "--results", f["results.csv"], "--provenance", f["provenance.json"], "--calibration", f["calibration.json"],
         "--settings", '{"bootstrap": 50}', "--out", f["fits.json"]],
        ["plan-memory", "--provenance", f["provenance.json"], "--results", f["results.csv"], "--fractions", "0.5,0.9",
         "--out", f["planner.json"]],
        ["plot", "--results", f["results.csv"], "--fits", f["fits.json"], "--style", style, "--itl-depth", f["itl_depth.csv"],
         "--provenance", f["provenance.json"], "--outdir", str(out / "figures")],
        ["plot-analysis", "--results", f["results.csv"], "--fits", f["fits.json"], "--planner", f["planner.json"],
         "--style", style, "--outdir", str(out / "figures")],
        ["render", "--template", str(templates / "longctx.tex.j2"), *common, "--out", str(out / "longctx.tex"),
         "--version-out", str(out / "version.json"), "--history-out", str(out / "history.json")],
        ["plot-history", "--history", str(out / "history.json"), "--style", style, "--outdir", str(out / "figures")],
        ["pdf", "--tex", str(out / "longctx.tex"), "--provenance", f["provenance.json"], "--version",
         str(out / "version.json"), "--out", str(out / "longctx.pdf")],
        ["markdown", "--template", str(templates / "longctx.md.j2"), "--version", str(out / "version.json"), *common,
         "--out", str(out / "longctx.md")],
    ]
    for argv in steps:
        assert cli.main(argv) in (0, None), argv[0]
    return {"pdf": out / "longctx.pdf", "md": out / "longctx.md", "data": data}


def build_report(paths: dict, out: Path, report_inputs: ReportInputs) -> None:
    """write_data's figures, then the .tex, the PDF and the Markdown twin under out, in this process as the report
    rules make them (a caller draws any other figures its inputs need, load or prefix, before)."""
    from longctx.report import latex, markdown
    from longctx.report.figures.analysis import plot_analysis
    from longctx.report.figures.history import plot_history
    from longctx.report.figures.measured import plot_all

    templates = Path(__file__).resolve().parents[1] / "templates"
    style = templates / "plot.mplstyle"
    plot_all(paths["results_csv"], paths["fits_json"], style, out / "figures", paths["itl_depth_csv"])
    plot_analysis(paths["results_csv"], paths["fits_json"], paths["planner_json"], style, out / "figures")
    latex.render_report(templates / "longctx.tex.j2", out / "longctx.tex", out / "version.json", report_inputs,
                        history_out=out / "history.json")
    plot_history(out / "history.json", style, out / "figures")
    latex.build_pdf(out / "longctx.tex", out / "longctx.pdf", paths["provenance_json"], out / "version.json")
    markdown.render_twin(templates / "longctx.md.j2", out / "longctx.md", out / "version.json", report_inputs)
