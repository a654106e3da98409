"""How a rendering writes values: one `Dialect` per output language (TeX in longctx.report.latex,
Markdown in longctx.report.markdown), and the Jinja filters and finalize hook built from it.

A dialect says how text is escaped, what a missing value prints as, which string type is already
in the language (printed as it is), how digits from longctx.report.numbers are typeset and how an
unbounded interval end reads. `Dialect.environment` then gives every template the same filters (fmt,
sig, num, ci, speedup and the dialect's extras) and the same finalize hook, so the PDF and its Markdown twin
print the same numbers.
"""

from __future__ import annotations

import math

import jinja2

from ..analysis.compare import NO_INTERVAL, SAME
from .numbers import interval, is_number, plain, sig


class Dialect:
    """The base: subclasses set `raw`, `unbounded` and `escape`, and may add filters in `extras`."""

    raw: type[str]  # a string already in the dialect: the template prints it as it is
    unbounded: str  # the high end of an interval without one
    approx: str  # the mark before a speedup that is no measurable difference (its interval includes 1)
    # What a value that is not there prints as. A None prints it as it is (TeX: an en dash); a filter
    # returns it as plain text, escaped like any other (TeX: two hyphens, -{}-).
    missing = "--"
    nonfinite_missing = False  # whether nan and inf print as `missing` rather than as themselves

    def escape(self, value) -> str:
        """value as text that prints as itself."""
        raise NotImplementedError

    def number(self, digits: str) -> str:
        """The digits of a number (longctx.report.numbers) as the reader sees them."""
        return self.raw(digits)

    def significant(self, digits: str) -> str:
        """The digits `sig` gives, typeset; by default as `number` typesets them."""
        return self.number(digits)

    def aside(self, text: str) -> str:
        """text (already in the dialect) set beside a number, smaller where the dialect can; by default as it is."""
        return self.raw(text)

    def finalize(self, value):
        """Jinja's finalize hook: what \\VAR{x} or {{ x }} prints for x."""
        if value is None:
            return self.missing
        if isinstance(value, self.raw):
            return value
        if self.nonfinite_missing and isinstance(value, float) and not math.isfinite(value):
            return self.missing
        return self.escape(value)

    def extras(self) -> dict:
        """Filters only this dialect has."""
        return {}

    def filters(self) -> dict:
        """The Jinja filters: fmt(kind), sig(digits), num, ci(scale, digits), est(scale, digits), speedup(ci, verdict),
        and the extras."""

        def fmt(value, kind: str):
            """A number as `kind` prints it; the missing mark where there is none."""
            digits = plain(value, kind)
            return self.missing if digits is None else self.number(digits)

        def significant(value, digits: int = 3):
            s = sig(value, digits)
            return self.missing if s is None else self.significant(s)

        def ci(pair, scale: float = 1.0, digits: int = 3):
            """[low, high] of a fit's interval (times scale); the missing mark without one."""
            ends = interval(pair, scale, digits)
            if ends is None:
                return self.missing
            high = self.number(ends[1]) if ends[1] is not None else self.unbounded
            return self.raw(f"[{self.number(ends[0])}, {high}]")

        def est(stat, scale: float = 1.0, digits: int = 3):
            """An estimate with its interval, {value, low, high} (load.json's percentiles and goodput), times
            scale: 'value [low, high]' as sig and ci print them; the value alone without an interval, the
            missing mark without a value."""
            if isinstance(stat, dict) and not is_number(stat.get("value")) and is_number(stat.get("max")) and stat.get("n"):
                # a quantile of too few values for it (longctx.analysis.load_summary.min_samples): their maximum, said so
                return self.raw(self.aside(self.escape(f"max of {int(stat['n'])}: ")) + significant(float(stat["max"]) * scale, digits))
            if not isinstance(stat, dict) or not is_number(stat.get("value")):
                return self.missing
            shown = significant(float(stat["value"]) * scale, digits)
            if stat.get("low") is None and stat.get("high") is None:
                return shown
            return self.raw(f"{shown} {ci([stat.get('low'), stat.get('high')], scale, digits)}")

        def speedup(value, ci=None, verdict=None, n=None):
            """A speedup (kind "speedup") with its interval, verdict and trials n (this configuration's, the
            baseline's: 'n=3/3' in the aside) (longctx.analysis.compare):
            the approx mark before one whose interval includes 1 (no measurable difference), the interval
            in brackets after it, "(no interval)" where there is none to judge by; without a verdict (the
            baseline's own rows) as fmt prints it. An end of the interval that would print as 1.00 on the
            other side of 1 gets a third decimal, so the brackets agree with the mark."""
            digits = plain(value, "speedup")
            if digits is None:
                return self.missing
            shown = self.number(digits)
            trials = f" n={n[0]}/{n[1]}" if n else ""  # this configuration's trials / the baseline's
            if verdict == NO_INTERVAL:
                return self.raw(f"{shown} {self.aside(self.escape('(no interval' + (',' + trials if trials else '') + ')'))}")
            if verdict == SAME:
                shown = self.raw(self.approx + shown)
            if not verdict or not ci:
                return shown
            ends = [plain(x, "ratio" if plain(x, "speedup") == "1.00" and x != 1 else "speedup") for x in ci]
            return self.raw(f"{shown} {self.aside(f'[{self.number(ends[0])}, {self.number(ends[1])}]' + trials)}")

        return {"fmt": fmt, "sig": significant, "num": lambda value: fmt(value, "int"), "ci": ci, "est": est, "speedup": speedup,
                **self.extras()}

    def environment(self, loader: jinja2.BaseLoader, **syntax) -> jinja2.Environment:
        """A strict Jinja environment that writes this dialect (syntax: the delimiters, where not Jinja's)."""
        env = jinja2.Environment(
            loader=loader, trim_blocks=True, lstrip_blocks=True, autoescape=False, undefined=jinja2.StrictUndefined,
            finalize=self.finalize, keep_trailing_newline=True, **syntax,
        )
        env.filters.update(self.filters())
        return env
