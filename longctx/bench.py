"""The sweep of one configuration: server up once, every length measured, server down.

Each length gives data/raw/<configuration>/<length>.json, written as soon as it is measured.
A failed length is a file with status "failed" and the reason (with the server log's path),
never a gap; the sweep goes on while the server lives.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import uuid
from pathlib import Path

import httpx

from . import provenance
from .client import request_body, stream_generate
from .config import digest
from .engines import EngineAdapter, get_adapter
from .analysis import fit_prefill, prefill_curve
from .modelspec import kv_bytes_per_token
from .process import ExternalServer, ManagedServer, ServerError, free_port
from .telemetry import Sampler, make_source, summarize
from .workload import prompt_ids

log = logging.getLogger("longctx.bench")
RAW_FORMAT = "longctx.raw/1"
# Thread limits a workflow job inherits (Snakemake sets them to the job's threads). The server's
# threading belongs to its configuration (engine flags or `env`), so they are not passed on.
THREAD_LIMIT_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def fetch_server_info(client: httpx.Client, base: str, api) -> dict:
    """Everything the server says about itself at the API's info endpoints, merged."""
    info: dict = {}
    for path in api.info_paths:
        try:
            r = client.get(base + path, timeout=10)
            if r.status_code == 200:
                body = r.json()
                for key, value in (body.items() if isinstance(body, dict) else [("value", body)]):
                    info.setdefault(key, value)
                info.setdefault("endpoints", []).append(path)
        except (httpx.HTTPError, ValueError):
            continue
    return info


def served_model(spec: dict) -> str:
    """The model name an OpenAI server expects in requests."""
    return str(spec["args"].get("served-model-name") or spec["model"].get("path") or spec["model"]["name"])


def kernel_manifest(spec: dict) -> dict | None:
    if not spec.get("kernel_build"):
        return None
    path = Path(spec["kernel_build"]) / "manifest.json"
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ServerError(f"kernel build {path} is missing or unreadable ({exc}); run the build_kernel rule") from None
    return {"name": m["name"], "build_hash": m["build_hash"], "sources": m["sources"]}


def _flush(client: httpx.Client, base: str, api) -> str | None:
    if not api.flush_path:
        return None
    try:
        r = client.post(base + api.flush_path, timeout=30)
        return None if r.status_code == 200 else f"flush_cache answered HTTP {r.status_code}"
    except httpx.HTTPError as exc:
        return f"flush_cache failed: {exc}"


def _spec_from_counters(before: dict | None, after: dict | None) -> dict:
    """Per-request acceptance from server-wide counters (vLLM): the deltas over one request."""
    if not before or not after:
        return {}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    drafts, proposed, accepted = d.get("drafts", 0), d.get("draft_tokens", 0), d.get("accepted_tokens", 0)
    if not drafts:
        return {}
    return {"spec_verify_ct": drafts, "spec_num_proposed_drafts": proposed, "spec_num_correct_drafts": accepted,
            "spec_accept_length": 1 + accepted / drafts, "spec_accept_rate": accepted / proposed if proposed else None,
            "spec_source": "metrics"}


def measure_length(client: httpx.Client, base: str, adapter: EngineAdapter, spec: dict, length: int, run_id: str,
                   telemetry=None, timeout_s: float | None = None) -> dict:
    """Warm-up and trials of one length; with a telemetry source, its samples over all of them
    and, per trial, their summaries over the prefill and the decode window."""
    timeout_s = timeout_s or spec["protocol"]["request_timeout_s"]
    if telemetry is None:
        return _requests(client, base, adapter, spec, length, run_id, timeout_s)
    with Sampler(telemetry, spec["telemetry"]["interval_s"]) as sampler:
        result = _requests(client, base, adapter, spec, length, run_id, timeout_s)
    for t in result["trials"]:
        t["telemetry"] = {
            "prefill": summarize(sampler.samples, t.get("t_sent"), t.get("t_first_token"), telemetry.metrics),
            "decode": summarize(sampler.samples, t.get("t_first_token"), t.get("t_last_token"), telemetry.metrics),
        }
    result["telemetry"] = {"source": telemetry.kind, "description": telemetry.describe(),
                           "interval_s": spec["telemetry"]["interval_s"],
                           "samples": [[round(t, 6), s] for t, s in sampler.samples]}
    return result


