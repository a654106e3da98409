"""Host KV pools on transparent huge pages: real mappings, read back from /proc/self/smaps."""

import subprocess
import sys

import pytest
import torch

from longctx.attention import hostmem

THP = hostmem.thp_mode() in ("always", "madvise")


@pytest.mark.parametrize("shape, dtype", [((3, 5), torch.float32), ((2, 3000, 576), torch.bfloat16), ((4096, 1024), torch.float32)])
def test_zeros_are_zero_writable_and_shaped(shape, dtype):
    t = hostmem.zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and not t.any()
    t.fill_(1)
    assert bool((t == 1).all())


def in_a_process_of_its_own(code: str) -> None:
    """The check in a fresh interpreter: in the suite's, memory an earlier test left on huge pages (advised, or collapsed
    by khugepaged) can come back to a later allocation, which says nothing of hostmem (seen under make test's two
    workers: 35 MB of huge pages under an 8 MiB tensor asked for without them)."""
    proc = subprocess.run([sys.executable, "-c", "import torch\nfrom longctx.attention import hostmem\n"
                           "from longctx.refengine.kvpool import KVPool\n" + code],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(not THP, reason=f"transparent huge pages are {hostmem.thp_mode()} on this host")
def test_a_large_pool_is_on_huge_pages_and_a_small_pages_request_is_not():
    in_a_process_of_its_own("""
big = hostmem.zeros((8 << 20) // 4, torch.float32)  # 8 MiB
assert big.data_ptr() % hostmem.HUGE_PAGE == 0
assert hostmem.huge_page_bytes(big) >= hostmem.HUGE_PAGE, hostmem.huge_page_bytes(big)  # maybe not all of it, but some
if hostmem.thp_mode() == "madvise":  # without the advice, ordinary pages
    small = hostmem.huge_page_bytes(hostmem.zeros((8 << 20) // 4, torch.float32, huge_pages=False))
    assert small == 0, small
""")


@pytest.mark.skipif(not THP, reason=f"transparent huge pages are {hostmem.thp_mode()} on this host")
def test_the_engine_pool_reports_its_huge_pages():
    in_a_process_of_its_own("""
pool = KVPool(2, 576, torch.bfloat16, 8192, 1, 1, 8192, "random", seed=0)  # 2 x 8193 x 576 bf16: 18.9 MB
assert pool.huge_page_bytes() >= hostmem.HUGE_PAGE, pool.huge_page_bytes()
assert pool.huge_page_bytes() <= pool.bytes() + hostmem.HUGE_PAGE, (pool.huge_page_bytes(), pool.bytes())
""")


def test_huge_page_bytes_of_an_ordinary_small_tensor_is_zero():
    """In a process of its own: in the suite's, a small tensor can land in heap memory an earlier test's huge-page pool
    left advised (14 MiB of huge pages under a 64-byte tensor, once), which says nothing of the function."""
    code = "import torch; from longctx.attention import hostmem; print(hostmem.huge_page_bytes(torch.zeros(16)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "0", out
