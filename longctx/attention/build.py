"""Build attention kernels from kernels/ into build/kernels/<name>/, checked and hashed; load them.

kind "torch": the sources are PyTorch modules (paged_mla_decode, paged_mla_verify); the build copies
them, imports the copy and checks it.
kind "native": C++ and CUDA sources. The .cpp is the CPU twin, a PyTorch C++ extension, compiled
(torch.utils.cpp_extension, -O3 -march=native, OpenMP) and checked on the CPU. The .cu is compiled by
standalone nvcc into a cubin per CUDA architecture (sm_120, sm_90 by default) with ptxas' resource
report (registers, shared memory, spills) kept beside it (both cached by source, flags and nvcc, as the
CPU twin is); without nvcc that part is skipped and the manifest says so. Where PyTorch has CUDA and a GPU, the .cu and the binding (*_binding.cpp) are also
built as a CUDA extension and checked on the GPU.

Every check compares against dense attention computed here in float64 (check_attention) on fresh
random inputs with scattered page tables, several lengths, head counts and page sizes, decode and
verify, into outputs poisoned with NaN so that an unwritten element fails. A native kernel is checked
at two KV cell shapes (CELLS), in fp32 and bf16: a small one, and the production one of DeepSeek-V3 /
Kimi K2 (kv_lora_rank 512 + rope 64), where the CUDA kernel gives each thread more than one output
dim (512 > its 256 threads) and asks for more than 48 KiB of dynamic shared memory (the opt-in path);
the manifest records which of those paths the GPU checks took (cuda_paths). It must also refuse a page
table that points outside the KV pool (check_rejects_outside_pool). A PyTorch kernel, the plainest
form, is checked at the small cell (the tests check the reference at the production one). A kernel
that disagrees stops the workflow before any configuration uses it.
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

from ..core.errors import write_atomic
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
# DeepSeek-V3 / Kimi K2's KV cell (kv_lora_rank, rope), and the cases checked at it: heads per rank
# of TP8 (8) and TP4 (16) and of TP1 (128: eight CUDA row groups), a verify whose rows fill one and a
# half row groups, page sizes 1, 16 and 64
PRODUCTION_CELL = (512, 64)
PRODUCTION_CASES = ((1, 8, 1, 3000, 1), (2, 16, 64, 1200, 1), (1, 8, 16, 1500, 3), (1, 128, 1, 700, 1))
# The KV cells the build checks, each with its cases: a small one, and the production one
CELLS = (((64, 16), CASES), (PRODUCTION_CELL, PRODUCTION_CASES))
# What both native kernels say of a page id outside the KV pool (the CPU twin's TORCH_CHECK, and the
# CUDA binding's for the kernel's flag)
OUTSIDE_POOL = "a page id in page_table points outside the KV pool"
# The CUDA kernel's paths the checks must take (kernels/cuda/paged_mla_decode.cu): dynamic shared
# memory past the 48 KiB a block gets without opting in
DEFAULT_SHARED_MEMORY = 48 * 1024


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
    """A compiled extension module from its file (torch must be imported first: it holds the symbols). One module
    per name in a process (its PyInit symbol carries the name): a name already loaded is returned as it is, which
    is right because a build's module name carries the hash of its source (build_cpu_twin, build_cuda_extension)."""
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
    build_hash: str | None = None  # the manifest's (a source directory's: of its module's source)
    kernel_dir: str | None = None  # where it was loaded from


def _native_kernel(name: str, target: str, fn: Callable) -> Kernel:
    def verify(q, kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale, out=None):
        return fn(q, kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale, out)

    def decode(q, kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale, out=None):
        o = fn(q[:, None], kv_pool, page_table, seq_lens, page_size, kv_lora_rank, sm_scale,
               None if out is None else out[:, None])
        return o[:, 0]

    return Kernel(name, target, decode, verify)


