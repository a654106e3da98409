"""The report as a PDF: Jinja-templated LaTeX (LaTeX-safe delimiters, every value escaped), built by latexmk.

`TEX` is the TeX dialect of longctx.report.dialect (escaping, \\num for numbers); `environment` is
the Jinja environment the templates under templates/ render in, each template's output marked so
that a LaTeX error can be traced back (`latex_error_origin`). `render_report` renders the context
every rendering shares (longctx.report.context) with this build's version (longctx.report.versions)
into the .tex; `build_pdf` runs latexmk with dates taken from the data and keeps the PDF as a version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jinja2

from ..core.errors import write_atomic
from . import history as historyview, versions
from .context import ReportError, ReportInputs, context, render, shown_path, source_date_epoch, version_of, with_version
from .dialect import Dialect
from .numbers import SISETUP

__all__ = ["TEX", "TeX", "build_pdf", "environment", "latex_error_origin", "render_report"]

_TEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
    "`": r"\textasciigrave{}", "'": r"\textquotesingle{}", '"': r"\textquotedbl{}",
}


# what pdflatex typesets from UTF-8 with T1 fonts: ASCII, Latin-1 and Latin Extended-A, and the common punctuation;
# any other character (a model's answer in another script, U+FFFD where its bytes were not UTF-8, a control
# character) stops the build with "Unicode character ... not set up for use with LaTeX", so it prints as "?"
_TYPESET_EXTRA = set("\u2013\u2014\u2018\u2019\u201c\u201d\u2026\u2022\u20ac")


def _typesettable(ch: str) -> str:
    o = ord(ch)
    if 0x20 <= o < 0x7F or 0xA0 <= o <= 0x17F or ch in _TYPESET_EXTRA:
        return ch
    return " " if ch in "\t\n\r" else "?"


class TeX(str):
    """A string that is already LaTeX: the template prints it as it is."""


class TeXDialect(Dialect):
    """Numbers typeset by siunitx (\\num, grouped as SISETUP says); nan and inf print as missing."""

    raw = TeX
    unbounded = r"$\infty$"
    approx = r"$\approx$"
    nonfinite_missing = True

    def escape(self, value) -> str:
        """value as text that prints as itself: TeX's specials escaped, quotes straight, and no
        ligature (-- , ,, and the like) joining two characters into another."""
        out = "".join(_TEX_SPECIALS.get(ch) or _typesettable(ch) for ch in str(value))
        return re.sub(r"([-,])(?=[-,])", r"\1{}", out)

    def number(self, digits: str) -> TeX:
        return TeX(f"\\num{{{digits}}}")

    def aside(self, text: str) -> TeX:
        return TeX(f"{{\\footnotesize {text}}}")

    def breakable(self, value) -> TeX:
        """Escaped, with line breaks allowed after / , = (long paths, JSON, command lines)."""
        return TeX(re.sub(r"([/,=])", r"\1\\allowbreak{}", self.escape(value)))

    def extras(self) -> dict:
        return {"tex": TeX, "breakable": self.breakable}


TEX = TeXDialect()


class _MarkedLoader(jinja2.FileSystemLoader):
    """Each template's output starts and ends with a TeX comment naming it, so that a LaTeX error in
    the .tex can be traced to the template that wrote the line. The marker is one line more at the
    top: template line numbers in errors are corrected by LINE_OFFSET."""

    LINE_OFFSET = 1

    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        shown = shown_path(filename)
        return f"% >>> template {shown}\n{source}" + ("" if source.endswith("\n") else "\n") + f"% <<< template {shown}\n", filename, uptodate


def environment(template_dir: str | Path) -> jinja2.Environment:
    env = TEX.environment(
        _MarkedLoader(str(template_dir)),
        block_start_string=r"\BLOCK{", block_end_string="}",
        variable_start_string=r"\VAR{", variable_end_string="}",
        comment_start_string=r"\#{", comment_end_string="}",
        line_statement_prefix="%%", line_comment_prefix="%#",
    )
    env.globals["SISETUP"] = TeX(SISETUP)
    return env


def render_report(template, out_tex, version_out, inputs: ReportInputs, *, versions_dir=None, history_out=None) -> dict:
    """The .tex and its version record (report/version.json), which the PDF build and the twin read; with
    history_out, the history and its change points (report/history.json), which the history figure is drawn from."""
    template = Path(template)
    versions_dir = Path(versions_dir) if versions_dir else Path(out_tex).parent / "versions"
    ctx = context(inputs, template_dir=template.parent)
    record = version_of(ctx, inputs, template.parent, versions_dir)
    full = with_version(ctx, record, versions_dir)
    render(template, out_tex, full, environment(template.parent))
    if history_out:
        historyview.write(history_out, full["history"])
    write_atomic(version_out, json.dumps(record, indent=1, sort_keys=True) + "\n")
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
