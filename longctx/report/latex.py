"""The report: Jinja-templated LaTeX (LaTeX-safe delimiters, every value escaped), built by latexmk.

`context` gathers what every rendering of the report shows (the PDF, its Markdown twin, a plan's
Results section): the medians, the fits with their intervals (fits.json), the memory planner
(planner.json), one diagnosis (longctx.report.diagnosis) and one headline table (longctx.report.headline); `render_report` adds the version (longctx.report.versions) and writes the .tex;
`build_pdf` runs latexmk with dates taken from the data and keeps the PDF as a version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import traceback
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
import yaml

from .. import __version__
from ..analysis import bands
from . import versions
from ..analysis.tables import concurrency_table, medians
from .diagnosis import diagnose
from .numbers import FORMATS, SISETUP, interval, plain
from .numbers import sig as _sig_plain
from ..measure.provenance import git_info, package_versions
from .headline import choose_baseline, headline

__all__ = ["FORMATS", "context", "render", "render_report", "build_pdf", "ReportError"]

_TEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
    "`": r"\textasciigrave{}", "'": r"\textquotesingle{}", '"': r"\textquotedbl{}",
}
# Front page: the title block and the summary (sections/summary.tex.j2). Then the body sections in
# this order; a section file not named here (a new analysis) comes after the named ones that precede
# "comparison". Files named appendix_* make the appendix, in APPENDIX_ORDER, then by name.
BODY_ORDER = ("diagnosis", "prefill", "decode", "intervals", "roofline", "hardware", "speculative", "telemetry", "planner", "needle",
              "concurrency", "itl_depth", "comparison", "failures")
APPENDIX_ORDER = ("appendix_configuration", "appendix_servers", "appendix_hardware", "appendix_results",
                  "appendix_versions")
FRONT = ("summary",)
# Config keys whose values are not printed (credentials passed to a server through its environment).
SECRET_KEY = re.compile(r"token|secret|password|passwd|api[_-]?key|credential", re.I)


class ReportError(SystemExit):
    """A report that cannot be made; the message names the file and line at fault."""


class TeX(str):
    """A string that is already LaTeX: the template prints it as it is."""


def tex_escape(value) -> str:
    """value as text that prints as itself: TeX's specials escaped, quotes straight, and no
    ligature (-- , ,, and the like) joining two characters into another."""
    out = "".join(_TEX_SPECIALS.get(ch, ch) for ch in str(value))
    return re.sub(r"([-,])(?=[-,])", r"\1{}", out)


def _finalize(value):
    if value is None:
        return "--"
    if isinstance(value, TeX):
        return value
    if isinstance(value, float) and not np.isfinite(value):
        return "--"
    return tex_escape(value)


def _num(digits: str | None) -> TeX | str:
    return TeX(f"\\num{{{digits}}}") if digits is not None else "--"


def _fmt(value, kind: str):
    """A number as `kind` prints it, typeset by siunitx; -- where there is none."""
    return _num(plain(value, kind))


def _sig(value, digits: int = 3):
    return _num(_sig_plain(value, digits))


def _interval(pair, scale: float = 1.0, digits: int = 3) -> TeX | str:
    """[low, high] of a fit's interval (times scale), -- without one."""
    ends = interval(pair, scale, digits)
    if ends is None:
        return "--"
    high = _num(ends[1]) if ends[1] is not None else r"$\infty$"
    return TeX(f"[{_num(ends[0])}, {high}]")


def _breakable(value) -> TeX:
    """Escaped, with line breaks allowed after / , = (long paths, JSON, command lines)."""
    return TeX(re.sub(r"([/,=])", r"\1\\allowbreak{}", tex_escape(value)))


class _MarkedLoader(jinja2.FileSystemLoader):
    """Each template's output starts and ends with a TeX comment naming it, so that a LaTeX error in
    the .tex can be traced to the template that wrote the line. The marker is one line more at the
    top: template line numbers in errors are corrected by LINE_OFFSET."""

    LINE_OFFSET = 1

    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        shown = _shown_path(filename)
        return f"% >>> template {shown}\n{source}" + ("" if source.endswith("\n") else "\n") + f"% <<< template {shown}\n", filename, uptodate