def load_kernel(kernel_dir: str | Path, device: str = "cpu") -> Kernel:
    """The kernel built into kernel_dir (its manifest.json), or the PyTorch module in a source directory.

    Two directories give two kernels, side by side in one process (the kernel A/B, longctx.attention.kernel_ab): a
    PyTorch kernel is a fresh module executed from the directory's own copy, and a native one an extension module
    whose name carries the hash of its source (build_cpu_twin, build_cuda_extension), so two different sources are
    two modules; the same source built twice is one module, the same code."""
    kernel_dir = Path(kernel_dir)
    manifest_path = kernel_dir / "manifest.json"
    if not manifest_path.is_file():
        path = kernel_dir / KERNEL_MODULE
        if not path.is_file():
            raise FileNotFoundError(f"no kernel in {kernel_dir}: neither manifest.json (a build) nor {KERNEL_MODULE}")
        m = load_module(path)
        return Kernel(path.stem, "torch", m.paged_mla_decode, getattr(m, "paged_mla_verify", None),
                      build_hash(path.stem, "torch", source_hashes([path])), str(kernel_dir))
    manifest = json.loads(manifest_path.read_text())
    if manifest["kind"] == "torch":
        m = load_module(kernel_dir / manifest["entry"])
        return Kernel(manifest["name"], "torch", m.paged_mla_decode, getattr(m, "paged_mla_verify", None),
                      manifest.get("build_hash"), str(kernel_dir))
    target = "cuda" if str(device).startswith("cuda") else "cpu"
    built = manifest["targets"].get(target)
    if not built or "library" not in built:
        why = (built or {}).get("skipped", "not built")
        raise FileNotFoundError(f"kernel {manifest['name']} in {kernel_dir} has no {target} build: {why}")
    ext = load_extension(kernel_dir / built["library"], built["module"])
    kernel = _native_kernel(manifest["name"], target, ext.paged_mla_attention)
    kernel.build_hash, kernel.kernel_dir = manifest.get("build_hash"), str(kernel_dir)
    return kernel


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


