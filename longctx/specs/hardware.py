"""Hardware ceilings: datasheet figures (longctx/specs/hardware.yaml, with units and sources) matched by
the NVML device name, and the measured ones from the `calibrate` step (longctx/measure/calibration.py).

A configuration's ceilings are those of the device its server computes on (the engine adapter's
compute_device): the GPU for SGLang, vLLM and external servers on a GPU machine, the CPU for the
reference engine on --device cpu.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml

TABLE_PATH = Path(__file__).with_name("hardware.yaml")
# value x factor -> SI (bytes, bytes/s, FLOP/s)
UNIT_FACTORS = {
    "B": 1.0, "GB": 1e9, "GiB": 2.0**30, "TB": 1e12,
    "B/s": 1.0, "GB/s": 1e9, "TB/s": 1e12, "GiB/s": 2.0**30,
    "FLOP/s": 1.0, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15,
}
QUANTITIES = ("memory", "memory_bandwidth", "bf16_dense", "fp8_dense", "fp32")
SI_UNITS = {"memory": "bytes", "memory_bandwidth": "bytes/s", "bf16_dense": "FLOP/s", "fp8_dense": "FLOP/s", "fp32": "FLOP/s"}


class HardwareTableError(ValueError):
    pass


def _norm(name: str) -> str:
    return re.sub(r"\s+", " ", name).strip().lower()


def _si(entry_name: str, key: str, q) -> float:
    if not isinstance(q, dict) or "value" not in q or "unit" not in q:
        raise HardwareTableError(f"{TABLE_PATH.name}: {entry_name}.{key} must be {{value: ..., unit: ...}}")
    if q["unit"] not in UNIT_FACTORS:
        raise HardwareTableError(f"{TABLE_PATH.name}: {entry_name}.{key} has unit {q['unit']!r}; known: {', '.join(UNIT_FACTORS)}")
    return float(q["value"]) * UNIT_FACTORS[q["unit"]]


def load_table(path: str | Path = TABLE_PATH) -> list[dict]:
    """The GPU entries with every quantity in SI units (key + '_si') beside the datasheet's value."""
    raw = yaml.safe_load(Path(path).read_text())
    out = []
    for e in raw["gpus"]:
        if not e.get("sources"):
            raise HardwareTableError(f"{Path(path).name}: {e['name']} has no sources")
        entry = {k: v for k, v in e.items() if k not in QUANTITIES}
        for key in QUANTITIES:
            if key in e:
                entry[key] = e[key]
                entry[f"{key}_si"] = _si(e["name"], key, e[key])
        for key in ("memory", "memory_bandwidth", "bf16_dense"):
            if f"{key}_si" not in entry:
                raise HardwareTableError(f"{Path(path).name}: {e['name']} lacks {key}")
        out.append(entry)
    return out


@lru_cache(maxsize=1)
def _table() -> tuple[dict, ...]:
    return tuple(load_table())


def match(nvml_name: str | None) -> dict | None:
    """The datasheet entry whose NVML names include this device name (case and spacing ignored)."""
    if not nvml_name:
        return None
    key = _norm(nvml_name)
    for e in _table():
        if key in (_norm(n) for n in e["nvml_names"]):
            return dict(e)
    return None


def peak_flops(entry: dict | None, dtype: str) -> tuple[float | None, str | None]:
    """The datasheet compute ceiling for attention computed in `dtype`, and which figure it is.
    FP8 KV caches are dequantised to BF16 for the attention math in the engines studied, so an
    FP8 cache still meets the BF16 tensor ceiling."""
    if entry is None:
        return None, None
    if dtype == "float32":
        return entry.get("fp32_si"), "FP32 (CUDA cores)"
    return entry.get("bf16_dense_si"), "BF16 tensor, dense"


def ceilings(device: str, hardware: dict, calibration: dict | None, dtype: str) -> dict:
    """Datasheet and measured ceilings (bytes/s, FLOP/s) of the device a configuration's server
    computes on: 'gpu' or 'cpu' (of the machine that measured), or 'remote' (none apply)."""
    out: dict = {"device": device, "device_name": None, "datasheet": None, "measured": None}
    if device == "remote":  # another machine's: neither this machine's datasheet entry nor its calibration applies
        why = "the server computes on another machine, whose device this one neither knows nor measured"
        return {**out, "datasheet_missing": why, "measured_missing": why}
    if device == "gpu":
        gpus = hardware.get("gpus") or []
        out["device_name"] = gpus[0]["name"] if gpus else None
        entry = match(out["device_name"])
        if entry:
            flops, which = peak_flops(entry, dtype)
            out["datasheet"] = {"name": entry["name"], "bandwidth_Bps": entry["memory_bandwidth_si"], "flops": flops,
                                "flops_kind": which, "memory_bytes": entry["memory_si"], "sources": entry["sources"]}
        elif out["device_name"]:
            out["datasheet_missing"] = f"no datasheet entry for {out['device_name']!r} in {TABLE_PATH.name}"
        else:
            out["datasheet_missing"] = "no GPU seen by NVML on the machine that measured"
    else:
        out["device_name"] = hardware.get("cpu")
        out["datasheet_missing"] = "CPUs have no datasheet entry: only the measured ceilings apply"
    m = (calibration or {}).get("devices", {}).get("cuda" if device == "gpu" else "cpu")
    if hardware.get("source") == "config":  # another machine's, named in the config (imported results)
        out["measured_missing"] = "the results were measured on another machine (named in the config), not calibrated here"
        if device == "cpu":
            out["datasheet_missing"] = "CPUs have no datasheet entry, and the machine that measured was not calibrated here"
    elif m and m.get("status") == "ok":
        out["measured"] = {"name": m.get("name"), "bandwidth_Bps": m["copy_Bps"], "read_Bps": m.get("read_Bps"),
                           "flops": m["matmul_flops"], "flops_dtype": m.get("dtype"), "kind": "cpu" if device == "cpu" else "GPU"}
    elif m:
        out["measured_missing"] = m.get("reason")
    else:
        out["measured_missing"] = "not calibrated (the calibrate step did not measure this device)"
    return out


def without_flops(ceil: dict, why: str) -> dict:
    """The ceilings less their FLOP roofs, where the engine computes in an arithmetic none of them timed (quantized
    weights): the bandwidth roofs stay; flops_withheld says why no FLOP roof is compared."""
    out = {**ceil, "flops_withheld": why}
    for which in ("datasheet", "measured"):
        if out.get(which):
            out[which] = {**out[which], "flops": None}  # what was timed stays named (flops_kind, flops_dtype)
    return out
