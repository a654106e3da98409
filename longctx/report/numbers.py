"""How numbers appear in the report, its Markdown twin and a plan's Results section.

Each kind formats a number as plain digits ("1234.5"); units live in the column headers. The
LaTeX report prints them through siunitx (`\\num{1234.5}`, which groups the integer part:
1,234.5), Markdown through `display`, which groups the same way, so both read alike and tests
can look for the same strings in either (longctx.report.dialect builds both renderings' filters
from these). `rounded` writes a number inside a sentence (the diagnosis, figure labels).
"""

from __future__ import annotations


import re

from ..core.numbers import is_number

FORMATS = {
    "ttft_ms": lambda x: f"{x * 1e3:.1f}",
    "tpot_ms": lambda x: f"{x * 1e3:.2f}",
    "decode_tok_s": lambda x: f"{x:.1f}",
    "e2e_s": lambda x: f"{x:.2f}",
    "accept_length": lambda x: f"{x:.2f}",
    "accept_rate": lambda x: f"{x * 100:.1f}",  # percent
    "util": lambda x: f"{x:.0f}",
    "gb": lambda x: f"{x:.2f}",
    "speedup": lambda x: f"{x:.2f}",
    "ratio": lambda x: f"{x:.3f}",
    "diff_ms": lambda x: f"{x * 1e3:+.1f}",
    "diff_tok_s": lambda x: f"{x:+.1f}",
    "int": lambda x: f"{int(x)}",
}

# siunitx options that make \num print what `display` prints (tests compare the two).
SISETUP = r"\sisetup{group-separator={,}, group-minimum-digits=4, group-digits=integer, retain-explicit-plus=true}"

_INTEGER_PART = re.compile(r"^([+-]?)(\d+)(.*)$")


def plain(value, kind: str) -> str | None:
    """The digits of value as `kind` prints them; None where there is no number."""
    return FORMATS[kind](float(value) if kind != "int" else value) if is_number(value) else None


def sig(value, digits: int = 3) -> str | None:
    """`digits` significant digits (1.23e-05 for tiny ones); a number of more integer digits than that
    rounded to them and written out (1,234.5 -> 1230, which `group` writes 1,230), never 1.23e+03."""
    if not is_number(value):
        return None
    text = f"{float(value):.{digits}g}"
    return f"{float(text):.0f}" if "e+" in text else text


def interval(pair, scale: float = 1.0, digits: int = 3) -> tuple[str, str | None] | None:
    """The ends of a fit's interval [low, high] (fits.json's "ci") times scale, as `sig` prints them;
    a missing low end is 0 (the quantities are non-negative), a missing high end None (unbounded).
    None where there is no interval."""
    if not pair or (pair[0] is None and pair[1] is None):
        return None
    lo = sig(pair[0] * scale, digits) if pair[0] is not None else "0"
    return lo, sig(pair[1] * scale, digits) if pair[1] is not None else None


def group(digits: str) -> str:
    """Group the integer part by thousands with commas, as siunitx does with SISETUP."""
    m = _INTEGER_PART.match(digits)
    if not m or "e" in m[3].lower():
        return digits
    sign, whole, rest = m.groups()
    if len(whole) >= 4:
        whole = f"{int(whole):,}"
    return f"{sign}{whole}{rest}"


def rounded(x: float) -> str:
    """x in a sentence: 3 significant digits, with thousands separators from 1,000 up."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def display(value, kind: str, missing: str = "--") -> str:
    """What a reader sees in the PDF and in Markdown for this value."""
    s = plain(value, kind)
    return missing if s is None else group(s)
