"""The sweep of one configuration: server up once, every length measured, then the workloads, server down.

Each length gives data/raw/<configuration>/<length>.json, written as soon as it is measured
(measure.rawfiles). A failed length is a file with status "failed" and the reason (with the server
log's path), never a gap; the sweep goes on while the server can be (re)started (measure.session).
One length's protocol is measure.protocol; an adaptive sweep's choices, measure.adaptive; the load
and reused-context workloads after the lengths, measure.load and measure.prefix; the metronome's readings at fixed
points of the run (before the first length, between the stages, at the end), measure.metronome.
"""

from __future__ import annotations

import copy
import logging
import signal
import uuid
from pathlib import Path

from . import provenance
from ..core.secrets import mask
from ..engines import ConfigurationSpec, get_adapter
from .adaptive import run_adaptive
from .loadrun import run_load
from .metronome import Metronome
from .prefix import cache_facts, run_prefix
from .health import ServerError
from .progress import EVERY_S, Progress, fitted
from .protocol import length_line, measure_at, measure_itl_depth, request_timeout, samples
from .rawfiles import (RAW_FORMAT, STARTS_AGAIN, Retries, resumable_any, resume_key, retry_reasons, transient, workloads_file,
                       writable, write_absent, write_json, write_kept)
from .session import Session

progress = logging.getLogger("longctx.progress")


