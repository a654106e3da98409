"""The calibrate step: measured ceilings (copy bandwidth, matmul rate) of every device of this machine
(the one the servers run on) that a configuration's server computes on (its adapter's `device`: managed
servers, and external servers with `device: cpu | gpu`), each measured by longctx/attention/microbench.py
run with the Python of the first such configuration's engine (the adapter's `python`).

data/calibration.json: {"devices": {"cpu": {...}, "cuda": {...}}, "remote": {...}}, one entry per device
kind used; a device that could not be measured has status "failed" and the reason, and the analysis then
has only the datasheet ceiling for it. "remote" names the configurations whose servers compute on another
machine, with the reason none of this machine's ceilings is theirs (present only where there are some).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

from ..core.errors import write_atomic
from ..attention import microbench
from ..config import configuration_spec
from ..engines import get_adapter
from ..specs.model import ModelSpecError

log = logging.getLogger("longctx.measure.calibration")
DEFAULTS = {"cpu": {"copy_mib": 256, "matmul_size": 1024}, "cuda": {"copy_mib": 2048, "matmul_size": 8192}}


def _dtype(model: dict, configuration: dict) -> str:
    try:
        d = get_adapter(configuration["engine"]).model_spec(model, configuration["args"]).weight_dtype
    except ModelSpecError:
        d = model.get("architecture", {}).get("torch_dtype", "bfloat16")
    return d if d in microbench.DTYPES else "bfloat16"


def plan(config: dict) -> dict:
    """What to measure: per device kind of this machine used by a configuration, the Python, dtype, sizes,
    threads; under "remote" (only where there are some), the configurations not measured, with why.
    (Run by the workflow when it parses the rules: cheap, and its result is the rule's params.)"""
    cal = config["calibration"]
    devices: dict = {}
    remote: dict = {}
    if not cal["enabled"]:
        return {"enabled": False, "devices": {}}
    for name in sorted(config["configurations"]):
        conf = config["configurations"][name]
        adapter = get_adapter(conf["engine"])
        if not adapter.measures:  # imported results: no server, here or elsewhere, to calibrate for
            continue
        spec = configuration_spec(config, name)
        device = adapter.device(spec)
        if device == "remote":
            remote[name] = (f"configurations.{name}.device: remote{' (the default)' if spec.device is None else ''}: its "
                            "server computes on another machine, whose ceilings this one cannot measure")
            continue
        kind = "cuda" if device == "gpu" else "cpu"
        if kind in devices:
            devices[kind]["configurations"].append(name)
            continue
        devices[kind] = {
            "python": adapter.python(spec),  # the engine's Python, as the server runs it
            "dtype": cal["dtype"] or _dtype(config["model"], conf),
            "copy_mib": cal["copy_mib"] or DEFAULTS[kind]["copy_mib"],
            "matmul_size": cal["matmul_size"] or DEFAULTS[kind]["matmul_size"],
            "repeats": cal["repeats"],
            "threads": (cal["threads"] or adapter.cpu_threads(conf["args"])) if kind == "cpu" else None,
            "configurations": [name],
        }
    return {"enabled": True, "devices": devices, **({"remote": remote} if remote else {})}


def run_device(kind: str, p: dict, timeout_s: float = 600) -> dict:
    cmd = [p["python"], str(Path(microbench.__file__).resolve()), "--device", kind, "--copy-mib", str(p["copy_mib"]),
           "--matmul-size", str(p["matmul_size"]), "--dtype", p["dtype"], "--repeats", str(p["repeats"])]
    if p.get("threads"):
        cmd += ["--threads", str(p["threads"])]
    log.info("calibrating %s: %s", kind, " ".join(cmd))
    # the workflow job's thread limits would cap the measurement below what the server gets
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"status": "failed", "device": kind, "reason": f"{type(exc).__name__}: {exc}", "command": cmd}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"status": "failed", "device": kind, "reason": f"{p['python']} exited {proc.returncode}: {tail[0]}", "command": cmd}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    log.info("%s (%s): copy %.1f GB/s, read %.1f GB/s, %s matmul %.1f GFLOP/s", kind, result["name"], result["copy_Bps"] / 1e9,
             result["read_Bps"] / 1e9, result["dtype"], result["matmul_flops"] / 1e9)
    return {**result, "command": cmd, "configurations": p["configurations"]}


def calibrate(plan_: dict, out: str | Path) -> dict:
    doc = {"format": "longctx.calibration/1", "enabled": plan_["enabled"],
           "devices": {kind: run_device(kind, p) for kind, p in sorted(plan_["devices"].items())}}
    if plan_.get("remote"):
        doc["remote"] = plan_["remote"]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc
