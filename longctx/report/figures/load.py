"""Figures of the load workloads (issue 18), from data/load.json and data/load_metrics.csv, as PDF
(for LaTeX) and PNG (for Markdown), in the style every figure shares (longctx.report.figures.style):

- load_latency: TTFT p50 and p99 and ITL p99 (with their order-statistic intervals as bars: load_summary) against the
  concurrency (closed loop) and the arrival rate (open loop), one line per configuration and length,
  the SLOs as horizontal lines where set;
- interference: the victims' worst gap against the injected prompt length, medians with intervals,
  and the fitted stall (chunks x time per chunk) with its interval;
- load_metrics: the server's own series over one representative point per configuration
  (longctx.report.load.representative): running and queued requests, and the KV tokens it says are
  used against the band the client knows is resident, the samples the reconciliation flagged marked;
- frontier: per configuration the (concurrency, L) plane: measured passes (filled) and fails (x),
  the pool's bound c x L <= pool tokens, and the SLO frontier as a step line.

A figure (or a panel) without data says "not measured: ..." on an axes with no ticks.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ...core.numbers import is_number  # noqa: E402
from .. import load as loadview  # noqa: E402
from . import LOAD_FIGURES  # noqa: E402
from .style import (LENGTH_MARKERS, begin, empty, empty_figure, errorbars, outputs, panels, save, shade,  # noqa: E402
                    spans_decades, stat, styles)

# a marker per prompt length within a configuration's lines (the configuration keeps its colour and line style)
SLO_STYLE = {"color": "0.45", "linestyle": "--", "linewidth": 0.9, "marker": ""}
FLAG_STYLE = {"linestyle": "none", "marker": "X", "color": "#D55E00", "markeredgecolor": "black", "markersize": 7}


def _length_text(L) -> str:
    return f"{int(L):,}"


def _stat(p: dict, key: str, q: str) -> tuple[float, float, float] | None:
    """(value, low, high) of p[key][q]; the interval's missing ends at the value."""
    return stat((p.get(key) or {}).get(q))


def _series(ax, x, stats, s: dict, marker: str, hollow: bool, label: str | None, scale: float = 1.0,
            joined: bool = True) -> None:
    """Estimates (value, low, high) at x as markers (joined by a line with `joined`), the intervals as bars."""
    line = "none" if not joined else s["linestyle"] if not hollow else ":"
    errorbars(ax, x, stats, scale, color=s["color"], linestyle=line, marker=marker,
              markerfacecolor="white" if hollow else s["color"], label=label, alpha=0.75 if hollow else 1.0)


def _slo_lines(ax, slo: dict, key: str, scale: float = 1.0) -> None:
    v = (slo or {}).get(key)
    if is_number(v):
        ax.axhline(float(v) * scale, label="SLO", **SLO_STYLE)
    elif isinstance(v, dict):
        for i, (L, t) in enumerate(sorted(v.items(), key=lambda kv: float(kv[0]))):
            if is_number(t):
                ax.axhline(float(t) * scale, label=f"SLO at {_length_text(float(L))}", **{**SLO_STYLE, "linestyle": (0, (1 + i, 2))})


def _values_axes(ax, ys: list[float]) -> None:
    """A log y axis where the values span a decade or more, else a linear one from 0."""
    ys = [y for y in ys if y > 0]
    if len(ys) > 1 and max(ys) / min(ys) >= 10:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def plot_latency(load: dict, sty: dict, outdir: Path) -> None:
    """TTFT (p50 filled, p99 hollow) and ITL p99 against concurrency (closed) and arrival rate (open)."""
    fig, axes = plt.subplots(2, 2, figsize=(6.7, 5.2))
    slo = load.get("slo") or {}
    confs = load.get("configurations") or {}
    for col, (kind, xlabel) in enumerate((("closed", "concurrency (requests in flight)"), ("open", "arrival rate (requests/s)"))):
        top, bottom = axes[0][col], axes[1][col]
        ys: dict = {"ttft": [], "itl": []}
        xs: list[float] = []
        for name in sorted(confs):
            points = [p for p in (confs[name] or {}).get(kind) or [] if is_number(p.get("level"))]
            for i, L in enumerate(sorted({p["length"] for p in points})):
                pts = sorted((p for p in points if p["length"] == L), key=lambda p: p["level"])
                x = [p["level"] for p in pts]
                marker = LENGTH_MARKERS[i % len(LENGTH_MARKERS)]
                label = f"{name}, L = {_length_text(L)}"
                p50, p99 = [_stat(p, "ttft", "p50") for p in pts], [_stat(p, "ttft", "p99") for p in pts]
                itl = [_stat(p, "itl", "p99") for p in pts]
                _series(top, x, p50, sty[name], marker, False, label)
                _series(top, x, p99, sty[name], marker, True, None)
                _series(bottom, x, itl, sty[name], marker, False, label, 1e3)
                ys["ttft"] += [v for st in p50 + p99 if st for v in st]
                ys["itl"] += [v * 1e3 for st in itl if st for v in st]
                xs += x
        what = "closed loop" if kind == "closed" else "open loop"
        for ax, key, ylabel, title in ((top, "ttft", "TTFT (s)", f"TTFT p50 (filled), p99 (hollow), {what}"),
                                       (bottom, "itl", "ITL p99 (ms)", f"Inter-token latency p99, {what}")):
            if not ys[key]:
                empty(ax, f"no {what} workload" if not xs else f"no {key.upper()} in the {what}")
                continue
            _slo_lines(ax, slo, "ttft_s" if key == "ttft" else "itl_s", 1.0 if key == "ttft" else 1e3)
            ax.set(xlabel=xlabel, ylabel=ylabel)
            ax.set_title(title, fontsize=8)
            if spans_decades(xs):
                ax.set_xscale("log")
            else:
                ax.set_xlim(left=0, right=max(xs) * 1.1)
            _values_axes(ax, ys[key])
            ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, outdir, "load_latency")


