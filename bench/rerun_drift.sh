#!/bin/bash
# bench/rerun_drift.sh CONFIG [N]: how far unchanged code moves between whole runs on this machine, to choose
# report.regression_margin above it. In a scratch copy of the workflow, CONFIG is run once, then N times more (default
# 3) with every length measured again (nothing reused); each version is compared with the first by `longctx compare`,
# whose intervals cover the trials of each run, not the machine's drift from one run to the next: a row "slower" or
# "faster" here is that drift. Prints each comparison; the largest ratio away from 1 is the margin's floor.
# Seen on a shared 2-core VM with tests/configs/versions.yaml: decode medians moved 5-10% between runs, once 25%.
set -euo pipefail
ROOT=$(realpath "$(dirname "$0")/..")
CONFIG=$(realpath "$1"); N=${2:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for f in Snakefile rules config kernels templates envs profiles; do cp -r "$ROOT/$f" "$WORK/"; done
export PATH=$ROOT/.venv/bin:$PATH
cd "$WORK"
snakemake --cores 1 --configfile "$CONFIG" > run-1.log 2>&1
for i in $(seq 2 $((N + 1))); do
  rm -rf data/partial
  snakemake --cores 1 -R bench_configuration --configfile "$CONFIG" > "run-$i.log" 2>&1
  longctx compare v1 "v$i"
done
