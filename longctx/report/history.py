"""The report's history: every kept version of each configuration and length, and where its TTFT or decode rate
stepped (the change points of longctx.analysis.history), in sentences and in a figure (report/history.json, drawn by
longctx.report.figures.history).

The history of version N is the versions before it (its record's "history": the log's entries numbered below N, as
`versions.assign` gave them) and N itself, so a rebuild of the same inputs is the same version with the same
history. Each earlier version's record (report/versions/longctx-v{n}-{hash}.json) gives its trials and what
identifies each configuration's measurements; a configuration's earlier measurements join its series only where they
are like with like with this version's (longctx.analysis.identity.unlike: the same engine, its version and code, hardware, model and settings;
the kernel may differ, that is what the history is about), else the section says which versions were left out, and
why. The series are those of the configurations this version measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..analysis import history as analysis
from ..core.errors import write_atomic
from ..core.words import listed
from ..analysis.compare import METRICS
from ..analysis.identity import unlike
from . import versions


def _by_key(measurements: dict, names) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = {}
    for t in measurements.get("trials") or []:
        if t.get("configuration") in names:
            out.setdefault((t["configuration"], int(t["length"])), []).append(t)
    return out


def _earlier(versions_dir: Path, entry: dict) -> tuple[dict | None, str | None]:
    """An earlier version's measurements, or None and why they cannot be had."""
    path = versions.record_path(versions_dir, entry)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"its record {path} cannot be read ({type(exc).__name__})"
    if "measurements" not in record:
        return None, "it kept only its medians (built before versions kept their trials)"
    return record["measurements"], None


def collect(versions_dir: str | Path, record: dict) -> dict:
    """The series of this version's configurations over the versions up to it: {"histories": {(configuration,
    length): [(version, trials)]}, "versions": the version numbers looked at, "left_out": [{configuration, versions,
    why}], "unread": [{version, why}]}."""
    now = record.get("measurements") or {}
    ids = now.get("configurations") or {}
    histories: dict[tuple[str, int], list[tuple[int, list[dict]]]] = {}
    left: dict[tuple[str, str], list[int]] = {}
    unread = []
    for e in sorted(record.get("history") or [], key=lambda e: e["n"]):
        m, why = _earlier(Path(versions_dir), e)
        if m is None:
            unread.append({"version": e["n"], "why": why})
            continue
        then = m.get("configurations") or {}
        alike = set()
        for name in sorted(ids.keys() & then.keys()):
            why = unlike(then[name], ids[name])
            if why:
                left.setdefault((name, why), []).append(e["n"])
            else:
                alike.add(name)
        for key, trials in _by_key(m, alike).items():
            histories.setdefault(key, []).append((e["n"], trials))
    for key, trials in _by_key(now, set(ids)).items():
        histories.setdefault(key, []).append((record["n"], trials))
    looked = sorted({e["n"] for e in record.get("history") or []} | {record["n"]})
    return {"histories": histories, "versions": looked, "unread": unread,
            "left_out": [{"configuration": c, "versions": ns, "why": w} for (c, w), ns in sorted(left.items())]}


def _name(figure: str) -> str:
    return METRICS[figure].words


def _factor(factor: float, slower: bool) -> str:
    return f"{factor if slower else 1 / factor:.2f}x {'slower' if slower else 'faster'}"


def _vs(ns: list[int]) -> str:
    return listed([f"v{n}" for n in ns])


def step_sentence(s: dict, step: dict) -> str:
    """'Decode in page64 at 16,384 tokens stepped 1.32x slower at v7 (6 versions before it, 6 since)'."""
    where = f"{_name(s['figure'])} in {s['configuration']} at {s['length']:,} tokens"
    before, after = step["points_before"], step["points_after"]
    since = (f"{after} since" if after > 1 else
             "seen in that version alone: a measurement after it tells a step from one slow run")
    text = (f"{where} stepped {_factor(step['factor'], step['slower'])} at v{step['version']} "
            f"({before} version{'s' if before != 1 else ''} before it, {since})")
    return text[0].upper() + text[1:]


def drift_sentence(s: dict) -> str:
    """'over its 3 steps, decode in page64 at 16,384 tokens is 1.51x slower in v12 than in v1'."""
    o = s["overall"]
    return (f"over its {o['steps']} steps, {_name(s['figure'])} in {s['configuration']} at {s['length']:,} tokens is "
            f"{_factor(o['factor'], o['slower'])} in v{o['to']} than in v{o['from']}")


def _most(s: dict) -> dict:
    ns = [p["version"] for p in s["points"]]
    return {"configuration": s["configuration"], "length": s["length"], "points": len(ns), "versions": ns,
            "text": f"{len(ns)} ({_name(s['figure'])} in {s['configuration']} at {s['length']:,} tokens: {_vs(ns)})"}


def view(versions_dir: str | Path, record: dict, confidence: float = 0.95) -> dict:
    """What the history section shows (and report/history.json holds, for its figure): the versions looked at, the
    series analysed with their points and steps, a sentence per step and per series that stepped more than once, or
    why nothing was analysed; the versions left out and why."""
    data = collect(versions_dir, record)
    result = analysis.analyse(data["histories"], confidence)
    series = result.pop("series")
    analysed = [s for s in series if s["analysed"]]
    newest = record["n"]
    steps = sorted(((s, st) for s in analysed for st in s["steps"]),
                   key=lambda x: (x[1]["version"], x[0]["configuration"], x[0]["length"], list(METRICS).index(x[0]["figure"])))
    longest = max(series, key=lambda s: (len(s["points"]), -s["points"][0]["version"] if s["points"] else 0), default=None)
    return {
        **result,
        "version": newest,
        "versions": data["versions"],
        "first": data["versions"][0],
        "series_count": len(series),
        "analysed_count": len(analysed),
        "too_few": not analysed,
        "most": _most(longest) if longest and longest["points"] else None,
        "steps": [{"configuration": s["configuration"], "length": s["length"], "figure": s["figure"], **st,
                   "sentence": step_sentence(s, st)} for s, st in steps],
        "drift": [drift_sentence(s) for s in analysed if len(s["steps"]) > 1],
        "left_out": [{**x, "text": f"{x['configuration']} in {_vs(x['versions'])}: {x['why']}"} for x in data["left_out"]],
        "unread": [{**x, "text": f"v{x['version']}: {x['why']}"} for x in data["unread"]],
        "series": [{k: s[k] for k in ("configuration", "length", "figure", "points", "steps")} for s in analysed],
        "drawn": bool(analysed),
    }


def write(path: str | Path, history: dict) -> None:
    """report/history.json: the view, for the history figure (longctx plot-history)."""
    write_atomic(path, json.dumps(history, indent=1, sort_keys=True) + "\n")


def read(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())
