"""longctx.attention: the attention kernels under study (sources in the repository's kernels/).

- build: build, check against dense attention in float64, hash and load a kernel (rule build_kernel).
- dense: dense MLA attention in the absorbed form (the engine's prefill).
- kernelbench: a kernel timed alone per length (rule bench_kernel).
- shapes: the shape a kernel is timed at: heads per tensor-parallel rank, cell and dtype as served.
- microbench: a device's measured ceilings (copy, read, matmul); standalone (stdlib and torch only).
- hostmem: host tensors on 2 MiB pages, for KV pools.
- kernel_ab: two builds of one kernel timed in one process, calls alternated in ABBA blocks (the raw blocks;
  longctx.analysis.kernel_ab computes the paired interval).
"""
