"""Build attention kernels from kernels/ into build/kernels/<name>/, checked and hashed; load them.

kind "torch": the sources are PyTorch modules (paged_mla_decode, paged_mla_verify); the build copies
them, imports the copy and checks it.
kind "native": C++ and CUDA sources. The .cpp is the CPU twin, a PyTorch C++ extension, compiled
(torch.utils.cpp_extension, -O3 -march=native, OpenMP) and checked on the CPU. The .cu is compiled by
standalone nvcc into a cubin per CUDA architecture (sm_120, sm_90 by default) with ptxas' resource
report (registers, shared memory, spills) kept beside it; without nvcc that part is skipped and the
manifest says so. Where PyTorch has CUDA and a GPU, the .cu and the binding (*_binding.cpp) are also
built as a CUDA extension and checked on the GPU.

Every check compares against the PyTorch reference (kernels/reference) on fresh random inputs with
scattered page tables, several lengths, head counts and page sizes, decode and verify, into outputs
poisoned with NaN so that an unwritten element fails. A kernel that disagrees stops the workflow
before any configuration uses it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .microbench import cpu_name

KINDS = ("torch", "native")
CUDA_ARCHS = ("sm_120", "sm_90")
REFERENCE = Path(__file__).resolve().parents[2] / "kernels/reference/paged_mla_decode.py"
KERNEL_MODULE = REFERENCE.name
CPU_CFLAGS = ("-O3", "-march=native", "-fopenmp")  # PyTorch adds its own -std
TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-2}
# (batch, heads, page_size, max_len, n_q): decode (n_q 1) and verify cases
CASES = ((1, 2, 1, 300, 1), (3, 4, 16, 1000, 1), (2, 8, 64, 4100, 1), (1, 16, 1, 2500, 1),
         (2, 4, 1, 700, 4), (1, 8, 16, 1500, 3))


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


def load_extension(path: Path, module: str):
    """A compiled extension module from its file (torch must be imported first: it holds the symbols)."""
    import torch  # noqa: F401

    if module in sys.modules:
        return sys.modules[module]
    loader = importlib.machinery.ExtensionFileLoader(module, str(path))
    spec = importlib.util.spec_from_file_location(module, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules[module] = mod
    return mod


@dataclass
class Kernel:
    """What the engine calls: decode (q [batch, heads, dim]) and verify (q [batch, n_q, heads, dim])."""

    name: str
    target: str  # "torch", "cpu" (the CPU twin) or "cuda"
    decode: Callable
    verify: Callable | None


def _native_kernel(name: str, target: str, fn: Callable) -> Kernel:
    def verify(q, kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale, out=None):
        return fn(q, kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale, out)

    def decode(q, kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale, out=None):
        o = fn(q[:, None], kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale,
               None if out is None else out[:, None])
        return o[:, 0]

    return Kernel(name, target, decode, verify)


def load_kernel(kernel_dir: str | Path, device: str = "cpu") -> Kernel:
    """The kernel built into kernel_dir (its manifest.json), or the PyTorch module in a source directory."""
    kernel_dir = Path(kernel_dir)
    manifest_path = kernel_dir / "manifest.json"
    if not manifest_path.is_file():
        path = kernel_dir / KERNEL_MODULE
        if not path.is_file():
            raise FileNotFoundError(f"no kernel in {kernel_dir}: neither manifest.json (a build) nor {KERNEL_MODULE}")
        m = load_module(path)
        return Kernel(path.stem, "torch", m.paged_mla_decode, getattr(m, "paged_mla_verify", None))
    manifest = json.loads(manifest_path.read_text())
    if manifest["kind"] == "torch":
        m = load_module(kernel_dir / manifest["entry"])
        return Kernel(manifest["name"], "torch", m.paged_mla_decode, getattr(m, "paged_mla_verify", None))
    target = "cuda" if str(device).startswith("cuda") else "cpu"
    built = manifest["targets"].get(target)
    if not built or "library" not in built:
        why = (built or {}).get("skipped", "not built")
        raise FileNotFoundError(f"kernel {manifest['name']} in {kernel_dir} has no {target} build: {why}")
    ext = load_extension(kernel_dir / built["library"], built["module"])
    return _native_kernel(manifest["name"], target, ext.paged_mla_attention)


# ---------------------------------------------------------------------------------------- checks


def _random_case(g, batch: int, heads: int, page_size: int, max_len: int, n_q: int, lat: int, rope: int, dtype, device):
    import torch

    lens = torch.randint(max(n_q, max_len // 2), max_len + 1, (batch,), generator=g)
    n_pages = int(sum(-(-int(n) // page_size) for n in lens)) + 1
    perm = torch.randperm(n_pages - 1, generator=g) + 1  # scattered pages, page 0 unused
    pool = torch.randn(n_pages * page_size, lat + rope, generator=g)
    q = torch.randn(batch, n_q, heads, lat + rope, generator=g)
    table = torch.zeros(batch, -(-int(lens.max()) // page_size), dtype=torch.int64)
    used = 0
    for b, n in enumerate(lens.tolist()):
        k = -(-n // page_size)
        table[b, :k] = perm[used : used + k]
        used += k
    return q.to(dtype).to(device), pool.to(dtype).to(device), table.to(device), lens


def check_attention(fn: Callable, dtype: str = "float32", device: str = "cpu", cases=CASES, seed: int = 0,
                    lat: int = 64, rope: int = 16) -> dict:
    """Max relative error of fn (verify signature) against the dense reference, outputs poisoned."""
    import torch

    from .dense import mla_attention

    g = torch.Generator().manual_seed(seed)
    tdtype = getattr(torch, dtype)
    worst = 0.0
    for batch, heads, page_size, max_len, n_q in cases:
        q, pool, table, lens = _random_case(g, batch, heads, page_size, max_len, n_q, lat, rope, tdtype, device)
        out = torch.full((batch, n_q, heads, lat), float("nan"), dtype=tdtype, device=device)
        out = fn(q, pool, table, lens, page_size, lat, 0.1, out=out)
        for b, n in enumerate(lens.tolist()):
            slots = (table[b, :, None].cpu() * page_size + torch.arange(page_size)).flatten()[:n]
            ref = mla_attention(q[b].cpu().float(), pool.cpu().float()[slots], n - n_q, lat, 0.1)
            err = ((out[b].cpu().float() - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, err if err == err else float("inf"))  # NaN: an element left unwritten
    return {"dtype": dtype, "device": device, "cases": [list(c) for c in cases], "max_rel_error": worst}


def check_paged_decode(kernel: Callable, seed: int = 0) -> dict:
    """Decode-only check (q [batch, heads, dim]) of a kernel with paged_mla_decode's signature."""

    def as_verify(q, pool, table, lens, page_size, lat, scale, out):
        o = kernel(q[:, 0], pool, table, lens, page_size, lat, scale, out=out[:, 0])
        return o[:, None]

    return check_attention(as_verify, cases=[c for c in CASES if c[4] == 1], seed=seed)


