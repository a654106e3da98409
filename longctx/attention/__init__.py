"""longctx.attention: the attention kernels under study (sources in the repository's kernels/).

- build: build, check against the dense reference, hash and load a kernel (rule build_kernel).
- dense: dense MLA attention in the absorbed form, the reference the kernels are checked against.
- kernelbench: a kernel timed alone per length (rule bench_kernel).
- microbench: a device's measured ceilings (copy, read, matmul); standalone (stdlib and torch only).
- hostmem: host tensors on 2 MiB pages, for KV pools.
"""
