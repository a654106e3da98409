"""The metronome's machine probe (longctx.measure.metronome), standalone on purpose (the standard library and numpy):
the bench runs this file in a process of its own at each of the run's points, so that the BLAS threads its matmul
starts end with it. In the bench's own process they spin on for a while after the matmul and take the cores from the
server's next measurements: the first lone requests of a load stage that followed a reading in-process were 30% slower
(tests/test_whatif_measured.py's sweep against load stage, 41 ms against 53 ms).

Per repeat an n x n float64 matmul (numpy's BLAS, with the threads its environment gives it: the job's CPUs, which
Snakemake passes as OMP_NUM_THREADS) and a copy of a buffer, timed together, after one untimed repeat; prints one JSON
object: each repeat's seconds and their median.

    python machineprobe.py '{"matmul_size": 512, "copy_mib": 64, "repeats": 5}'
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

# the environment variables the BLAS under numpy takes its thread count from, in the order it reads them
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def blas_threads() -> int:
    """The threads numpy's BLAS runs a matmul with: what its environment variables say, else the CPUs usable."""
    for var in BLAS_THREAD_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0))


def measure(settings: dict) -> dict:
    """Per repeat the matmul's and the copy's seconds, and their sum's median."""
    n, mib, repeats = settings["matmul_size"], settings["copy_mib"], settings["repeats"]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    matmul, copied = [], []
    for i in range(repeats + 1):  # the first untimed: the BLAS's threads started, the pages touched
        t0 = time.perf_counter()
        a @ b
        t1 = time.perf_counter()
        np.copyto(dst, src)
        t2 = time.perf_counter()
        if i:
            matmul.append(round(t1 - t0, 7))
            copied.append(round(t2 - t1, 7))
    seconds = [m + c for m, c in zip(matmul, copied)]
    return {"matmul_size": n, "copy_mib": mib, "repeats": repeats, "threads": blas_threads(),
            "cpus": len(os.sched_getaffinity(0)), "matmul_s": matmul, "copy_s": copied,
            "seconds": [round(s, 7) for s in seconds], "median_s": float(np.median(seconds))}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
