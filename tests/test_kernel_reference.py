"""The PyTorch reference of paged MLA decode against dense attention, and the kernel build."""

import json

import pytest
import torch

from longctx.attention import build as kernels
from longctx.attention.dense import mla_attention

from .conftest import ROOT

SOURCE = ROOT / "kernels" / "reference" / "paged_mla_decode.py"


@pytest.fixture(scope="module")
def paged_mla_decode():
    return kernels.load_module(SOURCE).paged_mla_decode


@pytest.mark.parametrize("page_size", [1, 4, 16, 64])
def test_paged_decode_equals_dense_on_scattered_pages(paged_mla_decode, page_size):
    g = torch.Generator().manual_seed(page_size)
    lat, rope, heads, n = 32, 8, 3, 777
    n_pages = -(-n // page_size)
    pool = torch.randn((n_pages + 5) * page_size, lat + rope, generator=g)
    pages = (torch.randperm(n_pages + 4, generator=g) + 1)[:n_pages]  # scattered, never page 0
    q = torch.randn(1, heads, lat + rope, generator=g)
    out = paged_mla_decode(q, pool, pages[None, :], torch.tensor([n]), page_size, lat, 0.125)
    slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
    ref = mla_attention(q, pool[slots], n - 1, lat, 0.125)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_build_check_passes_the_reference_and_catches_a_wrong_kernel(paged_mla_decode):
    assert kernels.check_paged_decode(paged_mla_decode)["max_rel_error"] < 1e-5

    def ignores_page_table(q, pool, table, lens, page_size, lat, scale, out=None):
        identity = torch.arange(table.shape[1])[None, :].expand_as(table) + 1
        return paged_mla_decode(q, pool, identity, lens, page_size, lat, scale, out=out)

    assert kernels.check_paged_decode(ignores_page_table)["max_rel_error"] > 1e-2

    def leaves_last_row_unwritten(q, pool, table, lens, page_size, lat, scale, out=None):
        full = paged_mla_decode(q, pool, table, lens, page_size, lat, scale)
        out[:-1] = full[:-1]
        return out

    assert kernels.check_paged_decode(leaves_last_row_unwritten)["max_rel_error"] == float("inf")


def test_build_writes_a_manifest_whose_hash_follows_the_source(tmp_path):
    src = tmp_path / "paged_mla_decode.py"
    src.write_text(SOURCE.read_text())
    m1 = kernels.build("k", "torch", [str(src)], tmp_path / "out")
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["build_hash"] == m1["build_hash"]
    assert (tmp_path / "out" / "paged_mla_decode.py").read_text() == SOURCE.read_text()
    src.write_text(SOURCE.read_text() + "\n# edited\n")
    m2 = kernels.build("k", "torch", [str(src)], tmp_path / "out")
    assert m2["build_hash"] != m1["build_hash"]


def test_build_refuses_a_kernel_that_disagrees(tmp_path):
    src = tmp_path / "paged_mla_decode.py"
    edited = SOURCE.read_text().replace("* sm_scale  # [n_q", "* sm_scale * 1.1  # [n_q")
    assert edited != SOURCE.read_text()
    src.write_text(edited)
    with pytest.raises(SystemExit, match="disagrees with the dense reference"):
        kernels.build("k", "torch", [str(src)], tmp_path / "out")


def test_verify_variant_equals_dense_causal_attention_over_the_new_tokens():
    verify = kernels.load_module(SOURCE).paged_mla_verify
    assert kernels.check_attention(verify)["max_rel_error"] < 1e-5
    # a verify that lets every query see every cell (no causal mask among the new tokens) is caught
    def sees_the_future(q, pool, table, lens, page_size, lat, scale, out=None):
        for j in range(q.shape[1]):
            out[:, j] = verify(q[:, j : j + 1], pool, table, lens, page_size, lat, scale)[:, 0]
        return out

    assert kernels.check_attention(sees_the_future)["max_rel_error"] > 1e-2


# bf16: the reference's scores come out of a bf16 matmul, rounded to bf16 before the softmax (the
# twin and the CUDA kernel keep them in fp32): at 576-dim cells that costs about 1.2% of the largest
# output (0.3% for the twin), past the build's bf16 tolerance of 1e-2, hence 2e-2 here
@pytest.mark.parametrize("dtype, tol", [("bfloat16", 2e-2), ("float32", 1e-5)])
@pytest.mark.parametrize("page_size, n_q", [(1, 1), (64, 3)])
def test_reference_at_the_production_cell_matches_float64_attention(dtype, tol, page_size, n_q):
    """kv_lora_rank 512 + rope 64 (DeepSeek-V3, Kimi K2), 8 heads (one TP8 rank): the reference (the
    build checks it at the small cell, in fp32, only) against float64 numpy attention written here."""
    import numpy as np

    verify = kernels.load_module(SOURCE).paged_mla_verify
    g = torch.Generator().manual_seed(page_size + n_q)
    lat, rope, heads, n = 512, 64, 8, 3000
    n_pages = -(-n // page_size)
    pages = torch.randperm(n_pages + 3, generator=g)[:n_pages]
    pool = torch.randn((n_pages + 3) * page_size, lat + rope, generator=g).to(getattr(torch, dtype))
    q = torch.randn(1, n_q, heads, lat + rope, generator=g).to(pool.dtype)
    out = verify(q, pool, pages[None], torch.tensor([n]), page_size, lat, 0.07)
    cells = pool[(pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n]].double().numpy()
    qn = q[0].double().numpy()
    for j in range(n_q):
        visible = cells[: n - n_q + j + 1]
        s = qn[j] @ visible.T * 0.07
        w = np.exp(s - s.max(axis=1, keepdims=True))
        ref = (w / w.sum(axis=1, keepdims=True)) @ visible[:, :lat]
        assert np.abs(out[0, j].double().numpy() - ref).max() / np.abs(ref).max() < tol
