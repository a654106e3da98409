"""The history over every kept version and its change points (longctx.analysis.history, longctx.report.history),
against truths the code did not make: version histories drawn from known lognormal distributions, with a step of known
size at a known version, a staircase of small steps, or none; version records written by hand with a known unlike
engine, a missing record and reused trials."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from longctx.analysis import history as analysis
from longctx.report import context as ctxmod, history as historyview, latex, markdown, versions
from longctx.report.figures.history import plot_history

from .conftest import ROOT
from .report_data import config, inputs, write_data

TEMPLATES = ROOT / "templates"


def trials(rng, name: str, length: int, ttft: float, tpot: float, sigma: float, n: int = 3, run: str = "r") -> list[dict]:
    """n successful trials as a version keeps them (versions.measurements), lognormal around ttft and tpot."""
    t, p = rng.lognormal(math.log(ttft), sigma, n), rng.lognormal(math.log(tpot), sigma, n)
    return [{"configuration": name, "length": length, "trial": i, "run_id": run, "ttft_s": float(a), "tpot_s": float(b),
             "decode_tok_s": float(1 / b)} for i, (a, b) in enumerate(zip(t, p))]


def history(seed: int, versions_n: int = 12, step_at: int | None = 7, step: float = 1.2, sigma: float = 0.02,
            name: str = "page64") -> dict:
    """{(name, length): [(version, trials)]}: at 4,096 tokens TTFT and time per token `step` times higher from
    version step_at on (decode rate 1/step); at 1,024 tokens no step. Per-trial noise sigma (log-sd)."""
    rng = np.random.default_rng(seed)
    out: dict = {(name, 4096): [], (name, 1024): []}
    for v in range(1, versions_n + 1):
        m = step if step_at and v >= step_at else 1.0
        out[(name, 4096)].append((v, trials(rng, name, 4096, 0.4 * m, 0.02 * m, sigma, run=f"run{v}")))
        out[(name, 1024)].append((v, trials(rng, name, 1024, 0.1, 0.015, sigma, run=f"run{v}")))
    return out


def found(result: dict, loosen: float = 1.0) -> dict:
    """{(length, figure): [versions of its steps]} at the result's level times loosen."""
    return {(s["length"], s["figure"]): [st["version"] for st in (
        s["steps"] if loosen == 1.0 else analysis.steps(s["points"], result["level"] * loosen, s["smaller_is_faster"]))]
        for s in result["series"]}


# At these seeds every answer below holds even at ten times the level, so none rests on a p-value near the threshold
# (about one seed in four has a flat series that a level ten times looser calls a step: how often the level itself
# does is test_a_report_of_flat_series_says_a_step_in_at_most_5_percent_of_builds's).
SEEDS = range(19, 30)


@pytest.mark.parametrize("seed", SEEDS)
def test_an_injected_step_is_found_at_its_version_with_its_size(seed):
    """12 versions, a 20% step at v7 (TTFT up, decode rate down) in lognormal trials of 2% noise: Otava finds it at v7,
    1.2x slower within its noise, in both figures, and nothing in the length that did not step."""
    result = analysis.analyse(history(seed))
    assert result["level"] == pytest.approx(0.05 / (4 * 66))  # 4 series of 12 points, 66 (split, end) pairs each
    want = {(4096, "ttft"): [7], (4096, "decode"): [7], (1024, "ttft"): [], (1024, "decode"): []}
    assert found(result) == want and found(result, loosen=10) == want
    for s in result["series"]:
        for st in s["steps"]:
            # the geometric means of 6 versions of 3 trials a side: 2% / sqrt(18) each, so within 3% of 1.2
            assert st["slower"] and st["factor"] == pytest.approx(1.2, abs=0.03)
            assert (st["after"], st["points_before"], st["points_after"]) == (6, 6, 6)
            assert st["pvalue"] < result["level"] / 100
    decode = next(s for s in result["series"] if (s["length"], s["figure"]) == (4096, "decode"))
    assert decode["steps"][0]["ratio"] == pytest.approx(1 / 1.2, abs=0.03)  # the rate fell: a ratio below 1 is slower


