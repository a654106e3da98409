"""The raw files of a sweep: written whole as each length is measured, kept for resuming, said when absent.

data/raw/<configuration>/<length>.json per length (RAW_FORMAT), load.json and prefix.json for the
workloads after the lengths, itl_depth.json, sweep.json for an adaptive sweep, metronome.json for the readings of
the run's metronome (measure.metronome). Every file is written
through a temporary file and renamed, so that a reader never sees half of one. With a resume
directory (data/partial/<configuration>) each is also kept there, under a resume key (what a reused
measurement must share with this run); a later run reuses what succeeded under the same key.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import provenance
from ..core.errors import ConfigError, write_atomic
from ..core.hashing import digest
from ..engines import ConfigurationSpec

progress = logging.getLogger("longctx.progress")
RAW_FORMAT = "longctx.raw/1"
FORMATS = {"load": "longctx.load/1", "prefix": 1, "metronome": "longctx.metronome/1"}
# what a workloads file holds when nothing of it was measured
EMPTY_WORKLOADS = {"load": {"workloads": []}, "prefix": {"points": [], "conversations": []}}


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
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def write_kept(name: str, doc: dict, outdir: Path, resume_dir: Path | None) -> None:
    """outdir/<name>.json, and the same kept in resume_dir for a later run to resume from."""
    if resume_dir:
        write_json(resume_dir / f"{name}.json", doc)
    write_json(outdir / f"{name}.json", doc)


def resume_key(spec: ConfigurationSpec, kernel: dict | None, version: str | None) -> str:
    """What a reused measurement must share with this run: the spec (lengths, workloads and metronome aside), the
    kernel build and the engine version."""
    return digest({"spec": {k: v for k, v in spec.hashable().items() if k not in ("lengths", "load", "prefix", "metronome")},
                   "kernel": kernel and kernel["build_hash"], "version": version})


def read_kept(resume_dir: Path | None, name: str) -> dict | None:
    """resume_dir/<name>.json as an earlier run kept it, or None (no resume directory, no file, or not readable)."""
    if resume_dir is None:
        return None
    try:
        return json.loads((resume_dir / f"{name}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def resumable_any(resume_dir: Path | None, length: int | str, key: str) -> dict | None:
    """A kept length (or file: itl_depth, load, ...) of the same key, whatever its status (an adaptive sweep replays
    its trials; a file a run never reached is counted against it)."""
    kept = read_kept(resume_dir, str(length))
    return kept if kept and kept.get("resume_key") == key else None


def read_raw(path: Path) -> tuple[dict | None, str | None]:
    """A raw file as a JSON object, or None and why it cannot be read."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return (raw, None) if isinstance(raw, dict) else (None, "not a JSON object")


# a failure another attempt may not repeat: the server died or hung (the sweep's `fault`), or the requests timed out,
# stalled, lost their connection or met a server error (HTTP 500, 502, 503, 504); anything else (too long for the server, refused by
# its validation or its key check, HTTP 4xx) would repeat
TRANSIENT_WORDS = ("timed out", "stalled", "ConnectError", "ConnectTimeout", "ReadError", "WriteError",
                   "RemoteProtocolError", "Connection refused", "Connection reset", "server disconnected")
SERVER_ERROR = re.compile(r"\bHTTP 50[0234]\b")  # 501 (not implemented) and 505 (version) would repeat


def transient(record: dict | None) -> str | None:
    """Why a length that did not succeed may succeed if measured again, or None (it succeeded, or failed for a reason
    that would repeat)."""
    if not record or record.get("status") in ("ok", "not chosen", "not configured") or record.get("gave_up"):
        return None
    if record.get("fault"):
        return record["fault"]
    reason = record.get("reason") or ""
    return reason if may_pass(reason) else None


def same_reason(a: str | None, b: str | None) -> bool:
    """Whether two failures are the same (their first clause, its figures left out: the seconds, ports and pids vary)."""
    def key(why: str | None) -> str:
        return re.sub(r"\d+(?:\.\d+)?", "#", (why or "").split(";")[0]).strip()[:160]
    return bool(a and b) and key(a) == key(b)