def run_configuration(spec: ConfigurationSpec, outdir: str | Path, server_log: str | Path,
                      resume_dir: str | Path | None = None, progress_every_s: float = EVERY_S) -> int:
    """Measure every length of one configuration; returns the number of failed lengths.

    With resume_dir, every measured length is also kept there, and a later run reuses the ones
    that succeeded under the same resume_key instead of measuring them again (an interrupted
    sweep resumes where it stopped). Progress (measure.progress) goes to the longctx.progress logger:
    a line per warm-up and trial, at most one every progress_every_s seconds, and every length's."""
    outdir, server_log = Path(outdir), Path(server_log)
    resume_dir = Path(resume_dir) if resume_dir else None
    tracker = Progress(spec.name, spec.lengths, spec.protocol, progress_every_s, workloads=bool(spec.load or spec.prefix))
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
        **provenance.model_provenance(adapter, spec),
        "args": mask(spec.args),
        **({"scheduler": mask(spec.scheduler)} if spec.scheduler else {}),  # an external server's, as its config says
        **({"verifies": spec.verifies} if spec.verifies else {}),  # the configuration whose advice this run proves
        "settings": spec.settings(),  # what a later version must match to be compared with this one
        "git": provenance.git_info(),
        "packages": provenance.package_versions(),
        "hardware": provenance.hardware(),
        "run_started_at": provenance.now_iso(),
    }
    common = {"format": RAW_FORMAT, "configuration": name, "engine": adapter.name, "run_id": run_id,
              "spec_hash": spec.spec_hash(), "provenance": prov}
    statuses: dict[int, str] = {}
    failure: str | None = None
    may_pass = False  # whether the failure that stopped the run may pass: the next run of the same command tries again

    def on_sigterm(signum, frame):  # Snakemake cancels jobs with SIGTERM: stop the server on the way out
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGHUP (a closed terminal or ssh session) is a SIGTERM too
    previous = {sig: signal.signal(sig, on_sigterm) for sig in (signal.SIGTERM, signal.SIGHUP)}
    session = None
    settle = None  # counts and keeps a file the run never reached (rawfiles.write_absent), once the key is known
    try:
        prov["kernel"] = provenance.kernel_manifest(spec)
        session = Session(adapter, spec, server_log, prov)
        key = resume_key(spec, prov["kernel"], session.version)
        history: list[tuple[int, float, float | None]] = []  # (length, TTFT, TPOT) of ok trials
        # what an earlier run of the same key kept: reused where it succeeded or failed for a reason that would
        # repeat; a length it lost to a transient fault is measured again (rawfiles.transient says why)
        earlier = {i: kept for i, length in enumerate(spec.lengths) if (kept := resumable_any(resume_dir, length, key))}
        lost_before = {i: why for i, kept in earlier.items() if (why := transient(kept))}
        # what the workflow found lost when it reran this job (a raw file that cannot be read, a length the run never
        # reached): said as the reason each is measured again
        noted = retry_reasons(resume_dir)
        lost_before.update({i: noted[str(n)] for i, n in enumerate(spec.lengths) if str(n) in noted and i not in earlier})
        # a length the command gave up on (server.give_up_after_runs) is kept as it failed while the job reruns by
        # the note of what a run lost; the job run again without one (--forcerun, an output removed) starts it again
        retrying = bool(noted)
        retries = Retries(retrying, spec.server["give_up_after_runs"])

        def settle(file: str, doc: dict) -> dict:
            doc = retries.count(resumable_any(resume_dir, file, key), {**doc, "resume_key": key})
            if doc.get("gave_up"):
                progress.warning("%s %s: %s; the same command no longer measures it %s", name, _named(file),
                                 doc["reason"][:300], STARTS_AGAIN)
            write_kept(file, doc, outdir, resume_dir)
            return doc

        if not retrying:
            lost_before.update({i: f"given up on by an earlier run ({kept.get('reason')}): the job was run again "
                                   "without a note of what was lost, so it is measured again"
                                for i, kept in earlier.items() if kept.get("gave_up")})
        kept_before = {i: kept for i, kept in earlier.items() if i not in lost_before}
        for i, kept in kept_before.items():
            tracker.known(i, samples(spec.lengths[i], kept))
        metronome = Metronome(spec, common, prov, key, outdir, resume_dir)
        metronome.carry({kept["run_id"] for kept in kept_before.values()})  # what those runs measured is in this one's
        metronome.ready(session)  # its first reading once the server is first up and primed
        for i, length in enumerate([] if spec.adaptive else spec.lengths):
            tracker.begin(i)
            kept = kept_before.get(i)
            if kept:
                write_json(outdir / f"{length}.json", {**kept, "resumed": True})
                statuses[length] = kept["status"]
                history += samples(length, kept)
                tracker.end(f"measured before (run {kept['run_id']}), reused", session.alive())
                continue
            started = provenance.now_iso()
            if i in lost_before:
                progress.warning("%s L=%d: measuring it again, lost by the last run: %s", name, length,
                                 lost_before[i].split(";")[0][:300])
            result = measure_at(session, spec, length, run_id, history, tracker)
            if result.get("fault") and session.restarts_left():  # lost to its server: measured again, once, on a new one
                lost = transient(result)
                progress.warning("%s L=%d: measuring it again on the restarted server (%s)", name, length, lost.split(";")[0])
                first = result
                result = measure_at(session, spec, length, run_id, history, tracker)
                result["remeasured"] = {"why": lost, "how": "again on the restarted server", "first_attempt": {
                    "status": first["status"], "reason": first.get("reason"), "trials": first.get("trials") or []}}
            elif i in lost_before:
                result["remeasured"] = {"why": lost_before[i], "how": "by a rerun of the same command"}
            result = retries.count(earlier.get(i) if i in lost_before else None, result)
            if result.get("gave_up"):
                progress.warning("%s L=%d: %s; the same command no longer sends it %s", name, length,
                                 result["reason"][:300], STARTS_AGAIN)
            record = {**common, "provenance": copy.deepcopy(prov), "length": length, **result, "resume_key": key,
                      "started_at": started, "finished_at": provenance.now_iso()}
            write_kept(str(length), record, outdir, resume_dir)
            statuses[length] = result["status"]
            tracker.end(length_line(result), session.alive())
        if spec.adaptive:
            run_adaptive(session, spec, run_id, common, prov, key, outdir, resume_dir, history, statuses, tracker)
        depth = spec.protocol["itl_depth"]
        if depth["length"]:
            session.up()
            write_json(outdir / "itl_depth.json", {**common, "provenance": copy.deepcopy(prov),
                                                   **measure_itl_depth(session, spec, run_id, history)})
        tracker.lengths_done()
        metronome.tick(session, "after_sweep")
        if spec.load:
            _measure_load(session, spec, run_id, history, common, prov, key, outdir, resume_dir, retries)
        metronome.tick(session, "after_load")
        if spec.prefix:
            _measure_prefix(session, spec, run_id, history, common, prov, key, outdir, resume_dir, retries)
        metronome.tick(session, "end")
        tracker.finish()
    except ServerError as exc:
        failure, may_pass = str(exc), getattr(exc, "may_pass", True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if session is not None:
            session.close()
    write_absent(spec, outdir, common, statuses, failure, may_pass, settle)
    return sum(status == "failed" for status in statuses.values())


def _named(name: str) -> str:
    return f"L={name}" if name.isdigit() else f"the {name.replace('_', '-')} {'request' if name == 'itl_depth' else 'workloads'}"


def _measure_load(session: Session, spec: ConfigurationSpec, run_id: str, history: list, common: dict, prov: dict,
                  key: str, outdir: Path, resume_dir: Path | None, retries: Retries) -> None:
    """The load workloads (longctx.measure.load) after the lengths, on the same server: load.json is
    written after every point (and kept in resume_dir); the points of an interrupted run under the same
    key are reused."""
    kept, keep = workloads_file("load", spec.load, key, common, prov, outdir, resume_dir,
                                 lambda points: {"workloads": points}, lambda doc: doc["workloads"])

    def predict(length: int) -> tuple[float, float] | None:
        p = fitted(history, [length])
        return (float(p[0][0]), float(p[1][0])) if p is not None else None

    run_load(session, spec, run_id, predict, keep, kept, retries)


def _measure_prefix(session: Session, spec: ConfigurationSpec, run_id: str, history: list, common: dict, prov: dict,
                    key: str, outdir: Path, resume_dir: Path | None, retries: Retries) -> None:
    """The reused-context workloads (longctx.measure.prefix) after the load ones, on the same server:
    prefix.json as load.json is written."""
    facts: dict = {}

    def fields(points: list[dict]) -> dict:
        if not facts and session.prov.get("server_info") is not None:
            facts.update(cache_facts(session, spec))
        return {**facts, "points": [p for p in points if p["kind"] == "hit_rate"],
                "conversations": [p for p in points if p["kind"] == "conversation"]}

    kept, keep = workloads_file("prefix", spec.prefix, key, common, prov, outdir, resume_dir, fields,
                                 lambda doc: doc["points"] + doc["conversations"])

    def timeout(length: int, output_tokens: int) -> float:
        return request_timeout({**spec.protocol, "output_tokens": output_tokens}, history, length)

    def flush() -> str | None:
        return session.flush(spec.protocol["request_timeout_s"])

    run_prefix(session, spec, run_id, timeout, flush, keep, kept, retries)
