"""Measured ceilings of one device: memory copy bandwidth, read bandwidth and matrix-multiply rate.

Standalone on purpose (the standard library and torch only): the calibrate step runs this file with
the Python that runs the engine (SGLang's environment on a GPU machine, which need not have longctx
installed), on the machine the server runs on. Prints one JSON object.

  copy:   dst.copy_(src) of a buffer; bytes read + bytes written per second (STREAM "copy" counting)
  read:   src.sum() over the same buffer; bytes read per second
  matmul: (n x n) @ (n x n) in the model's dtype; 2 n^3 FLOP per product
Each is run `repeats` times after a warm-up; the best repeat is the ceiling, the median is kept too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

DTYPES = ("float32", "bfloat16", "float16")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name"), else what platform says of the machine.
    The one reader: longctx's provenance and kernel builds import it from here."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(fn, sync, repeats: int) -> list[float]:
    fn()
    sync()
    out = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def copy_seconds(n_bytes: int, dev, sync, repeats: int) -> list[float]:
    """Times of dst.copy_(src) for a float32 buffer of n_bytes on dev (STREAM copy: 2 n_bytes move)."""
    import torch

    src = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src), sync, repeats)


def measure(device: str = "cpu", copy_mib: int = 256, matmul_size: int = 1024, dtype: str = "float32",
            repeats: int = 5, threads: int | None = None) -> dict:
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} in {sys.executable} sees no CUDA device")
        dev = torch.device("cuda", 0)
        sync = torch.cuda.synchronize
        name = torch.cuda.get_device_name(0)
    elif device == "cpu":
        dev = torch.device("cpu")
        sync = lambda: None  # noqa: E731
        name = cpu_name()
        if threads:
            torch.set_num_threads(threads)
    else:
        raise ValueError(f"device {device!r}; allowed: cpu, cuda")
    n_bytes = copy_mib * 2**20
    copy = copy_seconds(n_bytes, dev, sync, repeats)
    src = torch.ones(n_bytes // 4, dtype=torch.float32, device=dev)
    read = timed(src.sum, sync, repeats)
    del src
    tdtype = getattr(torch, dtype)
    a = torch.randn(matmul_size, matmul_size, device=dev).to(tdtype)
    b = torch.randn(matmul_size, matmul_size, device=dev).to(tdtype)
    mm = timed(lambda: a @ b, sync, repeats)
    flops = 2.0 * matmul_size**3
    return {
        "status": "ok", "device": device, "name": name, "dtype": dtype,
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "torch": torch.__version__, "python": sys.executable, "pid": os.getpid(),
        "copy_bytes": n_bytes, "matmul_size": matmul_size, "repeats": repeats,
        "copy_Bps": 2 * n_bytes / min(copy), "copy_Bps_median": 2 * n_bytes / statistics.median(copy),
        "read_Bps": n_bytes / min(read), "read_Bps_median": n_bytes / statistics.median(read),
        "matmul_flops": flops / min(mm), "matmul_flops_median": flops / statistics.median(mm),
        "seconds": {"copy": copy, "read": read, "matmul": mm},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--copy-mib", type=int, default=256)
    p.add_argument("--matmul-size", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    a = p.parse_args(argv)
    print(json.dumps(measure(a.device, a.copy_mib, a.matmul_size, a.dtype, a.repeats, a.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