def lost_again(before: dict | None, result: dict, retrying: bool, limit: int) -> dict:
    """A length's result with how many runs in a row lost it for the same reason that may pass (lost_runs: the run
    before's count where this run was started by its note, `retrying`, and lost it the same way, else 1); at `limit`
    the command gives up on it (gave_up: its reason says so, and `transient` no longer has it measured again)."""
    why = transient(result)
    if not why:
        return result
    runs = 1
    if retrying and before is not None and same_reason(transient({**before, "gave_up": None}), why):
        runs = int(before.get("lost_runs") or 1) + 1
    result = {**result, "lost_runs": runs}
    if runs >= limit:
        said = f"gave up after {runs} runs: "
        result.update(gave_up=runs, reason=said + (result.get("reason") or why),
                      **({"fault": said + result["fault"]} if result.get("fault") else {}))
    return result


# what the progress log adds where the command gives up on something (Retries)
STARTS_AGAIN = "(a changed configuration or --forcerun bench_configuration tries again)"


@dataclass(frozen=True)
class Retries:
    """How a run counts what it loses again (lost_again): `retrying` where the job was rerun by the note of what the
    run before lost (retry_reasons), `limit` its server.give_up_after_runs. The lengths, the workloads' points and the
    files a run never reached are counted alike: nothing that may pass is measured again forever."""
    retrying: bool = False
    limit: int = 0  # 0: counted, never given up

    def count(self, before: dict | None, result: dict) -> dict:
        return lost_again(before, result, self.retrying, self.limit or 10**9)

    def reuses(self, before: dict | None) -> bool:
        """Whether a record the run before kept stands as it is: it succeeded, or the command gave up on it and this
        run was started by the note of what was lost (a rerun without one, --forcerun, tries it again)."""
        return bool(before) and (before.get("status") == "ok" or (self.retrying and bool(before.get("gave_up"))))


def may_pass(reason: str | None) -> bool:
    """Whether a failure said so (a request's, a probe's, a flush's) may not repeat (TRANSIENT_WORDS, SERVER_ERROR)."""
    reason = reason or ""
    if "HTTP 4" in reason:
        return False
    return bool(SERVER_ERROR.search(reason)) or any(w.lower() in reason.lower() for w in TRANSIENT_WORDS)


def lost(raw_dir: str | Path, partial_dir: str | Path, names: list[str]) -> dict[str, str]:
    """What the same command, run again, measures again of a configuration's last run ({file name: why}): a length
    that failed for a reason that may pass (`transient`), a raw file that cannot be read with no intact copy in
    partial_dir (aggregation recovers one that has), and a workload (load, prefix, the ITL-depth request) the run
    never reached for a reason that may pass (its `fault`) or one of whose points a server's death or hang cost. A
    file that is not there is Snakemake's to rerun; a length that failed for a reason that would repeat is not
    measured again until its cause changes (its configuration, and with it the job's spec hash). An adaptive sweep
    (names hold "sweep") replays the trials it kept, failed ones too: of its lengths, only those it never reached
    (their `fault`) are measured again."""
    raw_dir, partial_dir = Path(raw_dir), Path(partial_dir)
    replayed = "sweep" in names
    out: dict[str, str] = {}
    for name in names:
        path = raw_dir / f"{name}.json"
        if not path.exists():
            continue
        raw, problem = read_raw(path)
        if raw is None:  # what aggregation reads in its place: its copy
            raw, _ = read_raw(partial_dir / f"{name}.json")
            if raw is None:
                out[name] = f"its raw file {path} cannot be read ({problem}) and no intact copy was kept"
                continue
        why = transient(raw) if name.isdigit() and not replayed else (
            (transient(raw) if raw.get("fault") else None) or _point_fault(raw))
        if why:
            out[name] = why
    return out


