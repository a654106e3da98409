#!/usr/bin/env python3
"""Wall time of the whole default run, and of `snakemake -n` on the up-to-date tree.

Goals (issue 2): the default run (setup excluded) under 5 minutes on 2 cores; `snakemake -n` on
an up-to-date tree under 3 s with nothing to do. Runs in a fresh copy of the workflow in a
temporary directory, so nothing of this checkout's data/ is reused.

    python bench/pipeline_time.py [--configfile config/longctx.yaml] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def run(cwd: Path, *args: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=ENV, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return elapsed, proc.stdout + proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", default="config/longctx.yaml")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="longctx-bench-"))
    for d in ("rules", "config", "kernels", "templates", "envs"):
        shutil.copytree(ROOT / d, work / d)
    shutil.copy(ROOT / "Snakefile", work)
    shutil.copy(ROOT / a.configfile, work / "run.yaml")
    print(f"workflow copy: {work}; {os.cpu_count()} CPUs")
    full, _ = run(work, "--cores", "1", "report/longctx.pdf", "--configfile", "run.yaml")
    print(f"full run (snakemake --cores 1 report/longctx.pdf): {full:.1f} s  [goal < 300 s]")
    dry = []
    for _ in range(3):
        t, out = run(work, "-n", "report/longctx.pdf", "--configfile", "run.yaml")
        dry.append(t)
    nothing = "Nothing to be done" in out
    print(f"snakemake -n on the up-to-date tree: median {statistics.median(dry):.2f} s of {[round(x, 2) for x in dry]}; "
          f"nothing to do: {nothing}  [goal < 3 s, nothing to do]")
    for log in sorted((work / "data" / "logs" / "bench").glob("*.log")):
        print(f"  {log.read_text().strip().splitlines()[-1]}")
    print((work / "report" / "longctx.tex").read_text().split(r"\begin{itemize}")[1].split(r"\end{itemize}")[0].strip())
    if a.keep:
        print(f"kept {work}")
    else:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
