#!/bin/bash
# bench/report_from_data.sh TREE DATA OUT: the report of TREE's code (a checkout of longctx, e.g. a
# `git worktree add` of an older commit) made from measurements taken before (DATA: a data/ folder
# with raw/, calibration.json and kernels/), in OUT, as the workflow's report rules make it; prints
# the path of its text (pdftotext -layout). Two trees, the same DATA, then `diff` of the two texts:
# what a code change alters in the report. Runs TREE's code with this checkout's .venv.
set -euo pipefail
TREE=$(realpath "$1"); DATA=$(realpath "$2"); OUT=$(realpath -m "$3")
VENV=$(realpath "$(dirname "$0")/../.venv")
rm -rf "$OUT"; mkdir -p "$OUT/data" "$OUT/report"
cp -r "$DATA/raw" "$DATA/calibration.json" "$DATA/kernels" "$OUT/data/"
cp -r "$TREE/templates" "$OUT/"
export PYTHONPATH=$TREE PATH=$VENV/bin:$PATH
cd "$OUT"
CFGJSON=$(python -c "import json,yaml,sys; sys.path.insert(0,'$TREE'); from longctx import config; print(json.dumps(config.load('$TREE/config/longctx.yaml')))")
RAW=$(ls data/raw/*/*.json | grep -v '/load\.json$' | sort)
longctx aggregate --out-csv data/results.csv --out-provenance data/provenance.json --out-itl-depth data/itl_depth.csv $RAW
SETTINGS=$(python -c "import json; c=json.loads('''$CFGJSON'''); print(json.dumps({k: v for k, v in c['analysis'].items() if k != 'mem_fractions'}, sort_keys=True, separators=(',', ':')))")
longctx fit --results data/results.csv --provenance data/provenance.json --calibration data/calibration.json --settings "$SETTINGS" --kernel-bench data/kernels/*.json --out data/fits.json > /dev/null
FR=$(python -c "import json; c=json.loads('''$CFGJSON'''); print(','.join(str(f) for f in c['analysis']['mem_fractions']))")
longctx plan-memory --provenance data/provenance.json --results data/results.csv --fractions $FR --out data/planner.json > /dev/null
longctx plot --results data/results.csv --fits data/fits.json --style templates/plot.mplstyle --itl-depth data/itl_depth.csv --provenance data/provenance.json --outdir report/figures > /dev/null
longctx plot-analysis --results data/results.csv --fits data/fits.json --planner data/planner.json --style templates/plot.mplstyle --outdir report/figures > /dev/null
LOAD=()  # the load workloads, in trees that have them (a tree before them has no aggregate-load)
if ls data/raw/*/load.json > /dev/null 2>&1 && longctx aggregate-load --help > /dev/null 2>&1; then
  longctx aggregate-load --out-requests data/load_requests.csv --out-interference data/load_interference.csv --out-metrics data/load_metrics.csv data/raw/*/load.json > /dev/null
  LSET=$(python -c "import json; c=json.loads('''$CFGJSON'''); print(json.dumps({'slo': c['slo'], 'load': c['load'], 'analysis': c['analysis']}, sort_keys=True, separators=(',', ':')))")
  longctx analyze-load --requests data/load_requests.csv --interference data/load_interference.csv --metrics data/load_metrics.csv --fits data/fits.json --provenance data/provenance.json --planner data/planner.json --settings "$LSET" --out data/load.json > /dev/null
  longctx plot-load --load data/load.json --metrics data/load_metrics.csv --style templates/plot.mplstyle --outdir report/figures > /dev/null
  LOAD=(--load data/load.json --load-metrics data/load_metrics.csv)
fi
HIST=()  # the history and its figure, in trees that have them (a tree before them has no plot-history)
if longctx plot-history --help > /dev/null 2>&1; then HIST=(--history-out report/history.json); fi
longctx render --template templates/longctx.tex.j2 --results data/results.csv --fits data/fits.json --provenance data/provenance.json --itl-depth data/itl_depth.csv --planner data/planner.json "${LOAD[@]}" --config-json "$CFGJSON" --out report/longctx.tex --version-out report/version.json "${HIST[@]}"
if [ ${#HIST[@]} -gt 0 ]; then
  longctx plot-history --history report/history.json --style templates/plot.mplstyle --outdir report/figures > /dev/null
fi
longctx pdf --tex report/longctx.tex --provenance data/provenance.json --version report/version.json --out report/longctx.pdf > /dev/null
longctx markdown --template templates/longctx.md.j2 --version report/version.json --results data/results.csv --fits data/fits.json --provenance data/provenance.json --itl-depth data/itl_depth.csv --planner data/planner.json "${LOAD[@]}" --config-json "$CFGJSON" --out report/longctx.md
pdftotext -layout report/longctx.pdf report/longctx.txt
echo "$OUT/report/longctx.txt"
