"""The report's Markdown twin (report/longctx.md) and the Results section a plan document carries.

Both are rendered from templates/markdown/ with the context the PDF is rendered from
(longctx.report.latex.context) and the PDF's version record, so the summary, the headline table
(longctx.report.headline.headline) and the numbers (longctx.report.numbers.display) are those of the PDF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jinja2

from .numbers import display, group, interval
from .numbers import sig as _sig
from .latex import ReportError, context, data_files, render, render_text, with_version

_MD_SPECIALS = set("\\`*_[]<>|#")


class Markdown(str):
    """A string that is already Markdown: printed as it is."""


def md_escape(value) -> str:
    """Backslash before the characters Markdown would read as markup (| would split a table cell)."""
    return "".join("\\" + ch if ch in _MD_SPECIALS else ch for ch in str(value)).replace("\n", " ")


def _finalize(value):
    if value is None:
        return "--"
    if isinstance(value, Markdown):
        return value
    return md_escape(value)


def _interval(pair, scale: float = 1.0, digits: int = 3) -> Markdown:
    """[low, high] of a fit's interval (times scale), -- without one: the PDF's, in Markdown."""
    ends = interval(pair, scale, digits)
    if ends is None:
        return Markdown("--")
    return Markdown(f"[{group(ends[0])}, {group(ends[1]) if ends[1] is not None else '∞'}]")


def environment(template_dir: str | Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)), trim_blocks=True, lstrip_blocks=True,
        autoescape=False, undefined=jinja2.StrictUndefined, finalize=_finalize, keep_trailing_newline=True,
    )
    env.filters.update(
        fmt=lambda v, kind: display(v, kind),
        sig=lambda v, digits=3: _sig(v, digits) or "--",
        num=lambda v: display(v, "int"),
        md=lambda s: Markdown(s),
        ci=_interval,
    )
    return env


def _link(target: str | Path, start: str | Path) -> str:
    """target relative to the directory start, with / separators (what a Markdown link wants)."""
    return Path(os.path.relpath(Path(target).resolve(), Path(start).resolve())).as_posix()


def markdown_context(results_csv, fits_json, provenance_json, itl_depth_csv, version_json, planner_json=None, *,
                     baseline=None, config=None, versions_dir=None, template_dir=None) -> dict:
    record = json.loads(Path(version_json).read_text())
    versions_dir = Path(versions_dir) if versions_dir else Path(version_json).parent / "versions"
    ctx = context(*data_files(results_csv, fits_json, provenance_json, itl_depth_csv, planner_json), baseline=baseline,
                  config=config, template_dir=template_dir)
    if ctx["baseline"] != record.get("baseline", ctx["baseline"]):
        raise ReportError(f"{version_json} was made with baseline {record['baseline']!r}, not {ctx['baseline']!r}: render the report again")
    return {**with_version(ctx, record, versions_dir), "versions_dir": versions_dir}


def render_twin(template, out_md, version_json, results_csv, fits_json, provenance_json, itl_depth_csv=None,
                planner_json=None, *, baseline=None, config=None, versions_dir=None) -> None:
    """report/longctx.md: links are relative to it (figures/*.png, versions/<name>.pdf)."""
    template, out_md = Path(template), Path(out_md)
    ctx = markdown_context(results_csv, fits_json, provenance_json, itl_depth_csv, version_json, planner_json,
                           baseline=baseline, config=config, versions_dir=versions_dir, template_dir=template.parent)
    ctx["pdf_link"] = _link(ctx["versions_dir"] / f"{ctx['version']['name']}.pdf", out_md.parent)
    ctx["figures"] = _link(out_md.parent / "figures", out_md.parent)
    render(template, out_md, ctx, environment(template.parent))


def plan_section(template, plan, version_json, results_csv, fits_json, provenance_json, itl_depth_csv=None,
                 planner_json=None, *, baseline=None, config=None, versions_dir=None) -> str:
    """The Results section for the plan document at `plan` (its links relative to the plan)."""
    template = Path(template)
    ctx = markdown_context(results_csv, fits_json, provenance_json, itl_depth_csv, version_json, planner_json,
                           baseline=baseline, config=config, versions_dir=versions_dir, template_dir=template.parent)
    ctx["pdf_link"] = _link(ctx["versions_dir"] / f"{ctx['version']['name']}.pdf", Path(plan).parent)
    return render_text(template, ctx, environment(template.parent))
