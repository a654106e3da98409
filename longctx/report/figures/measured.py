"""Figures from results.csv and fits.json, as PDF (for LaTeX) and PNG (for Markdown).

Every figure takes its look from one style file (templates/plot.mplstyle, an input of the plot
rule): colours that stay apart in grayscale, each configuration also told apart by line style and
marker. Length axes are logarithmic where the lengths span a decade or more; fitted curves carry
their bootstrap band from fits.json (longctx.analysis.bands). What every figure shares (styles,
axes, bands, saving in each format) is in longctx.report.figures.style. The overview (page one) draws
the TTFT and decode-rate panels of the single figures (ttft_panel, decode_rate_panel) side by side.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from ...analysis import bands  # noqa: E402
from ...analysis.tables import decode_absent, medians, ok_rows, step_seconds  # noqa: E402
from ...core.fitting import decode_curve, prefill_curve  # noqa: E402
from . import FIGURES, regime_places  # noqa: E402
from .style import begin, errorbars, fit_line, length_axis, not_measured, outputs, panels, save, seconds_axis, shade, spans_decades, styles  # noqa: E402


def _tokens_per_step(med: pd.DataFrame, grid) -> np.ndarray | float:
    """Tokens one decode step produces at each grid length: the medians' acceptance length under
    speculative decoding (interpolated on log L, held at the ends), else 1."""
    m = med[med["spec_accept_length"].notna()].sort_values("length")
    if m.empty:
        return 1.0
    return np.interp(np.log(np.asarray(grid, float)), np.log(m["length"].to_numpy(float)), m["spec_accept_length"].to_numpy(float))


def _legend_or_not_measured(ax, what: str, yscale: str | None = None, legend: bool = True) -> None:
    """The legend of what was drawn (on a yscale axis; no legend without `legend`), or, with nothing drawn,
    "not measured: what"."""
    if any(len(line.get_xdata()) for line in ax.lines):
        if yscale:
            ax.set_yscale(yscale)
        if legend:
            ax.legend()
    else:
        not_measured(ax, what)


def _medians(ax, m: pd.DataFrame, col: str, s: dict, label: str | None = None, hollow: bool = False, gid: str = "") -> None:
    """One configuration's medians of col as its markers; with hollow, its partial lengths' (medians'
    `partial` column) as hollow ones. gid: "<gid> median" and "<gid> median partial" on the two."""
    partial = m["partial"].to_numpy(bool) if hollow and "partial" in m else np.zeros(len(m), bool)
    ax.plot(m["length"][~partial], m[col][~partial], linestyle="none", marker=s["marker"], color=s["color"], label=label,
            gid=f"{gid} median")
    if partial.any():
        ax.plot(m["length"][partial], m[col][partial], linestyle="none", marker=s["marker"], color=s["color"],
                markerfacecolor="white", gid=f"{gid} median partial")


def ttft_panel(ax, name: str, s: dict, med: pd.DataFrame, fit: dict, grid, labels: bool = True, hollow: bool = False) -> None:
    """One configuration on a TTFT axes: its medians above 0 (a log axis) and its fitted a + bL + cL^2
    on grid with the bootstrap band. labels: the legend's "(median)" and "fit" entries; hollow: see _medians."""
    m = med[(med["configuration"] == name) & (med["ttft_s"] > 0)]
    _medians(ax, m, "ttft_s", s, f"{name} (median)" if labels else None, hollow, name)
    if "prefill" in fit:
        fit_line(ax, grid, prefill_curve(fit["prefill"], grid), bands.band(fit, "prefill", grid), s, fit, "prefill",
                 f"{name} fit" if labels else None, gid=f"{name} fit")


def ttft_axes(ax, lengths, legend: bool = True) -> None:
    """The TTFT axes' labels, scales and legend once every configuration is drawn, or "not measured"."""
    ax.set(xlabel="prompt length L (tokens)", ylabel="TTFT", title="Prefill: time to first token")
    length_axis(ax, lengths)
    _legend_or_not_measured(ax, "no time to first token above 0", yscale="log", legend=legend)
    seconds_axis(ax)


def decode_rate_panel(ax, name: str, s: dict, med: pd.DataFrame, fit: dict, grid, labels: bool = True,
                      hollow: bool = False) -> float:
    """One configuration on a decode-rate axes: its medians, and k(L)/t(L) from the decode fit on grid with
    its band (t: the time per decode step; k: tokens a step produces, the acceptance length interpolated
    between lengths, else 1). Returns the highest rate drawn (0 without one), for the y limit."""
    m = med[(med["configuration"] == name) & med["decode_tok_s"].notna()]
    top = float(m["decode_tok_s"].max()) if len(m) else 0.0
    if fit.get("decode"):
        k = _tokens_per_step(m, grid)
        step = decode_curve(fit["decode"], grid)
        band = bands.band(fit, "decode", grid)
        if band is not None:  # rate = k / step time; a step-time bound at or below 0 leaves the rate unbounded
            band = (k / np.maximum(band[1], 1e-300), np.where(band[0] > 0, k / np.maximum(band[0], 1e-300), 1e300))
        if (step > 0).all():
            fit_line(ax, grid, k / step, band, s, fit, "decode", f"{name} fit" if labels else None, gid=f"{name} fit")
            top = max(top, float((k / step).max()))
        else:
            shade(ax, grid, band, s)
    _medians(ax, m, "decode_tok_s", s, f"{name} (median)" if labels else None, hollow, name)
    return top


