"""The report: Jinja-templated LaTeX (LaTeX-safe delimiters, every value escaped), built by latexmk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd

from . import __version__
from .analysis import concurrency_table, is_number, medians
from .diagnosis import by_figure, diagnose
from .provenance import git_info, package_versions

# How numbers appear in the report's tables (tests read them back with pdftotext).
FORMATS = {
    "ttft_ms": lambda x: f"{x * 1e3:.1f}",
    "tpot_ms": lambda x: f"{x * 1e3:.2f}",
    "decode_tok_s": lambda x: f"{x:.1f}",
    "e2e_s": lambda x: f"{x:.2f}",
    "accept_length": lambda x: f"{x:.2f}",
    "accept_rate": lambda x: f"{x:.1%}",
    "util": lambda x: f"{x:.0f}",
    "gb": lambda x: f"{x:.2f}",
}

_TEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
}


class TeX(str):
    """A string that is already LaTeX: the template prints it as it is."""


def tex_escape(value) -> str:
    return "".join(_TEX_SPECIALS.get(ch, ch) for ch in str(value))


def _finalize(value):
    if value is None:
        return "--"
    if isinstance(value, TeX):
        return value
    return tex_escape(value)


def _fmt(value, kind: str) -> str:
    return FORMATS[kind](value) if is_number(value) else "--"


def _sig(value, digits: int = 3) -> str:
    """Engineering-style number with `digits` significant digits (1.23e-05 style for tiny ones)."""
    if not is_number(value):
        return "--"
    return f"{value:.{digits}g}"


def environment(template_dir: str | Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        block_start_string=r"\BLOCK{", block_end_string="}",
        variable_start_string=r"\VAR{", variable_end_string="}",
        comment_start_string=r"\#{", comment_end_string="}",
        line_statement_prefix="%%", line_comment_prefix="%#",
        trim_blocks=True, lstrip_blocks=True, autoescape=False,
        undefined=jinja2.StrictUndefined, finalize=_finalize, keep_trailing_newline=True,
    )
    env.filters.update(fmt=_fmt, sig=_sig, tex=lambda s: TeX(s))
    return env


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


def context(results_csv, fits_json, provenance_json, itl_depth_csv=None, planner_json=None) -> dict:
    df = pd.read_csv(results_csv)
    analysis = json.loads(Path(fits_json).read_text())
    fits = analysis["configurations"]
    planner = json.loads(Path(planner_json).read_text()) if planner_json else None
    prov = json.loads(Path(provenance_json).read_text())
    med = medians(df)
    configs = []
    for name in sorted(df["configuration"].unique()):
        p = prov["configurations"].get(name, {})
        configs.append({
            "name": name,
            "engine": p.get("engine"),
            "engine_version": p.get("engine_version"),
            "args": p.get("args", {}),
            "kv_pool": p.get("kv_pool") or {},
            "kernel": p.get("kernel"),
            "spec_hash": p.get("spec_hash"),
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
        "mem": "mem_used_gb" if gpu else "rss_gb",
        "mem_label": "GPU memory used (GB)" if gpu else "server RSS (GB)",
        "any": any(c.startswith("decode_") and med[c].notna().any() for c in med.columns),
    }
    failures = df[df["status"] != "ok"][["configuration", "length", "trial", "reason"]].to_dict("records")
    return {
        "version": __version__,
        "git": git_info(),
        "packages": package_versions(),
        "hardware": first.get("hardware", {}),
        "model": first.get("model", {}),
        "protocol": first.get("protocol", {}),
        "configurations": configs,
        "diagnosis": (sentences := diagnose(med, fits, planner)),
        "diagnosis_groups": by_figure(sentences),
        "analysis": analysis,
        "planner": planner,
        "failures": failures,
        "telemetry": telemetry,
        "itl_depth": itl_depth_summary(itl_depth_csv),
        "concurrency": concurrency_table(df).to_dict("records"),
        "needle": bool("needle" in med and med["needle"].notna().any()),
        "measured_at": datetime.fromtimestamp(source_date_epoch(prov)).isoformat() if prov.get("configurations") else None,
    }


def render(template: str | Path, out_tex: str | Path, ctx: dict) -> None:
    template = Path(template)
    text = environment(template.parent).get_template(template.name).render(**ctx)
    Path(out_tex).parent.mkdir(parents=True, exist_ok=True)
    Path(out_tex).write_text(text)


def build_pdf(tex: str | Path, out_pdf: str | Path, provenance_json: str | Path) -> None:
    """latexmk in a build directory beside the .tex, with dates taken from the data."""
    tex, out_pdf = Path(tex).resolve(), Path(out_pdf).resolve()
    if shutil.which("latexmk") is None:
        raise SystemExit("latexmk is not installed: run `make tex` (as root) or install "
                         "texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended texlive-science lmodern latexmk")
    build = tex.parent / "build"
    build.mkdir(exist_ok=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(source_date_epoch(json.loads(Path(provenance_json).read_text()))),
           "FORCE_SOURCE_DATE": "1"}
    cmd = ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error", f"-outdir={build}", tex.name]
    proc = subprocess.run(cmd, cwd=tex.parent, env=env, capture_output=True, text=True)
    print(proc.stdout[-5000:])
    if proc.returncode != 0:
        raise SystemExit(f"latexmk failed (exit {proc.returncode}); its log: {build / (tex.stem + '.log')}\n{proc.stdout[-3000:]}")
    shutil.copyfile(build / f"{tex.stem}.pdf", out_pdf)
