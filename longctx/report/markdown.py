"""The report's Markdown twin (report/longctx.md) and the Results section a plan document carries.

Both are rendered from templates/markdown/ with the context the PDF is rendered from
(longctx.report.context) and the PDF's version record, in the Markdown dialect of
longctx.report.dialect, so the summary, the headline table (longctx.report.headline.headline) and
the numbers (longctx.report.numbers) are those of the PDF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jinja2

from .context import ReportError, ReportInputs, context, render, render_text, with_version
from .dialect import Dialect
from .numbers import group

_MD_SPECIALS = set("\\`*_[]<>|#")


class Markdown(str):
    """A string that is already Markdown: printed as it is."""


class MarkdownDialect(Dialect):
    """Numbers grouped by thousands as siunitx groups them in the PDF; an unbounded end is ∞."""

    raw = Markdown
    unbounded = "∞"
    approx = "≈"

    def escape(self, value) -> str:
        """Backslash before the characters Markdown would read as markup (| would split a table cell)."""
        return "".join("\\" + ch if ch in _MD_SPECIALS else ch for ch in str(value)).replace("\n", " ")

    def number(self, digits: str) -> Markdown:
        return Markdown(group(digits))

    def significant(self, digits: str) -> Markdown:
        """As `sig` writes them, ungrouped (the twin has always printed them so)."""
        return Markdown(digits)

    def extras(self) -> dict:
        return {"md": Markdown}


MARKDOWN = MarkdownDialect()


def environment(template_dir: str | Path) -> jinja2.Environment:
    return MARKDOWN.environment(jinja2.FileSystemLoader(str(template_dir)))


def _link(target: str | Path, start: str | Path) -> str:
    """target relative to the directory start, with / separators (what a Markdown link wants)."""
    return Path(os.path.relpath(Path(target).resolve(), Path(start).resolve())).as_posix()


def markdown_context(inputs: ReportInputs, version_json, *, versions_dir=None, template_dir=None) -> dict:
    """The PDF's context and version record (version_json, from `render_report`), for the twin and a plan."""
    record = json.loads(Path(version_json).read_text())
    versions_dir = Path(versions_dir) if versions_dir else Path(version_json).parent / "versions"
    ctx = context(inputs, template_dir=template_dir)
    if ctx["baseline"] != record.get("baseline", ctx["baseline"]):
        raise ReportError(f"{version_json} was made with baseline {record['baseline']!r}, not {ctx['baseline']!r}: render the report again")
    return {**with_version(ctx, record, versions_dir), "versions_dir": versions_dir}


def render_twin(template, out_md, version_json, inputs: ReportInputs, *, versions_dir=None) -> None:
    """report/longctx.md: links are relative to it (figures/*.png, versions/<name>.pdf)."""
    template, out_md = Path(template), Path(out_md)
    ctx = markdown_context(inputs, version_json, versions_dir=versions_dir, template_dir=template.parent)
    ctx["pdf_link"] = _link(ctx["versions_dir"] / f"{ctx['version']['name']}.pdf", out_md.parent)
    ctx["figures"] = _link(out_md.parent / "figures", out_md.parent)
    render(template, out_md, ctx, environment(template.parent))


def plan_section(template, plan, version_json, inputs: ReportInputs, *, versions_dir=None) -> str:
    """The Results section for the plan document at `plan` (its links relative to the plan)."""
    template = Path(template)
    ctx = markdown_context(inputs, version_json, versions_dir=versions_dir, template_dir=template.parent)
    ctx["pdf_link"] = _link(ctx["versions_dir"] / f"{ctx['version']['name']}.pdf", Path(plan).parent)
    return render_text(template, ctx, environment(template.parent))