def decode_rate_axes(ax, lengths, top: float, legend: bool = True, absent: str = "no trial decoded a second token") -> None:
    """The decode-rate axes' labels, scales (a linear rate from 0) and legend once every configuration is drawn;
    absent: why no rate is drawn, where none is (longctx.analysis.tables.decode_absent)."""
    ax.set(xlabel="context length L (tokens)", ylabel="decode (tokens/s)", title="Decode rate (one request)")
    length_axis(ax, lengths)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    _legend_or_not_measured(ax, f"no decode rate ({absent})", legend=legend)


# The text width of an A4 page with 2 cm margins (17 cm) by a height that leaves room for the legend
# below: page one includes it at \linewidth, where the style's 9 pt (ticks and labels) and 8 pt (legend) read as
# such (issue 56: at 74% of the width, and wider than that for a note inside it, they printed at 3 to 6.7 pt).
OVERVIEW_SIZE = (6.7, 2.1)


def _regime_changes(fits: dict, names, axes: dict) -> None:
    """A grey dotted vertical on the `kind` axes where a configuration's regime changes (regime_places), between
    the last length its model fits and the first it misses, at their geometric mean; one per place. The fitted
    curve stays whole: it is the fit of every length. Page one's caption says what the verticals are; the
    section on extrapolation, where each one is."""
    for kind, upto, start in regime_places(fits, names):
        axes[kind].axvline(np.sqrt(upto * start), color="0.45", linestyle=":", linewidth=1, marker="", gid=f"regime {kind}")


def overview(df: pd.DataFrame, analysis: dict, provenance: dict | None = None):
    """Page one's figure, returned unsaved: TTFT (left, log-log) and decode rate (right, a log length axis)
    against L for every configuration: the medians as markers (hollow at partial lengths: fewer ok trials
    than configured), the fitted curves with their bootstrap bands, regime changes (_regime_changes), and
    one legend below both: a marker and line per configuration. What the marks are is said in page one's caption,
    not in the figure (a note in it, one long line, made it wider and so smaller on the page)."""
    fits = analysis["configurations"]
    med = medians(df, provenance)
    names = sorted(df["configuration"].unique())
    sty = styles(names)
    lengths = np.geomspace(max(1, df["length"].min()), df["length"].max(), 200)
    fig, (left, right) = plt.subplots(1, 2, figsize=OVERVIEW_SIZE)
    top = 0.0
    for name in names:
        ttft_panel(left, name, sty[name], med, fits.get(name, {}), lengths, labels=False, hollow=True)
        top = max(top, decode_rate_panel(right, name, sty[name], med, fits.get(name, {}), lengths, labels=False, hollow=True))
    _regime_changes(fits, names, {"prefill": left, "decode": right})
    ttft_axes(left, df["length"], legend=False)
    decode_rate_axes(right, df["length"], top, legend=False, absent=decode_absent(df))
    drawn = [line.get_gid() or "" for ax in (left, right) for line in ax.lines if len(line.get_xdata())]
    fitted = {name for name in names if f"{name} fit" in drawn}
    handles = [Line2D([], [], color=sty[name]["color"], marker=sty[name]["marker"],
                      linestyle=sty[name]["linestyle"] if name in fitted else "none", label=name) for name in names]
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.03), ncol=min(len(names), 4) or 1)
    return fig


