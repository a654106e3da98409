"""What every figure shares: the start of a plotting command (begin), the configurations' styles (from
templates/plot.mplstyle's cycle), length axes, grids of panels, estimates with their intervals as bars or
bands, axes and figures with nothing to draw, and saving in each of FORMATS (PDF for LaTeX, PNG for Markdown)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogFormatter, LogLocator, NullFormatter  # noqa: E402

from ...core.numbers import is_number  # noqa: E402
from . import FORMATS  # noqa: E402

BAND_ALPHA = 0.15
LENGTH_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")  # one per prompt length, in turn
# Metadata that would make two saves of the same figure differ (dates, the writer's version).
_METADATA = {"pdf": {"CreationDate": None, "ModDate": None}, "png": {"Software": None}}


def begin(style: str | Path, outdir: str | Path) -> Path:
    """A plotting command's start: the style sheet in use, outdir made; returns outdir as a Path."""
    plt.style.use(str(style))
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    return outdir


def save(fig, outdir: Path, stem: str) -> None:
    """outdir/<stem>.<ext> for each of FORMATS, the same bytes for the same figure; closes fig. The style's tight
    bounding box (savefig.bbox) is found once and cropped to in every format: finding it lays the figure out
    again, nearly a draw's work, once per format before."""
    tight = None
    if plt.rcParams["savefig.bbox"] == "tight":
        tight = fig.get_tightbbox(fig.canvas.get_renderer()).padded(plt.rcParams["savefig.pad_inches"])
    for ext in FORMATS:
        fig.savefig(outdir / f"{stem}.{ext}", metadata=_METADATA.get(ext), bbox_inches=tight)
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


def token_label(x: float, _pos=None) -> str:
    """A length on an axis, short enough not to run into its neighbours: 512, 2k, 64k, 1.5M."""
    if x >= 1e6:
        return f"{x / 1e6:g}M"
    return f"{x / 1e3:g}k" if x >= 1e3 else f"{x:g}"


def seconds_label(x: float) -> str:
    """A time on an axis in the unit that reads: 200 \u00b5s, 5 ms, 1 s."""
    if x < 1e-3:
        return f"{x * 1e6:g} \u00b5s"
    return f"{x * 1e3:g} ms" if x < 1 else f"{x:g} s"


class _SecondsLog(LogFormatter):
    """matplotlib's choice of which log ticks to label, each written by seconds_label: no 10^-3, whose exponent
    prints at 70% of the tick labels' size."""

    def _num_to_string(self, x, vmin, vmax):
        return seconds_label(x)


def seconds_axis(ax) -> None:
    """A logarithmic time y axis (where one is set) labelled in ms and s (seconds_label)."""
    if ax.get_yscale() == "log":
        ax.yaxis.set_major_formatter(_SecondsLog(labelOnlyBase=True))
        ax.yaxis.set_minor_formatter(_SecondsLog(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def length_axis(ax, lengths) -> None:
    """A logarithmic x axis where the lengths span a decade or more, else a linear one from 0. On a log axis the
    labelled ticks are 1, 2 and 5 times the powers of ten over two decades or less, the powers of ten beyond, each
    as token_label writes it, and the other ticks unlabelled (matplotlib labels minor ticks on a narrow log range,
    '2 x 10^3 3 x 10^3' running into each other)."""
    if spans_decades(lengths):
        ax.set_xscale("log")
        v = np.asarray([x for x in lengths if x and x > 0], float)
        decades = np.log10(v.max() / v.min()) if v.size else 3.0
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2 else (1.0,)))
        ax.xaxis.set_major_formatter(FuncFormatter(token_label))
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_xlim(left=0)


def not_measured(ax, what: str) -> None:
    """An axes with nothing to draw says so (a run whose every length failed still gets its figure)."""
    ax.text(0.5, 0.5, f"not measured: {what}", transform=ax.transAxes, ha="center", va="center")


def empty(ax, what: str) -> None:
    """An axes with nothing to draw: the words (not_measured), no ticks, no frame."""
    ax.set_axis_off()
    not_measured(ax, what)


def empty_figure(outdir: Path, stem: str, what: str) -> None:
    """The figure `stem` with one empty axes saying what is not measured."""
    fig, ax = plt.subplots()
    empty(ax, what)
    save(fig, outdir, stem)


def panels(n: int, cols: int, height: float) -> tuple:
    """A figure of n panels, at most `cols` a row, each row `height` inches high: (fig, the n axes); the grid's
    spare axes are switched off."""
    cols = min(n, cols)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.7, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_axis_off()
    return fig, list(axes.flat[:n])


def stat(x: dict | None) -> tuple[float, float, float] | None:
    """(value, low, high) of an estimate {value, low, high}, a missing end of its interval at the value; None
    without a value."""
    if not isinstance(x, dict) or not is_number(x.get("value")):
        return None
    v = float(x["value"])
    lo, hi = x.get("low"), x.get("high")
    return v, float(lo) if is_number(lo) else v, float(hi) if is_number(hi) else v


def errorbars(ax, x, stats, scale: float = 1.0, **kw) -> None:
    """Estimates (value, low, high) at x (those that are not None) times scale as markers, their intervals as
    bars; kw: matplotlib's errorbar styling."""
    keep = [(xi, st) for xi, st in zip(x, stats) if st is not None]
    if not keep:
        return
    xs = np.array([k[0] for k in keep], float)
    v, lo, hi = (np.array([k[1][i] for k in keep]) * scale for i in range(3))
    ax.errorbar(xs, v, yerr=np.vstack([np.maximum(v - lo, 0), np.maximum(hi - v, 0)]), capsize=2, elinewidth=0.8, **kw)


NOT_USED = " fit (not used: fails its gate)"  # the legend's words for a fit that may carry no claim


def fit_line(ax, x, y, band, style, fit: dict, kind: str, label: str | None, gid: str | None = None) -> None:
    """A configuration's fitted curve with its band; a fit that fails its quality gate (fits.json's quality.<kind>:
    longctx.analysis.bounds.quality, the same decision the text follows) dashed and thin, with no band, and its
    legend entry saying it is not used."""
    q = (fit.get("quality") or {}).get(kind)
    used = not q or q.get("usable", True)
    if used:
        shade(ax, x, band, style)
    name = label.removesuffix(" fit") if label else None
    ax.plot(x, y, color=style["color"], marker="", linestyle=style["linestyle"] if used else (0, (3, 3)),
            linewidth=None if used else 0.8, alpha=1.0 if used else 0.7,
            label=None if not label else label if used else f"{name}{NOT_USED}", gid=gid)


def shade(ax, x, band, style) -> None:
    """The interval band (lo, hi) around a curve, in the configuration's colour; nothing without one."""
    if band is not None:
        lo, hi = band
        ax.fill_between(x, lo, hi, color=style["color"], alpha=BAND_ALPHA, linewidth=0)
