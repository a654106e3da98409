"""Figures from results.csv and fits.json, as PDF (for LaTeX) and PNG (for Markdown)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .analysis import decode_curve, medians, ok_rows, prefill_curve, step_seconds  # noqa: E402
from .figures import FIGURES  # noqa: E402

def _save(fig, outdir: Path, stem: str) -> None:
    fig.savefig(outdir / f"{stem}.pdf", metadata={"CreationDate": None, "ModDate": None})
    fig.savefig(outdir / f"{stem}.png", metadata={"Software": None})
    plt.close(fig)


def _styles(names):
    cycle = plt.rcParams["axes.prop_cycle"].by_key()
    n = len(cycle["color"])
    return {name: {k: v[i % n] for k, v in cycle.items()} for i, name in enumerate(names)}


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
    sty = _styles(names)
    lengths = np.geomspace(max(1, df["length"].min()), df["length"].max(), 200)

    # TTFT against L, with the fitted a + bL + cL^2
    fig, ax = plt.subplots()
    for name in names:
        s = sty[name]
        pts = ok[ok["configuration"] == name]
        ax.plot(pts["length"], pts["ttft_s"], linestyle="none", marker=s["marker"], color=s["color"], alpha=0.35, markersize=3)
        m = med[(med["configuration"] == name) & med["ttft_s"].notna()]
        ax.plot(m["length"], m["ttft_s"], linestyle="none", marker=s["marker"], color=s["color"], label=f"{name} (median)")
        if "prefill" in fits.get(name, {}):
            ax.plot(lengths, prefill_curve(fits[name]["prefill"], lengths), color=s["color"], linestyle=s["linestyle"], marker="", label=f"{name} fit")
    ax.set(xscale="log", yscale="log", xlabel="prompt length L (tokens)", ylabel="TTFT (s)", title="Prefill: time to first token")
    ax.legend()
    _save(fig, outdir, "ttft")

    # decode rate against L
    fig, ax = plt.subplots()
    for name in names:
        s = sty[name]
        m = med[(med["configuration"] == name) & med["decode_tok_s"].notna()]
        ax.plot(m["length"], m["decode_tok_s"], color=s["color"], linestyle=s["linestyle"], marker=s["marker"], label=name)
    ax.set(xscale="log", xlabel="context length L (tokens)", ylabel="decode (tokens/s)", title="Decode rate (one request)")
    ax.set_ylim(bottom=0)
    ax.legend()
    _save(fig, outdir, "decode_rate")

    # step time against L, with the fitted t0 + beta L
    fig, ax = plt.subplots()
    for name in names:
        s = sty[name]
        pts = ok[(ok["configuration"] == name) & ok["tpot_s"].notna()]
        ax.plot(pts["length"], step_seconds(pts) * 1e3, linestyle="none", marker=s["marker"], color=s["color"], alpha=0.5, label=f"{name}")
        if "decode" in fits.get(name, {}):
            lin = np.linspace(0, df["length"].max(), 50)
            ax.plot(lin, decode_curve(fits[name]["decode"], lin) * 1e3, color=s["color"], linestyle=s["linestyle"], marker="", label=f"{name} fit")
    ax.set(xlabel="context length L (tokens)", ylabel="time per decode step (ms)", title="Decode step time (per output token without speculation)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend()
    _save(fig, outdir, "step_time")

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
    ax.set(xscale="log", xlabel="context length L (tokens)", ylabel="tokens per verify step",
           title="Speculative decoding: acceptance length")
    ax.set_ylim(bottom=0)
    _save(fig, outdir, "acceptance")

    # inter-token latency against KV depth, inside one long request per configuration
    fig, ax = plt.subplots()
    depth = pd.read_csv(itl_depth_csv) if itl_depth_csv else pd.DataFrame(columns=["configuration", "depth", "itl_s"])
    depth = depth[depth["itl_s"].notna()]
    for name in sorted(depth["configuration"].unique()):
        s = sty.get(name) or _styles([name])[name]
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
    _save(fig, outdir, "itl_depth")
    return [outdir / f"{stem}.{ext}" for stem in FIGURES for ext in ("pdf", "png")]
