"""What every rendering of the report shares: the PDF (longctx.report.latex), its Markdown twin and
a plan's Results section (longctx.report.markdown).

`ReportInputs` names what a report is made from (the data files, the baseline, the configuration);
`context` reads them into what the report shows: the medians, the fits with their intervals
(fits.json), the memory planner (planner.json), the load workloads where they were measured (load.json
and load_metrics.csv, longctx.report.load), the prefix cache where it was (prefix_fits.json,
longctx.report.prefix), one diagnosis (longctx.report.diagnosis) and one headline
table (longctx.report.headline). `version_of` makes this build's version record and
`with_version` adds it, with the comparison to an earlier version (longctx.report.changes) and the history of
every version up to it, with its change points (longctx.report.history).
`render_text` and `render` fill a template in a dialect's Jinja environment; an error names the
template and its line.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
import yaml

from ..core.errors import write_atomic
from .. import __version__
from ..core.net import is_loopback
from ..core.secrets import mask, mask_argv, redact_config
from ..analysis import bands
from ..analysis.tables import concurrency_table, decode_absent, length_cause, medians
from ..measure.provenance import git_info, package_versions
from ..specs.hardware import TABLE_PATH
from . import (advice as adviceview, changes, drafting as draftview, drift as driftview, history as historyview, load as loadview,
               prefix as prefixview, versions, whatif as whatifview, wording)
from .diagnosis import bound_words, diagnose
from .headline import choose_baseline, compact, headline
from .figures import regime_places

__all__ = ["DATA_FILES", "ReportError", "ReportInputs", "command_lines", "context", "itl_depth_summary", "mask",
           "render", "render_text", "sections", "shown_path", "source_date_epoch", "template_error", "version_of",
           "with_version"]

# Front page: the title block and the summary (sections/summary.tex.j2). Then the body sections in
# this order; a section file not named here (a new analysis) comes after the named ones that precede
# "comparison". Files named appendix_* make the appendix, in APPENDIX_ORDER, then by name.
BODY_ORDER = ("diagnosis", "prefill", "decode", "intervals", "roofline", "hardware", "speculative", "telemetry", "planner", "needle",
              "concurrency", "load", "whatif", "advice", "prefix", "itl_depth", "comparison", "history", "failures")
APPENDIX_ORDER = ("appendix_configuration", "appendix_servers", "appendix_model", "appendix_hardware", "appendix_results",
                  "appendix_versions")
FRONT = ("summary",)
# The data files a report reads: the fields of ReportInputs, in this order, are the keys of
# rules/common.smk's REPORT_DATA and the options of `longctx render/markdown/plan-section`.
DATA_FILES = ("results", "fits", "provenance", "itl_depth", "planner", "prefix", "load", "load_metrics", "whatif",
              "advice")


class ReportError(SystemExit):
    """A report that cannot be made; the message names the file and line at fault."""


@dataclass(frozen=True)
class ReportInputs:
    """What a report is made from: the same for the PDF, its Markdown twin and a plan's section."""

    results: str | Path
    """data/results.csv: one row per request (longctx.analysis.aggregate)."""
    fits: str | Path
    """data/fits.json: the fits per configuration, with their intervals (longctx.analysis.fits)."""
    provenance: str | Path
    """data/provenance.json: engine, launch command, server settings, hardware and model per configuration."""
    itl_depth: str | Path | None = None
    """data/itl_depth.csv: inter-token latency against KV depth; None where it was not measured."""
    planner: str | Path | None = None
    """data/planner.json: the KV memory planner (longctx.analysis.memory); None: no planner."""
    prefix: str | Path | None = None
    """data/prefix_fits.json: the prefix cache's analysis (longctx.analysis.prefix_model); None or absent: no prefix section."""
    load: str | Path | None = None
    """data/load.json: the load workloads' analysis (longctx.analysis.load); None or absent: no load section."""
    load_metrics: str | Path | None = None
    """data/load_metrics.csv: the server's own series over every load workload; None: none."""
    whatif: str | Path | None = None
    """data/whatif.json: the serving model simulated (longctx.analysis.whatif); None or absent: no what-if section."""
    advice: str | Path | None = None
    """report/advice.json: the flags to restart with toward the config's goal (longctx.analysis.advise); None or
    absent (no goal set): no advice section."""
    baseline: str | None = None
    """The configuration speedups are against; None: the first one in the configuration's order."""
    config: dict | None = None
    """The validated configuration: the configurations' order and descriptions, and the appendix's
    listing of it (secrets hidden); a version's hash covers it."""

    def files(self) -> list:
        """The data files in DATA_FILES order, None where one is absent (a version's hash covers each)."""
        return [getattr(self, name) for name in DATA_FILES]


