"""The kernel A/B (`longctx ab`): the working tree's kernel against a kept version's, both measured in one run,
interleaved in blocks, and gated. Checked against truths the code did not make: blocks written by hand with known
pair differences, Student's t computed here, and, end to end, the real reference engine running a kernel edited to
cost 10 ms a call above 6,000 cells (decode slower at 8,192 tokens, nothing else) while other processes compete for
the cores for part of the run; the same with no edit (A against A), and with an edit that fails above 6,000 cells."""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from scipy import stats

from longctx.analysis import ab as abstats
from longctx.report import ab, versions

from .conftest import ENV, ROOT, copy_workflow, snakemake

# alone under -n (tests/conftest.py): its verdicts compare the two builds' timings
pytestmark = pytest.mark.alone

KERNEL = "kernels/reference/paged_mla_decode.py"
CELLS = "        kv = _cells(pages, page_table[b, : -(-n // page_size)], n, dim)\n"
# 10 ms a call: decode at 8,192 tokens about 6 times slower (a step takes about 1.8 ms here). 2 ms, as this test had
# before, made it about 2 times slower, and once the competing processes widened the bound so far that "a slowdown
# under 201% could go unseen": the edit went unnamed (a clean-clone run, 2026-12-07)
SLOW = CELLS + "        if n >= 6000:  # the edit under test: 10 ms more per call above 6,000 cells\n" \
               "            __import__('time').sleep(0.01)\n"
FAIL = CELLS + "        if n >= 6000:  # the edit under test: it fails above 6,000 cells\n" \
               "            raise RuntimeError(f'edited kernel refuses {n} cells')\n"


def block(side: str, ttft: list[float], rate: list[float] | None = None, status: str = "ok", reason: str | None = None) -> dict:
    rate = rate or [100.0] * len(ttft)
    return {"side": side, "trials": [{"status": status, "reason": reason, "ttft_s": t, "decode_tok_s": r}
                                     for t, r in zip(ttft, rate)]}


def measured(blocks: list[dict], length: int = 8192) -> list[dict]:
    return [{"configuration": "page16", "lengths": [{"length": length, "blocks": blocks}], "starts": {"A": 1, "B": 1}}]