def request_timeout(proto: dict, history: list[tuple[int, float, float | None]], length: int) -> float:
    """Timeout for a request of `length` tokens: timeout_factor x its expected duration, predicted from
    (length, TTFT, TPOT) of the trials measured so far (the quadratic fit from three lengths on, a
    quadratic scaling of the longest before), never less than request_timeout_s."""
    floor = proto["request_timeout_s"]
    if not history:
        return floor
    lengths = [h[0] for h in history]
    longest = max(lengths)
    if len(set(lengths)) >= 3:
        ttft = float(prefill_curve(fit_prefill(lengths, [h[1] for h in history]), [length])[0])
    else:
        ttft = max(h[1] for h in history if h[0] == longest) * (length / longest) ** 2
    tpots = [h[2] for h in history if h[2]]
    decode = proto["output_tokens"] * max(tpots) * max(1.0, length / longest) if tpots else 0.0
    return max(floor, proto["timeout_factor"] * (ttft + decode))


def _requests(client: httpx.Client, base: str, adapter: EngineAdapter, spec: dict, length: int, run_id: str,
              timeout_s: float) -> dict:
    proto = spec["protocol"]
    name = spec["name"]
    api = adapter.api(spec)
    model = served_model(spec)
    warmup, trials = [], []
    total = proto["warmup"] + proto["trials"]
    for i in range(total):
        is_warmup = i < proto["warmup"]
        ids = prompt_ids(length, proto["seed"], f"{run_id}/{name}/{length}/{i}", tuple(proto["token_id_range"]))
        body = request_body(api.kind, ids, proto["output_tokens"], model)
        flush_error = _flush(client, base, api) if proto["flush_cache"] else None
        counters = adapter.spec_counters(client, base)
        summary = stream_generate(client, base + api.generate_path, body, timeout_s, api.kind).summary()
        summary["timeout_s"] = timeout_s
        if counters is not None and summary["spec_verify_ct"] is None:
            summary.update(_spec_from_counters(counters, adapter.spec_counters(client, base)))
        summary["flush_error"] = flush_error
        if summary["status"] == "ok" and summary["prompt_tokens"] != length:
            summary["status"] = "failed"
            summary["reason"] = f"the server counted {summary['prompt_tokens']} prompt tokens, expected {length}"
        if is_warmup:
            summary.pop("itl_s", None)
            warmup.append(summary)
            continue
        summary["trial"] = len(trials)
        trials.append(summary)
        if summary["status"] == "ok":
            log.info("%s L=%d trial %d/%d: TTFT %.3f s, decode %.1f tok/s", name, length, len(trials), proto["trials"],
                     summary["ttft_s"], summary["decode_tok_s"] or float("nan"))
        else:
            log.warning("%s L=%d trial %d/%d failed: %s", name, length, len(trials), proto["trials"], summary["reason"])
    ok = [t for t in trials if t["status"] == "ok"]
    status = "ok" if len(ok) == len(trials) else ("partial" if ok else "failed")
    reasons = sorted({t["reason"] for t in trials if t["status"] != "ok"})
    return {
        "status": status,
        "reason": "; ".join(reasons) or None,
        "warmup": warmup,
        "trials": trials,
    }


