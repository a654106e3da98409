"""Figures from results.csv and fits.json, as PDF (for LaTeX) and PNG (for Markdown).

Every figure takes its look from one style file (templates/plot.mplstyle, an input of the plot
rule): colours that stay apart in grayscale, each configuration also told apart by line style and
marker. Length axes are logarithmic where the lengths span a decade or more; fitted curves carry
their bootstrap band from fits.json (longctx.analysis.bands). What every figure shares (styles,
axes, bands, saving in each format) is in longctx.report.figures.style.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ...analysis import bands  # noqa: E402
from ...analysis.tables import medians, ok_rows, step_seconds  # noqa: E402
from ...core.fitting import decode_curve, prefill_curve  # noqa: E402
from . import FIGURES  # noqa: E402
from .style import length_axis, not_measured, outputs, save, shade, spans_decades, styles  # noqa: E402


def _tokens_per_step(med: pd.DataFrame, grid) -> np.ndarray | float:
    """Tokens one decode step produces at each grid length: the medians' acceptance length under
    speculative decoding (interpolated on log L, held at the ends), else 1."""
    m = med[med["spec_accept_length"].notna()].sort_values("length")
    if m.empty:
        return 1.0
    return np.interp(np.log(np.asarray(grid, float)), np.log(m["length"].to_numpy(float)), m["spec_accept_length"].to_numpy(float))


def _legend_or_not_measured(ax, what: str, yscale: str | None = None) -> None:
    """The legend of what was drawn (on a yscale axis), or, with nothing drawn, "not measured: what"."""
    if any(len(line.get_xdata()) for line in ax.lines):
        if yscale:
            ax.set_yscale(yscale)
        ax.legend()
    else:
        not_measured(ax, what)


def plot_all(results_csv: str | Path, fits_json: str | Path, style: str | Path, outdir: str | Path,
             itl_depth_csv: str | Path | None = None) -> list[Path]:
    plt.style.use(str(style))
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    df = pd.read_csv(results_csv)
    fits = json.loads(Path(fits_json).read_text())["configurations"]
    med = medians(df)
    ok = ok_rows(df)
    names = sorted(df["configuration"].unique())
    sty = styles(names)
    lengths = np.geomspace(max(1, df["length"].min()), df["length"].max(), 200)

    # TTFT against L, with the fitted a + bL + cL^2
    fig, ax = plt.subplots()
    for name in names:
        s = sty[name]
        pts = ok[(ok["configuration"] == name) & (ok["ttft_s"] > 0)]  # a log axis: no time at or below 0
        ax.plot(pts["length"], pts["ttft_s"], linestyle="none", marker=s["marker"], color=s["color"], alpha=0.35, markersize=3)
        m = med[(med["configuration"] == name) & (med["ttft_s"] > 0)]
        ax.plot(m["length"], m["ttft_s"], linestyle="none", marker=s["marker"], color=s["color"], label=f"{name} (median)")
        if "prefill" in fits.get(name, {}):
            fit = fits[name]["prefill"]
            shade(ax, lengths, bands.band(fits[name], "prefill", lengths), s)
            ax.plot(lengths, prefill_curve(fit, lengths), color=s["color"], linestyle=s["linestyle"], marker="", label=f"{name} fit")
    ax.set(xlabel="prompt length L (tokens)", ylabel="TTFT (s)", title="Prefill: time to first token")
    length_axis(ax, df["length"])
    _legend_or_not_measured(ax, "no time to first token above 0", yscale="log")
    save(fig, outdir, "ttft")

    # decode rate against L: medians, and k(L)/t(L) from the decode fit with its band (t: the time per
    # decode step; k: tokens a step produces, the acceptance length interpolated between lengths, else 1)
    fig, ax = plt.subplots()
    top = 0.0
    for name in names:
        s = sty[name]
        m = med[(med["configuration"] == name) & med["decode_tok_s"].notna()]
        top = max(top, float(m["decode_tok_s"].max()) if len(m) else 0.0)
        fit = fits.get(name, {}).get("decode")
        if fit:
            k = _tokens_per_step(m, lengths)
            step = decode_curve(fit, lengths)
            band = bands.band(fits[name], "decode", lengths)
            if band is not None:  # rate = k / step time; a step-time bound at or below 0 leaves the rate unbounded
                band = (k / np.maximum(band[1], 1e-300), np.where(band[0] > 0, k / np.maximum(band[0], 1e-300), 1e300))
            shade(ax, lengths, band, s)
            if (step > 0).all():
                ax.plot(lengths, k / step, color=s["color"], linestyle=s["linestyle"], marker="", label=f"{name} fit")
                top = max(top, float((k / step).max()))
        ax.plot(m["length"], m["decode_tok_s"], linestyle="none", marker=s["marker"], color=s["color"], label=f"{name} (median)")
    ax.set(xlabel="context length L (tokens)", ylabel="decode (tokens/s)", title="Decode rate (one request)")
    length_axis(ax, df["length"])
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    _legend_or_not_measured(ax, "no decode rate (no trial decoded a second token)")
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
            shade(ax, grid, None if band is None else (band[0] * 1e3, band[1] * 1e3), s)
            ax.plot(grid, decode_curve(fit, grid) * 1e3, color=s["color"], linestyle=s["linestyle"], marker="", label=f"{name} fit")
    ax.set(xlabel="context length L (tokens)", ylabel="time per decode step (ms)",
           title="Decode step time (per output token without speculation)")
    length_axis(ax, df["length"])
    ax.set_ylim(bottom=0)
    _legend_or_not_measured(ax, "no decode step time (no trial decoded a second token)")
    save(fig, outdir, "step_time")

    # speculative acceptance length against L
    fig, ax = plt.subplots()
    spec = med[med["spec_accept_length"].notna()]
    for name in names:
        s = sty[name]
        m = spec[spec["configuration"] == name]
        if len(m):
            ax.plot(m["length"], m["spec_accept_length"], color=s["color"], linestyle=s["linestyle"], marker=s["marker"], label=name)
    if spec.empty:
        ax.text(0.5, 0.5, "no speculative configuration", transform=ax.transAxes, ha="center", va="center")
    else:
        ax.legend()
    ax.set(xlabel="context length L (tokens)", ylabel="tokens per verify step",
           title="Speculative decoding: acceptance length")
    length_axis(ax, df["length"])
    ax.set_ylim(bottom=0)
    save(fig, outdir, "acceptance")

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
    return outputs(outdir, FIGURES)