def _shown_path(filename: str) -> str:
    rel = os.path.relpath(filename)
    return rel if not rel.startswith("..") else filename


def environment(template_dir: str | Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=_MarkedLoader(str(template_dir)),
        block_start_string=r"\BLOCK{", block_end_string="}",
        variable_start_string=r"\VAR{", variable_end_string="}",
        comment_start_string=r"\#{", comment_end_string="}",
        line_statement_prefix="%%", line_comment_prefix="%#",
        trim_blocks=True, lstrip_blocks=True, autoescape=False,
        undefined=jinja2.StrictUndefined, finalize=_finalize, keep_trailing_newline=True,
    )
    env.filters.update(fmt=_fmt, sig=_sig, tex=lambda s: TeX(s), breakable=_breakable,
                       num=lambda v: _fmt(v, "int"), ci=_interval)
    env.globals["SISETUP"] = TeX(SISETUP)
    return env


def template_error(exc: BaseException, offset: int = 0) -> str | None:
    """'<template> line <n>: <what>' for an error raised while rendering a template, or None."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        name = _shown_path(exc.filename) if exc.filename else exc.name
        return f"template {name} line {(exc.lineno or 0) - offset}: {exc.message}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".j2")]
    if not frames:
        return None
    f = frames[-1]
    return f"template {_shown_path(f.filename)} line {f.lineno - offset}: {type(exc).__name__}: {exc}"


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


def _mask(obj):
    """The configuration with the values of secret-looking keys hidden."""
    if isinstance(obj, dict):
        return {k: ("(hidden)" if SECRET_KEY.search(str(k)) and isinstance(v, str) else _mask(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_mask(v) for v in obj]
    return obj


def _command_lines(cmd) -> list[str]:
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


def _scalars(info: dict) -> list[tuple[str, str]]:
    """The server-reported settings that are single values, as (key, text) in key order."""
    out = []
    for k, v in sorted((info or {}).items()):
        if isinstance(v, (dict, list)):
            continue
        out.append((str(k), json.dumps(v) if not isinstance(v, str) else v))
    return out


def context(results_csv, fits_json, provenance_json, itl_depth_csv=None, planner_json=None, *, baseline: str | None = None,
            config: dict | None = None, template_dir: str | Path | None = None) -> dict:
    """What the report shows, from the data files; the same for the PDF, the Markdown twin and a plan."""
    df = pd.read_csv(results_csv)
    analysis = json.loads(Path(fits_json).read_text())
    fits = analysis["configurations"]
    planner = json.loads(Path(planner_json).read_text()) if planner_json else None
    prov = json.loads(Path(provenance_json).read_text())
    med = medians(df)
    names = sorted(df["configuration"].unique())
    order = list(config["configurations"]) if config else names
    base = choose_baseline([n for n in order if n in names] + [n for n in names if n not in order], baseline)
    configs = []
    for name in names:
        p = prov["configurations"].get(name, {})
        configs.append({
            "name": name,
            "engine": p.get("engine"),
            "engine_version": p.get("engine_version"),
            "installed_version": p.get("installed_version"),
            "description": ((config or {}).get("configurations", {}).get(name) or {}).get("description") or None,
            "args": p.get("args", {}),
            "launch": _command_lines(p.get("launch_command")),
            "url": p.get("base_url"),
            "server_args": _scalars(p.get("server_info")),
            "kv_pool": {"tokens": None, "log": None, **(p.get("kv_pool") or {})},
            "kernel": p.get("kernel"),
            "spec_hash": p.get("spec_hash"),
            "startup_s": p.get("startup_s"),
            "starts": p.get("starts"),
            "fit": fits.get(name, {}),
            "rows": med[med["configuration"] == name].to_dict("records"),
            "speculative": bool(med[med["configuration"] == name]["spec_accept_length"].notna().any()),
        })
    first = next(iter(prov["configurations"].values()), {})
    gpu = "decode_sm_util_pct_mean" in med and med["decode_sm_util_pct_mean"].notna().any()
    telemetry = {
        "description": first.get("telemetry", "off"),
        "util": "sm_util_pct" if gpu else "cpu_util_pct",
        "util_label": "SM utilisation (\\%)" if gpu else "CPU (\\% of one core)",
        "util_text": "SM utilisation (%)" if gpu else "CPU (% of one core)",
        "mem": "mem_used_gb" if gpu else "rss_gb",
        "mem_label": "GPU memory used (GB)" if gpu else "server RSS (GB)",
        "any": any(c.startswith("decode_") and med[c].notna().any() for c in med.columns),
    }
    failures = df[df["status"] != "ok"][["configuration", "length", "trial", "reason"]].to_dict("records")
    machines = {json.dumps(p["hardware"], sort_keys=True): p["hardware"] for p in prov["configurations"].values() if p.get("hardware")}
    epoch = source_date_epoch(prov)
    lengths = sorted(int(x) for x in df["length"].unique())
    return {
        "longctx_version": __version__,
        "git": git_info(),
        "packages": package_versions(),
        "hardware": first.get("hardware", {}),
        "machines": list(machines.values()),
        "model": first.get("model", {}),
        "protocol": first.get("protocol", {}),
        "lengths": lengths,
        "configurations": configs,
        "baseline": base,
        "headline": headline(med, base, [n for n in order if n in names] + [n for n in names if n not in order]),
        "diagnosis": diagnose(med, fits, planner),
        "analysis": analysis,
        "planner": planner,
        "bands": {kind: bands.describe(analysis, kind) for kind in bands.KINDS},
        "failures": failures,
        "telemetry": telemetry,
        "itl_depth": itl_depth_summary(itl_depth_csv),
        "concurrency": concurrency_table(df).to_dict("records"),
        "needle": bool("needle" in med and med["needle"].notna().any()),
        "measured_at": datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if prov.get("configurations") else None,
        "source_date_epoch": epoch,
        "config_yaml": yaml.safe_dump(_mask(config), sort_keys=False, width=88).splitlines() if config else [],
        "snapshot": versions.snapshot(med),
        "sections": sections(template_dir) if template_dir else {"front": [], "body": [], "appendix": []},
        "version": None,
        "comparison": None,
    }


def with_version(ctx: dict, record: dict, versions_dir: str | Path) -> dict:
    """The context with this build's version and the comparison with the previous version."""
    return {**ctx, "version": record, "comparison": versions.comparison(versions_dir, record["previous"], ctx["snapshot"])}


