"""Report versions: every build is kept as report/versions/longctx-v{N}-{hash}.pdf, with a log.

The hash covers what the document is made of: the data files, every file under templates/, the
longctx code, and the options and provenance the document prints (configuration, baseline, git
commit, package versions). The same inputs give the same hash and so the same version number: a
rebuild of unchanged inputs is the same version with the same bytes, and N counts up only when
something changed. Beside each PDF, longctx-v{N}-{hash}.json keeps the per-length medians, so the
next version can show what changed (same configuration and length: difference and ratio).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd

from ..core.errors import write_atomic
from ..core.hashing import digest
from ..core.numbers import ratio
from .numbers import is_number

LOG = "log.json"
CODE_DIR = Path(__file__).resolve().parents[1]  # the longctx package, every stage
# The medians a version keeps for the next one to compare with.
SNAPSHOT_COLUMNS = ("ttft_s", "tpot_s", "decode_tok_s")


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


def assign(versions_dir: str | Path, content: str) -> dict:
    """This build's version: the number the log gave this hash, or one more than the highest."""
    log = read_log(versions_dir)
    known = [e for e in log if e["hash"] == content]
    n = known[0]["n"] if known else max((e["n"] for e in log), default=0) + 1
    history = sorted((e for e in log if e["n"] < n), key=lambda e: e["n"])
    return {"n": n, "hash": content, "name": f"longctx-v{n}-{content}",
            "previous": history[-1] if history else None, "history": history}


def snapshot(med: pd.DataFrame) -> list[dict]:
    """The per-length medians a version keeps (plain floats, None where not measured)."""
    rows = []
    for r in med.sort_values(["configuration", "length"]).to_dict("records"):
        rows.append({"configuration": r["configuration"], "length": int(r["length"]),
                     **{k: float(r[k]) if is_number(r.get(k)) else None for k in SNAPSHOT_COLUMNS}})
    return rows


def register(versions_dir: str | Path, record: dict, pdf: str | Path) -> Path:
    """Keep the built PDF as versions/<name>.pdf, its record as <name>.json, and log it once."""
    versions_dir = Path(versions_dir)
    versions_dir.mkdir(parents=True, exist_ok=True)
    target = versions_dir / f"{record['name']}.pdf"
    if target.exists() and target.read_bytes() != Path(pdf).read_bytes():
        print(f"warning: {target} existed with other bytes (a build that is not reproducible?); replaced")
    shutil.copyfile(pdf, target)
    write_atomic(versions_dir / f"{record['name']}.json", json.dumps(record, indent=1, sort_keys=True) + "\n")
    log = read_log(versions_dir)
    if not any(e["hash"] == record["hash"] for e in log):
        log.append(record["entry"])
        log.sort(key=lambda e: e["n"])
        write_atomic(versions_dir / LOG, json.dumps({"versions": log}, indent=1, sort_keys=True) + "\n")
    return target


def comparison(versions_dir: str | Path, previous: dict | None, now: list[dict]) -> dict:
    """This version against the previous one: per configuration and length measured by both, the
    difference and ratio of TTFT and decode rate; and what only one of them measured."""
    if previous is None:
        return {"previous": None, "rows": [], "missing": None, "only_now": [], "only_before": []}
    path = Path(versions_dir) / f"longctx-v{previous['n']}-{previous['hash']}.json"
    try:
        before = json.loads(path.read_text())["snapshot"]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        return {"previous": previous, "rows": [], "missing": f"{path.name} cannot be read ({type(exc).__name__})",
                "only_now": [], "only_before": []}
    old = {(r["configuration"], r["length"]): r for r in before}
    new = {(r["configuration"], r["length"]): r for r in now}
    rows = []
    for key in sorted(old.keys() & new.keys()):
        a, b = old[key], new[key]
        rows.append({"configuration": key[0], "length": key[1],
                     "ttft_before_s": a["ttft_s"], "ttft_now_s": b["ttft_s"],
                     "ttft_diff_s": _diff(b["ttft_s"], a["ttft_s"]), "ttft_ratio": ratio(b["ttft_s"], a["ttft_s"]),
                     "decode_before_tok_s": a["decode_tok_s"], "decode_now_tok_s": b["decode_tok_s"],
                     "decode_diff_tok_s": _diff(b["decode_tok_s"], a["decode_tok_s"]),
                     "decode_ratio": ratio(b["decode_tok_s"], a["decode_tok_s"])})
    return {"previous": previous, "rows": rows, "missing": None,
            "only_now": [{"configuration": c, "length": n} for c, n in sorted(new.keys() - old.keys())],
            "only_before": [{"configuration": c, "length": n} for c, n in sorted(old.keys() - new.keys())]}


def _diff(now, before) -> float | None:
    return now - before if is_number(now) and is_number(before) else None
