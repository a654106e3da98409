"""The raw files of a sweep: written whole as each length is measured, kept for resuming, said when absent.

data/raw/<configuration>/<length>.json per length (RAW_FORMAT), load.json and prefix.json for the
workloads after the lengths, itl_depth.json, sweep.json for an adaptive sweep. Every file is written
through a temporary file and renamed, so that a reader never sees half of one. With a resume
directory (data/partial/<configuration>) each is also kept there, under a resume key (what a reused
measurement must share with this run); a later run reuses what succeeded under the same key.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path
from typing import Callable

from . import provenance
from ..core.errors import ConfigError, write_atomic
from ..core.hashing import digest
from ..engines import ConfigurationSpec

progress = logging.getLogger("longctx.progress")
RAW_FORMAT = "longctx.raw/1"
FORMATS = {"load": "longctx.load/1", "prefix": 1}
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
    """What a reused measurement must share with this run: the spec (lengths aside), the kernel
    build and the engine version."""
    return digest({"spec": {k: v for k, v in spec.to_dict().items() if k not in ("lengths", "load", "prefix")},
                   "kernel": kernel and kernel["build_hash"], "version": version})


def read_kept(resume_dir: Path | None, name: str) -> dict | None:
    """resume_dir/<name>.json as an earlier run kept it, or None (no resume directory, no file, or not readable)."""
    if resume_dir is None:
        return None
    try:
        return json.loads((resume_dir / f"{name}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def resumable_any(resume_dir: Path | None, length: int, key: str) -> dict | None:
    """A kept length of the same key, whatever its status (an adaptive sweep replays its trials)."""
    kept = read_kept(resume_dir, str(length))
    return kept if kept and kept.get("resume_key") == key else None


# a failure another attempt may not repeat: the server died or hung (the sweep's `fault`), or the requests timed out
# or lost their connection; anything else (too long for the server, refused by its validation, HTTP 4xx) would repeat
TRANSIENT_WORDS = ("timed out", "ConnectError", "ConnectTimeout", "ReadError", "WriteError", "RemoteProtocolError",
                   "Connection refused", "Connection reset", "server disconnected")


def transient(record: dict | None) -> str | None:
    """Why a length that did not succeed may succeed if measured again, or None (it succeeded, or failed for a reason
    that would repeat)."""
    if not record or record.get("status") == "ok":
        return None
    if record.get("fault"):
        return record["fault"]
    reason = record.get("reason") or ""
    if "HTTP 4" in reason:
        return None
    return reason if any(w.lower() in reason.lower() for w in TRANSIENT_WORDS) else None


def retry_files(resume_dir: str | Path) -> list[str]:
    """The note of the latest run of this configuration that lost lengths to a transient fault
    (resume_dir/retry-<n>.json, n counting such runs), as the bench rule's input: a run that loses lengths writes
    the next one, so that the input changes and the same command, run again, reruns the job (which remeasures those
    lengths and reuses the others); a rerun that loses nothing leaves it, and the job is not run again. [] where
    no run lost one."""
    found = sorted(Path(resume_dir).glob("retry-*.json"), key=lambda f: _generation(f.name))
    return [str(found[-1])] if found else []


def _generation(name: str) -> int:
    try:
        return int(name[len("retry-"):-len(".json")])
    except ValueError:
        return 0


def retry_generation(resume_dir: str | Path) -> int:
    """How many runs of this configuration lost lengths to a transient fault (0: none)."""
    files = retry_files(resume_dir)
    return _generation(Path(files[0]).name) if files else 0


def note_retry(resume_dir: Path | None, lost: dict[int, str]) -> None:
    """Lengths this run lost to a transient fault ({length: why}): the next run of the same command remeasures them."""
    if resume_dir is None or not lost:
        return
    n = retry_generation(resume_dir) + 1
    write_json(resume_dir / f"retry-{n}.json", {"generation": n, "lengths": {str(k): v for k, v in sorted(lost.items())}})
    for old in resume_dir.glob("retry-*.json"):
        if _generation(old.name) < n:
            old.unlink(missing_ok=True)


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


def write_absent(spec: ConfigurationSpec, outdir: Path, common: dict, statuses: dict[int, str], failure: str | None) -> None:
    """After a run: every file the workflow expects that the run did not write, saying why (`failure`, the
    server error that stopped it, or nothing): the ITL-depth request, the workloads (not configured, or not
    measured), an adaptive sweep's lengths it did not choose and its sweep.json, every length not measured
    (a failed length, told on the progress log too). `statuses` gains the lengths written."""
    if spec.protocol["itl_depth"]["length"] and not (outdir / "itl_depth.json").exists():
        write_json(outdir / "itl_depth.json", {**common, "status": "failed", "reason": f"not measured: {failure}",
                                               "length": spec.protocol["itl_depth"]["length"], "itl_s": [], "depth": []})
    # the analysis reads that there is nothing, or why not
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
            progress.error("%s L=%d %s", spec.name, length, reason)
            write_json(outdir / f"{length}.json", {**common, "length": length, "status": "failed", "reason": reason,
                                                   "warmup": [], "trials": [], "finished_at": provenance.now_iso()})
            statuses[length] = "failed"
