"""Figures of the prefix cache (issue 19), from data/prefix_fits.json, as PDF (for LaTeX) and PNG (for
Markdown), in the style every figure shares (longctx.report.figures.style):

- prefix_ttft: per configuration, the median TTFT (with its interval) against the prompt length L at each hit
  rate measured, and the fitted surface's curve at that hit rate, TTFT = a + b (L - P) + c (L^2 - P^2), with
  its band;
- prefix_saving: the saving against cold (cold TTFT over the hit's) against the hit rate, per configuration and
  length: measured (filled, with its interval) and as the model predicts it (hollow, its interval as bars);
- prefix_conversation: per configuration, the TTFT of each turn of the growing conversation, with the cache
  (filled) and the control (hollow, its cache flushed before every turn), against the model's prediction at
  that turn's context and cached count (lines, with their intervals as bands).

A figure (or a panel) without data says "not measured: ..." on an axes with no ticks.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ...core.numbers import is_number  # noqa: E402
from .. import prefix as prefixview  # noqa: E402
from . import PREFIX_FIGURES  # noqa: E402
from .style import (LENGTH_MARKERS, begin, empty, empty_figure, errorbars, outputs, panels, save, shade,  # noqa: E402
                    spans_decades, stat, styles)


def _hit_colours(rates) -> dict[float, tuple]:
    rates = sorted(set(rates))
    cmap = plt.get_cmap("viridis")
    return {h: cmap(0.85 * i / max(1, len(rates) - 1)) for i, h in enumerate(rates)}


def plot_ttft(doc: dict, outdir: Path) -> None:
    """Median TTFT against L per hit rate, with the fitted surface's curves."""
    confs = {n: c for n, c in sorted((doc.get("configurations") or {}).items()) if (c or {}).get("points")}
    if not confs:
        empty_figure(outdir, "prefix_ttft", "no prefix hit-rate point (prefix.hit_rates)")
        return
    fig, axes = panels(len(confs), 2, 2.9)
    for ax, (name, c) in zip(axes, confs.items()):
        points = c["points"]
        colours = _hit_colours([p["hit_rate"] for p in points] + [0.0])
        lengths = sorted({p["length"] for p in points})
        for h in sorted({p["hit_rate"] for p in points}):
            pts = sorted((p for p in points if p["hit_rate"] == h), key=lambda p: p["length"])
            errorbars(ax, [p["length"] for p in pts], [stat(p.get("ttft")) for p in pts], color=colours[h], linestyle="none",
                      marker="o", label=f"h = {h:.0%}")
        curves = c.get("curves") or {}
        grid = np.asarray(curves.get("length") or [], float)
        for key, cur in sorted((curves.get("hit_rates") or {}).items(), key=lambda kv: kv[1]["hit_rate"]):
            h = cur["hit_rate"]
            if h not in colours or not len(grid):
                continue
            if cur.get("lo") is not None and cur.get("hi") is not None:
                shade(ax, grid, (cur["lo"], cur["hi"]), {"color": colours[h]})
            ax.plot(grid, cur["fit"], color=colours[h], marker="", linestyle="-" if h else "--",
                    label="model, cold" if h == 0 and not any(p["hit_rate"] == 0 for p in points) else None)
        ax.set(xlabel="prompt length L (tokens)", ylabel="TTFT (s)", title=f"{name}: TTFT by prefix hit rate h")
        ax.title.set_fontsize(8)
        if spans_decades(lengths):
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            ax.set_xlim(left=0)
            ax.set_ylim(bottom=0)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, outdir, "prefix_ttft")