@pytest.mark.parametrize("seed", SEEDS)
def test_a_flat_history_has_no_step(seed):
    """The same noise without the step: no step in any series, at the level or at ten times it."""
    result = analysis.analyse(history(seed, step_at=None))
    assert all(s["analysed"] for s in result["series"])
    assert set(map(tuple, found(result).values())) == {()} and set(map(tuple, found(result, loosen=10).values())) == {()}


def test_a_report_of_flat_series_says_a_step_in_at_most_5_percent_of_builds():
    """The level is Bonferroni over every (split, end) pair in every series: 300 builds of 10 flat series (5 lengths,
    2 figures) at the fewest versions analysed, where the t-test's selection of the best split counts most, say a
    step in at most 5% of builds (here 3%). Otava's default, p 0.001 per series, says one in 9% of them."""
    def flat(seed):
        rng = np.random.default_rng(seed)
        return {("c", L): [(v, trials(rng, "c", L, 1e-4 * L, 0.01, 0.05, run=f"r{v}")) for v in range(1, analysis.MIN_POINTS + 1)]
                for L in (512, 1024, 2048, 4096, 8192)}

    builds = [analysis.analyse(flat(seed)) for seed in range(300)]
    said = sum(any(s["steps"] for s in b["series"]) for b in builds)
    assert 0 < said <= 0.05 * len(builds)
    # Otava's own default level over the same series, for contrast: it is the family that keeps the rate down
    default = sum(any(analysis.steps(s["points"], 0.001, s["smaller_is_faster"]) for s in b["series"]) for b in builds)
    assert default > 2 * said


