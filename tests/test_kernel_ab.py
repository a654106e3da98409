"""The kernel micro-benchmark A/B (issue 53, item 2): two builds of one kernel loaded side by side in one process,
calls alternated in ABBA blocks on the same inputs (longctx.attention.kernel_ab), the paired interval over the
lengths' family (longctx.analysis.kernel_ab) and `longctx ab-kernel`.

On a busy shared 2-core machine these must not be flaky: the kernels run on one thread (the A/B's default on a
CPU: a kernel's threads wait at their barrier for a neighbour's time slice), the slowed copy is about 5x slower
where it is slowed, the family's confidence is 0.999 and the flag is a regression beyond the 5% margin: an
unchanged length is flagged by chance in at most 1 run of 1,000, and the margin also covers the percent or two that
two loaded copies of the same code can differ by (memory layout), which a bare "slower" may see. The slowed
lengths' bounds clear 1.5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from longctx import cli
from longctx.analysis import kernel_ab as verdicts
from longctx.analysis.compare import SLOWER
from longctx.attention import build as kernels
from longctx.attention import kernel_ab, kernelbench
from longctx.attention.shapes import Shape
from longctx.core.interleave import schedule

from .conftest import ROOT, measuring, share_the_machine

# alone under -n (tests/conftest.py): its verdicts compare two kernels' timings
pytestmark = pytest.mark.alone

REFERENCE = ROOT / "kernels" / "reference" / "paged_mla_decode.py"
TWIN = ROOT / "kernels" / "cpu" / "paged_mla_decode.cpp"
SHAPE = Shape()  # 2 heads, cell 64 + 16, float32: the default config's
LENGTHS = [512, 1024, 2048, 4096]
SLOW_FROM = 2048
CONFIDENCE = 0.999
BLOCKS, CALLS = 24, 5

# The edit under test: the same attention four times more for a request of SLOW_FROM cells or more (about 5x
# slower there), nothing else (an int comparison per request below it)
LOOP = "    for b, n in enumerate(seq_lens.tolist()):\n"
EXTRA = (LOOP + f"        for _ in range(4 if n >= {SLOW_FROM} else 0):  # the edit under test\n"
         "            kv_ = _cells(pages, page_table[b, : -(-n // page_size)], n, dim)\n"
         "            torch.softmax(torch.matmul(q[b], kv_.t()).float() * sm_scale, dim=-1).to(kv_.dtype) @ kv_[:, :kv_lora_rank]\n")


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def slowed_source(tmp_path) -> str:
    text = REFERENCE.read_text()
    assert text.count(LOOP) == 1, "the reference's loop over requests changed: update the edit under test"
    out = tmp_path / "slowed" / REFERENCE.name
    out.parent.mkdir()
    out.write_text(text.replace(LOOP, EXTRA))
    return str(out)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """A: the reference built as the workflow builds a torch kernel (copied, checked, hashed); A2: the same build
    (loaded a second time, it is a second module); B: the slowed copy, a source directory (load_kernel takes one as
    it is: the build's checks take seconds)."""
    tmp = tmp_path_factory.mktemp("ab")
    kernels.build("paged_mla_decode_torch", "torch", [str(REFERENCE)], tmp / "A")
    return {"A": tmp / "A", "A2": tmp / "A", "B": Path(slowed_source(tmp)).parent}


def test_each_load_of_a_torch_kernel_is_its_own_module_side_by_side(builds):
    a, a2, b = (kernels.load_kernel(builds[s]) for s in ("A", "A2", "B"))
    assert len({id(k.decode) for k in (a, a2, b)}) == 3  # three modules, none taking another's place
    assert a.build_hash == a2.build_hash != b.build_hash and a.name == "paged_mla_decode_torch"
    assert a.build_hash == json.loads((builds["A"] / "manifest.json").read_text())["build_hash"]
    assert b.build_hash == kernels.build_hash("paged_mla_decode", "torch", kernels.source_hashes([builds["B"] / REFERENCE.name]))
    q, pool, table, lens = kernelbench.inputs(SHAPE, 4096, "cpu", contiguous=False)
    torch.testing.assert_close(a.decode(q[:, 0], pool, table, lens, 1, 64, 0.1), b.decode(q[:, 0], pool, table, lens, 1, 64, 0.1))


def test_a_against_a_gives_no_regression_at_any_length(builds):
    a, a2 = kernels.load_kernel(builds["A"]), kernels.load_kernel(builds["A2"])
    result = kernel_ab.alternate(a, a2, SHAPE, LENGTHS, BLOCKS, CALLS)
    assert [e["length"] for e in result["lengths"]] == LENGTHS and result["order"] == schedule(BLOCKS)
    for entry in result["lengths"]:
        assert [b["side"] for b in entry["blocks"]] == schedule(BLOCKS)
        assert all(len(b["seconds"]) == CALLS and min(b["seconds"]) > 0 for b in entry["blocks"])
        assert entry["max_abs_difference"] == 0
    assert result["sides"]["A"]["build_hash"] == result["sides"]["B"]["build_hash"]
    assert result["sides"]["A"]["kernel_dir"] == str(builds["A"]) and result["threads"] == 1
    v = verdicts.verdicts(result, CONFIDENCE)
    assert v["family"] == len(LENGTHS) and v["level"] == pytest.approx(1 - (1 - CONFIDENCE) / len(LENGTHS))
    assert v["regressions"] == [] and v["no_interval"] == []
    assert all(r["pairs"] == BLOCKS and r["ci"][0] < r["ratio"] < r["ci"][1] for r in v["rows"])


def test_a_copy_slowed_above_a_length_is_flagged_exactly_there(builds):
    a, b = kernels.load_kernel(builds["A"]), kernels.load_kernel(builds["B"])
    result = kernel_ab.alternate(a, b, SHAPE, LENGTHS, BLOCKS, CALLS)
    v = verdicts.verdicts(result, CONFIDENCE)
    slowed = [n for n in LENGTHS if n >= SLOW_FROM]
    assert v["regressions"] == slowed, [verdicts.line(r) for r in v["rows"]]
    for row in v["rows"]:
        if row["length"] in slowed:
            assert row["verdict"] == SLOWER and row["ci"][0] > 1.5 and row["speedup_ci"][1] < 1 / 1.5
        else:  # "slower" alone may be true here: two copies of one code can differ by a percent or two (layout)
            assert row["ci"][0] < 1.05 and not row["regression"]
    assert all(e["max_abs_difference"] == 0 for e in result["lengths"])  # the same answers, only slower


def test_a_block_enters_its_pair_by_its_median_call_by_default():
    assert verdicts.block_values([1.0, 9.0, 2.0, 3.0, 1.5]) == [2.0]
    assert verdicts.block_values([1.0, 9.0, 2.0], "min") == [1.0]
    assert verdicts.block_values([1.0, 9.0, 2.0], "all") == [1.0, 9.0, 2.0]
    with pytest.raises(ValueError, match="statistic"):
        verdicts.block_values([1.0], "mean")
    # one stalled call of five moves nothing by the median; by every call, a 10x stall reads as a 58% change
    order = schedule(6)
    quiet = {"length": 1, "blocks": [{"side": s, "seconds": [1.0, 1.01, 0.99, 1.0, 1.02]} for s in order]}
    stalled = {"length": 1, "blocks": [{"side": s, "seconds": [1.0, 1.01, 0.99, 1.0, 10.2 if s == "B" else 1.02]}
                                       for s in order]}
    level = 0.99
    assert verdicts.length_change(stalled, level)["ratio"] == pytest.approx(verdicts.length_change(quiet, level)["ratio"])
    assert verdicts.length_change(stalled, level, statistic="all")["ratio"] == pytest.approx((10.2 / 1.02) ** 0.2)


def test_too_few_blocks_give_no_interval_and_a_regression_needs_the_margin():
    one_pair = {"lengths": [{"length": 8, "blocks": [{"side": "A", "seconds": [1.0]}, {"side": "B", "seconds": [2.0]}]}]}
    v = verdicts.verdicts(one_pair)
    assert v["no_interval"] == [8] and v["regressions"] == [] and v["rows"][0]["ratio"] == pytest.approx(2.0)
    assert "no interval" in verdicts.line(v["rows"][0])
    order = schedule(8)
    drift = [1.0, 1.2, 0.9, 1.1, 0.95, 1.3, 0.8, 1.0]  # what the machine did, pair by pair: both sides share it
    small = {"lengths": [{"length": 8, "blocks": [
        {"side": s, "seconds": [drift[i // 2] * ((1.03 + 0.002 * (i % 3 - 1)) if s == "B" else 1.0)]}
        for i, s in enumerate(order)]}]}
    row = verdicts.verdicts(small, 0.95, margin=0.05)["rows"][0]
    assert row["verdict"] == SLOWER and not row["regression"]  # 3% slower, surely, but within a 5% margin
    assert verdicts.verdicts(small, 0.95, margin=0.01)["regressions"] == [8]


def test_alternate_refuses_builds_for_different_targets_and_empty_blocks(builds):
    a = kernels.load_kernel(builds["A"])
    other = kernels.Kernel(a.name, "cpu", a.decode, a.verify)
    with pytest.raises(ValueError, match="different targets"):
        kernel_ab.alternate(a, other, SHAPE, [64])
    with pytest.raises(ValueError, match="at least 1"):
        kernel_ab.alternate(a, a, SHAPE, [64], blocks_per_side=0)


def test_ab_kernel_command_writes_the_blocks_and_the_verdicts_and_exits_by_them(builds, tmp_path, capsys):
    out = tmp_path / "ab.json"
    lengths = ["1024", "4096"]
    argv = ["ab-kernel", "--a", str(builds["A"]), "--b", str(builds["B"]), "--lengths", *lengths, "--blocks", "16",
            "--calls", "3", "--confidence", str(CONFIDENCE), "--out", str(out)]
    assert cli.main(argv) == 1
    printed = capsys.readouterr().out.splitlines()
    doc = json.loads(out.read_text())
    assert doc["exit"] == 1 and doc["a"] == str(builds["A"]) and doc["verdicts"]["regressions"] == [4096]
    assert [e["length"] for e in doc["measured"]["lengths"]] == [1024, 4096]
    assert [b["side"] for b in doc["measured"]["lengths"][0]["blocks"]] == schedule(16)
    assert doc["measured"]["sides"]["B"]["kernel_dir"] == str(builds["B"]) and doc["measured"]["threads"] == 1
    rows = doc["verdicts"]["rows"]
    assert {r["length"]: r["regression"] for r in rows} == {1024: False, 4096: True}
    assert all({"ratio", "ci", "verdict", "regression", "detectable", "pairs"} <= set(r) for r in rows)
    assert sum(line.lstrip().startswith(("1024:", "4096:")) for line in printed) == 2
    assert "B slower beyond 5% at 4096 tokens" in printed[-1]
    # A against A: exit 0; a single block a side: no interval anywhere, exit 2
    assert cli.main(argv[:4] + [str(builds["A2"])] + argv[5:]) == 0
    assert "no regression beyond 5% at 2 lengths" in capsys.readouterr().out
    assert cli.main(argv[:4] + [str(builds["A2"]), "--lengths", "512", "--blocks", "1"]) == 2


@pytest.mark.slow
def test_two_native_builds_whose_sources_differ_load_side_by_side_and_time_differently(tmp_path):
    """Two CPU twins of one kernel name, the second with a busy loop per call: two extension modules (each named
    after the hash of its source, so neither PyInit nor sys.modules takes one for the other), the same answers,
    and the busy one much slower at every length. Compiles the busy copy (about 25 s; cached by source) with the machine
    shared under -n (tests/conftest.py: a compile times nothing; held alone, it was 55 s of the other worker waiting in
    the timeline of 2026-12-08), then holds it alone to time the two."""
    share_the_machine()
    anchor = "  int64_t splits = num_splits;\n"
    text = TWIN.read_text()
    assert text.count(anchor) == 1, "the twin's entry point changed: update the edit under test"
    busy = tmp_path / "busy" / TWIN.name
    busy.parent.mkdir()
    busy.write_text(text.replace(anchor, "  static volatile int64_t sink = 0;  // the edit under test: busy work per call\n"
                                         "  for (int64_t spin = 0; spin < 2000000; ++spin) sink = spin;\n" + anchor))
    manifests = {side: kernels.build("twin", "native", [src], tmp_path / side)
                 for side, src in (("A", str(TWIN)), ("B", str(busy)))}
    modules = {side: m["targets"]["cpu"]["module"] for side, m in manifests.items()}
    assert modules["A"] != modules["B"] and manifests["A"]["build_hash"] != manifests["B"]["build_hash"]
    a, b = kernel_ab.load_pair(tmp_path / "A", tmp_path / "B")
    assert a.name == b.name == "twin" and a.target == b.target == "cpu"
    assert sys.modules[modules["A"]] is not sys.modules[modules["B"]]
    assert kernels.load_kernel(tmp_path / "A").build_hash == manifests["A"]["build_hash"]
    with measuring():
        result = kernel_ab.alternate(a, b, SHAPE, [512, 4096], 8, 3)
    assert all(e["max_abs_difference"] < 1e-5 for e in result["lengths"])
    v = verdicts.verdicts(result, CONFIDENCE)
    assert v["regressions"] == [512, 4096] and all(r["ci"][0] > 2 for r in v["rows"]), [verdicts.line(r) for r in v["rows"]]
    assert {s["build_hash"] for s in result["sides"].values()} == {m["build_hash"] for m in manifests.values()}
