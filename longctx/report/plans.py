"""Attach the report to a plan document: a delimited Results section, inserted or replaced.

Everything outside the markers stays byte for byte (line endings included); a plan without the
section gets it appended at its end; running again replaces only what lies between the markers.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import write_atomic

BEGIN = "<!-- longctx:results:begin (written by `longctx attach-plan`; edits between these markers are replaced) -->"
END = "<!-- longctx:results:end -->"


class PlanError(SystemExit):
    """A plan document whose markers cannot be read; the message names the file and line."""


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def splice(text: str, section: str, name: str = "plan") -> str:
    """text with the section between the markers (replacing what was there), or appended."""
    newline = "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"  # the plan's own line ending
    body = section.strip("\n").replace("\r\n", "\n").replace("\n", newline)
    block = f"{BEGIN}{newline}{body}{newline}{END}"
    begins = _find_all(text, BEGIN)
    ends = _find_all(text, END)
    if len(begins) > 1 or len(ends) > 1:
        extra = (begins if len(begins) > 1 else ends)[1]
        raise PlanError(f"{name} line {_line_of(text, extra)}: a second longctx results marker; keep one section")
    if begins and ends and ends[0] > begins[0]:
        return text[:begins[0]] + block + text[ends[0] + len(END):]
    if begins or ends:
        at = (begins or ends)[0]
        raise PlanError(f"{name} line {_line_of(text, at)}: a longctx results marker without its "
                        f"{'end' if begins else 'begin'} marker; restore it or delete the marker")
    sep = "" if not text else (newline if text.endswith(("\n", "\r")) else newline * 2)  # a blank line before
    return text + sep + block + newline


def _find_all(text: str, marker: str) -> list[int]:
    out, i = [], text.find(marker)
    while i >= 0:
        out.append(i)
        i = text.find(marker, i + 1)
    return out


def attach(plan: str | Path, section: str, title: str | None = None) -> Path:
    """Insert or update the Results section of the plan document; a missing plan is started with a title."""
    plan = Path(plan)
    if plan.exists():
        text = plan.read_bytes().decode("utf-8", errors="surrogateescape")
    else:
        plan.parent.mkdir(parents=True, exist_ok=True)
        text = f"# {title or plan.stem}\n"
    new = splice(text, section, str(plan))
    if new != text:
        write_atomic(plan, new.encode("utf-8", errors="surrogateescape"))
    return plan
