"""The flake hunt (issue 54, item 4): run the suite's slow tests (or the ones named) N times, each round a pytest
of its own in the README's test environment, and list every test that failed in any round, with the round, its
wall time and the line that made it fail (the assertion's message: the figures, seeds or timings it printed).

    python bench/flake_hunt.py --rounds 3                      # every test marked slow, three times
    python bench/flake_hunt.py --rounds 5 tests/test_kernel_gate.py tests/test_realmodel.py::test_vllms_what_if_answer_at_a_concurrency_its_model_never_saw_holds

Run it with the environment `make test` sets (LONGCTX_VLLM_PYTHON, LONGCTX_LLAMACPP_PYTHON, ...): `make flake-hunt
ROUNDS=3` does. Exits 1 where any test failed in any round. A test that fails one round in N is a defect to fix, not
to rerun."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_round(targets: list[str], marker: str | None, junit: Path, workers: int) -> tuple[int, float]:
    started = time.monotonic()
    # as `make test` runs them: two workers, the tests that measure timings alone (tests/conftest.py)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), "--dist", "loadfile",
           "--no-loadscope-reorder",
           f"--junitxml={junit}", *targets]
    if marker:
        cmd += ["-m", marker]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return proc.returncode, time.monotonic() - started


def failures(junit: Path) -> dict[str, str]:
    """{test id: the first line of its failure message} from a JUnit XML report."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as exc:
        return {"(no report)": str(exc)}
    out = {}
    for case in root.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            message = (bad.get("message") or bad.text or "").strip()
            out[name] = re.sub(r"\s+", " ", message)[:400]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="pytest workers, as make test (PYTEST_WORKERS)")
    parser.add_argument("targets", nargs="*", help="pytest node ids or files (default: every test marked slow)")
    args = parser.parse_args(argv)
    marker = None if args.targets else "slow"
    seen: dict[str, list[tuple[int, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, args.rounds + 1):
            junit = Path(tmp) / f"round-{k}.xml"
            code, wall = one_round(args.targets or ["tests"], marker, junit, args.workers)
            failed = failures(junit) if code else {}
            print(f"round {k}/{args.rounds}: exit {code} in {wall:.0f} s; {len(failed)} failed", flush=True)
            for name, message in failed.items():
                print(f"  {name}: {message}", flush=True)
                seen.setdefault(name, []).append((k, message))
    if not seen:
        print(f"no test failed in {args.rounds} rounds")
        return 0
    print(f"{len(seen)} test(s) failed in at least one of {args.rounds} rounds:")
    for name, rounds in sorted(seen.items()):
        print(f"- {name}: rounds {', '.join(str(k) for k, _ in rounds)}; first: {rounds[0][1]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