def test_the_pairs_are_neighbouring_blocks_and_the_bound_is_students():
    """Four pairs written by hand (A B, B A, A B, B A): B's TTFT 1.2, 1.1, 1.3, 1.2 times A's. The ratio and the
    one-sided bound are Student's t on those four log ratios, computed here."""
    ratios = [1.2, 1.1, 1.3, 1.2]
    blocks, order = [], ["A", "B", "B", "A", "A", "B", "B", "A"]
    for i, side in enumerate(order):
        base = 0.1 * (1 + (i // 2) / 2)  # the machine 50% slower at each pair than the one before: both sides of a pair
        blocks.append(block(side, [base * (ratios[i // 2] if side == "B" else 1.0)]))
    (cell,) = abstats.server_cells(measured(blocks))
    fam = abstats.family([cell], "server", 0.95, 0.05)
    row = fam["rows"][0]
    d = np.log(ratios)
    level = 1 - 0.05 / fam["tests"]
    half = stats.t.ppf(level, 3) * d.std(ddof=1) / 2
    assert row["n_now"] == 4 and row["ttft"]["ratio"] == pytest.approx(math.exp(d.mean()))
    assert row["ttft"]["ci"] == pytest.approx([math.exp(d.mean() - half), math.exp(d.mean() + half)])
    assert row["ttft"]["regression"] and [g["figure"] for g in fam["regressions"]] == ["ttft"]
    assert row["decode"]["verdict"] == "no measurable difference" and fam["lost"] == []


def test_a_length_the_candidate_lost_is_lost_with_its_reason():
    """B's trials at 8,192 all failed (the server aborted them): no pair has both sides, where A had four."""
    order = ["A", "B", "B", "A", "A", "B", "B", "A"]
    why = "the server aborted the request: engine error: boom"
    blocks = [block(s, [0.1]) if s == "A" else block(s, [0.1], status="failed", reason=why) for s in order]
    fam = abstats.family(abstats.server_cells(measured(blocks)), "server", 0.95, 0.05)
    (x,) = fam["lost"]
    assert (x["n_before"], x["n_now"], x["figures"]) == (4, 0, ["ttft", "decode"])
    assert x["why"] == f"{why} (4 trials)"
    # a decode rate gone while the first token still came (an ok trial with no rate): decode alone is lost
    blocks = [block(s, [0.1]) if s == "A" else block(s, [0.1], rate=[None]) for s in order]
    (x,) = abstats.family(abstats.server_cells(measured(blocks)), "server", 0.95, 0.05)["lost"]
    assert x["figures"] == ["decode"] and x["what"] == "decode"


def kept_version(vdir, n: int, kernel_sources: dict[str, bytes]) -> dict:
    """A version record that kept these kernel sources (as versions.register keeps them)."""
    sources = {p: versions.hashlib.sha256(d).hexdigest() for p, d in kernel_sources.items()}
    record = {"n": n, "hash": f"{n:012x}", "name": f"longctx-v{n}-{n:012x}", "entry": {"commit": "c" * 40},
              "measurements": {"configurations": {"page16": {"kernel": {"name": "paged_mla_decode_torch", "build_hash": "x",
                                                                        "sources": sources}}}, "trials": []}}
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / f"{record['name']}.json").write_text(json.dumps(record))
    log = versions.read_log(vdir) + [{"n": n, "hash": record["hash"]}]
    (vdir / "log.json").write_text(json.dumps({"versions": log}))
    for p, d in kernel_sources.items():
        (vdir / versions.SOURCES).mkdir(exist_ok=True)
        (vdir / versions.SOURCES / sources[p]).write_bytes(d)
    return record


def config_of(work) -> dict:
    from longctx import config as cfg

    return cfg.load([str(work / "ab.yaml")])


def test_the_plan_takes_the_baselines_sources_and_says_what_differs(tmp_path):
    work = copy_workflow(tmp_path)
    shutil.copy(ROOT / "tests" / "configs" / "ab.yaml", work / "ab.yaml")
    config = config_of(work)
    vdir = work / "report" / "versions"
    original = (work / KERNEL).read_bytes()
    kept_version(vdir, 1, {KERNEL: original})
    same = ab.plan(config, "v1", None, vdir, work)
    assert same["aa"] and same["configurations"] == ["page16"] and same["kernels"][0]["differs"] == []
    (work / KERNEL).write_text(original.decode().replace(CELLS, SLOW))
    edited = ab.plan(config, "v1", None, vdir, work)
    assert not edited["aa"] and edited["kernels"][0]["differs"] == ["paged_mla_decode.py"]
    assert edited["kernels"][0]["before"][KERNEL] == original
    # what it cannot do, in one line each
    with pytest.raises(ab.ABError, match="needs one baseline"):
        ab.plan(config, None, None, vdir, work)
    with pytest.raises(ab.ABError, match=r"there is no v7 in .*\(kept: v1\)"):
        ab.plan(config, "v7", None, vdir, work)
    record = kept_version(vdir, 2, {KERNEL: b"# another\n"})
    (vdir / versions.SOURCES / versions.hashlib.sha256(b"# another\n").hexdigest()).unlink()
    with pytest.raises(ab.ABError, match=r"v2 kept no copy of kernels/reference/paged_mla_decode.py .*--against-rev "
                                         rf"\(its commit: {record['entry']['commit']}\)"):
        ab.plan(config, "v2", None, vdir, work)
    with pytest.raises(ab.ABError, match="cannot be read at git revision 'no-such-rev'"):
        ab.plan(config, None, "no-such-rev", vdir, work)


def test_a_version_keeps_the_kernel_sources_it_measured_and_an_ab_takes_them(tmp_path):
    """versions.keep_sources, as register calls it: the sources whose content is the one the version recorded are kept
    under versions/sources/ (read where they are, or from the kernel's build once the working tree moved on), so that
    `longctx ab --against v1` has them after the file was edited; content that is nowhere is said."""
    work = copy_workflow(tmp_path)
    shutil.copy(ROOT / "tests" / "configs" / "ab.yaml", work / "ab.yaml")
    vdir = work / "report" / "versions"
    original = (work / KERNEL).read_bytes()
    record = kept_version(vdir, 1, {})
    sha = versions.hashlib.sha256(original).hexdigest()
    record["measurements"]["configurations"]["page16"]["kernel"]["sources"] = {KERNEL: sha}
    (vdir / f"{record['name']}.json").write_text(json.dumps(record))
    (work / KERNEL).write_text(original.decode().replace(CELLS, SLOW))  # edited since it was measured ...
    assert versions.keep_sources(vdir, record, work) == {KERNEL: "its content is no longer where it was measured (edited since)"}
    build = work / "build" / "kernels" / "paged_mla_decode_torch"
    build.mkdir(parents=True)
    (build / "paged_mla_decode.py").write_bytes(original)  # ... but its build still holds what was measured
    assert versions.keep_sources(vdir, record, work) == {} and versions.kept_source(vdir, sha) == original
    plan = ab.plan(config_of(work), "v1", None, vdir, work)
    assert plan["kernels"][0]["before"] == {KERNEL: original} and plan["kernels"][0]["differs"] == ["paged_mla_decode.py"]


# --- end to end: the real reference engine, real servers, real contention --------------------------------------


class Busy:
    """Processes that keep every core busy from `after` s into the block for `for_s` s (another job on the machine),
    stopped by their pids."""

    def __init__(self, after: float, for_s: float, processes: int = 3):
        self.after, self.for_s, self.n = after, for_s, processes
        self.procs: list[subprocess.Popen] = []
        self.window: list[float] = []
        self._stop = threading.Event()

    def _run(self):
        if self._stop.wait(self.after):
            return
        self.window.append(time.monotonic())
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        self._stop.wait(self.for_s)
        self._kill()
        self.window.append(time.monotonic())

    def _kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()
        self._kill()


def longctx_ab(work, *args) -> tuple[int, str, float]:
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "longctx.cli", "ab", "--configfile", "ab.yaml", *args], cwd=work, env=ENV,
                          capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """The workflow's files with tests/configs/ab.yaml, committed to a git repository of their own: the baseline is
    that commit (--against-rev HEAD; a kept version's sources are the plan's test above, and the Snakemake target's
    below)."""
    work = copy_workflow(tmp_path_factory.mktemp("ab"))
    shutil.copy(ROOT / "tests" / "configs" / "ab.yaml", work / "ab.yaml")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "baseline"]):
        subprocess.run(["git", *args], cwd=work, check=True, capture_output=True)
    return work


@contextlib.contextmanager
def edited(work, new: str):
    """The workflow's reference kernel with CELLS replaced by new, restored afterwards."""
    kernel = work / KERNEL
    original = kernel.read_text()
    kernel.write_text(original.replace(CELLS, new))
    try:
        yield
    finally:
        kernel.write_text(original)


@pytest.mark.slow
def test_the_ab_names_the_slowed_length_and_no_other_while_the_machine_is_busy(workflow):
    with edited(workflow, SLOW), Busy(after=8, for_s=12) as busy:
        code, out, wall = longctx_ab(workflow, "--against-rev", "HEAD")
    print(out, f"\n(busy from {busy.window} s; {wall:.0f} s in all)")
    assert busy.window, "the competing processes never started: the A/B ended before them"
    assert code == 1, out
    named = re.findall(r"^(page16) at ([\d,]+) tokens: (\w+) now/before ([\d.]+) \[([\d.]+), ([\d.]+)\], (\d+) pairs, "
                       r"slower beyond the 5% margin against git HEAD's kernel sources$", out, re.M)
    assert [(L, f) for _, L, f, *_ in named] == [("8,192", "decode")], out
    assert re.search(r"^A/B against git HEAD: kernel paged_mla_decode_torch \(paged_mla_decode.py\); 1 configuration\(s\) at the "
                     r"server level, 10 blocks a side per length; cost 2 server starts and \d+ s$", out, re.M), out
    answer = json.loads((workflow / "report" / "ab.json").read_text())
    assert answer["cost"]["server_starts"] == 2 and answer["lost"] == [] and answer["kind"] == "interleaved"
    page = (workflow / "report" / "ab.md").read_text()
    assert "The verdict comes from the server-level A/B" in page and "## Kernel level" in page
    kernel_rows = {r["length"]: r for r in json.loads((workflow / "data" / "ab" / "measurements.json").read_text())["kernel"][0]["lengths"]}
    assert set(kernel_rows) == {1024, 8192}


@pytest.mark.slow
def test_a_length_the_edit_made_fail_is_lost_with_the_reason(workflow):
    with edited(workflow, FAIL):
        code, out, _ = longctx_ab(workflow, "--against-rev", "HEAD")
    print(out)
    assert code == 1, out
    assert re.search(r"^page16 at 8,192 tokens: TTFT and decode lost since git HEAD's kernel sources \(10 then 0 pairs with both "
                     r"sides measured\): the server aborted the request: engine error: edited kernel refuses 8193 cells "
                     r"\(10 trials\)$", out, re.M), out
    assert "page16 at 1,024 tokens" not in out


@pytest.mark.slow
def test_the_snakemake_target_runs_an_aa_that_passes_and_says_what_it_could_not_see_and_keeps_its_measurements(workflow):
    """The Snakemake target (measure_ab, then check_ab) on the same kernel as the baseline, while other processes
    compete for the cores: the A/A passes, says it is one, and what slowdown it could not have seen (one A/A run in the
    suite: `longctx ab` itself is the slowed and failed tests' above)."""
    with Busy(after=5, for_s=10):
        out = snakemake(workflow, "--cores", "1", "report/ab.json", "--configfile", "ab.yaml", "--config",
                        "ab={'against_rev': 'HEAD'}")
    print(out)
    assert "measure_ab" in out and "check_ab" in out
    assert "an A/A run (no kernel source differs: the machine's noise)" in out
    assert re.search(r"^longctx ab: no regression beyond the 5% margin against git HEAD's kernel sources: 2 configuration and "
                     r"lengths compared \(4 one-sided bounds, bonferroni over the table, server-level A/B.*\); a slowdown under "
                     r"\d+% at page16 [\d,]+ tokens \((TTFT|decode)\) could go unseen$", out, re.M), out
    answer = json.loads((workflow / "report" / "ab.json").read_text())
    assert answer["aa"] is True and answer["regressions"] == [] and answer["against"] == "git HEAD's kernel sources"
    assert (workflow / "data" / "ab" / "measurements.json").is_file()
    # nothing changed: nothing reruns
    again = snakemake(workflow, "--cores", "1", "report/ab.json", "--configfile", "ab.yaml", "--config",
                      "ab={'against_rev': 'HEAD'}")
    assert "Nothing to be done" in again
