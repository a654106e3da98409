#!/usr/bin/env bash
# On a GPU machine: build the CUDA paged MLA decode kernel for the GPU present, check it against dense
# float64 attention (fp32 and bf16, decode and verify, scattered page tables, poisoned outputs, at a
# small cell and at the production cell 512 + 64; page ids outside the pool refused as the CPU twin
# refuses them), check it again at long contexts at the production shape, and time it against the
# copy bandwidth measured on the same GPU (issue 7), and read the GPU's own counters (GPM) over it at the
# longest length (issue 56). Needs nvcc and a CUDA PyTorch.
#
#   bash bench/device_check.sh             # prints everything; JSON records go to $OUT (or /tmp)
#   bash bench/device_check.sh --dry-run   # the same steps on the CPU twin, shorter, without a GPU
#
# Shape: one layer of Kimi K2 / DeepSeek-V3 on one of 8 tensor-parallel ranks (8 heads, latent 512 +
# rope 64, bf16), batch 1, page_size 1 with scattered slots; the long-context checks also at 128 heads
# (one rank of TP1). At that cell the CUDA kernel takes the paths a small cell never does: each of its
# 256 threads owns two of the 512 output dims, and a block asks for more than 48 KiB of dynamic shared
# memory (94,400 bytes in bf16, 74,432 in fp32: the cudaFuncSetAttribute opt-in); the check fails
# unless the build's GPU checks took both (manifest cuda_paths). Goal on an H200: at least 80% of the
# copy bandwidth at 128k.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUTDIR=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: bash bench/device_check.sh [--dry-run]" >&2; exit 2 ;;
esac

if [ "$DRY_RUN" = 1 ]; then
  echo "dry run: the CPU twin stands in for the CUDA kernel; nothing here says anything about a GPU"
  DEVICE_ARGS=()
  VARIANT=twin
  LENGTHS=(4096 16384)
  CHECK_LENGTHS=(32768)
  BUILD_DIR=build/device_check_dry_run
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv || true
  command -v nvcc >/dev/null && nvcc --version | tail -2 || { echo "nvcc not found: the CUDA kernel cannot be built" >&2; exit 1; }
  "$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
    torch.cuda.get_device_name() if torch.cuda.is_available() else None); sys.exit(0 if torch.cuda.is_available() else 1)' \
    || { echo "PyTorch sees no CUDA GPU: nothing to run" >&2; exit 1; }
  DEVICE_ARGS=(--device cuda)
  VARIANT=cuda
  LENGTHS=(4096 16384 65536 131072)
  CHECK_LENGTHS=(131072)
  BUILD_DIR=build/device_check
fi

# builds the CPU twin and the CUDA extension (sm of this GPU), checks both (the build's checks, then
# the long-context ones on each device), then times every variant
"$PY" bench/kernel_decode.py ${DEVICE_ARGS[@]+"${DEVICE_ARGS[@]}"} --dtype bfloat16 --heads 8 --kv-lora-rank 512 --rope 64 \
  --lengths "${LENGTHS[@]}" --check-lengths "${CHECK_LENGTHS[@]}" --check-heads 8 128 --build-dir "$BUILD_DIR" \
  --json "$OUTDIR/kernel_decode_$VARIANT.json" --checks-json "$OUTDIR/kernel_checks_$VARIANT.json"

"$PY" - "$OUTDIR/kernel_decode_$VARIANT.json" "$VARIANT" "$DRY_RUN" <<'PY'
import json, sys
records, variant, dry_run = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3] == "1"
timed = {r["length"]: r for r in records if r["variant"] == variant}
gather = {r["length"]: r for r in records if r["variant"] == "gather"}
for length, r in sorted(timed.items()):
    print(f"{variant} {length:>7}: {r['seconds'] * 1e6:8.1f} us  {r['gb_s']:8.1f} GB/s  {r['fraction_of_copy']:6.1%} of copy "
          f"({r['copy_gb_s']:.0f} GB/s)  {gather[length]['seconds'] / r['seconds']:7.1f}x the CPU gather")
top = timed[max(timed)]
verdict = 'met' if top['fraction_of_copy'] >= 0.8 else 'NOT met'
print(f"goal (H200, 128k, batch 1, page_size 1): >= 80% of copy bandwidth: "
      + (f"not judged (dry run: {variant} at {max(timed)}, {top['fraction_of_copy']:.1%})" if dry_run
         else f"{verdict} ({top['fraction_of_copy']:.1%})"))
PY

# the GPU's own counters (GPM, issue 56) over the CUDA kernel at the longest length: DRAM's share of its bandwidth
# beside the kernel's own GB/s, SM activity and occupancy, tensor pipes; where GPM cannot be read, the line why
"$PY" bench/gpm_kernel.py --build-dir "$BUILD_DIR" --length "${CHECK_LENGTHS[0]}" --json "$OUTDIR/gpm_kernel_$VARIANT.json"

manifest=$BUILD_DIR/manifest.json
"$PY" - "$manifest" "$DRY_RUN" <<'PY'
import json, sys
m, dry_run = json.load(open(sys.argv[1])), sys.argv[2] == "1"
print(json.dumps({"checks": [{k: v for k, v in c.items() if k != "cases"} for c in m["checks"]], "targets": m["targets"],
                  "cuda_paths": m.get("cuda_paths"),
                  "ptxas": {a: v["functions"] for a, v in m.get("cuda", {}).get("archs", {}).items()}}, indent=1))
paths = m.get("cuda_paths")
if dry_run:
    print("CUDA paths: not run (dry run)" if paths is None else f"CUDA paths: {paths}")
elif not paths or not (paths["more_output_dims_than_threads"] and paths["over_48KiB_shared_memory"]):
    sys.exit(f"the GPU checks did not take both CUDA paths (more output dims than threads, over 48 KiB of dynamic "
             f"shared memory): {paths}")
else:
    print("CUDA paths checked: more output dims than threads, and over 48 KiB of dynamic shared memory "
          f"({paths['shared_memory_bytes']})")
PY