def shown_path(filename: str) -> str:
    """A template's file name as an error shows it: relative to the working directory when it lies below it."""
    rel = os.path.relpath(filename)
    return rel if not rel.startswith("..") else filename


def template_error(exc: BaseException, offset: int = 0) -> str | None:
    """'<template> line <n>: <what>' for an error raised while rendering a template, or None."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        name = shown_path(exc.filename) if exc.filename else exc.name
        return f"template {name} line {(exc.lineno or 0) - offset}: {exc.message}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".j2")]
    if not frames:
        return None
    f = frames[-1]
    return f"template {shown_path(f.filename)} line {f.lineno - offset}: {type(exc).__name__}: {exc}"


def source_date_epoch(provenance: dict) -> int:
    """The time of the last measurement: the report's date, so a rebuild gives the same bytes."""
    stamps = [c.get("last_finished_at") for c in provenance.get("configurations", {}).values()]
    stamps = [datetime.fromisoformat(s) for s in stamps if s]
    return int(max(stamps).timestamp()) if stamps else 0


def itl_depth_summary(itl_depth_csv) -> list[dict]:
    """Per configuration: the depth range, median ITL in the first and last tenth, and the slope."""
    if not itl_depth_csv:
        return []
    df = pd.read_csv(itl_depth_csv)
    out = []
    for name, g in df.groupby("configuration", sort=True):
        g = g[g["itl_s"].notna()].sort_values("depth")
        if len(g) < 10:
            out.append({"name": name, "reason": g["reason"].iloc[0] if "reason" in g and len(g) else "no tokens"})
            continue
        tenth = max(1, len(g) // 10)
        slope = float(np.polyfit(g["depth"], g["itl_s"], 1)[0])
        out.append({"name": name, "first": int(g["depth"].iloc[0]), "last": int(g["depth"].iloc[-1]),
                    "itl_start_ms": g["itl_s"].iloc[:tenth].median() * 1e3, "itl_end_ms": g["itl_s"].iloc[-tenth:].median() * 1e3,
                    "slope_us_per_1k": slope * 1e9, "reason": None})
    return out


def sections(template_dir: str | Path) -> dict[str, list[str]]:
    """The section templates under template_dir/sections/, in the order the report shows them."""
    names = sorted(p.name.removesuffix(".tex.j2") for p in (Path(template_dir) / "sections").glob("*.tex.j2"))
    appendix = [n for n in APPENDIX_ORDER if n in names] + [n for n in names if n.startswith("appendix_") and n not in APPENDIX_ORDER]
    known = [n for n in BODY_ORDER if n in names]
    new = [n for n in names if n not in BODY_ORDER and n not in FRONT and not n.startswith("appendix_")]
    cut = known.index("comparison") if "comparison" in known else len(known)
    return {"front": [n for n in FRONT if n in names], "body": known[:cut] + new + known[cut:], "appendix": appendix}


def command_lines(cmd) -> list[str]:
    """A launch command: the program on the first line, then one --flag and its value per line."""
    if not cmd:
        return []
    head: list[str] = []
    lines: list[str] = []
    for word in cmd:
        if word.startswith("--"):
            lines.append(word)
        elif lines:
            lines[-1] += " " + word
        else:
            head.append(word)
    return [" ".join(head), *lines] if head else lines


def needle_rows(med: pd.DataFrame) -> list[dict]:
    """The needle probe per configuration and length, where it was run or said why not: its verdict, the
    model's answer, and the reason beside a verdict that needs one (failed: the probe got no answer, with the
    transport's or server's words; not applicable; a prompt that could not be brought to its length)."""
    if "needle" not in med:
        return []

    def text(value) -> str | None:
        return value.strip() if isinstance(value, str) and value.strip() else None

    return [{"configuration": r["configuration"], "length": r["length"], "partial": bool(r.get("partial")),
             "verdict": r["needle"], "answer": text(r.get("needle_answer")), "reason": text(r.get("needle_reason"))}
            for r in med.to_dict("records") if text(r.get("needle"))]


def settings_against_first(configs: list[dict]) -> None:
    """Each configuration's `settings_shown` (the server's settings the appendix prints) and `settings_base`: the first
    configuration whose server reported settings prints them all; another whose settings are mostly the same prints
    only those that differ from it (and those it lacks, as 'not reported'), as that one's 'except'."""
    first = next((c for c in configs if c["server_args"]), None)
    for c in configs:
        c["settings_shown"], c["settings_base"] = c["server_args"], None
        if first is None or c is first or not c["server_args"]:
            continue
        mine, base = dict(c["server_args"]), dict(first["server_args"])
        differ = [(k, mine.get(k, "not reported")) for k in sorted(set(mine) | set(base)) if mine.get(k) != base.get(k)]
        if len(differ) < len(mine) / 2:
            c["settings_shown"], c["settings_base"] = differ, first["name"]


# the figure each `drawn` flag stands for (longctx.report.figures' names)
DRAWN_FIGURES = {"ttft": ("ttft",), "decode": ("decode_rate", "step_time"), "fits": ("residuals", "extrapolation"),
                 "planner": ("planner",)}


def without_undrawn(diagnosis: dict, drawn: dict) -> dict:
    """The diagnosis with no sentence pointing at a figure the report does not draw (nothing to draw in it)."""
    gone = {f for flag, figures in DRAWN_FIGURES.items() if not drawn[flag] for f in figures}

    def fix(items: list[dict]) -> list[dict]:
        return [{**d, "figure": None if d.get("figure") in gone else d.get("figure")} for d in items]

    return {**diagnosis, "summary": fix(diagnosis["summary"]), "planner": fix(diagnosis["planner"]),
            "configurations": [{**g, "items": fix(g["items"])} for g in diagnosis["configurations"]]}


def planner_groups(configs: list[dict], plans: dict) -> list[dict]:
    """The planner section's blocks: configurations next to each other whose planner entries read the same (the
    memory free before loading, which moves by megabytes between starts, aside) share one, with that memory as a
    range. Each {names, p (the first one's entry), reason, memory: (lowest, highest) bytes or None}."""
    out: list[dict] = []
    for c in configs:
        p = plans.get(c["name"])
        if p is None:
            continue
        # what the section prints: not the memory itself, nor the uncapped pools that follow it (the figure's)
        key = json.dumps({**p, "memory": {k: v for k, v in p["memory"].items() if k != "memory_bytes"},
                          "rows": [{k: v for k, v in r.items() if k != "pool_tokens_uncapped"} for r in p.get("rows") or []]},
                         sort_keys=True, default=str)
        mem = p["memory"].get("memory_bytes")
        prev = out[-1] if out else None
        if prev and prev["key"] == key and prev["reason"] == c["planner_reason"]:
            prev["names"].append(c["name"])
            if mem is not None and prev["memory"]:
                prev["memory"] = (min(prev["memory"][0], mem), max(prev["memory"][1], mem))
            continue
        out.append({"key": key, "names": [c["name"]], "p": p, "reason": c["planner_reason"],
                    "memory": (mem, mem) if mem is not None else None})
    return [{k: v for k, v in g.items() if k != "key"} for g in out]


def needle_table(rows: list[dict]) -> list[dict]:
    """The needle section's table: a configuration whose every length has the same verdict and words is one row
    ("every length, 1,024 to 16,384"), and configurations whose one row reads the same share it; otherwise a row
    per length. Each row: {configuration (names), lengths (words), partial, verdict, answer, reason}."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["configuration"], []).append(r)
    out: list[dict] = []
    for name, rs in by.items():
        same = len(rs) > 1 and not any(r["partial"] for r in rs) and \
            len({(r["verdict"], r["answer"], r["reason"]) for r in rs}) == 1
        if not same:
            out += [{**r, "lengths": f"{int(r['length']):,}"} for r in rs]
            continue
        one = {**rs[0], "lengths": f"every length, {int(rs[0]['length']):,} to {int(rs[-1]['length']):,}"}
        prev = out[-1] if out else None
        if prev and all(prev[k] == one[k] for k in ("lengths", "verdict", "answer", "reason", "partial")):
            prev["configuration"] += f", {name}"
        else:
            out.append(one)
    return out


def failure_rows(df: pd.DataFrame) -> list[dict]:
    """One row per length that lost requests (or noted a failed warm-up): what lost it where that was its
    server (it died, it stopped answering), not the transport errors behind it; else the length's own
    reason (its requests' reasons, from the raw file), else its requests' reasons; and how many were lost.
    A length whose first attempt a transient fault lost and that was then measured in full is a row too: how it
    was measured again, and after what."""
    out = []
    for (name, length), g in df.groupby(["configuration", "length"], sort=True):
        bad = g[g["status"] != "ok"]
        noted = g["length_reason"].dropna() if "length_reason" in g else pd.Series(dtype=object)
        again = g["length_remeasured"].dropna() if "length_remeasured" in g else pd.Series(dtype=object)
        if bad.empty and noted.empty and len(again):  # lost to a transient fault, then measured in full
            out.append({"configuration": name, "length": int(length), "reason": again.iloc[0],
                        "lost": "none: measured again"})
            continue
        if bad.empty and noted.empty:
            continue
        reason = length_cause(g)
        measured = "trial" in g and g["trial"].notna().any()
        out.append({"configuration": name, "length": int(length), "reason": reason,
                    "lost": f"{len(bad)} of {len(g)}" if measured else "all"})
    return out


def flushes(entries: dict, names: list[str]) -> dict[str, list[str]]:
    """Which configurations' prefix caches were flushed before each request ("flushed"), and which
    servers offer no flush, so that only the unique prompt prefixes kept caches from serving a trial
    ("unique"): from each one's protocol and the flush endpoint its API has (provenance flush_path;
    a record from before it was kept counts as flushed where the protocol asked for it)."""
    out: dict[str, list[str]] = {"flushed": [], "unique": []}
    for name in names:
        p = entries.get(name) or {}
        if not (p.get("protocol") or {}).get("flush_cache"):
            out["unique"].append(name)
        elif "flush_path" not in p or p["flush_path"]:
            out["flushed"].append(name)
        else:
            out["unique"].append(name)
    return out


def context(inputs: ReportInputs, *, template_dir: str | Path | None = None) -> dict:
    """What the report shows, from the data files; the same for the PDF, the Markdown twin and a plan."""
    config = inputs.config
    df = pd.read_csv(inputs.results)
    analysis = json.loads(Path(inputs.fits).read_text())
    fits = dict(analysis["configurations"])
    planner = json.loads(Path(inputs.planner).read_text()) if inputs.planner else None
    prov = json.loads(Path(inputs.provenance).read_text())
    med = medians(df, prov)  # with the partial lengths (fewer ok trials than the protocol's) marked
    names = sorted(df["configuration"].unique())
    order = list(config["configurations"]) if config else names
    base = choose_baseline([n for n in order if n in names] + [n for n in names if n not in order], inputs.baseline)
    plans = (planner or {}).get("configurations", {})
    for name, fit in fits.items():  # ceilings the fits took for another device than the recorded one are not its
        recorded = (prov["configurations"].get(name) or {}).get("device")
        taken = (fit.get("ceilings") or {}).get("device")
        if recorded in wording.DEVICES and taken and taken != recorded:
            fits[name] = wording.without_ceilings(fit, recorded)
    partial = wording.partial_lengths(med, analysis)
    configs = []
    for name in names:
        p = prov["configurations"].get(name, {})
        fit = fits.get(name, {})
        if "model_spec" not in fit and p.get("model_spec"):  # nothing fitted: the model as its configuration describes it
            fit = {**fit, "model_spec": p["model_spec"], "kv_bytes_per_token": (p.get("model") or {}).get("kv_bytes_per_token"),
                   "kv_bytes_source": (p["model_spec"].get("field_sources") or {}).get("kv_bytes_per_token"), **({"model_spec_absent": p["model_spec_absent"]}
                                                             if p.get("model_spec_absent") else {})}
        info = p.get("server_info") if isinstance(p.get("server_info"), dict) else {}
        where = wording.device(p, fit)
        spec = fit.get("model_spec") or {}
        configs.append({
            "name": name,
            "engine": p.get("engine"),
            "engine_version": wording.engine_version(p),
            "engine_text": wording.engine_text(p),
            "imported": wording.imported(p),
            "prediction": wording.prediction(fit),
            "sweep": p.get("sweep") if (p.get("sweep") or {}).get("path") is not None else None,
            "sweep_confirmation": wording.sweep_confirmation(p["sweep"]) if p.get("sweep") else None,
            "managed": wording.managed(p),
            "installed_version": p.get("installed_version"),
            "description": ((config or {}).get("configurations", {}).get(name) or {}).get("description") or None,
            "args": mask(p.get("args", {})),
            "launch": command_lines(mask_argv(p.get("launch_command"))),
            "url": p.get("base_url"),
            "server_info_recorded": "server_info" in p,
            "server_args": wording.server_settings(mask(info)),
            "settings_endpoints": wording.settings_endpoints(info),
            "device": where,
            "device_text": wording.DEVICE_WORDS.get(where, "not recorded") if where else "not recorded",
            "attention": spec.get("attention") if spec and "model_spec_absent" not in fit else None,
            "tp_size": spec.get("tp_size") or 1,
            "telemetry": wording.telemetry(p.get("telemetry", "off")),
            "prompts": wording.prompt_probe(p.get("prompt_probe")),
            "probe_answers": list((p.get("prompt_probe") or {}).get("answers") or []),
            "flags": wording.trial_flags(df[df["configuration"] == name], p, fit),
            "stray_server": p.get("stray_server"),
            "recovered": p.get("recovered") or [],
            "drift_words": driftview.run_words(p.get("metronome")),  # the run's drift (longctx.report.drift)
            "served": wording.model_served(fit, plans.get(name), (p.get("model") or {}).get("name")),
            "planner_reason": wording.planner_reason(plans[name]) if name in plans else None,
            "kv_pool": {"tokens": None, "log": None, **(p.get("kv_pool") or {})},
            "kernel": p.get("kernel"),
            "spec_hash": p.get("spec_hash"),
            "startup_s": p.get("startup_s"),
            "starts": p.get("starts"),
            # a server longctx started on an address other than loopback (server.allow_remote): reachable from the network
            "remote_listen": p["listen"] if p.get("listen") and not is_loopback(p["listen"]) else None,
            "fit": fit,
            "bound": bound_words(fit),  # what bounds each phase (longctx.analysis.bounds), in words; None: not decided
            "no_fit": wording.no_fit(fit, med[med["configuration"] == name]),  # why a phase has no model, in words
            # whether each fit may carry claims (extrapolations among them): fits.json's quality, usable where absent
            "claims": {k: bool(((fit.get("quality") or {}).get(k) or {"usable": True})["usable"]) for k in ("prefill", "decode")},
            "rows": med[med["configuration"] == name].to_dict("records"),
            "partial": [r for r in partial["rows"] if r["configuration"] == name],
            "speculative": bool(med[med["configuration"] == name]["spec_accept_length"].notna().any()),
        })
    # the served model, hardware and protocol: from the first configuration whose server started
    # (one whose every length failed before a server answered records none of them)
    entries = list(prov["configurations"].values())
    first = next((p for p in entries if p.get("model")), entries[0] if entries else {})
    gpu = "decode_sm_util_pct_mean" in med and med["decode_sm_util_pct_mean"].notna().any()
    sources = [c["telemetry"] for c in configs if c["telemetry"]["source"] not in ("off", None)]
    labels = wording.telemetry_labels([s["text"] for s in sources], gpu)
    telemetry = {
        "description": first.get("telemetry", "off") if isinstance(first.get("telemetry", "off"), str)
        else wording.telemetry(first.get("telemetry"))["text"],
        "sources": sorted({re.sub(r"\s*\(pid \d+\)", "", s["text"]) for s in sources}),  # one per kind of source
        # the configurations' own descriptions differ (one remote, one on this CPU...): each is said
        "per_configuration": len({re.sub(r"\(pid \d+[^)]*\)", "", c["telemetry"]["text"]) for c in configs}) > 1,
        "gpm": wording.gpm_line([s["text"] for s in sources]),
        "util": "sm_util_pct" if gpu else "cpu_util_pct",
        "util_label": labels["util"],
        "util_text": labels["util"],
        "mem": "mem_used_gb" if gpu else "rss_gb",
        "mem_label": labels["mem"],
        "any": any(c.startswith("decode_") and med[c].notna().any() for c in med.columns),
    }
    devices = {c["device"] for c in configs}
    settings_against_first(configs)
    # the planner's configurations whose pool SGLang's sizing rule modelled (those with rows)
    ruled = [c for c in configs if (plans.get(c["name"]) or {}).get("rows")]
    served = _served_groups(configs)
    engines: dict[str, list[str]] = {}
    for c in configs:
        engines.setdefault(c["engine_text"] + (f", on {c['device_text']}" if c["device"] else ""), []).append(c["name"])
    failures = failure_rows(df)
    cache_flush = flushes(prov["configurations"], names)
    # the machines that measured (an imported configuration's hardware is the config's word for another one)
    machines = {json.dumps(p["hardware"], sort_keys=True): p["hardware"] for p in prov["configurations"].values()
                if p.get("hardware") and p["hardware"].get("source") != "config"}
    epoch = source_date_epoch(prov)
    load = loadview.read(inputs.load)
    prefix = prefixview.read(inputs.prefix)
    lengths = sorted(int(x) for x in df["length"].unique())
    out = {
        "longctx_version": __version__,
        "git": git_info(),
        "packages": package_versions(),
        "hardware": next(iter(machines.values()), {}),
        "machines": list(machines.values()),
        "model": {"name": None, "kv_bytes_per_token": None, "architecture": None, **first.get("model", {})},
        "protocol": first.get("protocol", {}),
        "lengths": lengths,
        "configurations": configs,
        "baseline": base,
        "headline": headline(med, base, [n for n in order if n in names] + [n for n in names if n not in order],
                             df, analysis.get("settings")),
        "analysis": analysis,
        "planner": planner,
        "bands": {kind: bands.describe(analysis, kind) for kind in bands.KINDS},
        "failures": failures,
        "partial": partial,
        # servers longctx started beyond loopback (server.allow_remote): page one names them (the appendix too: remote_listen)
        "exposed": wording.exposed(configs),
        "flagged": [{"name": c["name"], "flags": c["flags"]} for c in configs if c["flags"]],
        "cache_flush": cache_flush,
        "measured": bool((med["ttft_s"] > 0).any()),  # False: no length of any configuration has a usable TTFT
        # the figures with something to draw; one without is a line in its section, not a page of axes
        "decode_absent": decode_absent(df),  # why no decode figure is drawn, where none is
        "drawn": {"ttft": bool((med["ttft_s"] > 0).any()),
                  "decode": bool((med["decode_tok_s"] > 0).any()) if "decode_tok_s" in med else False,
                  "fits": any(f.get("prefill") or f.get("decode") for f in fits.values()),
                  "planner": any(p.get("rows") for p in plans.values())},
        # the overview's dotted verticals (longctx.report.figures.measured.overview): its caption says what they are
        "regime_changes": bool(regime_places(fits, names)),
        "telemetry": telemetry,
        "devices": {"gpu": "gpu" in devices, "cpu": "cpu" in devices, "remote": "remote" in devices or any(c["imported"] for c in configs),
                    "remote_names": [c["name"] for c in configs if c["device"] == "remote" or c["imported"]]},
        "imported": [c for c in configs if c["imported"]],
        "predicted": [c for c in configs if c["prediction"]],
        "swept": [c for c in configs if c["sweep"]],
        "mla": any(c["attention"] == "mla" for c in configs),
        "tensor_parallel": any((c["tp_size"] or 1) > 1 for c in configs),
        "served": served,
        "engines": [{"text": text, "names": ns, "all": len(engines) == 1 and len(configs) > 1} for text, ns in engines.items()],
        "planner_rule": {"names": [c["name"] for c in ruled], "gpu": any(c["device"] == "gpu" for c in ruled),
                         "mla": any(c["attention"] == "mla" for c in ruled),
                         "tensor_parallel": any((c["tp_size"] or 1) > 1 for c in ruled)},
        "hardware_table": f"longctx/{TABLE_PATH.parent.name}/{TABLE_PATH.name}",
        "itl_depth": itl_depth_summary(inputs.itl_depth),
        "concurrency": concurrency_table(df).to_dict("records"),
        "needle": needle_rows(med),
        "needle_table": needle_table(needle_rows(med)),
        "planner_groups": planner_groups(configs, plans),
        # the load workloads (longctx.report.load.view): the load section and its figures where any was measured
        "load": loadview.view(load, loadview.read_metrics(inputs.load_metrics), order),
        # the sweep's lone request against the load stage's, read against the drift around them (longctx.report.drift)
        "lone": driftview.lone_requests(df, load, prov, order),
        # the serving model simulated against the load points, and the what-if grid (longctx.report.whatif.view)
        "whatif": whatifview.view(whatifview.read(inputs.whatif), order, load),
        # the flags to restart with toward the config's goal (longctx.report.advice.view)
        "advice": adviceview.view(adviceview.read(inputs.advice), order),
        # the prefix cache's hit rates and conversations (longctx.report.prefix.view): its section where measured
        "prefix": prefixview.view(prefix, order),
        # each drafting configuration against its twin without drafting (longctx.report.drafting.view)
        "drafting": draftview.view(analysis.get("drafting")),
        "measured_at": datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if prov.get("configurations") else None,
        "source_date_epoch": epoch,
        # lists and maps of plain values on one line each (flow style): the appendix is read, not edited
        # the one redaction (a config read by `longctx render --configfile` is the file as written)
        "config_yaml": yaml.safe_dump(redact_config(config), sort_keys=False, width=100, default_flow_style=None).splitlines() if config else [],
        "measurements": versions.measurements(df, prov),
        "sections": sections(template_dir) if template_dir else {"front": [], "body": [], "appendix": []},
        "version": None,
        "comparison": None,
        "history": None,
    }
    # page one's answer and the diagnosis: the headline's speedups (with their intervals) are what it compares
    out["compact"] = compact(out["headline"])
    out["diagnosis"] = without_undrawn(diagnose(med, fits, planner, out["headline"], analysis.get("settings"), load, prefix),
                                       out["drawn"])
    return out


def _served_groups(configs: list[dict]) -> list[dict]:
    """The model as served, one entry per distinct description, with the configurations that share it."""
    groups: dict[str, dict] = {}
    for c in configs:
        key = json.dumps(c["served"], sort_keys=True, default=str)
        groups.setdefault(key, {**c["served"], "names": []})["names"].append(c["name"])
    return list(groups.values())


def version_of(ctx: dict, inputs: ReportInputs, template_dir: str | Path, versions_dir: str | Path) -> dict:
    """This build's version record (longctx.report.versions): number, hash, previous version, the trials it keeps
    and what identifies them, and what it is compared with (report.compare_to, report.regression_margin)."""
    extra = {"baseline": ctx["baseline"], "config": inputs.config, "git": ctx["git"], "packages": ctx["packages"]}
    frame = versions.content_hash([], template_dir, extra)
    known_data = versions.learned(ctx["measurements"], [inputs.itl_depth, inputs.prefix, inputs.load, inputs.load_metrics])
    record = versions.assign(versions_dir, versions.content_hash(inputs.files(), template_dir, extra), frame, known_data)
    report = (inputs.config or {}).get("report") or {}
    record["measurements"] = ctx["measurements"]
    record["compare"] = {"against": report.get("compare_to") or changes.PREVIOUS,
                         "margin": report.get("regression_margin", changes.MARGIN),
                         "confidence": (ctx["analysis"].get("settings") or {}).get("confidence", 0.95)}
    record["baseline"] = ctx["baseline"]
    record["measured_at"] = ctx["measured_at"]
    record["entry"] = {"n": record["n"], "hash": record["hash"], "pdf": f"{record['name']}.pdf",
                       "measured_at": ctx["measured_at"], "commit": ctx["git"]["commit"], "frame": frame,
                       "learned": known_data,
                       "configurations": [c["name"] for c in ctx["configurations"]], "lengths": ctx["lengths"]}
    return record


def with_version(ctx: dict, record: dict, versions_dir: str | Path) -> dict:
    """The context with this build's version, its comparison with the version it is compared with
    (longctx.report.changes; `missing` says why there is none; a row's partial_now: the length is partial in this
    version, marked like every per-length row) and its history over every version up to it, with its change points
    (longctx.report.history)."""
    settings = record.get("compare") or {}
    try:
        before, why = changes.baseline_of(versions_dir, record, settings.get("against"))
        cmp = changes.against_record(before, record) if before else {"missing": why, "sentence": None}
    except changes.VersionError as exc:
        cmp = {"missing": str(exc.code), "sentence": None}
    cmp["against"] = settings.get("against") or changes.PREVIOUS
    keys = set((ctx.get("partial") or {}).get("keys") or [])
    for r in cmp.get("rows") or []:
        r["partial_now"] = r["key"] in keys
    history = historyview.view(versions_dir, record, settings.get("confidence", 0.95))
    return {**ctx, "version": record, "comparison": cmp, "history": history}


def render_text(template: str | Path, ctx: dict, env: jinja2.Environment) -> str:
    """template (a file in the environment's template directory) rendered with ctx; an error in a
    template names the template and its line."""
    template = Path(template)
    offset = getattr(env.loader, "LINE_OFFSET", 0)
    try:
        return env.get_template(template.name).render(**ctx)
    except jinja2.TemplateNotFound as exc:
        raise ReportError(f"template {exc.name} not found under {template.parent}") from None
    except Exception as exc:
        where = template_error(exc, offset)
        if where is None:
            raise
        raise ReportError(f"cannot render {template}: {where}") from exc


def render(template: str | Path, out: str | Path, ctx: dict, env: jinja2.Environment) -> None:
    """render_text, written to out."""
    text = render_text(template, ctx, env)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text)
