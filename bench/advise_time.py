#!/usr/bin/env python3
"""Wall time of `longctx advise`'s search (issue 55: the whole search on the example grid in under 60 s on 2 cores),
on a run already made: the directory of a workflow that measured its configurations (data/ in place) and a goal.

    python bench/advise_time.py RUN_DIR --configfile RUN_DIR/tiny.yaml --goal goal.yaml

Prints the seconds the command took and, per configuration, how many settings it searched and what it picked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the workflow's directory, after a run")
    parser.add_argument("--configfile", action="append", default=[], help="the run's config files")
    parser.add_argument("--goal", required=True, help="a YAML file with the advise key")
    args = parser.parse_args(argv)
    files = [str(Path(f).resolve()) for f in [*args.configfile, args.goal]]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "longctx.cli", "advise", "--json",
                           *[x for f in files for x in ("--configfile", f)]],
                          cwd=args.run, env=ENV, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    doc = json.loads(proc.stdout)
    print(f"longctx advise: {seconds:.1f} s on {os.cpu_count()} cores")
    for name, a in doc["configurations"].items():
        pick = (a.get("recommended") or a.get("nearest") or {}).get("flags")
        print(f"  {name}: {a.get('settings', 0)} settings searched; "
              + (f"{'pick' if a.get('feasible') else 'nearest'} {pick}" if pick else f"no advice: {a.get('reason')}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