@pytest.mark.parametrize("seed", range(5))
def test_slow_drift_over_small_steps_is_seen_step_by_step_and_in_all(seed):
    """A staircase of 8% steps every 4 versions over 16 (each under a gate's margin of 10%): three steps, each at the
    version it came in, and 1.08 cubed (1.26x) slower in all."""
    rng = np.random.default_rng(seed)
    h = {("page64", 16384): [(v, trials(rng, "page64", 16384, 2.0 * 1.08 ** ((v - 1) // 4), 0.05 * 1.08 ** ((v - 1) // 4), 0.01))
                             for v in range(1, 17)]}
    for s in analysis.analyse(h)["series"]:
        assert [st["version"] for st in s["steps"]] == [5, 9, 13]
        assert all(st["slower"] and st["factor"] == pytest.approx(1.08, abs=0.02) for st in s["steps"])
        assert s["overall"]["factor"] == pytest.approx(1.08 ** 3, abs=0.03) and (s["overall"]["from"], s["overall"]["to"]) == (1, 16)


def test_fewer_versions_than_the_minimum_are_not_analysed_and_reused_trials_count_once():
    """A version that reused an earlier one's trials adds no point: 12 versions of which v8 to v12 kept v7's trials are
    7 points; at MIN_POINTS - 1 versions nothing is analysed, however large the step."""
    h = history(19)
    reused = {k: [(v, t if v <= 7 else dict(vs)[7]) for v, t in vs] for k, vs in h.items()}
    result = analysis.analyse(reused)
    assert {len(s["points"]) for s in result["series"]} == {7}
    assert [p["version"] for p in result["series"][0]["points"]] == [1, 2, 3, 4, 5, 6, 7]
    few = analysis.analyse(history(19, versions_n=analysis.MIN_POINTS - 1, step_at=3, step=3.0))
    assert few["level"] is None and not any(s["analysed"] or s["steps"] for s in few["series"])


# --- version records on disk: like with like, records that cannot be read, the section ---------------------------

IDENTITY = {"engine": "reference", "engine_version": "0.1.0", "hardware": {"cpu": "Test CPU", "usable_cpus": 2, "gpus": []},
            "model": "refmla", "settings": {"args.page-size": 64}, "settings_hash": "h64",
            "kernel": {"name": "paged_mla_decode_torch", "build_hash": "b", "sources": {"k.py": "1"}}, "spec_hash": "s"}


def write_history(vdir, h: dict, identities: dict | None = None, drop: tuple = ()) -> dict:
    """Each version of h as a kept record under vdir (identities: {version: identity} where not IDENTITY; drop: versions
    whose record is not written); returns the last version's record, as render makes it (its history the log's
    entries before it)."""
    vdir.mkdir(parents=True, exist_ok=True)
    by_version: dict[int, list[dict]] = {}
    for _, vs in sorted(h.items()):
        for v, ts in vs:
            by_version.setdefault(v, []).extend(ts)
    entries, record = [], None
    for v in sorted(by_version):
        ident = (identities or {}).get(v, IDENTITY)
        names = sorted({t["configuration"] for t in by_version[v]})
        record = {"n": v, "hash": f"{v:012x}", "name": f"longctx-v{v}-{v:012x}", "history": list(entries),
                  "measurements": {"configurations": {n: ident for n in names}, "trials": by_version[v]},
                  "compare": {"confidence": 0.95}}
        if v not in drop:
            versions.record_path(vdir, record).write_text(json.dumps(record))
        entries.append({"n": v, "hash": record["hash"]})
    return record


def test_only_versions_like_with_like_join_the_history_and_what_is_left_out_is_said(tmp_path):
    """v2 ran another engine version (left out, with the reason as the gate words it), v3's record is gone and v4 kept
    only its medians (not read, each with why); the kernel differs in v5, which still counts."""
    vdir = tmp_path / "versions"
    other_engine = {**IDENTITY, "engine_version": "0.2.0"}
    new_kernel = {**IDENTITY, "kernel": {**IDENTITY["kernel"], "sources": {"k.py": "2"}}}
    current = write_history(vdir, history(19), {2: other_engine, 5: new_kernel}, drop=(3,))
    rec4 = versions.record_path(vdir, {"n": 4, "hash": f"{4:012x}"})
    rec4.write_text(json.dumps({k: v for k, v in json.loads(rec4.read_text()).items() if k != "measurements"}))
    got = historyview.collect(vdir, current)
    assert [v for v, _ in got["histories"][("page64", 4096)]] == [1, 5, 6, 7, 8, 9, 10, 11, 12]
    assert got["left_out"] == [{"configuration": "page64", "versions": [2],
                                "why": "the engine's version differs (0.2.0 then 0.1.0)"}]
    assert [u["version"] for u in got["unread"]] == [3, 4]
    assert "cannot be read" in got["unread"][0]["why"] and "kept only its medians" in got["unread"][1]["why"]
    assert got["versions"] == list(range(1, 13))


def render_section(view: dict) -> tuple[str, str]:
    """The history section alone, as the PDF's .tex and the Markdown twin write it (dialects unescaped for reading)."""
    sections, partials = TEMPLATES / "sections", TEMPLATES / "markdown"
    tex = ctxmod.render_text(sections / "history.tex.j2", {"history": view}, latex.environment(sections))
    md = ctxmod.render_text(partials / "history.md.j2", {"history": view, "figures": "figures"}, markdown.environment(partials))
    return tuple(" ".join(re.sub(r"\\(.)", r"\1", text).split()) for text in (tex, md))


def test_the_section_says_each_step_with_its_version_and_size(tmp_path):
    """12 versions with a 20% step at v7: a sentence per step in the PDF's section and the twin's (configuration,
    length, figure, version, size), the figure included, the level and the versions looked at."""
    current = write_history(tmp_path / "versions", history(19))
    view = historyview.view(tmp_path / "versions", current)
    assert view["drawn"] and not view["too_few"] and (view["first"], view["version"], view["analysed_count"]) == (1, 12, 4)
    sentences = [s["sentence"] for s in view["steps"]]
    assert len(sentences) == 2 and all(re.fullmatch(r"(TTFT|Decode) in page64 at 4,096 tokens stepped 1\.[12]\dx slower at v7 "
                                                    r"\(6 versions before it, 6 since\)", s) for s in sentences)
    for text in render_section(view):
        assert all(s in text for s in sentences)
        assert "over v1 to v12" in text and "at most 5% of builds" in text and "history." in text


def test_the_section_says_when_there_are_too_few_versions_or_no_step(tmp_path):
    few = historyview.view(tmp_path / "few", write_history(tmp_path / "few", history(19, versions_n=3)))
    assert few["too_few"] and not few["drawn"]
    for text in render_section(few):
        assert (f"needs at least {analysis.MIN_POINTS} versions that measured it anew, like with like, and the most any "
                "has is 3 (TTFT in page64 at 1,024 tokens: v1, v2 and v3)") in text
        assert "history.p" not in text  # no figure
    flat = historyview.view(tmp_path / "flat", write_history(tmp_path / "flat", history(19, step_at=None)))
    for text in render_section(flat):
        assert "No step in any of the 4 series over 12 versions." in text


def test_a_step_seen_in_the_newest_version_alone_says_so(tmp_path):
    """A step in the last version only cannot be told from one slow run: the sentence says a later measurement
    will tell."""
    current = write_history(tmp_path / "v", history(19, step_at=12, step=1.5))
    steps = historyview.view(tmp_path / "v", current)["steps"]
    assert steps and all(s["version"] == 12 and "seen in that version alone" in s["sentence"] for s in steps)


def test_the_figure_is_the_same_bytes_twice_and_says_when_there_is_nothing_to_draw(tmp_path):
    current = write_history(tmp_path / "versions", history(19))
    historyview.write(tmp_path / "history.json", historyview.view(tmp_path / "versions", current))
    style = TEMPLATES / "plot.mplstyle"
    a = plot_history(tmp_path / "history.json", style, tmp_path / "a")
    b = plot_history(tmp_path / "history.json", style, tmp_path / "b")
    assert [p.name for p in a] == ["history.pdf", "history.png"]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    few = historyview.view(tmp_path / "few", write_history(tmp_path / "few", history(19, versions_n=2)))
    historyview.write(tmp_path / "few.json", few)
    assert all(p.stat().st_size for p in plot_history(tmp_path / "few.json", style, tmp_path / "c"))


def test_a_versions_history_is_the_versions_up_to_it_and_the_same_on_a_rebuild(tmp_path):
    """Through the report's own version records: v1 to v3 from three data sets, then v2's data again is v2, and its
    history is v1 and v2 (not v3), as when it was first built, and the history is the same bytes."""
    vdir = tmp_path / "versions"
    data = [write_data(tmp_path / f"d{i}", seed=i, scale=1 + 0.1 * i, settings={"bootstrap": 0}) for i in range(3)]

    def build(paths):
        report_inputs = inputs(paths, config=config())
        ctx = ctxmod.context(report_inputs, template_dir=TEMPLATES)
        record = ctxmod.version_of(ctx, report_inputs, TEMPLATES, vdir)
        full = ctxmod.with_version(ctx, record, vdir)
        (tmp_path / "fake.pdf").write_bytes(record["hash"].encode())
        versions.register(vdir, record, tmp_path / "fake.pdf")
        return record, full["history"]

    built = [build(d) for d in data]
    assert [r["n"] for r, _ in built] == [1, 2, 3] and built[2][1]["versions"] == [1, 2, 3]
    again, h = build(data[1])
    assert again["n"] == 2 and h["versions"] == [1, 2] and json.dumps(h, sort_keys=True) == json.dumps(built[1][1], sort_keys=True)
    assert h["too_few"] and h["most"]["points"] == 2 and h["series_count"] == 2 * 4 * 2  # 2 configurations, 4 lengths, 2 figures


def test_otava_is_pinned_alike_for_make_and_conda_and_imports_without_its_dependencies():
    pins = [line for line in (ROOT / "envs" / "otava.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert pins == ["apache-otava==0.8.0"] and f'"{pins[0]}"' in (ROOT / "envs" / "longctx.post-deploy.sh").read_text()
    # in a fresh interpreter: the analysis runs and loads none of the clients the package would pull
    code = ("import sys; from longctx.analysis import history as h; "
            "print(h.steps([{'version': v, 'value': 1.0 + (v > 6) + 0.01 * (v % 2)} for v in range(1, 13)], 0.001, True)[0]['version']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'google', 'slack_sdk', 'pg8000', 'dateparser', 'pystache', "
            "'ruamel', 'configargparse', 'requests', 'tabulate', 'validators'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.split("\n")
    assert out[:2] == ["7", "[]"]


def test_without_otava_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "otava.analysis", None)  # import otava.analysis now raises ImportError
    with pytest.raises(analysis.OtavaMissing, match=r"make setup.*pip install --no-deps -r envs/otava\.txt"):
        analysis.analyse(history(19))
