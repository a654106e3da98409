"""Results other benchmark tools measured, as raw files like the sweep's (configurations with engine: imported).

`longctx import` (rule import_results) reads a configuration's result files with the reader of its format
(one module per tool: vllm_bench, sglang_bench, aiperf, guidellm; records.Run and records.Request are what
each returns), groups their requests into lengths, and writes data/raw/<configuration>/<length>.json for
each, in the sweep's format (measure.rawfiles.RAW_FORMAT): a trial per request sent alone, a batch per run of
requests that overlapped. The rest of the workflow (aggregation, fits, roofline, report) reads them as it
reads its own measurements; the provenance says which tool, version, file and hash each came from and what
the format lacks (records.LACKS).

Lengths: a run whose prompts are all of one length (within SAME_LENGTH) is that length (the run's
configured input length where the file says it, else the median prompt); a run whose prompts vary is
binned (configurations.<name>.bins, default powers of two), each bin at the median prompt of its requests,
its edges stated. Runs at the same length are one length, their requests its trials.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import math
import statistics
from collections import Counter
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import ConfigError
from ...core.hashing import digest
from ...engines import ConfigurationSpec
from ...engines.imported import FORMATS
from .. import provenance
from .records import LACKS, Request, Run

MODULES = {"vllm-bench": "vllm_bench", "sglang-bench": "sglang_bench", "aiperf": "aiperf", "guidellm": "guidellm"}
assert set(MODULES) == set(FORMATS)
SAME_LENGTH = 0.05  # a run whose longest prompt is at most 5% over its shortest is one length


def reader(fmt: str):
    """The reader module of a format (its TOOL and read(path) -> list[Run])."""
    if fmt not in MODULES:
        raise ConfigError(f"unknown import format {fmt!r}; allowed values: {', '.join(MODULES)}")
    return importlib.import_module(f"{__name__}.{MODULES[fmt]}")


def expand(patterns: list[str], where: str) -> list[Path]:
    """The files the globs name (relative to the working directory), each once, in order; a glob that
    matches no file is a ConfigError naming the key."""
    out: list[Path] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern, recursive=True))
        if not found:
            raise ConfigError(f"config key '{where}': {pattern!r} matches no file (globs are relative to the working "
                              f"directory, {Path.cwd()})")
        out += [Path(f) for f in found if Path(f) not in out]
    return out


def files_of(spec_or_conf, name: str) -> list[Path]:
    imported = spec_or_conf.imported if isinstance(spec_or_conf, ConfigurationSpec) else spec_or_conf
    return expand(imported["files"], f"configurations.{name}.files")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_runs(fmt: str, paths: list[Path]) -> list[Run]:
    """Every run of every file; a file the reader refuses is a ConfigError naming the file and the format."""
    mod = reader(fmt)
    runs: list[Run] = []
    for path in paths:
        try:
            runs += mod.read(path)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ConfigError(f"{path} cannot be read as format {fmt!r} ({mod.TOOL}): {exc}") from None
    return runs


@dataclass
class Group:
    """The requests at one length, with where each came from."""

    length: int
    members: list[tuple[Run, int]] = field(default_factory=list)  # (run, index of the request in run.requests)
    how: list[str] = field(default_factory=list)  # how each contributing run placed its requests here


def _edges(lengths: list[int], bins: list[int] | None) -> list[int]:
    if bins:
        return sorted(set(bins))
    lo = 2 ** math.floor(math.log2(max(1, min(lengths))))
    hi = 2 ** (math.floor(math.log2(max(lengths))) + 1)
    return [2**k for k in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]


def _bin(length: int, edges: list[int]) -> tuple[int, int] | None:
    for a, b in zip(edges, edges[1:]):
        if a <= length < b:
            return a, b
    return None


def group(runs: list[Run], bins: list[int] | None = None) -> tuple[list[Group], list[str]]:
    """The lengths the runs' requests are grouped into (see the module's docstring), and a sentence for each
    request that could be placed at no length (a failed one whose prompt length the file does not hold,
    in a run of varying lengths, or a prompt outside the given bins)."""
    groups: dict[int, Group] = {}
    unplaced: list[str] = []

    def at(length: int) -> Group:
        return groups.setdefault(length, Group(length))

    for run in runs:
        lens = [r.prompt_tokens for r in run.requests if r.prompt_tokens]
        where = f"{run.path} (run {run.record})"
        if not lens and run.requested_input_tokens is None:
            unplaced += [f"{where}: {len(run.requests)} request(s) with no prompt length recorded"]
            continue
        if not lens or max(lens) <= min(lens) * (1 + SAME_LENGTH):
            nominal = run.requested_input_tokens
            length = nominal if nominal and (not lens or min(lens) <= nominal * (1 + SAME_LENGTH) and
                                             max(lens) >= nominal * (1 - SAME_LENGTH)) else round(statistics.median(lens))
            g = at(length)
            g.members += [(run, i) for i in range(len(run.requests))]
            spread = f"{min(lens)}-{max(lens)}" if lens and min(lens) != max(lens) else f"{lens[0] if lens else length}"
            g.how.append(f"{where}: one length, prompts of {spread} tokens")
            continue
        edges = _edges(lens, bins)
        placed: dict[tuple[int, int], list[int]] = {}
        median_bin = _bin(round(statistics.median(lens)), edges)
        for i, r in enumerate(run.requests):
            b = _bin(r.prompt_tokens, edges) if r.prompt_tokens else median_bin
            if b is None:
                unplaced.append(f"{where}, request {i}: {r.prompt_tokens} prompt tokens, outside the bins "
                                f"{edges[0]}-{edges[-1]} (configurations.<name>.bins)")
                continue
            placed.setdefault(b, []).append(i)
        for (a, b), idx in sorted(placed.items()):
            in_bin = [run.requests[i].prompt_tokens for i in idx if run.requests[i].prompt_tokens]
            length = round(statistics.median(in_bin)) if in_bin else (a + b) // 2
            g = at(length)
            g.members += [(run, i) for i in idx]
            g.how.append(f"{where}: prompts of {a} to {b - 1} tokens (a bin of a distribution: {len(idx)} request(s), "
                         f"median {length})")
    return [groups[k] for k in sorted(groups)], unplaced


def overlap(requests: list[Request]) -> int | None:
    """The most requests in flight at once, from their start times and latencies (None: not recorded)."""
    spans = [(r.start_s, r.start_s + r.e2e_s) for r in requests if r.ok and r.start_s is not None and r.e2e_s is not None]
    if not spans or len(spans) < sum(r.ok for r in requests):
        return None
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def concurrency(run: Run) -> tuple[int, str]:
    """How many of the run's requests were in flight at once, and how that is known: 1 where the tool sent
    them one at a time (its setting, or no two overlapping in its times), else its limit or the overlap seen."""
    seen = overlap(run.requests)
    if run.concurrency == 1:
        return 1, "the tool's setting: one at a time"
    if seen == 1:
        return 1, "no two requests overlapped in the tool's times"
    if run.concurrency:
        return run.concurrency, f"the tool's limit of {run.concurrency} in flight" + (f" ({seen} seen at once)" if seen else "")
    if seen:
        return seen, f"{seen} in flight at once at most, in the tool's times"
    if not any(r.ok for r in run.requests):
        return 1, "not recorded, and no request succeeded: none was timed in flight beside another"
    return len(run.requests), "not recorded: taken as all of the run's requests at once"


def trial(req: Request) -> dict:
    """One request as a sweep trial: the fields of results.csv the file holds (per-token gaps only where each
    chunk carried one token: a chunk's gap is not divided among tokens the file does not count per chunk)."""
    out: dict = {"status": "ok" if req.ok else "failed", "reason": req.reason, "prompt_tokens": req.prompt_tokens,
                 "completion_tokens": req.completion_tokens, "cached_tokens": req.cached_tokens,
                 "ttft_s": req.ttft_s, "e2e_s": req.e2e_s, "tokens_estimated": False,
                 "usage_source": "server" if req.prompt_tokens_source == "server" else "tool",
                 "tpot_s": None, "decode_tok_s": None, "itl_median_s": None, "itl_max_s": None}
    if req.ok and req.ttft_s is None:
        out.update(status="failed", reason="the tool recorded no time to first token")
        return out
    times = req.token_times_s
    if times is None and req.itl_s is not None and req.ttft_s is not None:
        times = [req.ttft_s]
        for gap in req.itl_s:
            times.append(times[-1] + gap)
    if req.ok and times:
        out["chunks"] = len(times)
        decode_s = times[-1] - times[0]
        # tokens after the first chunk, taking the first chunk as one token (as the tools' own TPOT does)
        decode_tokens = req.completion_tokens - 1 if req.completion_tokens else len(times) - 1
        if decode_tokens > 0 and decode_s > 0:
            out.update(tpot_s=decode_s / decode_tokens, decode_tok_s=decode_tokens / decode_s, decode_s=decode_s)
        gaps = [b - a for a, b in zip(times, times[1:])]
        if gaps and (req.completion_tokens is None or req.completion_tokens == len(times)):
            out.update(itl_median_s=statistics.median(gaps), itl_max_s=max(gaps))
    elif req.ok and req.tpot_s:
        out.update(tpot_s=req.tpot_s, decode_tok_s=1 / req.tpot_s)
    return out


def _file_entry(path: Path, runs: list[Run]) -> dict:
    return {"path": str(path), "sha256": sha256(path), "bytes": path.stat().st_size,
            "runs": [{"record": r.record, "label": r.label, "requests": len(r.requests),
                      "failed": sum(not q.ok for q in r.requests), "tool_version": r.tool_version,
                      "version_source": r.version_source, "started_at": r.started_at, "model": r.model,
                      "tool_summary": r.tool_summary, "notes": r.notes}
                     for r in runs if r.path == str(path)]}


def imported_provenance(spec: ConfigurationSpec, runs: list[Run], paths: list[Path], unplaced: list[str]) -> dict:
    """What the report says of where the rows came from: the tool and its version, each file with its hash,
    what the format lacks (the union over its runs, with why), and the requests placed at no length."""
    imp = spec.imported
    tool = reader(imp["format"]).TOOL
    versions = sorted({r.tool_version for r in runs if r.tool_version})
    lacks: dict[str, str] = {}
    for r in runs:
        for key, why in r.lacks.items():
            lacks.setdefault(key, why)
    cached = [q for r in runs for q in r.requests if q.ok and q.cached_tokens]
    notes = [f"{len(cached)} of {sum(q.ok for r in runs for q in r.requests)} successful requests were served partly from "
             "the server's prefix cache (its cached count is above 0): their TTFT is not a cold prefill's"] if cached else []
    if any(_utc(r.started_at) not in (None, r.started_at) for r in runs):
        notes.append(f"{tool} dates its runs in its machine's local time without the zone: the dates are read as UTC")
    return {
        "format": imp["format"], "tool": tool, "notes": notes,
        # what the config says of the runs' server beyond its flags (longctx.engines.imported: for_record reads them)
        "server_engine": imp.get("server_engine"), "tp_size": imp.get("tp_size"),
        "tool_version": imp.get("tool_version") or (", ".join(versions) if versions else None),
        "version_source": ("config key tool_version" if imp.get("tool_version") else
                           "the files" if versions else (runs[0].version_source if runs else "no run was read")),
        "files": [_file_entry(p, runs) for p in paths],
        "lacks": {k: {"what": LACKS[k], "why": lacks[k]} for k in LACKS if k in lacks},
        "unplaced": unplaced,
        "models": sorted({r.model for r in runs if r.model}),
    }


def lengths_of(spec: ConfigurationSpec) -> list[int]:
    """The lengths an imported configuration's files hold (what the workflow expects of rule import_results)."""
    groups, _ = group(read_runs(spec.imported["format"], files_of(spec, spec.name)), spec.imported.get("bins"))
    return [g.length for g in groups]


def import_configuration(spec: ConfigurationSpec, outdir: str | Path) -> list[int]:
    """Write data/raw/<configuration>/<length>.json for every length the files hold (and the load and
    reused-context files, recording that nothing of theirs was imported); returns the lengths."""
    from ...engines import get_adapter
    from ..provenance import model_provenance
    from ..rawfiles import EMPTY_WORKLOADS, FORMATS as WORKLOAD_FORMATS, RAW_FORMAT, write_json

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    imp = spec.imported
    paths = files_of(spec, spec.name)
    runs = read_runs(imp["format"], paths)
    groups, unplaced = group(runs, imp.get("bins"))
    if not groups:
        raise ConfigError(f"config key 'configurations.{spec.name}.files': no request in {', '.join(map(str, paths))} "
                          f"has a prompt length: nothing to import" + (f" ({'; '.join(unplaced)})" if unplaced else ""))
    hw = imp.get("hardware") or {}
    device = spec.device or "remote"
    prov = {
        # the model as the config describes it, as for an external server
        **model_provenance(get_adapter(spec.engine).for_record(imp), spec),
        # the flags the runs' server ran with, as the config gives them (in server_engine's names; imported below)
        "args": dict(spec.args),
        "device": device,
        # the machine the runs were measured on, as the config names it (not this one: none of its ceilings apply)
        "hardware": {"source": "config", "gpus": [{"name": hw["gpu"]}] * (hw.get("count") or 1) if hw.get("gpu") else [],
                     "cpu": hw.get("cpu")},
        "server_info": {"context_length": imp["context_length"]} if imp.get("context_length") else {},
        "kv_pool": {"given": {"tokens": imp["kv_pool_tokens"], "key": f"configurations.{spec.name}.kv_pool_tokens"}}
        if imp.get("kv_pool_tokens") else {},
        "engine_version": None,
        "settings": spec.settings(),
        "telemetry": "off",
        "imported": imported_provenance(spec, runs, paths, unplaced),
        "git": provenance.git_info(),
        "packages": provenance.package_versions(),
        "run_started_at": provenance.now_iso(),
    }
    prov["imported"]["grouping"] = {str(g.length): g.how for g in groups}
    run_id = digest([f["sha256"] for f in prov["imported"]["files"]])
    common = {"format": RAW_FORMAT, "configuration": spec.name, "engine": spec.engine, "run_id": run_id,
              "spec_hash": spec.spec_hash(), "provenance": prov}
    # the runs' dates; one the file gives without its zone (vLLM's local time) read as UTC, so that the report's own
    # date, the last measurement's, does not depend on where it is rendered (the provenance's notes say so)
    dates = sorted(d for d in (_utc(r.started_at) for r in runs) if d)
    for g in groups:
        trials, batches = [], {}
        for run, i in g.members:
            c, how = concurrency(run)
            t = {**trial(run.requests[i]), "imported": {"path": run.path, "record": run.record, "request": i,
                                                         "concurrency_source": how}}
            if c == 1:
                trials.append({**t, "trial": len(trials)})
            else:
                batch = batches.setdefault((run.path, run.record), {"concurrency": c, "batch": len(batches), "requests": []})
                batch["requests"].append({**t, "concurrency": c, "batch": batch["batch"], "request": len(batch["requests"])})
        every = trials + [r for b in batches.values() for r in b["requests"]]
        ok = [t for t in every if t["status"] == "ok"]
        reasons = Counter(t["reason"] for t in every if t["status"] != "ok" and t["reason"])
        write_json(outdir / f"{g.length}.json", {
            **common, "length": g.length, "status": "ok" if len(ok) == len(every) else ("partial" if ok else "failed"),
            "reason": "; ".join(f"{reasons[why]} request(s): {why}" for why in sorted(reasons)) or None,
            "grouping": g.how, "warmup": [], "trials": trials,
            "batches": [{**b, "aggregate": {"ok": sum(r["status"] == "ok" for r in b["requests"]),
                                            "requests": len(b["requests"])}} for b in batches.values()],
            "started_at": dates[0] if dates else None, "finished_at": dates[-1] if dates else None})
    if spec.protocol["itl_depth"]["length"]:
        write_json(outdir / "itl_depth.json", {**common, "status": "failed", "length": spec.protocol["itl_depth"]["length"],
                                               "reason": f"not measured: imported from {prov['imported']['tool']} results",
                                               "itl_s": [], "depth": []})
    for what, empty in EMPTY_WORKLOADS.items():
        write_json(outdir / f"{what}.json", {**common, "format": WORKLOAD_FORMATS[what], "status": "not configured",
                                             "reason": None, **empty})
    return [g.length for g in groups]


def _utc(stamp: str | None) -> str | None:
    """The stamp with its time zone, one without taken as UTC; None where there is none (or it is no ISO 8601 date)."""
    if not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return stamp if when.tzinfo else when.replace(tzinfo=timezone.utc).isoformat()
