#!/usr/bin/env python3
"""What the figures cost every run of the workflow (and every whole-workflow test of the suite), on a finished run's
data, on one core:

- the plot rules as the workflow runs them (plot_figures, every figure of the data in one process; plot_history),
  with the style's PDF font type as each type given;
- the figures of the data drawn by four processes (`longctx plot`, `plot-analysis`, `plot-load`, `plot-prefix`, as
  four rules drew them before) against one (`longctx plot` given every input, as plot_figures does).

    python bench/figure_time.py [--work DIR] [--fonttype 3 42] [--repeats 3]

DIR: a workflow directory whose run has finished (default: this checkout, after `make report`); it is copied to a
temporary directory, so nothing of it is touched. Prints medians of wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
RULES = ("plot_figures", "plot_history")
STYLE = Path("templates") / "plot.mplstyle"


def timed(command: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command[:4])} ... failed in {cwd}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return took


def plot_rules(work: Path) -> float:
    """Seconds of `snakemake --cores 1` running the plot rules (forced) and nothing else (--allowed-rules: the
    copy's newer timestamps never rerun a measurement)."""
    return timed([sys.executable, "-m", "snakemake", "--cores", "1", "--forcerun", *RULES, "--allowed-rules", *RULES,
                  "--", *RULES], work)


def data_figures(work: Path, out: Path, processes: int) -> float:
    """Seconds of drawing every figure of the data into `out`, in four processes or in one."""
    cli = [sys.executable, "-m", "longctx.cli"]
    style = ["--style", str(STYLE), "--outdir", str(out)]
    measured = ["--results", "data/results.csv", "--fits", "data/fits.json", "--itl-depth", "data/itl_depth.csv",
                "--provenance", "data/provenance.json"]
    parts = {"analysis": ["--planner", "data/planner.json"], "load": ["--load", "data/load.json", "--metrics",
                                                                      "data/load_metrics.csv"],
             "prefix": ["--prefix", "data/prefix_fits.json"]}
    if processes == 1:
        return timed([*cli, "plot", *measured, *[w for p in parts.values() for w in p], *style], work)
    return (timed([*cli, "plot", *measured, *style], work)
            + timed([*cli, "plot-analysis", "--results", "data/results.csv", "--fits", "data/fits.json",
                     *parts["analysis"], *style], work)
            + timed([*cli, "plot-load", *parts["load"], *style], work)
            + timed([*cli, "plot-prefix", *parts["prefix"], *style], work))


def median_of(times: list[float]) -> str:
    return f"{statistics.median(times):.1f} s (median of {len(times)}: {', '.join(f'{t:.1f}' for t in times)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=ROOT, help="a workflow directory whose run has finished")
    ap.add_argument("--fonttype", type=int, nargs="+", default=[3, 42], choices=[3, 42])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not (a.work / "report" / "history.json").exists():
        sys.exit(f"{a.work} has no finished run (report/history.json): run `make report` there first, or pass --work")
    with tempfile.TemporaryDirectory(prefix="longctx-figures-") as tmp:
        work = Path(tmp) / "work"
        shutil.copytree(a.work, work, symlinks=True, ignore=shutil.ignore_patterns(".venv*", ".git", "build"))
        style = work / STYLE
        original = style.read_text()
        for fonttype in a.fonttype:
            style.write_text(re.sub(r"^pdf\.fonttype: *\d+", f"pdf.fonttype: {fonttype}", original, flags=re.M))
            plot_rules(work)  # once unmeasured: the file cache warm for every type alike
            print(f"pdf.fonttype {fonttype}: the plot rules took {median_of([plot_rules(work) for _ in range(a.repeats)])}",
                  flush=True)
        style.write_text(original)
        for n in (4, 1):
            times = [data_figures(work, Path(tmp) / f"figures-{n}", n) for _ in range(a.repeats)]
            print(f"the figures of the data in {n} process{'es' if n > 1 else ''}: {median_of(times)}", flush=True)


if __name__ == "__main__":
    main()
