"""Host KV pools on transparent huge pages: real mappings, read back from /proc/self/smaps."""

import subprocess
import sys

import pytest
import torch

from longctx.attention import hostmem
from longctx.refengine.kvpool import KVPool

THP = hostmem.thp_mode() in ("always", "madvise")


@pytest.mark.parametrize("shape, dtype", [((3, 5), torch.float32), ((2, 3000, 576), torch.bfloat16), ((4096, 1024), torch.float32)])
def test_zeros_are_zero_writable_and_shaped(shape, dtype):
    t = hostmem.zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and not t.any()
    t.fill_(1)
    assert bool((t == 1).all())


@pytest.mark.skipif(not THP, reason=f"transparent huge pages are {hostmem.thp_mode()} on this host")
def test_a_large_pool_is_on_huge_pages_and_a_small_pages_request_is_not():
    big = hostmem.zeros((8 << 20) // 4, torch.float32)  # 8 MiB
    assert big.data_ptr() % hostmem.HUGE_PAGE == 0
    assert hostmem.huge_page_bytes(big) >= hostmem.HUGE_PAGE  # the kernel may not back all of it, but some
    if hostmem.thp_mode() == "madvise":  # without the advice, ordinary pages
        assert hostmem.huge_page_bytes(hostmem.zeros((8 << 20) // 4, torch.float32, huge_pages=False)) == 0


@pytest.mark.skipif(not THP, reason=f"transparent huge pages are {hostmem.thp_mode()} on this host")
def test_the_engine_pool_reports_its_huge_pages():
    pool = KVPool(2, 576, torch.bfloat16, 8192, 1, 1, 8192, "random", seed=0)  # 2 x 8193 x 576 bf16: 18.9 MB
    assert pool.huge_page_bytes() >= hostmem.HUGE_PAGE
    assert pool.huge_page_bytes() <= pool.bytes() + hostmem.HUGE_PAGE


def test_huge_page_bytes_of_an_ordinary_small_tensor_is_zero():
    """In a process of its own: in the suite's, a small tensor can land in heap memory an earlier test's huge-page pool
    left advised (14 MiB of huge pages under a 64-byte tensor, once), which says nothing of the function."""
    code = "import torch; from longctx.attention import hostmem; print(hostmem.huge_page_bytes(torch.zeros(16)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "0", out
