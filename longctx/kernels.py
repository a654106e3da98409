"""Build an attention kernel from kernels/ into build/kernels/<name>/, checked and hashed.

kind "torch": the sources are PyTorch modules; the build copies them, imports the built copy and
checks it against the dense MLA attention on random inputs with scattered page tables. A kernel
that disagrees stops the workflow before any configuration uses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

KINDS = ("torch",)


def source_hashes(sources: list[str | Path]) -> dict[str, str]:
    return {str(s): hashlib.sha256(Path(s).read_bytes()).hexdigest() for s in sources}


def build_hash(name: str, kind: str, hashes: dict[str, str]) -> str:
    h = hashlib.sha256(f"{name}\0{kind}\0".encode())
    for path in sorted(hashes):
        h.update(f"{Path(path).name}\0{hashes[path]}\0".encode())
    return h.hexdigest()[:16]


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"longctx_built_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_paged_decode(kernel, cases=((1, 2, 1, 300), (3, 4, 16, 1000), (2, 8, 64, 4100)), seed: int = 0) -> dict:
    """Max relative error of kernel against dense attention, over scattered page layouts."""
    import torch

    from .refengine.attention import mla_attention

    g = torch.Generator().manual_seed(seed)
    lat, rope = 64, 16
    worst = 0.0
    for batch, heads, page_size, max_len in cases:
        lens = torch.randint(max_len // 2, max_len + 1, (batch,), generator=g)
        n_pages = int(sum(-(-int(n) // page_size) for n in lens)) + 1
        perm = torch.randperm(n_pages - 1, generator=g) + 1  # scattered pages, page 0 unused
        pool = torch.randn(n_pages * page_size, lat + rope, generator=g)
        q = torch.randn(batch, heads, lat + rope, generator=g)
        max_pages = -(-int(lens.max()) // page_size)
        table = torch.zeros(batch, max_pages, dtype=torch.int64)
        used = 0
        for b, n in enumerate(lens.tolist()):
            k = -(-n // page_size)
            table[b, :k] = perm[used : used + k]
            used += k
        out = torch.full((batch, heads, lat), float("nan"))  # poisoned: an unwritten element fails
        scale = 0.1
        out = kernel(q, pool, table, lens, page_size, lat, scale, out=out)
        for b, n in enumerate(lens.tolist()):
            slots = (table[b, :, None] * page_size + torch.arange(page_size)).flatten()[:n]
            ref = mla_attention(q[b : b + 1], pool[slots], n - 1, lat, scale)[0]
            err = ((out[b] - ref).abs().max() / ref.abs().max()).item()
            if err != err:  # NaN
                err = float("inf")
            worst = max(worst, err)
    return {"cases": [list(c) for c in cases], "max_rel_error": worst}


def build(name: str, kind: str, sources: list[str], outdir: str | Path, tolerance: float = 1e-4) -> dict:
    if kind not in KINDS:
        raise SystemExit(f"kernel {name}: kind {kind!r}; allowed values: {', '.join(KINDS)}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    hashes = source_hashes(sources)
    for src in sources:
        shutil.copyfile(src, outdir / Path(src).name)
    modules = [outdir / Path(s).name for s in sources if s.endswith(".py")]
    kernels = [m for m in map(load_module, modules) if hasattr(m, "paged_mla_decode")]
    if not kernels:
        raise SystemExit(f"kernel {name}: none of {sources} defines paged_mla_decode")
    check = check_paged_decode(kernels[0].paged_mla_decode)
    if not check["max_rel_error"] <= tolerance:
        raise SystemExit(f"kernel {name} disagrees with the dense reference: max relative error "
                         f"{check['max_rel_error']:.3g} > {tolerance:g}")
    manifest = {"name": name, "kind": kind, "sources": hashes, "build_hash": build_hash(name, kind, hashes), "check": check}
    (outdir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
