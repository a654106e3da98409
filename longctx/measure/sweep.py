"""The sweep of one configuration: server up once, every length measured, server down.

Each length gives data/raw/<configuration>/<length>.json, written as soon as it is measured.
A failed length is a file with status "failed" and the reason (with the server log's path),
never a gap; the sweep goes on while the server lives.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import threading
import time
import uuid
from typing import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from . import provenance
from .client import timed_client
from ..core.errors import ConfigError
from ..core.hashing import digest
from ..engines import ConfigurationSpec, EngineAdapter, get_adapter
from ..specs.model import ModelNotDescribed, ModelSpecError
from ..specs.pool import observed_pool
from .process import ExternalServer, ManagedServer, NoHealthPath, PortTaken, ServerError, free_port, pid_file, reap_stray
from .telemetry import Sampler, summarize, telemetry_source
from .load import LOAD_FORMAT, run_load
from .prefix import PREFIX_FORMAT, cache_facts, run_prefix
from .needle import probe as needle_probe
from .progress import EVERY_S, Progress, fitted
from .prompts import Prompter, PromptError, check_counts, probe as prompt_probe, tokenizer_path

log = logging.getLogger("longctx.measure.sweep")
# One line per bring-up attempt and per length: what `longctx bench --log` also shows on the console
progress = logging.getLogger("longctx.progress")
RAW_FORMAT = "longctx.raw/1"
PORT_ATTEMPTS = 5  # launches on fresh ports when another process took the chosen one
HEALTH_TIMEOUT_S = 10.0  # what a server answering its health path after a failed length must answer within
# Thread limits a workflow job inherits (Snakemake sets them to the job's threads). The server's
# threading belongs to its configuration (engine flags or `env`), so they are not passed on.
THREAD_LIMIT_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def writable(directory: Path | None) -> None:
    """Create directory and write a file in it, or say at once, in words, why that cannot be done."""
    if directory is None:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".longctx-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write to {directory} ({exc.strerror or exc}): the bench keeps every length it measures "
                          "there, so nothing was started; make it writable, or free space, and run again") from None


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


def server_env(spec: ConfigurationSpec) -> dict[str, str]:
    """The configuration's environment variables, plus LONGCTX_KERNEL_DIR (the absolute path of the
    kernel build it uses) for any engine: a server patched to run the kernel under study finds it there."""
    env = dict(spec.env or {})
    if spec.kernel_build:
        env.setdefault("LONGCTX_KERNEL_DIR", str(Path(spec.kernel_build).resolve()))
    return env


def resolved_model_spec(adapter: EngineAdapter, spec: ConfigurationSpec) -> tuple[dict | None, str | None]:
    """The architecture as this configuration serves it (TP size, KV dtype, model.kv_bytes_per_token),
    for the analysis, or None and why: the config describes no model, or one the spec cannot
    (then model.kv_bytes_per_token, if given, is the only KV figure). A description that is wrong
    (a missing file, a field an MHA/GQA/MLA model needs) is a ConfigError."""
    try:
        return adapter.model_spec(spec.model, spec.args).to_dict(), None
    except ModelNotDescribed as exc:
        return None, str(exc)
    except ModelSpecError as exc:
        if spec.model.get("kv_bytes_per_token"):
            return None, str(exc)
        raise ConfigError(str(exc)) from None


def model_provenance(adapter: EngineAdapter, spec: ConfigurationSpec) -> dict:
    """The provenance's model, model_spec and model_spec_absent: the config's model with the KV figure the spec
    derives where it describes the model exactly (resolved_model_spec)."""
    mspec, absent = resolved_model_spec(adapter, spec)
    exact = mspec["kv_bytes_per_token"] if mspec and (mspec["exact"] or mspec["kv_bytes_override"]) else None
    return {"model": {**spec.model, "kv_bytes_per_token": spec.model.get("kv_bytes_per_token") or exact},
            "model_spec": mspec, "model_spec_absent": absent}


def kernel_manifest(spec: ConfigurationSpec) -> dict | None:
    if not spec.kernel_build:
        return None
    path = Path(spec.kernel_build) / "manifest.json"
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ServerError(f"kernel build {path} is missing or unreadable ({exc}); run the build_kernel rule") from None
    return {"name": m["name"], "build_hash": m["build_hash"], "sources": m["sources"]}


def _flush(client: httpx.Client, base: str, api, timeout_s: float) -> str | None:
    if not api.flush_path:
        return None
    try:
        r = client.post(base + api.flush_path, timeout=min(30.0, timeout_s))
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


def measure_length(session: "Session", spec: ConfigurationSpec, length: int, run_id: str,
                   timeout_s: float | None = None, tracker: Progress | None = None) -> dict:
    """Warm-up and trials of one length; with the session's telemetry source, its samples over all
    of them and, per trial, their summaries over the prefill and the decode window. Each warm-up and
    trial done is told to tracker (a progress line)."""
    timeout_s = timeout_s or spec.protocol["request_timeout_s"]
    telemetry = session.source
    if telemetry is None:
        return _requests(session, spec, length, run_id, timeout_s, tracker)
    with Sampler(telemetry, spec.telemetry["interval_s"]) as sampler:
        result = _requests(session, spec, length, run_id, timeout_s, tracker)
    for t in result["trials"]:
        t["telemetry"] = {
            "prefill": summarize(sampler.samples, t.get("t_sent"), t.get("t_first_token"), telemetry.metrics),
            "decode": summarize(sampler.samples, t.get("t_first_token"), t.get("t_last_token"), telemetry.metrics),
        }
    result["telemetry"] = {"source": telemetry.kind, "description": telemetry.describe(),
                           "interval_s": spec.telemetry["interval_s"],
                           "samples": [[round(t, 6), s] for t, s in sampler.samples]}
    return result


def request_timeout(proto: dict, history: list[tuple[int, float, float | None]], length: int) -> float:
    """Timeout for a request of `length` tokens: timeout_factor x its expected duration, predicted from
    (length, TTFT, TPOT) of the trials measured so far (the fits of progress.fitted from three lengths
    on, as the progress lines' time left; before, the longest length's TTFT scaled quadratically and
    its TPOT linearly), never less than request_timeout_s."""
    floor = proto["request_timeout_s"]
    if not history:
        return floor
    predicted = fitted(history, [length])
    if predicted is not None:
        ttft, tpot = float(predicted[0][0]), float(predicted[1][0])
    else:
        longest = max(h[0] for h in history)
        ttft = max(h[1] for h in history if h[0] == longest) * (length / longest) ** 2
        tpots = [h[2] for h in history if h[2]]
        tpot = max(tpots) * max(1.0, length / longest) if tpots else 0.0
    return max(floor, proto["timeout_factor"] * (ttft + proto["output_tokens"] * tpot))


def _requests(session: "Session", spec: ConfigurationSpec, length: int, run_id: str, timeout_s: float,
              tracker: Progress | None) -> dict:
    proto = spec.protocol
    name = spec.name
    client, base, adapter, api, prompter = session.client, session.base, session.adapter, session.api, session.prompter
    warmup, trials = [], []
    total = proto["warmup"] + proto["trials"]
    for i in range(total):
        is_warmup = i < proto["warmup"]
        body = prompter.body(length, f"{run_id}/{name}/{length}/{i}", proto["output_tokens"])
        flush_error = _flush(client, base, api, timeout_s) if proto["flush_cache"] else None
        counters = adapter.spec_counters(client, base)
        summary = prompter.generate(client, base + api.generate_path, body, timeout_s, length)
        summary["timeout_s"] = timeout_s
        if counters is not None and summary["spec_verify_ct"] is None:
            summary.update(_spec_from_counters(counters, adapter.spec_counters(client, base)))
        summary["flush_error"] = flush_error
        check_counts(summary, length, proto["output_tokens"])
        if is_warmup:
            summary.pop("itl_s", None)
            warmup.append(summary)
        else:
            summary["trial"] = len(trials)
            trials.append(summary)
        if tracker is not None:
            tracker.request(is_warmup, len(warmup) if is_warmup else len(trials),
                            proto["warmup"] if is_warmup else proto["trials"], summary)
    batches = [_batch(session, spec, length, run_id, timeout_s, c, b)
               for c in proto["concurrency"] for b in range(proto["trials"])]
    every = trials + [r for batch in batches for r in batch["requests"]]
    ok = [t for t in every if t["status"] == "ok"]
    status = "ok" if len(ok) == len(every) else ("partial" if ok else "failed")
    reasons = sorted({t["reason"] for t in every if t["status"] != "ok"})
    failed_warmups = [w for w in warmup if w["status"] != "ok"]
    if failed_warmups:  # said beside the trials' reasons: a length measured after a failed warm-up is not cold-start clean
        reasons.append(f"{len(failed_warmups)} of {len(warmup)} warm-up request(s) failed: {failed_warmups[0]['reason']}")
    return {
        "status": status,
        "reason": "; ".join(reasons) or None,
        "warmup_failed": len(failed_warmups),
        "warmup": warmup,
        "trials": trials,
        "batches": batches,
    }


def _needle(session: "Session", spec: ConfigurationSpec, length: int, timeout_s: float) -> dict | None:
    cfg = spec.protocol["needle"]
    if not cfg["enabled"]:
        return None
    result = needle_probe(session.client, session.base, session.api.kind, session.adapter.served_model(spec), length, cfg,
                          timeout_s, session.random_weights)
    log.info("%s L=%d needle: %s", spec.name, length, result["status"])
    return result


def _batch(session: "Session", spec: ConfigurationSpec, length: int, run_id: str, timeout_s: float,
           concurrency: int, index: int) -> dict:
    """`concurrency` requests of `length` tokens sent together: each one's figures, and the batch's
    output rate (all output tokens over the span from the first send to the last token)."""
    proto, api, name, client, base = spec.protocol, session.api, spec.name, session.client, session.base
    bodies = [session.prompter.body(length, f"{run_id}/{name}/{length}/c{concurrency}/{index}/{j}", proto["output_tokens"])
              for j in range(concurrency)]
    if proto["flush_cache"]:
        _flush(client, base, api, timeout_s)
    start = threading.Barrier(concurrency)

    def one(body: bytes) -> dict:
        start.wait()
        return session.prompter.generate(client, base + api.generate_path, body, timeout_s, length)

    with ThreadPoolExecutor(concurrency) as pool:
        requests = [check_counts(s, length, proto["output_tokens"]) for s in pool.map(one, bodies)]
    for j, r in enumerate(requests):
        r.update(concurrency=concurrency, batch=index, request=j, timeout_s=timeout_s)
    ok = [r for r in requests if r["status"] == "ok"]
    aggregate = {"ok": len(ok), "requests": concurrency}
    if ok:
        span = max(r["t_last_token"] for r in ok) - min(r["t_sent"] for r in ok)
        aggregate.update(output_tok_s=sum(r["completion_tokens"] for r in ok) / span if span > 0 else None,
                         ttft_max_s=max(r["ttft_s"] for r in ok))
        for r in requests:
            r["batch_output_tok_s"] = aggregate["output_tok_s"]
    log.info("%s L=%d %d at once, batch %d: %d ok, %s tok/s overall", name, length, concurrency, index + 1, len(ok),
             f"{aggregate.get('output_tok_s') or float('nan'):.1f}")
    return {"concurrency": concurrency, "batch": index, "requests": requests, "aggregate": aggregate}


def measure_itl_depth(session: "Session", spec: ConfigurationSpec, run_id: str, history: list) -> dict:
    """One request of itl_depth.length prompt tokens decoding output_tokens: the gap before each
    token against the KV depth it was decoded at (prompt + tokens before it)."""
    depth = spec.protocol["itl_depth"]
    length, n = depth["length"], depth["output_tokens"]
    timeout = request_timeout({**spec.protocol, "output_tokens": n}, history, length)
    body = session.prompter.body(length, f"{run_id}/{spec.name}/itl-depth", n)
    s = session.prompter.generate(session.client, session.base + session.api.generate_path, body, timeout, length)
    itl = s.pop("itl_s", None) or []
    check_counts(s, length, n)
    return {"kind": "itl_depth", "length": length, "output_tokens": n, **s,
            "itl_s": itl, "depth": [length + 1 + i for i in range(len(itl))]}


class LengthRefused(Exception):
    """A length the server said, at start-up, that it cannot hold."""


class FatalServerError(ServerError):
    """A server that no restart can bring up (its engine rejects the command line)."""


class Session:
    """The configuration's server: started when first needed, restarted on a fresh port after it
    died or hung (at most server.max_restarts times), stopped by its process group at the end."""

    def __init__(self, adapter: EngineAdapter, spec: ConfigurationSpec, server_log: Path, provenance_: dict):
        self.adapter, self.spec, self.log_path, self.prov = adapter, spec, server_log, provenance_
        self.api = adapter.api(spec)
        # the health probes in order (the first that answers 200 is used), or the configured path alone
        self.health_paths = (spec.server["health_path"],) if spec.server.get("health_path") else self.api.health_paths
        self.health_path: str | None = None  # the one chosen at start-up
        self.version = adapter.installed_version(spec) if adapter.managed else None
        self.server = None
        self.base: str | None = None
        self.source = None
        self.random_weights = bool(spec.model.get("random_weights"))
        self.starts = 0
        self.preflight_done = False
        tokenizer_path(spec.model)  # a model.tokenizer that is not there is a config error, before any server starts
        self.prompter: Prompter | None = None  # decided by the prompt probe once the server first answers
        self.client = timed_client()
        self.prov.update(installed_version=self.version, api=self.api.kind, flush_path=self.api.flush_path,
                         server_log=str(server_log) if adapter.managed else None, starts=0)
        if adapter.managed:  # a server an earlier run of this configuration left behind (its bench was killed)
            stray = reap_stray(pid_file(server_log), spec.server["stop_timeout_s"])
            if stray:
                progress.warning("%s: %s", spec.name, stray)
                self.prov["stray_server"] = stray

    def up(self) -> None:
        if self.server is not None and self.server.alive():
            return
        self.down()
        limit = 1 + self.spec.server["max_restarts"]
        last = None
        while self.starts < limit:
            self.starts += 1
            progress.info("%s: %s (attempt %d of at most %d)", self.spec.name, "starting the server" if self.adapter.managed
                          else f"connecting to the external server at {self.spec.url}", self.starts, limit)
            try:
                self._start()
                self._probe()
                return
            except (FatalServerError, NoHealthPath):
                raise
            except ServerError as exc:
                last = str(exc)
                progress.warning("%s: start %d of at most %d failed: %s", self.spec.name, self.starts, limit, last)
                self.down()
        raise ServerError(f"the server could not be (re)started after {self.starts} starts; last: {last}")

    def _start(self) -> None:
        a, spec = self.adapter, self.spec
        timeout = spec.startup_timeout_s or spec.server["startup_timeout_s"]
        if a.managed:
            cmd, startup_s = self._start_managed(timeout)
        else:
            cmd, self.base = None, spec.url.rstrip("/")
            self.server = ExternalServer(self.base)
            try:
                self.health_path, startup_s = self.server.wait_ready(self.health_paths, timeout)
            except ServerError as exc:  # longctx cannot start it: a restart would only wait again
                raise FatalServerError(f"the external server of configuration {spec.name!r} (configurations."
                                       f"{spec.name}.url: {spec.url}) is not ready: {exc}") from None
        progress.info("%s: server up in %.1f s (pid %s, %s), health on %s", spec.name, startup_s, self.server.pid,
                 self.log_path if a.managed else self.base, self.health_path)
        info = fetch_server_info(self.client, self.base, self.api)
        log_text = self.log_path.read_text(errors="replace") if a.managed else ""
        tele = telemetry_source(a, spec, self.server.pid, self.base)
        self.source = tele.source
        self.random_weights = bool(spec.model.get("random_weights") or info.get("random_weights"))
        self.prov.update(
            launch_command=cmd, base_url=self.base, server_pid=self.server.pid, startup_s=startup_s, starts=self.starts,
            health_path=self.health_path,
            server_info=info, engine_version=info.get("version") or self.version,
            kv_pool={"tokens": a.pool_tokens(info), "log": a.kv_pool_from_log(log_text), "budget": a.kv_budget(spec)},
            telemetry=tele.description, telemetry_scope=tele.scope(), device=tele.device,
        )

    def _probe(self) -> None:
        """Once per sweep: how this server takes prompts and counts tokens (measure.prompts)."""
        if self.prompter is not None:
            return
        spec = self.spec
        try:
            plan, self.prompter = prompt_probe(self.client, self.base + self.api.generate_path, self.api.kind,
                                               self.adapter.served_model(spec), spec.protocol, spec.model,
                                               spec.protocol["request_timeout_s"])
        except PromptError as exc:  # the same server would answer the same: no restart helps
            raise FatalServerError(f"the prompt probe of configuration {spec.name!r} failed: {exc}") from None
        self.prov["prompt_probe"] = plan.to_dict()
        progress.info("%s: prompt probe: %s", spec.name, plan.describe())

    def _start_managed(self, timeout: float) -> tuple[list[str], float]:
        """Launch on a free port; when another process takes that port first (another bench job
        on the node), launch again on another, up to PORT_ATTEMPTS times: that is not a restart."""
        a, spec = self.adapter, self.spec
        host = spec.server["host"]
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port(host)
            self.base = f"http://{host}:{port}"
            cmd = a.launch_command(spec, host, port, self.version)
            if not self.preflight_done:
                problem = a.preflight(spec, cmd)
                if problem:
                    raise FatalServerError(problem)
                self.preflight_done = True
            self.server = ManagedServer(cmd, self.log_path, env=server_env(spec),
                                        stop_timeout_s=spec.server["stop_timeout_s"], unset=THREAD_LIMIT_VARS)
            self.server.start()
            try:
                self.health_path, startup_s = self.server.wait_ready(self.base, self.health_paths, timeout, port=port)
                return cmd, startup_s
            except PortTaken as exc:
                log.warning("%s: %s; launching on another port (%d of %d)", spec.name, exc, attempt, PORT_ATTEMPTS)
        raise ServerError(f"every one of {PORT_ATTEMPTS} ports was taken by another process before the server bound it")

    def refuses(self, length: int, output_tokens: int) -> str | None:
        """Why a request of `length` prompt and output_tokens output tokens cannot be served, from what the
        server reported at start-up (its context length, its KV pool's tokens), or None."""
        info = self.prov.get("server_info") or {}
        models = info.get("data") if isinstance(info.get("data"), list) else []
        try:
            context = self.adapter.context_length(self.spec.args, info)
        except (TypeError, ValueError):
            context = None
        context = context or next((m.get("max_model_len") for m in models if isinstance(m, dict) and m.get("max_model_len")), None)
        pool, _ = observed_pool(self.prov)
        need = length + output_tokens
        if context and need > int(context):
            return (f"not sent: {length} prompt and {output_tokens} output tokens exceed the context length of "
                    f"{int(context)} tokens the server reports")
        if pool and need > int(pool):
            return (f"not sent: {length} prompt and {output_tokens} output tokens exceed the {int(pool)} tokens of the KV "
                    "pool the server allocated")
        return None

    def alive(self) -> bool:
        return self.server is not None and self.server.alive()

    def healthy(self) -> bool:
        """Alive and answering the health path chosen at start-up within a few seconds."""
        if not self.alive():
            return False
        try:
            return self.client.get(self.base + self.health_path, timeout=HEALTH_TIMEOUT_S).status_code == 200
        except httpx.HTTPError:
            return False

    def fault(self, during: str, then: str) -> str:
        """Why a server that failed its health check `during` something failed (it died, or it stopped
        answering its health path), in words with its log's path; the server is stopped, so that `then`
        (the next length, the next point) starts it again."""
        if self.alive():
            reason = (f"the server stopped answering {self.health_path} {during}; it is restarted for {then}; "
                      f"server log: {self.log_path}")
        else:
            reason = self.server.died_message(f"the server died {during}")
        self.down()
        return reason

    def down(self) -> None:
        if self.server is not None and self.adapter.managed:
            self.server.stop()
        self.server = None

    def close(self) -> None:
        self.client.close()  # first: a server waits for its open responses before it exits
        self.down()


FORMATS = {"load": LOAD_FORMAT, "prefix": PREFIX_FORMAT}
# what a workloads file holds when nothing of it was measured
EMPTY_WORKLOADS = {"load": {"workloads": []}, "prefix": {"points": [], "conversations": []}}


def resume_key(spec: ConfigurationSpec, kernel: dict | None, version: str | None) -> str:
    """What a reused measurement must share with this run: the spec (lengths aside), the kernel
    build and the engine version."""
    return digest({"spec": {k: v for k, v in spec.to_dict().items() if k not in ("lengths", "load", "prefix")},
                   "kernel": kernel and kernel["build_hash"], "version": version})


def run_configuration(spec: ConfigurationSpec, outdir: str | Path, server_log: str | Path,
                      resume_dir: str | Path | None = None, progress_every_s: float = EVERY_S) -> int:
    """Measure every length of one configuration; returns the number of failed lengths.

    With resume_dir, every measured length is also kept there, and a later run reuses the ones
    that succeeded under the same resume_key instead of measuring them again (an interrupted
    sweep resumes where it stopped). Progress (measure.progress) goes to the longctx.progress logger:
    a line per warm-up and trial, at most one every progress_every_s seconds, and every length's."""
    outdir, server_log = Path(outdir), Path(server_log)
    resume_dir = Path(resume_dir) if resume_dir else None
    tracker = Progress(spec.name, spec.lengths, spec.protocol, progress_every_s)
    adapter = get_adapter(spec.engine)
    for where in (outdir, resume_dir, server_log.parent if adapter.managed else None):
        writable(where)  # before any server starts: nothing measured may be lost for want of a place to keep it
    name = spec.name
    run_id = uuid.uuid4().hex
    if adapter.managed:
        server_log.parent.mkdir(parents=True, exist_ok=True)
        server_log.unlink(missing_ok=True)
    prov = {
        "protocol": spec.protocol,
        **model_provenance(adapter, spec),
        "args": spec.args,
        "git": provenance.git_info(),
        "packages": provenance.package_versions(),
        "hardware": provenance.hardware(),
        "run_started_at": provenance.now_iso(),
    }
    common = {"format": RAW_FORMAT, "configuration": name, "engine": adapter.name, "run_id": run_id,
              "spec_hash": digest(spec.to_dict()), "provenance": prov}
    statuses: dict[int, str] = {}
    failure: str | None = None

    def on_sigterm(signum, frame):  # Snakemake cancels jobs with SIGTERM: stop the server on the way out
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGHUP (a closed terminal or ssh session) is a SIGTERM too
    previous = {sig: signal.signal(sig, on_sigterm) for sig in (signal.SIGTERM, signal.SIGHUP)}
    session = None
    try:
        prov["kernel"] = kernel_manifest(spec)
        session = Session(adapter, spec, server_log, prov)
        key = resume_key(spec, prov["kernel"], session.version)
        history: list[tuple[int, float, float | None]] = []  # (length, TTFT, TPOT) of ok trials
        kept_before = {i: kept for i, length in enumerate(spec.lengths) if (kept := _resumable(resume_dir, length, key))}
        for i, kept in kept_before.items():
            tracker.known(i, _samples(spec.lengths[i], kept))
        for i, length in enumerate([] if spec.adaptive else spec.lengths):
            tracker.begin(i)
            kept = kept_before.get(i)
            if kept:
                write_json(outdir / f"{length}.json", {**kept, "resumed": True})
                statuses[length] = kept["status"]
                history += _samples(length, kept)
                tracker.end(f"measured before (run {kept['run_id']}), reused", session.alive())
                continue
            started = provenance.now_iso()
            result = _measure_at(session, spec, length, run_id, history, tracker)
            record = {**common, "provenance": copy.deepcopy(prov), "length": length, **result, "resume_key": key,
                      "started_at": started, "finished_at": provenance.now_iso()}
            if resume_dir:
                write_json(resume_dir / f"{length}.json", record)
            write_json(outdir / f"{length}.json", record)
            statuses[length] = result["status"]
            tracker.end(_length_line(result), session.alive())
        if spec.adaptive:
            _sweep_adaptive(session, spec, run_id, common, prov, key, outdir, resume_dir, history, statuses, tracker)
        depth = spec.protocol["itl_depth"]
        if depth["length"]:
            session.up()
            write_json(outdir / "itl_depth.json", {**common, "provenance": copy.deepcopy(prov),
                                                   **measure_itl_depth(session, spec, run_id, history)})
        if spec.load:
            _measure_load(session, spec, run_id, history, common, prov, key, outdir, resume_dir)
        if spec.prefix:
            _measure_prefix(session, spec, run_id, history, common, prov, key, outdir, resume_dir)
        tracker.finish()
    except ServerError as exc:
        failure = str(exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if session is not None:
            session.close()
    if spec.protocol["itl_depth"]["length"] and not (outdir / "itl_depth.json").exists():
        write_json(outdir / "itl_depth.json", {**common, "status": "failed", "reason": f"not measured: {failure}",
                                               "length": spec.protocol["itl_depth"]["length"], "itl_s": [], "depth": []})
    # the workflow's outputs all the same: the analysis reads that there is nothing, or why not
    for what, settings in (("load", spec.load), ("prefix", spec.prefix)):
        empty = EMPTY_WORKLOADS[what]
        if not settings:
            write_json(outdir / f"{what}.json", {**common, "format": FORMATS[what], "status": "not configured",
                                                 "reason": None, **empty})
        elif not (outdir / f"{what}.json").exists():
            write_json(outdir / f"{what}.json", {**common, "format": FORMATS[what], "status": "failed",
                                                 "reason": f"not measured: {failure}", **empty})
    if spec.adaptive and failure is None:  # the grid's other lengths: files the workflow expects, with no trial
        for length in spec.lengths:
            if length not in statuses:
                write_json(outdir / f"{length}.json", {**common, "length": length, "status": "not chosen", "reason": None,
                                                       "warmup": [], "trials": [], "finished_at": provenance.now_iso()})
                statuses[length] = "not chosen"
    if spec.adaptive and not (outdir / "sweep.json").exists():
        write_json(outdir / "sweep.json", {**common, "kind": "adaptive", "path": [], "outcome": {},
                                           "reason": f"not run: {failure}"})
    for length in spec.lengths:
        if length not in statuses:
            reason = f"not measured: {failure}"
            progress.error("%s L=%d %s", name, length, reason)
            write_json(outdir / f"{length}.json", {**common, "length": length, "status": "failed", "reason": reason,
                                                   "warmup": [], "trials": [], "finished_at": provenance.now_iso()})
            statuses[length] = "failed"
    return sum(status == "failed" for status in statuses.values())


def _workloads_file(what: str, settings: dict, key: str, common: dict, prov: dict, outdir: Path,
                    resume_dir: Path | None, fields: Callable[[list[dict]], dict],
                    stored: Callable[[dict], list[dict]]) -> tuple[list[dict] | None, Callable[[list[dict]], None]]:
    """The points an interrupted run of the same key measured (from resume_dir/<what>.json), and keep(points):
    <what>.json written with every point done so far (and kept in resume_dir), its fields(points) beside the
    status; the workloads after the lengths (load, prefix) write theirs so."""
    file_key = digest({"resume_key": key, what: settings})
    kept = None
    if resume_dir is not None:
        try:
            before = json.loads((resume_dir / f"{what}.json").read_text())
            kept = stored(before) if before.get(f"{what}_key") == file_key else None
        except (OSError, json.JSONDecodeError, KeyError):
            kept = None

    def keep(points: list[dict]) -> None:
        bad = [p for p in points if p["status"] != "ok"]
        status = "ok" if points and not bad else ("partial" if len(bad) < len(points) else "failed")
        reason = "; ".join(f"{p['kind']} {describe_key(p)}: {p['reason']}" for p in bad) or None
        doc = {**common, "format": FORMATS[what], "provenance": copy.deepcopy(prov), what: settings,
               f"{what}_key": file_key, "status": status,
               "reason": reason if points else f"not measured: the run stopped before its first {what} point",
               **fields(points), "finished_at": provenance.now_iso()}
        if resume_dir:
            write_json(resume_dir / f"{what}.json", doc)
        write_json(outdir / f"{what}.json", doc)

    keep([])
    return kept, keep


def describe_key(point: dict) -> str:
    if point["kind"] == "conversation":
        return "with the cache" if point.get("cache") else "flushed before every turn"
    return f"L={point['length']}" + (f" h={point['hit_rate']:g}" if point["kind"] == "hit_rate" else "")


def _measure_load(session: Session, spec: ConfigurationSpec, run_id: str, history: list, common: dict, prov: dict,
                  key: str, outdir: Path, resume_dir: Path | None) -> None:
    """The load workloads (longctx.measure.load) after the lengths, on the same server: load.json is
    written after every point (and kept in resume_dir); the points of an interrupted run under the same
    key are reused."""
    kept, keep = _workloads_file("load", spec.load, key, common, prov, outdir, resume_dir,
                                 lambda points: {"workloads": points}, lambda doc: doc["workloads"])

    def predict(length: int) -> tuple[float, float] | None:
        p = fitted(history, [length])
        return (float(p[0][0]), float(p[1][0])) if p is not None else None

    run_load(session, spec, run_id, predict, keep, kept)


def _measure_prefix(session: Session, spec: ConfigurationSpec, run_id: str, history: list, common: dict, prov: dict,
                    key: str, outdir: Path, resume_dir: Path | None) -> None:
    """The reused-context workloads (longctx.measure.prefix) after the load ones, on the same server:
    prefix.json as load.json is written."""
    facts: dict = {}

    def fields(points: list[dict]) -> dict:
        if not facts and session.prov.get("server_info") is not None:
            facts.update(cache_facts(session, spec))
        return {**facts, "points": [p for p in points if p["kind"] == "hit_rate"],
                "conversations": [p for p in points if p["kind"] == "conversation"]}

    kept, keep = _workloads_file("prefix", spec.prefix, key, common, prov, outdir, resume_dir, fields,
                                 lambda doc: doc["points"] + doc["conversations"])

    def timeout(length: int, output_tokens: int) -> float:
        return request_timeout({**spec.protocol, "output_tokens": output_tokens}, history, length)

    def flush() -> str | None:
        return _flush(session.client, session.base, session.api, spec.protocol["request_timeout_s"])

    run_prefix(session, spec, run_id, timeout, flush, keep, kept)


def _samples(length: int, result: dict) -> list[tuple[int, float, float | None]]:
    """(length, TTFT, TPOT) of a length's successful trials."""
    return [(length, t["ttft_s"], t.get("tpot_s")) for t in result["trials"] if t["status"] == "ok"]


def _length_line(result: dict) -> str:
    """A measured length in one line: its status, trials that succeeded, median TTFT and decode rate."""
    ok = [t for t in result.get("trials") or [] if t["status"] == "ok"]
    line = f"{result['status']}, {len(ok)} of {len(result.get('trials') or [])} trials"
    if ok:
        ttft = sorted(t["ttft_s"] for t in ok)[len(ok) // 2]
        rates = sorted(t["decode_tok_s"] for t in ok if t.get("decode_tok_s"))
        line += f", TTFT {ttft:.3f} s" + (f", decode {rates[len(rates) // 2]:.1f} tok/s" if rates else "")
    return line + (f" ({result['reason'][:200]})" if result.get("reason") and result["status"] != "ok" else "")


def _measure_at(session: "Session", spec: ConfigurationSpec, length: int, run_id: str, history: list,
                tracker: Progress, needle: bool = True) -> dict:
    """One length's warm-up and trials (measure_length) and its needle probe, with the server brought up first;
    a refused length, a surprise or the server's fault is the result's status and reason, never an exception.
    The successful trials join history."""
    name = spec.name
    session.up()
    tracker.needle = needle and spec.protocol["needle"]["enabled"] and not session.random_weights
    timeout_s = request_timeout(spec.protocol, history, length)
    too_long = session.refuses(length, spec.protocol["output_tokens"])
    try:
        if too_long:  # nothing is sent: the server would refuse it, or evict to serve it
            raise LengthRefused(too_long)
        result = measure_length(session, spec, length, run_id, timeout_s, tracker)
        result["needle"] = _needle(session, spec, length, timeout_s) if needle else None
        history += _samples(length, result)
    except LengthRefused as exc:
        progress.error("%s L=%d: %s", name, length, exc)
        result = {"status": "failed", "reason": str(exc), "warmup": [], "trials": []}
    except Exception as exc:  # a bug or a surprise must not cost the lengths already measured
        log.exception("%s L=%d: measurement failed", name, length)
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "warmup": [], "trials": []}
    if result["status"] != "ok" and not too_long and not session.healthy():
        reason = session.fault(f"while measuring length {length}", "the next length")
        # the fault is what the report names for the length, not the transport errors it caused
        result.update(status="failed", fault=reason, reason="; ".join(filter(None, [reason, result.get("reason")])))
        progress.error("%s L=%d: %s", name, length, reason)
    return result


def _sweep_adaptive(session: "Session", spec: ConfigurationSpec, run_id: str, common: dict, prov: dict, key: str,
                    outdir: Path, resume_dir: Path | None, history: list, statuses: dict, tracker: Progress) -> None:
    """The adaptive sweep (longctx.measure.adaptive.Planner): each choice measured (warm-up before the first only,
    no batches), its trials joining its length's raw file (a length chosen again gets more trials), each file kept
    in resume_dir as it grows; then sweep.json, the path with every choice and its reason. On resume the planner
    replays its choices over the trials kept (same trials, same fits, same choices) and measures from where the
    interrupted run stopped."""
    from dataclasses import replace

    from .adaptive import Planner

    planner = Planner(spec.adaptive, spec.protocol, seed=int(spec.protocol.get("seed") or 0))
    before = {L: r for L in spec.lengths if (r := _resumable_any(resume_dir, L, key))}
    kept = {L: list(r["trials"]) for L, r in before.items()}
    kept_time = {L: float(r.get("adaptive_seconds") or 0.0) for L, r in before.items()}
    records: dict[int, dict] = {}

    def step(length: int, n: int) -> None:
        ok_before = len(records.get(length, {}).get("trials") or [])
        reused = kept.get(length, [])[ok_before:ok_before + n]
        started = provenance.now_iso()
        t0 = time.monotonic()
        if len(reused) == n:  # measured before this interruption: the same trials
            result = {"status": "ok" if all(t["status"] == "ok" for t in reused) else "partial", "reason": None,
                      "warmup": [], "trials": [dict(t) for t in reused], "resumed": True}
            history.extend(_samples(length, result))
            seconds = kept_time.get(length, 0.0) * n / max(1, len(kept.get(length, [])))
        else:
            tracker.begin(spec.lengths.index(length))
            sub = replace(spec, protocol={**spec.protocol, "trials": n, "warmup": planner.warmup(), "concurrency": []})
            result = _measure_at(session, sub, length, run_id, history, tracker, needle=length not in records)
            seconds = time.monotonic() - t0
        rec = records.get(length)
        trials = (rec["trials"] if rec else []) + result.get("trials", [])
        for j, t in enumerate(trials):
            t["trial"] = j
        ok = [t for t in trials if t["status"] == "ok"]
        reasons = sorted({t["reason"] for t in trials if t["status"] != "ok" and t.get("reason")} |
                         ({result["reason"]} if result.get("reason") and not result.get("trials") else set()))
        rec = {**common, "provenance": copy.deepcopy(prov), "length": length, **(rec or {}),
               "status": "ok" if trials and len(ok) == len(trials) else ("partial" if ok else "failed"),
               "reason": "; ".join(reasons) or None, "warmup": (rec or {}).get("warmup", []) + result.get("warmup", []),
               "trials": trials, "batches": [], "needle": (rec or {}).get("needle") or result.get("needle"),
               "resume_key": key, "started_at": (rec or {}).get("started_at") or started, "finished_at": provenance.now_iso(),
               "adaptive_seconds": (rec or {}).get("adaptive_seconds", 0.0) + seconds}
        if result.get("fault"):
            rec["fault"] = result["fault"]
        records[length] = rec
        if resume_dir and not result.get("resumed"):
            write_json(resume_dir / f"{length}.json", rec)
        write_json(outdir / f"{length}.json", rec)
        statuses[length] = rec["status"]
        planner.record(length, n, _samples(length, result), seconds)
        progress.info("%s L=%d: %d trial(s) (%s), %.1f s; %s", spec.name, length, n, planner.path[-1]["reason"][:120],
                      seconds, _length_line(result))

    while (choice := planner.next_step()) is not None:
        step(choice[0], choice[1])
    if planner.phase == "around":
        for length, n, _ in planner.around():
            step(length, n)
    write_json(outdir / "sweep.json", {**common, "kind": "adaptive", **planner.summary(), "finished_at": provenance.now_iso()})


def _resumable_any(resume_dir: Path | None, length: int, key: str) -> dict | None:
    """A kept length of the same key, whatever its status (an adaptive sweep replays its trials)."""
    if resume_dir is None:
        return None
    try:
        kept = json.loads((resume_dir / f"{length}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return kept if kept.get("resume_key") == key else None


def _resumable(resume_dir: Path | None, length: int, key: str) -> dict | None:
    """A kept length of the same key that succeeded (a fixed sweep reuses it whole)."""
    kept = _resumable_any(resume_dir, length, key)
    return kept if kept and kept.get("status") == "ok" else None
