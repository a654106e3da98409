"""Report versions: every build is kept as report/versions/longctx-v{N}-{hash}.pdf, with a log.

The hash covers what the document is made of: the data files, every file under templates/, the
longctx code, and the options and provenance the document prints (configuration, baseline, git
commit, package versions). The same inputs give the same hash and so the same version number: a
rebuild of unchanged inputs is the same version with the same bytes, and N counts up only when
something changed. Beside each PDF, longctx-v{N}-{hash}.json keeps its record: every successful
single-request trial (TTFT, TPOT, decode rate, the run that measured it) and what identifies each
configuration's measurements (longctx.analysis.identity: engine, its version and code, hardware, model
and settings, kernel sources, spec hash), per configuration and length how many trials succeeded and why others did
not, and each configuration's metronome readings (longctx.measure.metronome), so that any later version can be
compared with it, with intervals and the drift between the two runs (longctx.report.changes,
longctx.analysis.drift.between), and a length it lost is told from one it no longer measures. Under versions/sources/
it keeps the kernel sources each version measured (by content hash), so that any kept version can be the baseline of
an A/B.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd

from ..analysis.identity import identity
from ..analysis.tables import ok_rows, single
from ..core.errors import write_atomic
from ..core.hashing import digest
from .numbers import is_number

LOG = "log.json"
SOURCES = "sources"  # versions/sources/<sha256>: each kernel source a version measured, once per content
CODE_DIR = Path(__file__).resolve().parents[1]  # the longctx package, every stage
# What a version keeps of each trial, for any later version to compare with.
TRIAL_COLUMNS = ("ttft_s", "tpot_s", "decode_tok_s")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root: Path, pattern: str) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): _sha256(p) for p in sorted(root.rglob(pattern))
            if p.is_file() and "__pycache__" not in p.parts}


def content_hash(data_files: list[str | Path], template_dir: str | Path, extra: dict, code_dir: Path = CODE_DIR) -> str:
    """12 hex digits over the data (by file name and content), templates/, the code and `extra`."""
    parts = {
        "data": {Path(f).name: _sha256(Path(f)) for f in data_files if f},
        "templates": _tree(Path(template_dir), "*"),
        "code": _tree(code_dir, "*.py"),
        "extra": extra,
    }
    return digest(parts, 12)


def read_log(versions_dir: str | Path) -> list[dict]:
    path = Path(versions_dir) / LOG
    if not path.exists():
        return []
    try:
        return json.loads(path.read_text())["versions"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise SystemExit(f"the version log {path} is unreadable ({exc}); fix it or move report/versions aside") from None


def learned(measurements: dict, files: list[str | Path | None]) -> str:
    """What a build's data measured, as a digest: its successful trials (each with the run that measured it, so that a
    length measured again and successfully is new), how many trials each length tried and kept, and the workloads'
    files (`files`: load, reused context, ITL against depth). Not the failures' words, times or the metronome's
    readings: a rerun whose only new data are the same failures again learned nothing."""
    return digest({"trials": measurements.get("trials"),
                   "lengths": [{k: x.get(k) for k in ("configuration", "length", "ok", "tried")}
                               for x in measurements.get("lengths") or []],
                   "configurations": measurements.get("configurations"),
                   "files": {Path(f).name: _sha256(Path(f)) for f in files if f and Path(f).exists()}}, 12)


def assign(versions_dir: str | Path, content: str, frame: str | None = None, known_data: str | None = None) -> dict:
    """This build's version: the number the log gave this hash, or one more than the highest; or, where the newest
    version was built from the same code, templates and configuration (`frame`) and measured the same (`known_data`,
    `learned`), that version: a rerun that measured nothing new (the same failures again) makes no new version
    (`unchanged` says so; its PDF is built again, under that version's name)."""
    log = read_log(versions_dir)
    known = [e for e in log if e["hash"] == content]
    newest = max(log, key=lambda e: e["n"], default=None)
    unchanged = (not known and newest is not None and frame is not None and known_data is not None
                 and newest.get("frame") == frame and newest.get("learned") == known_data)
    if unchanged:
        content = newest["hash"]
        known = [newest]
    n = known[0]["n"] if known else max((e["n"] for e in log), default=0) + 1
    history = sorted((e for e in log if e["n"] < n), key=lambda e: e["n"])
    return {"n": n, "hash": content, "name": f"longctx-v{n}-{content}", "unchanged": unchanged,
            "previous": history[-1] if history else None, "history": history}


def _plain(value):
    return float(value) if is_number(value) else None


def _lengths(df: pd.DataFrame) -> list[dict]:
    """Per configuration and length measured: its successful single-request trials and, where any failed, why
    (the length's fault, else its reason, else the first failed trial's): what a later version reads to tell a
    length it lost from one it no longer measures."""
    one = single(df)
    ok = ok_rows(df)
    counts = ok.groupby(["configuration", "length"]).size().to_dict() if len(ok) else {}
    out = []
    for (conf, length), rows in one.groupby(["configuration", "length"], sort=True):
        n = int(counts.get((conf, length), 0))
        bad = rows[~rows["status"].eq("ok")]
        reasons = [bad[c].dropna().astype(str) for c in ("length_fault", "length_reason", "reason") if c in bad]
        why = next((r.iloc[0] for r in reasons if len(r)), None) if len(bad) or not n else None
        good = ok[(ok["configuration"] == conf) & (ok["length"] == length)]
        no_rate = good[good["decode_tok_s"].isna()] if "decode_tok_s" in good else good.iloc[0:0]
        said = [no_rate[c].dropna().astype(str) for c in ("decode_unmeasured", "reason") if c in no_rate]
        why_decode = next((r.iloc[0] for r in said if len(r)), "no decode rate measured") if len(no_rate) else None
        out.append({"configuration": str(conf), "length": int(length), "ok": n, "tried": int(len(rows)),
                    "why": why if why else (None if n else "no successful trial"), "why_decode": why_decode})
    return out


def measurements(df: pd.DataFrame, provenance: dict) -> dict:
    """What a version keeps: every successful single-request trial (results.csv's ok_rows) with the run that
    measured it, per configuration and length how many succeeded and why others did not (_lengths), per configuration
    its identity (longctx.analysis.identity), and under "metronome" per configuration its metronome readings
    (provenance.json's, as longctx.analysis.drift.between takes them; a configuration without any is left out)."""
    ok = ok_rows(df).sort_values(["configuration", "length", "trial"], kind="stable")
    trials = [{"configuration": str(r["configuration"]), "length": int(r["length"]),
               "trial": int(r["trial"]) if is_number(r.get("trial")) else None,
               "run_id": r["run_id"] if isinstance(r.get("run_id"), str) else None,
               **{k: _plain(r.get(k)) for k in TRIAL_COLUMNS}} for r in ok.to_dict("records")]
    entries = provenance.get("configurations") or {}
    names = sorted(str(n) for n in df["configuration"].unique())
    metronome = {n: [kept_reading(r) for r in entries[n]["metronome"]["readings"]] for n in names
                 if ((entries.get(n) or {}).get("metronome") or {}).get("readings")}
    return {"configurations": {n: identity(entries.get(n) or {}) for n in names}, "trials": trials,
            "lengths": _lengths(df), "metronome": metronome}


def keep_sources(versions_dir: str | Path, record: dict, root: str | Path = ".") -> dict[str, str]:
    """Each configuration's kernel sources, kept under versions/sources/<sha256> (once per content), so that any
    kept version can be the baseline of an A/B (longctx.analysis.ab) after the working tree moved on. A source is
    read where its path is (under root, the workflow's directory) or, for a PyTorch kernel, from its build; only
    content whose hash is the one the version recorded is kept. Returns {path: why} for those that could not be."""
    store = Path(versions_dir) / SOURCES
    missing: dict[str, str] = {}
    for ident in (record.get("measurements") or {}).get("configurations", {}).values():
        kernel = ident.get("kernel") or {}
        for path, sha in (kernel.get("sources") or {}).items():
            target = store / sha
            if target.exists():
                continue
            candidates = [Path(root) / path, Path(root) / "build" / "kernels" / str(kernel.get("name")) / Path(path).name]
            data = next((d for c in candidates if c.is_file() and hashlib.sha256(d := c.read_bytes()).hexdigest() == sha), None)
            if data is None:
                missing[path] = "its content is no longer where it was measured (edited since)"
                continue
            store.mkdir(parents=True, exist_ok=True)
            write_atomic(target, data)
    return missing


def kept_source(versions_dir: str | Path, sha: str) -> bytes | None:
    """A kernel source a version kept (keep_sources), by its content hash; None where none was kept."""
    path = Path(versions_dir) / SOURCES / sha
    return path.read_bytes() if path.is_file() else None


# What a version keeps of a metronome reading (longctx.measure.metronome), and of each of its requests and its probe
READING_KEYS = ("point", "run_id", "started_at", "t_s", "status", "ttft_s", "tpot_s", "server_start")
PROBE_KEYS = ("median_s", "seconds", "threads", "cpus", "matmul_size", "copy_mib")
KERNEL_KEYS = ("median_s", "seconds", "build_hash", "device", "length", "status", "reason")


def kept_reading(r: dict) -> dict:
    """A metronome reading as a version keeps it: its figures, each request's TTFT and TPOT, the probe's seconds, the
    kernel call's where it has one."""
    return {**{k: r.get(k) for k in READING_KEYS},
            "requests": [{k: q.get(k) for k in ("status", "ttft_s", "tpot_s")} for q in r.get("requests") or []],
            "probe": {k: (r.get("probe") or {}).get(k) for k in PROBE_KEYS},
            **({"kernel": {k: r["kernel"].get(k) for k in KERNEL_KEYS}} if r.get("kernel") else {})}


def register(versions_dir: str | Path, record: dict, pdf: str | Path) -> Path:
    """Keep the built PDF as versions/<name>.pdf, its record as <name>.json, and log it once."""
    versions_dir = Path(versions_dir)
    versions_dir.mkdir(parents=True, exist_ok=True)
    target = versions_dir / f"{record['name']}.pdf"
    if target.exists() and target.read_bytes() != Path(pdf).read_bytes() and not record.get("unchanged"):
        print(f"warning: {target} existed with other bytes (a build that is not reproducible?); replaced")
    shutil.copyfile(pdf, target)
    record["sources_missing"] = keep_sources(versions_dir, record) or None
    write_atomic(versions_dir / f"{record['name']}.json", json.dumps(record, indent=1, sort_keys=True) + "\n")
    log = read_log(versions_dir)
    if not any(e["hash"] == record["hash"] for e in log):
        log.append(record["entry"])
        log.sort(key=lambda e: e["n"])
        write_atomic(versions_dir / LOG, json.dumps({"versions": log}, indent=1, sort_keys=True) + "\n")
    return target


def record_path(versions_dir: str | Path, entry: dict) -> Path:
    return Path(versions_dir) / f"longctx-v{entry['n']}-{entry['hash']}.json"


def find(versions_dir: str | Path, n: int) -> tuple[dict | None, str | None]:
    """The kept record of version n, or None and why not (never built, or its record cannot be read)."""
    log = read_log(versions_dir)
    entry = next((e for e in log if e["n"] == n), None)
    if entry is None:
        kept = ", ".join(f"v{e['n']}" for e in log) or "none"
        return None, f"there is no v{n} in {Path(versions_dir) / LOG} (kept: {kept})"
    path = record_path(versions_dir, entry)
    try:
        return json.loads(path.read_text()), None
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"v{n}'s record {path} cannot be read ({type(exc).__name__})"