def _point_fault(doc: dict) -> str | None:
    """The fault that cost a workload's point (a load or reused-context point the server died or hung in, its
    `fault`), where one did: the workload is measured again by the same command, its points that succeeded reused
    (measure.points), as a length lost so is."""
    points = [*(doc.get("workloads") or []), *(doc.get("points") or []), *(doc.get("conversations") or [])]
    return next((f"{p.get('kind', 'a')} point: {p['fault']}" for p in points
                 if isinstance(p, dict) and p.get("status") != "ok" and p.get("fault") and not p.get("gave_up")), None)


def retry_files(resume_dir: str | Path) -> list[str]:
    """The latest note of what a run of this configuration lost (resume_dir/retry-<key>.json, rule note_retry's): the
    bench rule's input, [] where there was none."""
    found = sorted(Path(resume_dir).glob("retry-*.json"), key=lambda f: f.stat().st_mtime_ns)
    return [str(found[-1])] if found else []


def _lost_key(raw_dir: Path, found: dict[str, str]) -> str:
    """What names one run's losses: each lost file's name, why, size and modification time (the bench, run again,
    rewrites them), so that the note's name is the same however often the workflow is read (a cluster's job step
    reads it again after note_retry ran) and new after every bench run that loses something again."""
    ident = {}
    for name, why in found.items():
        try:
            st = (raw_dir / f"{name}.json").stat()
            ident[name] = [why, st.st_size, st.st_mtime_ns]
        except OSError:
            ident[name] = [why]
    return digest(ident)[:12]


def retry_input(raw_dir: str | Path, resume_dir: str | Path, names: list[str]) -> list[str]:
    """The bench rule's retry input: where the last run lost something that may pass (`lost`), the note of those
    losses, resume_dir/retry-<key>.json, which rule note_retry writes: a new input, so the same command, run again,
    reruns the job (which measures again what was lost and reuses the rest); else the latest note (the input set
    unchanged, so a run that lost nothing is not run again)."""
    found = lost(raw_dir, resume_dir, names)
    if found:
        return [str(Path(resume_dir) / f"retry-{_lost_key(Path(raw_dir), found)}.json")]
    return retry_files(resume_dir)


def write_retry_note(path: str | Path, raw_dir: str | Path, names: list[str]) -> str:
    """Note what the last run lost (`lost`) in path (resume_dir/retry-<key>.json; other notes removed), and say it in
    one line: what is measured again, and why."""
    path = Path(path)
    found = lost(raw_dir, path.parent, names)
    for old in [*path.parent.glob("retry-*.json"), *path.parent.glob("retry-*.done")]:
        if old != path:
            old.unlink(missing_ok=True)
    write_json(path, {"lost": found})
    what = "; ".join(f"{'L=' + n if n.isdigit() else n} ({why.split(';')[0][:160]})" for n, why in found.items())
    return f"{Path(raw_dir).name}: measuring again what the last run lost: {what or 'nothing'}"


def retry_reasons(resume_dir: Path | None) -> dict[str, str]:
    """What the latest note says the run before lost ({file name: why}), for the bench to say why it measures each
    again; read once: the note is marked done (retry-<key>.done beside it), so that a later run of the job (a kernel
    edit, a length removed by hand) is not told that the run before lost them. {} where there is none."""
    files = retry_files(resume_dir) if resume_dir else []
    if not files or Path(files[0]).with_suffix(".done").exists():
        return {}
    note = read_kept(Path(files[0]).parent, Path(files[0]).stem)
    Path(files[0]).with_suffix(".done").write_text("")
    return (note or {}).get("lost") or {}