def plot_interference(load: dict, sty: dict, outdir: Path) -> None:
    """The victims' worst gap against the injected length, with the fitted stall."""
    fig, ax = plt.subplots()
    confs = load.get("configurations") or {}
    drawn = []
    for name in sorted(confs):
        inter = (confs[name] or {}).get("interference") or {}
        pts = sorted((p for p in inter.get("points") or [] if is_number((p.get("worst_gap") or {}).get("value"))),
                     key=lambda p: p["length"])
        if not pts:
            continue
        s = sty[name]
        L = [p["length"] for p in pts]
        _series(ax, L, [stat(p.get("worst_gap")) for p in pts], s, s["marker"], False, f"{name} (median worst gap)", joined=False)
        drawn += L
        fit = inter.get("fit")
        grid = np.linspace(1, max(L), 400)
        curve = loadview.stall_curve(grid, fit) if fit else None
        if curve is not None:
            y, (lo, hi) = curve
            if lo is not None and hi is not None:
                shade(ax, grid, (lo, hi), s)
            what = (f"{int(fit['chunk']):,}-token chunks" if fit.get("basis", "chunks") == "chunks" else "linear in L")
            ax.plot(grid, y, color=s["color"], linestyle=s["linestyle"], marker="", label=f"{name} fit ({what})")
    if not drawn:
        empty(ax, "no interference probe (load.interference.lengths)")
    else:
        ax.set(xlabel="injected prompt length L (tokens)", ylabel="worst gap of a running stream (s)",
               title="Interference: one long prefill against running decodes")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    save(fig, outdir, "interference")


def _named(m: pd.DataFrame, name: str) -> pd.DataFrame:
    return m[m["name"] == name].sort_values("t_s")


def plot_metrics(load: dict, metrics: pd.DataFrame, sty: dict, outdir: Path) -> None:
    """Per configuration, at its representative point: running and queued requests (left), the server's used
    KV tokens against the client's resident band (right), flagged samples marked."""
    names = sorted(set(metrics["configuration"].dropna().astype(str))) if len(metrics) else []
    confs = load.get("configurations") or {}
    if not names:
        empty_figure(outdir, "load_metrics", "no server metrics over the load workloads (load.metrics)")
        return
    fig, axes = plt.subplots(len(names), 2, figsize=(6.7, 2.3 * len(names)), squeeze=False)
    for (left, right), name in zip(axes, names):
        s = sty.get(name) or styles([name])[name]
        point = loadview.representative(metrics, name)
        m = loadview.point_samples(metrics, name, point)
        where = loadview.point_words(point)
        queue = False
        for series, style in (("running", {"linestyle": "-"}), ("queued", {"linestyle": "--"})):
            d = _named(m, series)
            if len(d):
                left.step(d["t_s"], d["value"], where="post", color=s["color"] if series == "running" else "0.4",
                          marker="", label=series, **style)
                queue = True
        if queue:
            left.set(xlabel="time since the point's start (s)", ylabel="requests", title=f"{name}: {where}")
            left.title.set_fontsize(7)
            left.set_ylim(bottom=0)
            left.legend(fontsize=6)
        else:
            empty(left, f"{name}: no running or queued series")
        used = _named(m, "used_tokens")
        if used.empty:  # the usage as a share of the pool, where the server gives only that
            usage, pool = _named(m, "token_usage"), _named(m, "pool_tokens")
            if len(usage) and len(pool):
                used = usage.assign(value=usage["value"] * float(pool["value"].iloc[-1]))
        low, high = _named(m, "client_resident_low"), _named(m, "client_resident_high")
        if used.empty and low.empty:
            empty(right, f"{name}: no KV usage series")
            continue
        if len(low) and len(high):
            band = pd.merge_asof(low[["t_s", "value"]], high[["t_s", "value"]], on="t_s", suffixes=("_low", "_high"),
                                 direction="nearest")
            right.fill_between(band["t_s"], band["value_low"], band["value_high"], step="post", color=s["color"], alpha=0.25,
                               linewidth=0, label="client: resident (low..high)")
        if len(used):
            right.step(used["t_s"], used["value"], where="post", color=s["color"], linestyle=s["linestyle"], marker="",
                       label="server: used tokens")
        flagged = [f for f in ((confs.get(name) or {}).get("reconciliation") or {}).get("flagged") or []
                   if point and f.get("kind") == point["kind"] and f.get("length") == point["length"]
                   and (point.get("level") is None or f.get("level") == point["level"])]
        if flagged:
            right.plot([f["t_s"] for f in flagged], [f["server_tokens"] for f in flagged], label="flagged (outside the margin)",
                       **FLAG_STYLE)
        right.set(xlabel="time since the point's start (s)", ylabel="KV tokens", title="KV: server against client")
        right.title.set_fontsize(7)
        right.set_ylim(bottom=0)
        right.legend(fontsize=6)
    fig.tight_layout()
    save(fig, outdir, "load_metrics")