def plot_saving(doc: dict, sty: dict, outdir: Path) -> None:
    """The saving against cold against the hit rate: measured (filled) and predicted (hollow)."""
    fig, ax = plt.subplots()
    drawn = []
    for name, c in sorted((doc.get("configurations") or {}).items()):
        pts = [p for p in (c or {}).get("points") or [] if p.get("hit_rate", 0) > 0]
        s = sty[name]
        for i, L in enumerate(sorted({p["length"] for p in pts})):
            row = sorted((p for p in pts if p["length"] == L), key=lambda p: p["hit_rate"])
            x = [100 * p["hit_rate"] for p in row]
            marker = LENGTH_MARKERS[i % len(LENGTH_MARKERS)]
            measured = [stat(prefixview.saving(p.get("saving"))) for p in row]
            predicted = [stat(prefixview.saving(p.get("saving_predicted"))) for p in row]
            errorbars(ax, x, measured, color=s["color"], linestyle=s["linestyle"], marker=marker, label=f"{name}, L = {L:,}")
            errorbars(ax, x, predicted, color=s["color"], linestyle="none", marker=marker, markerfacecolor="white", alpha=0.75)
            drawn += [m[0] for m in measured + predicted if m]
    if not drawn:
        empty(ax, "no saving against cold (no hit-rate point above 0 with a cold TTFT)")
    else:
        ax.axhline(1.0, color="0.45", linestyle=":", linewidth=0.9, marker="")
        ax.set(xlabel="prefix hit rate h (%)", ylabel="saving: cold TTFT / TTFT", title="Saving against cold (filled: measured, hollow: the model)")
        ax.title.set_fontsize(8)
        if max(drawn) / max(min(drawn), 1e-9) >= 10:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.legend(fontsize=6)
    save(fig, outdir, "prefix_saving")


def plot_conversation(doc: dict, outdir: Path) -> None:
    """Per configuration: each turn's TTFT, with the cache and the control, against the model's prediction."""
    confs = {n: c for n, c in sorted((doc.get("configurations") or {}).items()) if (c or {}).get("conversations")}
    if not confs:
        empty_figure(outdir, "prefix_conversation", "no growing conversation (prefix.conversation)")
        return
    fig, axes = panels(len(confs), 2, 2.9)
    for ax, (name, c) in zip(axes, confs.items()):
        ys = []
        for conv in c["conversations"]:
            cached = bool(conv.get("cache"))
            colour = "#0072B2" if cached else "#D55E00"
            turns = sorted(conv.get("turns") or [], key=lambda t: t.get("turn") or 0)
            x = [t["turn"] for t in turns]
            measured = [(t["ttft_s"], t["ttft_s"], t["ttft_s"]) if is_number(t.get("ttft_s")) else None for t in turns]
            label = "with the cache" if cached else "control (flushed)"
            errorbars(ax, x, measured, color=colour, linestyle="none", marker="o", markerfacecolor=colour if cached else "white",
                      label=f"{label}: measured")
            pred = [stat(t.get("predicted")) for t in turns]
            px = [xi for xi, p in zip(x, pred) if p]
            if px:
                v = np.array([p[0] for p in pred if p])
                lo, hi = np.array([p[1] for p in pred if p]), np.array([p[2] for p in pred if p])
                shade(ax, px, (lo, hi), {"color": colour})
                ax.plot(px, v, color=colour, linestyle="-" if cached else "--", marker="", label=f"{label}: model")
                ys += list(v)
            ys += [m[0] for m in measured if m]
        if not ys:
            empty(ax, f"{name}: no turn measured")
            continue
        ax.set(xlabel="turn", ylabel="TTFT (s)", title=f"{name}: growing conversation")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.title.set_fontsize(8)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, outdir, "prefix_conversation")


def plot_prefix(prefix_json: str | Path | None, style: str | Path, outdir: str | Path) -> list[Path]:
    """Every figure of PREFIX_FIGURES in outdir (each says "not measured" where its data is absent)."""
    outdir = begin(style, outdir)
    doc = prefixview.read(prefix_json)
    sty = styles(sorted(doc.get("configurations") or {}))
    plot_ttft(doc, outdir)
    plot_saving(doc, sty, outdir)
    plot_conversation(doc, outdir)
    return outputs(outdir, PREFIX_FIGURES)
