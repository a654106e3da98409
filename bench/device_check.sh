#!/usr/bin/env bash
# On a GPU machine: build the CUDA paged MLA decode kernel for the GPU present, check it against the
# PyTorch reference (fp32 and bf16, decode and verify, scattered page tables, poisoned outputs), and
# time it against the copy bandwidth measured on the same GPU (issue 7). Needs nvcc and a CUDA PyTorch.
#
#   bash bench/device_check.sh            # prints everything; JSON records go to $OUT (or /tmp)
#
# Shape: one layer of Kimi K2 / DeepSeek-V3 on one of 8 tensor-parallel ranks (8 heads, latent 512 +
# rope 64, bf16), batch 1, page_size 1 with scattered slots. Goal on an H200: at least 80% of the copy
# bandwidth at 128k.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUTDIR=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv || true
command -v nvcc >/dev/null && nvcc --version | tail -2 || { echo "nvcc not found: the CUDA kernel cannot be built" >&2; exit 1; }
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
  torch.cuda.get_device_name() if torch.cuda.is_available() else None); sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "PyTorch sees no CUDA GPU: nothing to run" >&2; exit 1; }
# builds the CPU twin and the CUDA extension (sm of this GPU), checks both, then times every variant
"$PY" bench/kernel_decode.py --device cuda --dtype bfloat16 --heads 8 --kv-lora-rank 512 --rope 64 \
  --lengths 4096 16384 65536 131072 --build-dir build/device_check --json "$OUTDIR/kernel_decode_cuda.json"
"$PY" - "$OUTDIR/kernel_decode_cuda.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
cuda = {r["length"]: r for r in records if r["variant"] == "cuda"}
gather = {r["length"]: r for r in records if r["variant"] == "gather"}
for length, r in sorted(cuda.items()):
    print(f"cuda {length:>7}: {r['seconds'] * 1e6:8.1f} us  {r['gb_s']:8.1f} GB/s  {r['fraction_of_copy']:6.1%} of copy "
          f"({r['copy_gb_s']:.0f} GB/s)  {gather[length]['seconds'] / r['seconds']:7.1f}x the CPU gather")
top = cuda[max(cuda)]
print(f"goal (H200, 128k, batch 1, page_size 1): >= 80% of copy bandwidth: {'met' if top['fraction_of_copy'] >= 0.8 else 'NOT met'} "
      f"({top['fraction_of_copy']:.1%})")
PY
manifest=build/device_check/manifest.json
"$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(json.dumps({"checks": m["checks"], "targets": m["targets"],
  "ptxas": {a: v["functions"] for a, v in m.get("cuda", {}).get("archs", {}).items()}}, indent=1))' "$manifest"
