"""What every figure shares: the configurations' styles (from templates/plot.mplstyle's cycle),
length axes, interval bands, and saving in each of FORMATS (PDF for LaTeX, PNG for Markdown)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import FORMATS  # noqa: E402

BAND_ALPHA = 0.15
# Metadata that would make two saves of the same figure differ (dates, the writer's version).
_METADATA = {"pdf": {"CreationDate": None, "ModDate": None}, "png": {"Software": None}}


def save(fig, outdir: Path, stem: str) -> None:
    """outdir/<stem>.<ext> for each of FORMATS, the same bytes for the same figure; closes fig."""
    for ext in FORMATS:
        fig.savefig(outdir / f"{stem}.{ext}", metadata=_METADATA.get(ext))
    plt.close(fig)


def outputs(outdir: Path, stems) -> list[Path]:
    """The files `save` writes for each of stems, in order."""
    return [outdir / f"{stem}.{ext}" for stem in stems for ext in FORMATS]


def styles(names) -> dict[str, dict]:
    """Per configuration name: colour, line style and marker, the style cycle's in turn."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()
    n = len(cycle["color"])
    return {name: {k: v[i % n] for k, v in cycle.items()} for i, name in enumerate(names)}


def spans_decades(lengths) -> bool:
    """Lengths from smallest to largest cover a factor of ten or more: a log axis shows them evenly."""
    L = np.asarray([x for x in lengths if x and x > 0], float)
    return len(L) > 1 and L.max() / L.min() >= 10


def length_axis(ax, lengths) -> None:
    """A logarithmic x axis where the lengths span a decade or more, else a linear one from 0."""
    if spans_decades(lengths):
        ax.set_xscale("log")
    else:
        ax.set_xlim(left=0)


def not_measured(ax, what: str) -> None:
    """An axes with nothing to draw says so (a run whose every length failed still gets its figure)."""
    ax.text(0.5, 0.5, f"not measured: {what}", transform=ax.transAxes, ha="center", va="center")


def shade(ax, x, band, style) -> None:
    """The interval band (lo, hi) around a curve, in the configuration's colour; nothing without one."""
    if band is not None:
        lo, hi = band
        ax.fill_between(x, lo, hi, color=style["color"], alpha=BAND_ALPHA, linewidth=0)
