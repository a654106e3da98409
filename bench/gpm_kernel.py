"""The GPU's own counters (NVML's GPM: longctx.measure.gpm) over the CUDA paged MLA decode kernel at one length: the
kernel called back to back for a second between two GPM samples, then DRAM's share of its bandwidth (and in GB/s,
against the datasheet's: longctx.specs.hardware), SM activity and occupancy and tensor-pipe activity, beside the
KV bytes the kernel read per second by its own count. The first run on a lent GPU checks the counters this way
(bench/device_check.sh calls it at 128k); where GPM cannot be read it prints the one line that says why, and exits 0.

    python bench/gpm_kernel.py --build-dir build/device_check --length 131072 --json /tmp/gpm_kernel.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.measure.gpm import open_gpm  # noqa: E402
from longctx.specs import hardware  # noqa: E402


def nvml_handle():
    """(pynvml, the handle of the GPU torch computes on) or (None, why not)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound without a GPU driver
        return None, f"GPM counters not read: NVML cannot start here ({exc})"
    import torch

    if not torch.cuda.is_available():
        pynvml.nvmlShutdown()
        return None, "GPM counters not read: PyTorch sees no CUDA GPU"
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:  # NVML's order of the GPUs need not be CUDA's: found by the PCI address, as NVML writes it
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        return pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(bus.encode())
    except Exception:  # noqa: BLE001 - a torch or driver without the address: the same index
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-lora-rank", type=int, default=512)
    ap.add_argument("--rope", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    nvml, handle = nvml_handle()
    record: dict = {"length": a.length}
    if nvml is None:
        record["said"] = handle
    else:
        try:
            record.update(read(nvml, handle, a))
        finally:
            nvml.nvmlShutdown()
    print(record["said"])
    if "gpm_dram_bw_pct" in record:
        gbs = f" = {record['gpm_dram_gbs']:.0f} GB/s of the datasheet's {record['datasheet_gbs']:.0f}" if "gpm_dram_gbs" in record else ""
        print(f"at {a.length:,} cells, {record['calls']} calls in {record['seconds']:.2f} s: the kernel read its KV at "
              f"{record['kernel_gbs']:.0f} GB/s by its own count; DRAM at {record['gpm_dram_bw_pct']:.1f}% of its bandwidth{gbs}; "
              f"SMs {record.get('gpm_sm_active_pct', float('nan')):.1f}% active at {record.get('gpm_sm_occupancy_pct', float('nan')):.1f}% "
              f"occupancy; tensor pipes {record.get('gpm_tensor_active_pct', float('nan')):.1f}% active")
    if a.json:
        Path(a.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


def read(nvml, handle, a) -> dict:
    import torch

    from longctx.attention import build as kernels, kernelbench

    name = nvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    shape = kernelbench.Shape(a.heads, a.kv_lora_rank, a.rope, a.dtype, 1, 1)
    kernel = kernels.load_kernel(a.build_dir, "cuda")
    q, pool, table, lens = kernelbench.inputs(shape, a.length, "cuda", contiguous=False)
    fn = kernelbench.call(kernel, shape, q, pool, table, lens)
    fn()
    torch.cuda.synchronize()
    gpm, said = open_gpm(nvml, [handle])  # its first sample: the interval starts here
    out = {"gpu": name, "said": said}
    if gpm is None:
        return out
    try:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < a.seconds:
            fn()
            calls += 1
            if calls % 64 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        out.update(gpm.sample())
    finally:
        gpm.close()
    kv_bytes = a.length * shape.dim * torch.finfo(getattr(torch, a.dtype)).bits // 8
    out.update(calls=calls, seconds=seconds, kernel_gbs=kv_bytes * calls / seconds / 1e9)
    entry = hardware.match(name)
    if entry and "gpm_dram_bw_pct" in out:
        out["datasheet_gbs"] = entry["memory_bandwidth_si"] / 1e9
        out["gpm_dram_gbs"] = out["gpm_dram_bw_pct"] / 100 * out["datasheet_gbs"]
    return out


if __name__ == "__main__":
    sys.exit(main())
