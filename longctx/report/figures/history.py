"""The history figure, from report/history.json (longctx.report.history.view), as PDF (for LaTeX) and PNG (for
Markdown), in the style every figure shares (longctx.report.figures.style): one panel per configuration and figure
(TTFT, decode rate) with a series analysed, versions on x and, per length, each version's geometric mean relative to
the series' first point on y; a step is a ring around the point where it came in and a dotted line between it and the point before.
Where no series was analysed (too few versions) the figure says so, on an axes with no ticks.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .. import history as historyview  # noqa: E402
from . import HISTORY_FIGURES  # noqa: E402
from .style import LENGTH_MARKERS, begin, empty_figure, outputs, panels, save, styles, token_label  # noqa: E402

LABELS = {"ttft": "TTFT", "decode": "decode rate"}


def plot_history(history_json: str | Path, style: str | Path, outdir: str | Path) -> list[Path]:
    """HISTORY_FIGURES in outdir."""
    outdir = begin(style, outdir)
    doc = historyview.read(history_json)
    series = doc.get("series") or []
    if not series:
        need = doc.get("min_points")
        empty_figure(outdir, "history", f"too few versions for a change-point analysis (it needs {need})")
        return outputs(outdir, HISTORY_FIGURES)
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in series:
        groups.setdefault((s["configuration"], s["figure"]), []).append(s)
    lengths = sorted({s["length"] for s in series})
    sty = styles([str(n) for n in lengths])
    fig, axes = panels(len(groups), 2, 2.6)
    for ax, ((name, figure), ss) in zip(axes, groups.items()):
        for s in sorted(ss, key=lambda s: s["length"]):
            st = sty[str(s["length"])]
            marker = LENGTH_MARKERS[lengths.index(s["length"]) % len(LENGTH_MARKERS)]
            first = s["points"][0]["value"]
            x = [p["version"] for p in s["points"]]
            y = [p["value"] / first for p in s["points"]]
            ax.plot(x, y, color=st["color"], linestyle=st["linestyle"], marker=marker, label=token_label(s["length"]))
            at = {p["version"]: v for p, v in zip(s["points"], y)}
            for step in s["steps"]:
                ax.plot([step["version"]], [at[step["version"]]], linestyle="none", marker="o", markersize=11,
                        markerfacecolor="none", markeredgecolor=st["color"], markeredgewidth=1.2)
                ax.axvline((step["after"] + step["version"]) / 2, color=st["color"], linestyle=":", linewidth=0.9)
        ax.axhline(1.0, color="0.5", linewidth=0.6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="version", ylabel=f"{LABELS[figure]}, relative to the first", title=f"{name}: {LABELS[figure]}")
        ax.title.set_fontsize(8)
        ax.legend(fontsize=6, title="tokens", title_fontsize=6)
    fig.tight_layout()
    save(fig, outdir, "history")
    return outputs(outdir, HISTORY_FIGURES)