def render_text(template: str | Path, ctx: dict, env: jinja2.Environment | None = None) -> str:
    """template (a file in the environment's template directory) rendered with ctx; an error in a
    template names the template and its line."""
    template = Path(template)
    env = env or environment(template.parent)
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


def render(template: str | Path, out: str | Path, ctx: dict, env: jinja2.Environment | None = None) -> None:
    text = render_text(template, ctx, env)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)


def data_files(results_csv, fits_json, provenance_json, itl_depth_csv=None, planner_json=None) -> list:
    """The data a report is made from, in context's order (a version's hash covers each)."""
    return [results_csv, fits_json, provenance_json, itl_depth_csv, planner_json]


def version_of(ctx: dict, files: list, template_dir: str | Path, versions_dir: str | Path, config: dict | None) -> dict:
    """This build's version record (longctx.report.versions): number, hash, previous version, the medians it keeps."""
    extra = {"baseline": ctx["baseline"], "config": config, "git": ctx["git"], "packages": ctx["packages"]}
    record = versions.assign(versions_dir, versions.content_hash(files, template_dir, extra))
    record["snapshot"] = ctx["snapshot"]
    record["baseline"] = ctx["baseline"]
    record["measured_at"] = ctx["measured_at"]
    record["entry"] = {"n": record["n"], "hash": record["hash"], "pdf": f"{record['name']}.pdf",
                       "measured_at": ctx["measured_at"], "commit": ctx["git"]["commit"],
                       "configurations": [c["name"] for c in ctx["configurations"]], "lengths": ctx["lengths"]}
    return record


