"""The metronome's kernel call (longctx.measure.metronome): a configuration's native kernel, the one its rule bench_kernel
times alone, called at one fixed shape and KV length at each point of the run, so that the run's drift has a reading of
the kernel under study beside the request through the server and the machine probe.

Run in a process of its own at each point (`python -m longctx.attention.kernelprobe '<json>'`), as the machine probe
is: the threads torch starts for the call end with it and take no core from the server's next measurement. Per point
one untimed call (the inputs' pages touched, the kernel's code loaded), then `calls` calls, each timed alone with the
device synchronised around it (microbench.timed); the point's figure is their median. The inputs are those of rule
bench_kernel (kernelbench.inputs: one request, page_size 1, slots scattered by a fixed seed), the same at every point.

    python -m longctx.attention.kernelprobe '{"kernel_dir": "build/kernels/twin", "shape": {"heads": 2, ...},
                                              "length": 4096, "calls": 20}'

Prints one JSON object: the kernel's name, target and build hash, the shape, the length, each call's seconds and their
median.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict

from . import microbench
from .build import load_kernel
from .kernelbench import call, inputs, synchronizer
from .shapes import Shape


def device_of(kernel_dir: str) -> str:
    """Where the kernel is called: the GPU where torch has one and the build has a CUDA target, else the CPU."""
    import torch

    if torch.cuda.is_available():
        try:
            load_kernel(kernel_dir, "cuda")
            return "cuda"
        except (FileNotFoundError, KeyError, RuntimeError):
            pass
    return "cpu"


def measure(settings: dict) -> dict:
    """The point's kernel calls (module docstring)."""
    shape = Shape(**settings["shape"])
    device = settings.get("device") or device_of(settings["kernel_dir"])
    kernel = load_kernel(settings["kernel_dir"], device)
    q, pool, table, lens = inputs(shape, settings["length"], device, contiguous=False)
    seconds = microbench.timed(call(kernel, shape, q, pool, table, lens), synchronizer(device), settings["calls"])
    return {"kernel": kernel.name, "target": kernel.target, "build_hash": kernel.build_hash, "device": device,
            "shape": asdict(shape), "length": settings["length"], "calls": settings["calls"],
            "seconds": [round(s, 9) for s in seconds], "median_s": statistics.median(seconds)}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