def dense_float64(q, cells, lat: int, scale: float):
    """Attention of q [n_q, heads, dim] to one request's cells [n, dim] in token order, in float64:
    query j sees cells 0 .. n - n_q + j; values are the cells' first lat dims. [n_q, heads, lat]."""
    import torch

    q, cells = q.double(), cells.double()
    n_q, n = q.shape[0], cells.shape[0]
    scores = torch.einsum("jhd,td->jht", q, cells) * scale
    future = torch.arange(n)[None, :] > (n - n_q + torch.arange(n_q))[:, None]  # [n_q, n]
    scores = scores.masked_fill(future[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ cells[:, :lat]


def check_attention(fn: Callable, dtype: str = "float32", device: str = "cpu", cases=CASES, seed: int = 0,
                    lat: int = 64, rope: int = 16) -> dict:
    """Max relative error of fn (verify signature) against dense attention in float64 (dense_float64,
    on the CPU, of the same rounded inputs) over the cases, outputs poisoned with NaN."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tdtype = getattr(torch, dtype)
    worst = 0.0
    for batch, heads, page_size, max_len, n_q in cases:
        q, pool, table, lens = _random_case(g, batch, heads, page_size, max_len, n_q, lat, rope, tdtype, device)
        out = torch.full((batch, n_q, heads, lat), float("nan"), dtype=tdtype, device=device)
        out = fn(q, pool, table, lens, page_size, lat, 0.1, out=out)
        pool_cpu, table_cpu, q_cpu, out_cpu = pool.cpu(), table.cpu(), q.cpu(), out.cpu().double()
        for b, n in enumerate(lens.tolist()):
            slots = (table_cpu[b, :, None] * page_size + torch.arange(page_size)).flatten()[:n]
            ref = dense_float64(q_cpu[b], pool_cpu[slots], lat, 0.1)
            err = ((out_cpu[b] - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, err if err == err else float("inf"))  # NaN: an element left unwritten
    return {"dtype": dtype, "device": device, "kv_lora_rank": lat, "rope": rope, "cases": [list(c) for c in cases],
            "max_rel_error": worst}


def check_rejects_outside_pool(fn: Callable, dtype: str = "float32", device: str = "cpu", lat: int = 64,
                               rope: int = 16) -> dict:
    """fn (verify signature) must refuse a page table whose page id, for a cell below seq_len, lies
    past the pool's end, or is negative, with OUTSIDE_POOL (RuntimeError), at page_size 1 and 16;
    and answer rightly on the next, valid call (a refusal leaves the device usable)."""
    import torch

    tdtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(3)
    refused = []
    for page_size, bad in ((1, 64), (16, 4), (1, -1)):  # pools of 64 slots: 64 pages of 1, 4 of 16
        pool = torch.randn(64, lat + rope, generator=g).to(tdtype).to(device)
        q = torch.randn(1, 1, 2, lat + rope, generator=g).to(tdtype).to(device)
        n_pages = -(-40 // page_size)
        table = torch.arange(n_pages, dtype=torch.int64)[None, :]
        table[0, n_pages // 2] = bad
        try:
            fn(q, pool, table.to(device), torch.tensor([40]), page_size, lat, 0.1)
        except RuntimeError as exc:
            if OUTSIDE_POOL not in str(exc):
                raise
            refused.append([page_size, bad])
    after = check_attention(fn, dtype, device, cases=((1, 2, 1, 300, 1),), seed=1, lat=lat, rope=rope)
    return {"dtype": dtype, "device": device, "refused": refused, "cases": 3,
            "max_rel_error_after": after["max_rel_error"]}


def check_paged_decode(kernel: Callable, seed: int = 0) -> dict:
    """Decode-only check (q [batch, heads, dim]) of a kernel with paged_mla_decode's signature."""

    def as_verify(q, pool, table, lens, page_size, lat, scale, out):
        o = kernel(q[:, 0], pool, table, lens, page_size, lat, scale, out=out[:, 0])
        return o[:, None]

    return check_attention(as_verify, cases=[c for c in CASES if c[4] == 1], seed=seed)


def require(name: str, check: dict) -> dict:
    """The check of kernel `name`, or SystemExit saying what failed (an error past the dtype's tolerance,
    or a page id outside the pool not refused)."""
    tol = TOLERANCE[check["dtype"]]
    if "refused" in check:
        if len(check["refused"]) != check["cases"] or not check["max_rel_error_after"] <= tol:
            raise SystemExit(f"kernel {name} ({check['device']}, {check['dtype']}) does not refuse page ids outside the "
                             f"KV pool as the CPU twin does: refused {check['refused']} of {check['cases']} "
                             f"(page_size, page id) cases; error on the next call {check['max_rel_error_after']:.3g}")
        return check
    if not check["max_rel_error"] <= tol:
        cell = f", cell {check['kv_lora_rank']}+{check['rope']}" if "kv_lora_rank" in check else ""
        raise SystemExit(f"kernel {name} ({check['device']}, {check['dtype']}{cell}) disagrees with the dense reference: "
                         f"max relative error {check['max_rel_error']:.3g} > {tol:g}")
    return check


def native_checks(name: str, kernel: Kernel, device: str, cells=CELLS) -> list[dict]:
    """The checks a native build runs on one device: every cell in fp32 and bf16, and the refusal of
    page ids outside the pool; each required to pass (SystemExit otherwise)."""
    checks = [require(name, check_attention(kernel.verify, dtype, device, cases, lat=lat, rope=rope))
              for (lat, rope), cases in cells for dtype in TOLERANCE]
    checks.append(require(name, check_rejects_outside_pool(kernel.verify, "float32", device)))
    return checks


def cuda_paths(ext, checks: list[dict]) -> dict:
    """Which of the CUDA kernel's paths the checks took (ext: the CUDA extension): more output dims than
    threads (each thread owns several), dynamic shared memory past the default 48 KiB."""
    threads = int(ext.threads_per_block)
    cells = {(c["dtype"], c["kv_lora_rank"], c["rope"]) for c in checks if "kv_lora_rank" in c}
    smem = {f"{d} {lat}+{rope}": int(ext.shared_memory_bytes(d, lat + rope)) for d, lat, rope in sorted(cells)}
    return {"threads_per_block": threads, "shared_memory_bytes": smem,
            "more_output_dims_than_threads": any(lat > threads for _, lat, _ in cells),
            "over_48KiB_shared_memory": any(b > DEFAULT_SHARED_MEMORY for b in smem.values())}


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
    """nvcc -cubin per architecture, with ptxas' resource report kept beside each cubin. Each cubin and
    its report are cached (cache_root()) by the source, the flags, the architecture and nvcc (its path
    and whole --version): the same source compiled again by the same nvcc is copied, not recompiled."""
    nvcc = nvcc_path()
    if nvcc is None:
        msg = "nvcc not found (PATH, CUDA_HOME): CUDA kernels not compiled; the CPU twin was built and checked"
        print(msg, flush=True)
        return {"skipped": msg}
    version_text = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip()
    version = version_text.splitlines()[-1]
    result = {"nvcc": nvcc, "nvcc_version": version, "archs": {}}
    for arch in archs:
        n = arch.removeprefix("sm_")
        cubin = outdir / f"{source.stem}.{arch}.cubin"
        flags = ["-cubin", f"-gencode=arch=compute_{n},code={arch}", "-O3", "-std=c++17", "-Xptxas", "-v"]
        cmd = [nvcc, *flags, "-o", str(cubin), str(source)]
        key = hashlib.sha256("\0".join([source.read_text(), *flags, nvcc, version_text]).encode()).hexdigest()[:16]
        cache = cache_root() / f"{re.sub(r'[^A-Za-z0-9_]', '_', source.stem)}_{arch}_{key}"
        cached_cubin, cached_report = cache / cubin.name, cache / f"{source.stem}.{arch}.ptxas.txt"
        if cached_cubin.is_file() and cached_report.is_file():
            print(f"cubin {cubin.name} found compiled in {cache} (same source, flags and nvcc)", flush=True)
            shutil.copyfile(cached_cubin, cubin)
            report = cached_report.read_text()
            (outdir / cached_report.name).write_text(report)
        else:
            print(" ".join(cmd), flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            report = proc.stdout + proc.stderr
            (outdir / f"{source.stem}.{arch}.ptxas.txt").write_text(report)
            if proc.returncode != 0:
                raise SystemExit(f"nvcc failed for {arch} (exit {proc.returncode}); its report is in "
                                 f"{outdir / f'{source.stem}.{arch}.ptxas.txt'}:\n{report[-3000:]}")
            cache.mkdir(parents=True, exist_ok=True)  # each file whole (a rename), the report last
            tmp = cache / f".{os.getpid()}.tmp"
            shutil.copyfile(cubin, tmp)
            os.replace(tmp, cached_cubin)
            tmp.write_text(report)
            os.replace(tmp, cached_report)
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
        checks = [require(name, check_paged_decode(module.paged_mla_decode))]
        if hasattr(module, "paged_mla_verify"):
            checks.append(require(name, check_attention(module.paged_mla_verify)))
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
        manifest["checks"] += native_checks(name, kernel, "cpu")
        if cu:
            manifest["cuda"] = compile_cubins(cu[0], outdir, cuda_archs)
            binding = [c for c in copies if c.stem.endswith("_binding")]
            targets["cuda"] = build_cuda_extension(name, cu + binding, outdir) if binding else {"skipped": "no *_binding.cpp source"}
            if "library" in targets["cuda"]:
                ext = load_extension(outdir / targets["cuda"]["library"], targets["cuda"]["module"])
                gk = _native_kernel(name, "cuda", ext.paged_mla_attention)
                gpu_checks = native_checks(name, gk, "cuda")
                manifest["checks"] += gpu_checks
                manifest["cuda_paths"] = cuda_paths(ext, gpu_checks)
        else:
            targets["cuda"] = {"skipped": "no CUDA source (.cu) in this kernel's sources"}
    write_atomic(outdir / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