def render_report(template, out_tex, version_out, results_csv, fits_json, provenance_json, itl_depth_csv=None,
                  planner_json=None, *, baseline: str | None = None, config: dict | None = None, versions_dir=None) -> dict:
    """The .tex and its version record (report/version.json), which the PDF build and the twin read."""
    template = Path(template)
    versions_dir = Path(versions_dir) if versions_dir else Path(out_tex).parent / "versions"
    files = data_files(results_csv, fits_json, provenance_json, itl_depth_csv, planner_json)
    ctx = context(*files, baseline=baseline, config=config, template_dir=template.parent)
    record = version_of(ctx, files, template.parent, versions_dir, config)
    render(template, out_tex, with_version(ctx, record, versions_dir))
    Path(version_out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


_TEX_ERROR = re.compile(r"^(?:\./)?(?P<file>[^:\n]+\.tex):(?P<line>\d+): (?P<msg>.*)$", re.M)
_VAR = re.compile(r"\\VAR\{.*?\}|\\BLOCK\{.*?\}")


def latex_error_origin(tex: Path, log_text: str) -> str | None:
    """For the first error latexmk reported in the .tex: the template that wrote that line, and the
    template's line where its text is found."""
    m = _TEX_ERROR.search(log_text)
    if not m:
        return None
    line_no, msg = int(m["line"]), m["msg"]
    lines = tex.read_text().splitlines()
    where = f"{tex.name} line {line_no}: {msg}"
    if Path(m["file"]).name != tex.name or not 0 < line_no <= len(lines):
        return where
    stack: list[str] = []
    for line in lines[:line_no]:
        if line.startswith("% >>> template "):
            stack.append(line.removeprefix("% >>> template "))
        elif line.startswith("% <<< template ") and stack:
            stack.pop()
    if not stack:
        return where
    name, text = stack[-1], lines[line_no - 1].strip()
    tline = _template_line(Path(name), text)
    return f"template {name}" + (f" line {tline}" if tline else "") + f" (wrote {where}); the line: {text}"


def _template_line(path: Path, text: str) -> int | None:
    """The template line whose literal parts (outside \\VAR{} and \\BLOCK{}) all occur, in order, in text."""
    try:
        source = path.read_text().splitlines()
    except OSError:
        return None
    best, best_len = None, 0
    for i, line in enumerate(source, 1):
        if line.lstrip().startswith(("%%", "%#")):
            continue
        parts = [p.strip() for p in _VAR.split(line) if p.strip()]
        pos, ok = 0, bool(parts)
        for p in parts:
            pos = text.find(p, pos)
            if pos < 0:
                ok = False
                break
            pos += len(p)
        size = sum(map(len, parts))
        if ok and size > best_len:
            best, best_len = i, size
    return best


def build_pdf(tex: str | Path, out_pdf: str | Path, provenance_json: str | Path, version_json: str | Path | None = None,
              versions_dir: str | Path | None = None) -> Path | None:
    """latexmk in a build directory beside the .tex, with dates taken from the data; with version_json,
    the PDF is also kept as versions/<name>.pdf and logged. Returns that copy."""
    tex, out_pdf = Path(tex).resolve(), Path(out_pdf).resolve()
    if shutil.which("latexmk") is None:
        raise ReportError("latexmk is not installed: run `make tex` (as root) or install "
                          "texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended texlive-science lmodern latexmk")
    build = tex.parent / "build"
    build.mkdir(exist_ok=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(source_date_epoch(json.loads(Path(provenance_json).read_text()))),
           "FORCE_SOURCE_DATE": "1"}
    cmd = ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error", f"-outdir={build}", tex.name]
    proc = subprocess.run(cmd, cwd=tex.parent, env=env, capture_output=True, text=True)
    print(proc.stdout[-5000:])
    if proc.returncode != 0:
        log_path = build / (tex.stem + ".log")
        log_text = log_path.read_text(errors="replace") if log_path.exists() else proc.stdout
        origin = latex_error_origin(tex, log_text)
        raise ReportError(f"latexmk failed (exit {proc.returncode})" + (f" at {origin}" if origin else "")
                          + f"\nits log: {log_path}\n{proc.stdout[-3000:]}")
    shutil.copyfile(build / f"{tex.stem}.pdf", out_pdf)
    if version_json is None:
        return None
    record = json.loads(Path(version_json).read_text())
    return versions.register(Path(versions_dir) if versions_dir else out_pdf.parent / "versions", record, out_pdf)