def workloads_file(what: str, settings: dict, key: str, common: dict, prov: dict, outdir: Path,
                    resume_dir: Path | None, fields: Callable[[list[dict]], dict],
                    stored: Callable[[dict], list[dict]]) -> tuple[list[dict] | None, Callable[[list[dict]], None]]:
    """The points an interrupted run of the same key measured (from resume_dir/<what>.json), and keep(points):
    <what>.json written with every point done so far (and kept in resume_dir), its fields(points) beside the
    status; the workloads after the lengths (load, prefix) write theirs so."""
    file_key = digest({"resume_key": key, what: settings})
    before = read_kept(resume_dir, what)
    try:
        kept = stored(before) if before and before.get(f"{what}_key") == file_key else None
    except KeyError:
        kept = None

    def keep(points: list[dict]) -> None:
        bad = [p for p in points if p["status"] != "ok"]
        status = "ok" if points and not bad else ("partial" if len(bad) < len(points) else "failed")
        reason = "; ".join(f"{p['kind']} {describe_key(p)}: {p['reason']}" for p in bad) or None
        doc = {**common, "format": FORMATS[what], "provenance": copy.deepcopy(prov), what: settings,
               f"{what}_key": file_key, "status": status,
               "reason": reason if points else f"not measured: the run stopped before its first {what} point",
               **fields(points), "finished_at": provenance.now_iso()}
        write_kept(what, doc, outdir, resume_dir)

    keep([])
    return kept, keep


def describe_key(point: dict) -> str:
    if point["kind"] == "conversation":
        return "with the cache" if point.get("cache") else "flushed before every turn"
    return f"L={point['length']}" + (f" h={point['hit_rate']:g}" if point["kind"] == "hit_rate" else "")


def write_absent(spec: ConfigurationSpec, outdir: Path, common: dict, statuses: dict[int, str], failure: str | None,
                 may_pass: bool = False, settle: Callable[[str, dict], dict] | None = None) -> None:
    """After a run: every file the workflow expects that the run did not write, saying why (`failure`, the
    server error that stopped it, or nothing): the ITL-depth request, the workloads (not configured, or not
    measured), an adaptive sweep's lengths it did not choose and its sweep.json, every length not measured
    (a failed length, told on the progress log too), the metronome's file (not configured, or no reading taken).
    `statuses` gains the lengths written. Where the failure
    may pass (may_pass: a server that could not be reached or started, not one that rejects its command line),
    each file not measured records it as its `fault`: the same command, run again, measures it (`lost`), and
    settle(name, doc) counts it as the runs before lost it (Retries) and keeps it, so that the same cause, run after
    run, is given up on as a length's is."""
    fault = {"fault": failure} if may_pass and failure else {}

    def absent(name: str, doc: dict) -> dict:
        if settle and fault:
            return settle(name, doc)
        write_json(outdir / f"{name}.json", doc)
        return doc

    if spec.protocol["itl_depth"]["length"] and not (outdir / "itl_depth.json").exists():
        absent("itl_depth", {**common, "status": "failed", "reason": f"not measured: {failure}", **fault,
                             "length": spec.protocol["itl_depth"]["length"], "itl_s": [], "depth": []})
    # the analysis reads that there is nothing, or why not
    for what, settings in (("load", spec.load), ("prefix", spec.prefix)):
        empty = EMPTY_WORKLOADS[what]
        if not settings:
            write_json(outdir / f"{what}.json", {**common, "format": FORMATS[what], "status": "not configured",
                                                 "reason": None, **empty})
        elif not (outdir / f"{what}.json").exists():
            absent(what, {**common, "format": FORMATS[what], "status": "failed", "reason": f"not measured: {failure}",
                          **fault, **empty})
    if not (outdir / "metronome.json").exists():  # the run stopped before its metronome was set up
        write_json(outdir / "metronome.json", {**common, "format": FORMATS["metronome"], "metronome": spec.metronome,
                                                "status": "not configured" if spec.metronome is None else "failed",
                                                "reason": None if spec.metronome is None else
                                                f"not taken: {failure or 'the run stopped before its first point'}",
                                                "points": [], "readings": []})
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
            doc = absent(str(length), {**common, "length": length, "status": "failed", "reason": f"not measured: {failure}",
                                       **fault, "warmup": [], "trials": [], "finished_at": provenance.now_iso()})
            progress.error("%s L=%d %s", spec.name, length, doc["reason"])
            statuses[length] = "failed"