def plot_frontier(load: dict, sty: dict, outdir: Path) -> None:
    """Per configuration: measured passes and fails on the (concurrency, L) plane, the pool's bound and the frontier."""
    confs = {n: c for n, c in sorted((load.get("configurations") or {}).items()) if (c or {}).get("frontier")}
    if not confs:
        empty_figure(outdir, "frontier", "no SLO frontier (no closed-loop grid, or no SLO set)")
        return
    fig, axes = panels(len(confs), 3, 2.8)
    for ax, (name, c) in zip(axes, confs.items()):
        s = sty[name]
        front = sorted(c["frontier"], key=lambda r: r["concurrency"])
        cs = np.array([r["concurrency"] for r in front], float)
        passes = [(r["concurrency"], L) for r in front for L in r.get("passes") or []]
        fails = [(r["concurrency"], L) for r in front for L in r.get("fails") or []]
        if passes:
            ax.plot(*zip(*passes), linestyle="none", marker="o", color=s["color"], label="meets the SLOs")
        if fails:
            ax.plot(*zip(*fails), linestyle="none", marker="x", color="0.3", label="misses them")
        bounds = [r["pool_bound"] * r["concurrency"] for r in front if is_number(r.get("pool_bound"))]
        grid = np.geomspace(max(cs.min() * 0.8, 0.5), cs.max() * 1.25, 200)
        if bounds:
            ax.plot(grid, max(bounds) / grid, color="0.45", linestyle=":", marker="", label="pool: c x L = pool tokens")
        ok = [(r["concurrency"], r["max_length"]) for r in front if is_number(r.get("max_length")) and r["max_length"] > 0]
        if ok:
            x, y = zip(*ok)
            ax.step(x, y, where="pre", color=s["color"], linestyle=s["linestyle"], marker="", label="frontier")
            model = [(r["concurrency"], r["max_length"]) for r in front if r.get("basis") == "model" and is_number(r.get("max_length"))]
            if model:
                ax.plot(*zip(*model), linestyle="none", marker="D", markerfacecolor="white", color=s["color"],
                        label="frontier from the model")
        Ls = [L for _, L in passes + fails] + [y for _, y in ok]
        if not Ls:
            empty(ax, f"{name}: no length measured under load")
            continue
        ax.set(xlabel="concurrency c", ylabel="prompt length L (tokens)", title=name)
        if spans_decades(cs):
            ax.set_xscale("log")
        if spans_decades(Ls):
            ax.set_yscale("log")
            ax.set_ylim(min(Ls) / 1.5, max(Ls) * 1.5)
        else:
            ax.set_ylim(0, max(Ls) * 1.2)
        ax.set_xlim(grid[0], grid[-1])
        ax.legend(fontsize=6)
    fig.tight_layout()
    save(fig, outdir, "frontier")


def plot_load(load_json: str | Path | None, metrics_csv: str | Path | None, style: str | Path, outdir: str | Path) -> list[Path]:
    """Every figure of LOAD_FIGURES in outdir (each says "not measured" where its data is absent)."""
    outdir = begin(style, outdir)
    load = loadview.read(load_json)
    metrics = loadview.read_metrics(metrics_csv)
    names = sorted(set(load.get("configurations") or {}) | (set(metrics["configuration"].dropna().astype(str)) if len(metrics) else set()))
    sty = styles(names)
    plot_latency(load, sty, outdir)
    plot_interference(load, sty, outdir)
    plot_metrics(load, metrics, sty, outdir)
    plot_frontier(load, sty, outdir)
    return outputs(outdir, LOAD_FIGURES)