def run_configuration(spec: dict, outdir: str | Path, server_log: str | Path) -> int:
    """Measure every length of one configuration; returns the number of failed lengths."""
    outdir, server_log = Path(outdir), Path(server_log)
    adapter = get_adapter(spec["engine"])
    api = adapter.api(spec)
    name = spec["name"]
    run_id = uuid.uuid4().hex
    if adapter.managed:
        host = spec["server"]["host"]
        port = free_port(host)
        base = f"http://{host}:{port}"
        server_log.parent.mkdir(parents=True, exist_ok=True)
        server_log.unlink(missing_ok=True)
        version = adapter.installed_version(spec)
        cmd = adapter.launch_command(spec, host, port, version)
    else:
        base, version, cmd = spec["url"].rstrip("/"), None, None
    common = {
        "format": RAW_FORMAT,
        "configuration": name,
        "engine": adapter.name,
        "run_id": run_id,
        "spec_hash": digest(spec),
        "provenance": {
            "launch_command": cmd,
            "installed_version": version,
            "api": api.kind,
            "base_url": base,
            "server_log": str(server_log) if adapter.managed else None,
            "protocol": spec["protocol"],
            "model": {**spec["model"], "kv_bytes_per_token": kv_bytes_per_token(spec["model"])},
            "args": spec["args"],
            "git": provenance.git_info(),
            "packages": provenance.package_versions(),
            "hardware": provenance.hardware(),
            "run_started_at": provenance.now_iso(),
        },
    }
    statuses: dict[int, str] = {}
    failure: str | None = None

    def on_sigterm(signum, frame):  # Snakemake cancels jobs with SIGTERM: stop the server on the way out
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        common["provenance"]["kernel"] = kernel_manifest(spec)
        if adapter.managed:
            problem = adapter.preflight(spec, cmd)
            if problem:
                raise ServerError(problem)
            server = ManagedServer(cmd, server_log, env=spec.get("env"), stop_timeout_s=spec["server"]["stop_timeout_s"],
                                   unset=THREAD_LIMIT_VARS)
        else:
            server = ExternalServer(base)
        with server:
            timeout = spec.get("startup_timeout_s") or spec["server"]["startup_timeout_s"]
            startup_s = server.wait_healthy(base + api.health_path, timeout)
            log.info("%s: server up in %.1f s (pid %s, %s)", name, startup_s, server.pid, server_log if adapter.managed else base)
            with httpx.Client() as client:
                info = fetch_server_info(client, base, api)
                log_text = server_log.read_text(errors="replace") if adapter.managed else ""
                common["provenance"].update(
                    server_pid=server.pid,
                    startup_s=startup_s,
                    server_info=info,
                    engine_version=info.get("version") or version,
                    kv_pool={"tokens": adapter.pool_tokens(info), "log": adapter.kv_pool_from_log(log_text)},
                )
                source = make_source(server.pid, gpu_indices=spec["telemetry"]["gpus"]) if spec["telemetry"]["enabled"] else None
                common["provenance"]["telemetry"] = source.describe() if source else "off"
                history: list[tuple[int, float, float | None]] = []  # (length, TTFT, TPOT) of ok trials
                for length in spec["lengths"]:
                    started = provenance.now_iso()
                    timeout_s = request_timeout(spec["protocol"], history, length)
                    try:
                        result = measure_length(client, base, adapter, spec, length, run_id, source, timeout_s)
                        history += [(length, t["ttft_s"], t.get("tpot_s")) for t in result["trials"] if t["status"] == "ok"]
                    except Exception as exc:  # a bug or a surprise must not cost the lengths already measured
                        log.exception("%s L=%d: measurement failed", name, length)
                        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "warmup": [], "trials": []}
                    if not server.alive():
                        failure = server.died_message(f"the server died while measuring length {length}")
                        result.update(status="failed", reason=failure)
                    write_json(outdir / f"{length}.json", {**common, "length": length, **result,
                                                           "started_at": started, "finished_at": provenance.now_iso()})
                    statuses[length] = result["status"]
                    if failure:
                        break
    except ServerError as exc:
        failure = str(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)
    for length in spec["lengths"]:
        if length not in statuses:
            reason = f"not measured: {failure}"
            log.error("%s L=%d %s", name, length, reason)
            write_json(outdir / f"{length}.json", {**common, "length": length, "status": "failed", "reason": reason,
                                                   "warmup": [], "trials": [], "finished_at": provenance.now_iso()})
            statuses[length] = "failed"
    return sum(status == "failed" for status in statuses.values())