def _require(name: str, check: dict) -> dict:
    tol = TOLERANCE[check["dtype"]]
    if not check["max_rel_error"] <= tol:
        raise SystemExit(f"kernel {name} ({check['device']}, {check['dtype']}) disagrees with the dense reference: "
                         f"max relative error {check['max_rel_error']:.3g} > {tol:g}")
    return check


# ---------------------------------------------------------------------------------------- builds


def cache_root() -> Path:
    base = os.environ.get("LONGCTX_KERNEL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "longctx" / "kernels"
    return Path(base)


def build_cpu_twin(name: str, source: Path, outdir: Path) -> dict:
    """Compile the CPU twin (cached by source, flags, torch, Python and CPU), copy it into outdir."""
    import torch
    from torch.utils import cpp_extension

    key = hashlib.sha256("\0".join([source.read_text(), *CPU_CFLAGS, torch.__version__, sys.version,
                                     cpu_name()]).encode()).hexdigest()[:16]
    module = f"longctx_{re.sub(r'[^A-Za-z0-9_]', '_', name)}_cpu_{key}"
    cache = cache_root() / module
    library = cache / f"{module}.so"
    if not library.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"compiling the CPU twin {source} ({' '.join(CPU_CFLAGS)}) in {cache}", flush=True)
        cpp_extension.load(name=module, sources=[str(source)], extra_cflags=list(CPU_CFLAGS),
                           extra_ldflags=["-fopenmp"], build_directory=str(cache), verbose=True)
    else:
        print(f"CPU twin {module} found compiled in {cache}", flush=True)
    shutil.copyfile(library, outdir / library.name)
    return {"library": library.name, "module": module, "cflags": list(CPU_CFLAGS)}


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(report: str) -> dict[str, dict]:
    """ptxas -v output -> {function: {registers, smem_bytes, stack_bytes, spill_stores, spill_loads}}."""
    funcs: dict[str, dict] = {}
    current = None
    for line in report.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            current = funcs.setdefault(m.group(1), {"arch": m.group(2)})
        elif current is None:
            continue
        elif m := _PTXAS_STACK.search(line):
            current.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif m := _PTXAS_USED.search(line):
            current.update(registers=int(m.group(1)), smem_bytes=int(m.group(2) or 0))
    names = list(funcs)
    if names and shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
        if len(out) == len(names):
            funcs = {pretty: funcs[raw] for raw, pretty in zip(names, out)}
    return funcs


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return None


