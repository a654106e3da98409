#!/usr/bin/env python3
"""Time of the five plot rules (plot_figures, plot_analysis_figures, plot_load_figures, plot_prefix_figures,
plot_history) on a finished run's data, one after another on one core, with the style's PDF font type as it is and
as each type given: what the figures cost every run of the workflow (and every whole-workflow test of the suite).

    python bench/figure_time.py [--work DIR] [--fonttype 3 42] [--repeats 3]

DIR: a workflow directory whose run has finished (default: this checkout, after `make report`); it is copied to a
temporary directory, so nothing of it is touched. Prints, per font type, the median wall time of the five rules.
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
RULES = ("plot_figures", "plot_analysis_figures", "plot_load_figures", "plot_prefix_figures", "plot_history")
STYLE = Path("templates") / "plot.mplstyle"


def plot_rules(work: Path) -> float:
    """Seconds of `snakemake --cores 1` running the five plot rules (forced) and nothing else (--allowed-rules: the
    copy's newer timestamps never rerun a measurement)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--forcerun", *RULES, "--allowed-rules", *RULES,
                           "--", *RULES],
                          cwd=work, env=ENV, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"the plot rules failed in {work}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return took


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
            times = [plot_rules(work) for _ in range(a.repeats)]
            print(f"pdf.fonttype {fonttype}: the five plot rules took {statistics.median(times):.1f} s "
                  f"(median of {a.repeats}: {', '.join(f'{t:.1f}' for t in times)})", flush=True)


if __name__ == "__main__":
    main()