def plot_all(results_csv: str | Path, fits_json: str | Path, style: str | Path, outdir: str | Path,
             itl_depth_csv: str | Path | None = None, provenance_json: str | Path | None = None) -> list[Path]:
    """Every figure of FIGURES in outdir; provenance_json (its protocol's trials) tells the overview's
    partial lengths (longctx.analysis.tables.medians)."""
    outdir = begin(style, outdir)
    df = pd.read_csv(results_csv)
    analysis = json.loads(Path(fits_json).read_text())
    fits = analysis["configurations"]
    provenance = json.loads(Path(provenance_json).read_text()) if provenance_json else None
    med = medians(df, provenance)
    ok = ok_rows(df)
    names = sorted(df["configuration"].unique())
    sty = styles(names)
    lengths = np.geomspace(max(1, df["length"].min()), df["length"].max(), 200)

    save(overview(df, analysis, provenance), outdir, "overview")

    # TTFT against L, every trial and the medians, with the fitted a + bL + cL^2
    fig, ax = plt.subplots()
    for name in names:
        s = sty[name]
        pts = ok[(ok["configuration"] == name) & (ok["ttft_s"] > 0)]  # a log axis: no time at or below 0
        ax.plot(pts["length"], pts["ttft_s"], linestyle="none", marker=s["marker"], color=s["color"], alpha=0.35, markersize=3)
        ttft_panel(ax, name, s, med, fits.get(name, {}), lengths)
    ttft_axes(ax, df["length"])
    save(fig, outdir, "ttft")

    # decode rate against L: medians and the decode fit's rate
    fig, ax = plt.subplots()
    top = max([0.0] + [decode_rate_panel(ax, name, sty[name], med, fits.get(name, {}), lengths) for name in names])
    decode_rate_axes(ax, df["length"], top, absent=decode_absent(df))
    save(fig, outdir, "decode_rate")

    # step time against L, with the fitted t0 + beta L
    fig, ax = plt.subplots()
    for name in names:
        s = sty[name]
        pts = ok[(ok["configuration"] == name) & (ok["tpot_s"] > 0)]
        ax.plot(pts["length"], step_seconds(pts) * 1e3, linestyle="none", marker=s["marker"], color=s["color"], alpha=0.5, label=f"{name}")
        if "decode" in fits.get(name, {}):
            fit = fits[name]["decode"]
            grid = lengths if spans_decades(df["length"]) else np.linspace(0, df["length"].max(), 50)
            band = bands.band(fits[name], "decode", grid)
            fit_line(ax, grid, decode_curve(fit, grid) * 1e3, None if band is None else (band[0] * 1e3, band[1] * 1e3), s,
                     fits[name], "decode", f"{name} fit")
    ax.set(xlabel="context length L (tokens)", ylabel="time per decode step (ms)",
           title="Decode step time (per output token without speculation)")
    length_axis(ax, df["length"])
    ax.set_ylim(bottom=0)
    _legend_or_not_measured(ax, f"no decode step time ({decode_absent(df)})")
    save(fig, outdir, "step_time")

    # inter-token latency against KV depth, inside one long request per configuration
    fig, ax = plt.subplots()
    depth = pd.read_csv(itl_depth_csv) if itl_depth_csv else pd.DataFrame(columns=["configuration", "depth", "itl_s"])
    depth = depth[depth["itl_s"].notna()]
    for name in sorted(depth["configuration"].unique()):
        s = sty.get(name) or styles([name])[name]
        d = depth[depth["configuration"] == name].sort_values("depth")
        ax.plot(d["depth"], d["itl_s"] * 1e3, linestyle="none", marker=".", color=s["color"], alpha=0.25, markersize=2)
        ax.plot(d["depth"], d["itl_s"].rolling(25, center=True, min_periods=5).median() * 1e3, color=s["color"],
                linestyle=s["linestyle"], marker="", label=f"{name} (running median)")
    if depth.empty:
        ax.text(0.5, 0.5, "not measured (protocol.itl_depth.length)", transform=ax.transAxes, ha="center", va="center")
    else:
        ax.legend()
    ax.set(xlabel="KV depth (tokens in the cache)", ylabel="inter-token latency (ms)", title="ITL against KV depth, one request")
    ax.set_ylim(bottom=0)
    save(fig, outdir, "itl_depth")
    save(drafting_figure(analysis.get("drafting") or {}), outdir, "drafting")
    return outputs(outdir, FIGURES)


def drafting_figure(drafting: dict):
    """Speculative decoding against L (fits.json's "drafting", longctx.analysis.drafting): per drafting configuration,
    its acceptance (tokens per verify step: the median trial, the trials' range as a bar) and its decode speedup over
    its twin without drafting, with the family's intervals; 1 (no change) marked."""
    confs = drafting.get("configurations") or {}
    fig, (acc, speed) = panels(2, 2, 3.0)
    sty = styles(sorted(confs))
    for name, c in sorted(confs.items()):
        s, rows = sty[name], c["rows"]
        x = [r["length"] for r in rows]
        errorbars(acc, x, [(r["acceptance"], *r["acceptance_range"]) if r.get("acceptance") is not None else None for r in rows],
                  marker=s["marker"], color=s["color"], label=name)
        if c.get("baseline"):
            errorbars(speed, x, [(r["speedup"], *r["ci"]) if r.get("ci") else None for r in rows],
                      marker=s["marker"], color=s["color"], label=f"{name} / {c['baseline']}")
    fam = drafting.get("family") or {}
    acc.set(xlabel="context length L (tokens)", ylabel="tokens per verify step", title="Acceptance (median, range)")
    speed.set(xlabel="context length L (tokens)", ylabel="decode rate with / without drafting",
              title=f"Decode speedup ({fam.get('level', 0.95) * 100:.3g}% intervals)" if fam.get("tests") else "Decode speedup")
    for ax, what in ((acc, "no configuration drafts"),
                     (speed, "no speedup with an interval (no twin without drafting, or under 3 trials a side)")):
        if ax.containers:
            length_axis(ax, [r["length"] for c in confs.values() for r in c["rows"]])
            ax.legend(fontsize="small")
        else:
            not_measured(ax, what)
    if speed.containers:
        speed.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    fig.tight_layout()
    return fig