def compile_cubins(source: Path, outdir: Path, archs: tuple[str, ...] = CUDA_ARCHS) -> dict:
    """nvcc -cubin per architecture, with ptxas' resource report kept beside each cubin."""
    nvcc = nvcc_path()
    if nvcc is None:
        msg = "nvcc not found (PATH, CUDA_HOME): CUDA kernels not compiled; the CPU twin was built and checked"
        print(msg, flush=True)
        return {"skipped": msg}
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    result = {"nvcc": nvcc, "nvcc_version": version, "archs": {}}
    for arch in archs:
        n = arch.removeprefix("sm_")
        cubin = outdir / f"{source.stem}.{arch}.cubin"
        cmd = [nvcc, "-cubin", f"-gencode=arch=compute_{n},code={arch}", "-O3", "-std=c++17", "-Xptxas", "-v",
               "-o", str(cubin), str(source)]
        print(" ".join(cmd), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        report = proc.stdout + proc.stderr
        (outdir / f"{source.stem}.{arch}.ptxas.txt").write_text(report)
        if proc.returncode != 0:
            raise SystemExit(f"nvcc failed for {arch} (exit {proc.returncode}); its report is in "
                             f"{outdir / f'{source.stem}.{arch}.ptxas.txt'}:\n{report[-3000:]}")
        print(report, flush=True)
        result["archs"][arch] = {"cubin": cubin.name, "sha256": hashlib.sha256(cubin.read_bytes()).hexdigest(),
                                 "report": f"{source.stem}.{arch}.ptxas.txt", "functions": parse_ptxas(report)}
    return result


def build_cuda_extension(name: str, sources: list[Path], outdir: Path) -> dict:
    """The CUDA kernel as a PyTorch extension for the GPU present; only with a CUDA PyTorch and a GPU."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": f"PyTorch {torch.__version__} sees no CUDA GPU: the CUDA kernel was compiled (cubins) but not run"}
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}{'a' if major == 9 else ''}"
    key = hashlib.sha256("\0".join([*(s.read_text() for s in sources), arch, torch.__version__]).encode()).hexdigest()[:16]
    module = f"longctx_{re.sub(r'[^A-Za-z0-9_]', '_', name)}_cuda_{key}"
    cache = cache_root() / module
    cache.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name=module, sources=[str(s) for s in sources], build_directory=str(cache), verbose=True,
                       extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}"])
    library = cache / f"{module}.so"
    shutil.copyfile(library, outdir / library.name)
    return {"library": library.name, "module": module, "arch": f"sm_{arch}", "gpu": torch.cuda.get_device_name()}


def build(name: str, kind: str, sources: list[str], outdir: str | Path, cuda_archs: tuple[str, ...] = CUDA_ARCHS) -> dict:
    if kind not in KINDS:
        raise SystemExit(f"kernel {name}: kind {kind!r}; allowed values: {', '.join(KINDS)}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    hashes = source_hashes(sources)
    copies = []
    for src in sources:
        shutil.copyfile(src, outdir / Path(src).name)
        copies.append(outdir / Path(src).name)
    manifest = {"name": name, "kind": kind, "sources": hashes, "build_hash": build_hash(name, kind, hashes)}
    if kind == "torch":
        entries = [c for c in copies if c.suffix == ".py" and hasattr(load_module(c), "paged_mla_decode")]
        if not entries:
            raise SystemExit(f"kernel {name}: none of {sources} defines paged_mla_decode")
        manifest["entry"] = entries[0].name
        module = load_module(entries[0])
        checks = [_require(name, check_paged_decode(module.paged_mla_decode))]
        if hasattr(module, "paged_mla_verify"):
            checks.append(_require(name, check_attention(module.paged_mla_verify)))
        manifest["checks"] = checks
    else:
        cpp = [c for c in copies if c.suffix == ".cpp" and not c.stem.endswith("_binding")]
        cu = [c for c in copies if c.suffix == ".cu"]
        if len(cpp) != 1:
            raise SystemExit(f"kernel {name}: a native kernel has exactly one CPU twin source (.cpp, not *_binding.cpp); got {sources}")
        targets = {"cpu": build_cpu_twin(name, cpp[0], outdir)}
        manifest["targets"] = targets
        manifest["checks"] = []
        kernel = _native_kernel(name, "cpu", load_extension(outdir / targets["cpu"]["library"], targets["cpu"]["module"]).paged_mla_attention)
        for dtype in TOLERANCE:
            manifest["checks"].append(_require(name, check_attention(kernel.verify, dtype)))
        if cu:
            manifest["cuda"] = compile_cubins(cu[0], outdir, cuda_archs)
            binding = [c for c in copies if c.stem.endswith("_binding")]
            targets["cuda"] = build_cuda_extension(name, cu + binding, outdir) if binding else {"skipped": "no *_binding.cpp source"}
            if "library" in targets["cuda"]:
                ext = load_extension(outdir / targets["cuda"]["library"], targets["cuda"]["module"])
                gk = _native_kernel(name, "cuda", ext.paged_mla_attention)
                for dtype in TOLERANCE:
                    manifest["checks"].append(_require(name, check_attention(gk.verify, dtype, device="cuda")))
        else:
            targets["cuda"] = {"skipped": "no CUDA source (.cu) in this kernel's sources"}
    (outdir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
