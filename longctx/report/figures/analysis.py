"""Figures of the analysis: roofline, fit residuals, extrapolation with intervals, memory planner."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ...analysis import bands  # noqa: E402
from ...analysis.tables import ok_rows, step_seconds  # noqa: E402
from ...core.fitting import decode_curve, prefill_curve  # noqa: E402
from ..numbers import rounded  # noqa: E402
from . import ANALYSIS_FIGURES  # noqa: E402
from ...analysis.memory import pool_tokens  # noqa: E402
from .style import begin, fit_line, outputs, save, styles  # noqa: E402


def length_label(n: float) -> str:
    """185000 -> 185k, 32768 -> 32Ki, 700 -> 700."""
    n = int(n)
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}Ki"
    return f"{n / 1000:.0f}k" if n >= 10000 else str(n)


def _roofs(fits: dict) -> list[dict]:
    """Distinct ceilings (device, datasheet or measured) over the configurations."""
    seen, out = set(), []
    for fit in fits.values():
        ceil = fit.get("ceilings") or {}
        for which in ("datasheet", "measured"):
            c = ceil.get(which)
            if not c or not c.get("flops") or not c.get("bandwidth_Bps"):
                continue
            key = (which, c.get("name") or ceil.get("device_name"), round(c["flops"]), round(c["bandwidth_Bps"]))
            if key not in seen:
                seen.add(key)
                out.append({"which": which, "name": key[1], "flops": c["flops"], "bw": c["bandwidth_Bps"]})
    return out


KERNEL_MARKERS = {"gather": "v", "contiguous": "^", "twin": "D", "cuda": "*"}


def plot_roofline(fits: dict, sty: dict, outdir: Path, kernels: dict | None = None) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    points = {n: f["roofline"] for n, f in fits.items() if f.get("roofline", {}).get("points")}
    roofs = _roofs(fits)
    xs = ([r["flops"] / r["bw"] for r in roofs] + [p["intensity"] for r in points.values() for p in r["points"]]
          + [p["intensity"] for pts in (kernels or {}).values() for p in pts])
    if not xs:
        ax.text(0.5, 0.5, "no decode measurement or model spec", transform=ax.transAxes, ha="center", va="center")
        save(fig, outdir, "roofline")
        return
    x = np.geomspace(min(xs) / 8, max(xs) * 8, 200)
    for r in roofs:
        dashed = r["which"] == "measured"
        ridge = r["flops"] / r["bw"]
        label = (f"{'measured' if dashed else 'datasheet'}: {r['name']} "
                 f"({rounded(r['bw'] / 1e9)} GB/s, {rounded(r['flops'] / 1e12)} TFLOP/s)")
        ax.plot(x, np.minimum(r["flops"], x * r["bw"]), color="0.2" if not dashed else "0.45",
                linestyle="--" if dashed else "-", marker="", linewidth=1.4, label=label)
        ax.axvline(ridge, color="0.6", linestyle=":", linewidth=0.8)
        ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, r["flops"]), textcoords="offset points", xytext=(3, -11 if dashed else 4),
                    fontsize=7, color="0.3")
    for i, (name, r) in enumerate(points.items()):
        s = sty[name]
        px = [p["intensity"] for p in r["points"]]
        py = [p["achieved_flops"] for p in r["points"]]
        q = r["query_tokens"]
        ax.plot(px, py, linestyle="none", marker=s["marker"], color=s["color"],
                label=f"{name}" + (f" (verify width {q})" if q > 1 else ""))
        for p in r["points"]:
            left = i % 2 == 1  # configurations that share an intensity label on alternate sides
            ax.annotate(length_label(p["length"]), (p["intensity"], p["achieved_flops"]), textcoords="offset points",
                        xytext=(-5 if left else 5, -2), ha="right" if left else "left", fontsize=6, color=s["color"])
    for variant, pts in sorted((kernels or {}).items()):  # the kernels timed alone (bench_kernel), hollow markers
        marker = KERNEL_MARKERS.get(variant, "x")
        ax.plot([p["intensity"] for p in pts], [p["achieved_flops"] for p in pts], linestyle="none", marker=marker,
                markerfacecolor="none", color="0.35", label=f"kernel alone: {variant} ({pts[0]['device']})")
        for p in pts:
            ax.annotate(length_label(p["length"]), (p["intensity"], p["achieved_flops"]), textcoords="offset points",
                        xytext=(5, 2), fontsize=5, color="0.35")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per KV byte)", ylabel="attention FLOP/s achieved",
           title="Decode attention on the roofline (one step, one device)")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    save(fig, outdir, "roofline")


def plot_residuals(ok: pd.DataFrame, fits: dict, sty: dict, outdir: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=False)
    for ax, kind, col, curve, title in ((axes[0], "prefill", "ttft_s", prefill_curve, "prefill: TTFT"),
                                        (axes[1], "decode", "step_s", decode_curve, "decode: step time")):
        any_ = False
        for name, fit in fits.items():
            f = fit.get(kind)
            if not f:
                continue
            s = sty[name]
            g = ok[(ok["configuration"] == name) & ok[col].notna()]
            rel = (g[col] / curve(f, g["length"]) - 1) * 100
            ax.plot(g["length"], rel, linestyle="none", marker=s["marker"], color=s["color"], alpha=0.6, markersize=3, label=name)
            rc = f.get("regime_change")
            if rc:
                ax.axvline(rc["from_length"], color=s["color"], linestyle="--", linewidth=1)
                ax.annotate(f"regime change ({name})", (rc["from_length"], 0), rotation=90, fontsize=6, color=s["color"],
                            textcoords="offset points", xytext=(2, 4))
            any_ = True
        ax.axhline(0, color="0.3", linewidth=0.8)
        ax.set(xscale="log", xlabel="length L (tokens)", ylabel="measured / fit - 1 (%)", title=f"Residuals, {title}")
        if any_:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "no fit", transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    save(fig, outdir, "residuals")


def plot_extrapolation(ok: pd.DataFrame, fits: dict, sty: dict, outdir: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, kind, col, key, ylabel in ((axes[0], "prefill", "ttft_s", "ttft_s", "TTFT (s)"),
                                       (axes[1], "decode", "step_s", "step_s", "decode step (s)")):
        for name, fit in fits.items():
            curves = fit.get("curves") or {}
            if kind not in curves:
                continue
            s = sty[name]
            L = np.asarray(curves["length"])
            fit_line(ax, L, curves[kind]["fit"], bands.band(fit, kind, L), s, fit, kind, f"{name} fit")
            med = ok[ok["configuration"] == name].groupby("length")[col].median().dropna()
            ax.plot(med.index, med.values, linestyle="none", marker=s["marker"], color=s["color"])
            ex = fit.get("extrapolation") or {}
            if key in ex:
                ci = ex.get("ci_" + key)
                if ci and ci[0] is not None and ci[1] is not None:  # a percentile interval need not hold the fit's value
                    ax.plot([ex["length"]] * 2, ci, color=s["color"], marker="_", markersize=6, linestyle="-", linewidth=1)
                ax.plot([ex["length"]], [ex[key]], color=s["color"], marker="D", markersize=4, linestyle="none")
                ax.axvline(ex["length"], color=s["color"], linestyle=":", linewidth=0.8)
        ax.set(xscale="log", yscale="log", xlabel="length L (tokens)", ylabel=ylabel)
        if ax.lines:
            ax.legend(fontsize=6)
    axes[0].set_title("Prefill, extrapolated (band: interval)")
    axes[1].set_title("Decode, extrapolated (diamond: max length)")
    fig.tight_layout()
    save(fig, outdir, "extrapolation")


def plot_planner(planner: dict, sty: dict, outdir: Path) -> None:
    fig, ax = plt.subplots()
    f = np.linspace(0.05, 0.99, 189)
    drawn: dict = {}
    for name, p in planner["configurations"].items():
        mm = p["memory"]
        if not p["rows"]:
            continue
        # the page size only rounds: configurations that differ in it alone share a curve
        # (and the memory a reference engine finds free differs by a few MB from one start to the next)
        key = json.dumps({k: float(f"{mm[k]:.2g}") if isinstance(mm[k], (int, float)) else mm[k]
                          for k in ("memory_bytes", "weights_bytes", "cell_bytes", "max_total_tokens")}, sort_keys=True)
        s = sty[name]
        if key in drawn:
            drawn[key][0].set_label(drawn[key][0].get_label() + f", {name}")
        else:
            capped = np.array([pool_tokens(mm, x) or np.nan for x in f], float)
            line, = ax.plot(f, np.where(capped > 0, capped, np.nan), color=s["color"], linestyle=s["linestyle"], marker="", label=name)
            if mm["max_total_tokens"]:
                free = np.array([pool_tokens(mm, x, capped=False) or np.nan for x in f], float)
                ax.plot(f, np.where(free > 0, free, np.nan), color=s["color"], linestyle=":", marker="", alpha=0.7,
                        label="memory alone (without max-total-tokens)")
            drawn[key] = (line,)
        if mm["mem_fraction_static"] and mm["observed_tokens"]:
            ax.plot([mm["mem_fraction_static"]], [mm["observed_tokens"]], marker=s["marker"], color=s["color"], linestyle="none")
        if mm["context_length"]:
            ax.axhline(int(mm["context_length"]), color="0.5", linestyle="--", linewidth=0.8)
            ax.annotate(f"context length {int(mm['context_length']):,}", (0.06, int(mm["context_length"])), fontsize=6,
                        color="0.3", textcoords="offset points", xytext=(0, 2))
    if not drawn:  # no pool sized by a memory fraction: no axis of one either
        ax.clear()
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no configuration's KV pool could be modelled\n(the report's planner section says why)",
                transform=ax.transAxes, ha="center", va="center")
        ax.set_title("KV memory planner")
    else:
        ax.set_yscale("log")
        ax.legend(fontsize=6)
        ax.set(xlabel="mem-fraction-static", ylabel="KV pool (tokens)", title="KV memory planner (markers: pools the servers allocated)")
    save(fig, outdir, "planner")


def plot_prediction(fits: dict, sty: dict, outdir: Path) -> None:
    """Per configuration: how far the model fitted up to each cut missed the longest length measured (measured /
    predicted - 1, TTFT and decode rate), with the fit's interval there; a hollow marker lies outside it."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, kind, title in ((axes[0], "prefill", "TTFT"), (axes[1], "decode", "decode rate")):
        any_ = False
        for name, fit in fits.items():
            check = (fit.get("prediction") or {}).get(kind)
            if not check:
                continue
            s, xs, ys, lo, hi, inside = sty[name], [], [], [], [], []
            for cut in check["cuts"]:
                r = cut["predictions"][-1]  # the longest length
                if kind == "prefill":  # measured / predicted - 1, the interval's ends as the same ratio
                    dev, ends = r["deviation"], [r["measured"] / b - 1 if b else None for b in (r["hi"], r["lo"])]
                else:  # the rate: predicted step / measured step - 1
                    dev, ends = r["rate_deviation"], [b / r["measured"] - 1 if b is not None else None for b in (r["lo"], r["hi"])]
                if dev is None:
                    continue
                xs.append(cut["fitted_up_to"])
                ys.append(100 * dev)
                lo.append(100 * (dev - ends[0]) if ends[0] is not None else 0)
                hi.append(100 * (ends[1] - dev) if ends[1] is not None else 0)
                inside.append(r["inside"] is not False)
            if not xs:
                continue
            ax.errorbar(xs, ys, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], color=s["color"], linestyle="-", linewidth=0.8,
                        capsize=2, marker="none", label=f"{name} (to {length_label(check['cuts'][0]['predictions'][-1]['length'])})")
            for x, y, ok_ in zip(xs, ys, inside):
                ax.plot([x], [y], marker=s["marker"], color=s["color"], markerfacecolor=s["color"] if ok_ else "white", markersize=5)
            any_ = True
        ax.axhline(0, color="0.3", linewidth=0.8)
        ax.set(xscale="log", xlabel="fitted up to L (tokens)", ylabel="measured / predicted - 1 (%)",
               title=f"Prediction of the longest length's {title}")
        cuts = sorted({c["fitted_up_to"] for f in fits.values() for c in ((f.get("prediction") or {}).get(kind) or {}).get("cuts", [])})
        if cuts:
            ax.set_xticks(cuts, [length_label(x) for x in cuts])
            ax.minorticks_off()
            ax.set_xlim(cuts[0] / 1.3, cuts[-1] * 1.3)
        if any_:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "too few lengths to check a prediction", transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    save(fig, outdir, "prediction")


def plot_analysis(results_csv: str | Path, fits_json: str | Path, planner_json: str | Path, style: str | Path,
                  outdir: str | Path) -> list[Path]:
    outdir = begin(style, outdir)
    df = pd.read_csv(results_csv)
    analysis = json.loads(Path(fits_json).read_text())
    fits = analysis["configurations"]
    planner = json.loads(Path(planner_json).read_text())
    ok = ok_rows(df).copy()
    ok["step_s"] = step_seconds(ok)
    sty = styles(sorted(set(df["configuration"]) | set(fits) | set(planner["configurations"])))
    plot_roofline(fits, sty, outdir, (analysis.get("kernels") or {}).get("roofline"))
    plot_residuals(ok, fits, sty, outdir)
    plot_extrapolation(ok, fits, sty, outdir)
    plot_planner(planner, sty, outdir)
    plot_prediction(fits, sty, outdir)
    return outputs(outdir, ANALYSIS_FIGURES)
