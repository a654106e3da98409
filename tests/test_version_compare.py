"""A report version against an earlier one (longctx.report.changes) and `longctx gate`, against truths the code did not
make: trials drawn from known lognormal distributions at the noise the default run showed (tests/data/
default_run_noise.json, bench/version_gate.py), Welch's interval as scipy computes it, and version records written
by hand with a known change, a known unlike setting or the very same trials."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from longctx import cli
from longctx.analysis import compare as stats_compare
from longctx.analysis import sides
from longctx.analysis.compare import detectable_change, family_level, welch_log_interval
from longctx.analysis.identity import unlike
from longctx.engines import ConfigurationSpec
from longctx.report import changes
from longctx.report.numbers import sig

from .conftest import ROOT, bench_script

sim = bench_script("version_gate")
NOISE = sim.load_noise()


def test_the_noise_file_is_the_default_runs_table():
    """The simulation's table is the default config's: its 4 configurations by 5 lengths, 3 trials each."""
    import yaml

    config = yaml.safe_load((ROOT / "config" / "longctx.yaml").read_text())
    assert sorted({r["configuration"] for r in NOISE}) == sorted(config["configurations"])
    assert sorted({r["length"] for r in NOISE}) == config["lengths"]
    assert {r["trials"] for r in NOISE} == {config["protocol"]["trials"]} and len(NOISE) == 20


def test_unchanged_code_is_called_slower_in_at_most_5_percent_of_reruns():
    """1,000 reruns of unchanged code at the default run's noise, 40 one-sided bounds a table: a false "slower"
    anywhere in at most 5% of the tables (the gate's family), a regression in fewer still; a wrong verdict either
    way (two one-sided families, "slower" and "faster", each at 5%) in at most 10%."""
    null = sim.simulate(NOISE, seeds=1000, trials=3)
    assert null["tests"] == 40 and null["level"] == pytest.approx(1 - 0.05 / 40)
    assert null["slower"] <= 0.05 and null["regression"] <= 0.05 and null["wrong"] <= 0.10, null


def test_without_the_family_correction_the_same_check_fails(monkeypatch):
    """The check above can fail: with each interval at 95% alone (no correction), unchanged code gets a wrong
    verdict somewhere in most tables of 40."""
    monkeypatch.setattr(sides, "family_level", lambda tests, confidence: confidence)
    null = sim.simulate(NOISE, seeds=200, trials=3)
    assert null["slower"] > 0.3, null


def test_a_30_percent_slowdown_is_found_or_the_report_says_it_could_not_be():
    """Every row and figure 1.3x slower at 3 trials: each is found beyond the 5% margin in at least 80% of 1,000
    reruns, or the smallest change the report says its noise and trials could show (its median over the reruns)
    is above 30%: the report never claims a sensitivity it does not have. With 5 trials nearly every row finds it."""
    slow = sim.simulate(NOISE, seeds=1000, trials=3, factor=1.3)
    for r in slow["rows"]:
        assert r["found"] >= 0.8 or r["said_median"] > 0.3, r
        # and where it says it could see 30%, it does
        assert r["said_median"] > 0.3 or r["found"] >= 0.75, r
    found = [r["found"] for r in slow["rows"]]
    assert sum(f >= 0.8 for f in found) >= 10  # the quieter rows (noise under ~1.8%) do find it
    five = sim.simulate(NOISE, seeds=300, trials=5, factor=1.3)
    assert sum(r["found"] >= 0.8 for r in five["rows"]) >= 36


@pytest.mark.parametrize("sigma, trials, tests", [(0.01, 3, 40), (0.025, 3, 10), (0.04, 5, 40), (0.025, 4, 20)])
def test_the_detectable_change_is_found_in_4_of_5_reruns(sigma, trials, tests):
    """A true slowdown of exactly detectable_change, drawn 20,000 times and judged by Welch's interval at the
    family's level (brute force, no shortcut): found beyond the margin in 80% of draws."""
    rng = np.random.default_rng(11)
    level = family_level(tests, 0.95)
    d = detectable_change(sigma, trials, trials, level, 0.05)
    before = np.exp(rng.normal(0, sigma, (20000, trials)))
    now = np.exp(rng.normal(0, sigma, (20000, trials))) * (1 + d)
    found = (welch_log_interval(now, before, level)[:, 0] > 1.05).mean()
    assert found == pytest.approx(0.8, abs=0.015), (d, found)


def test_a_rows_interval_is_scipys_welch_interval_at_the_familys_level():
    before, now = [10.0, 10.4, 9.8], [12.1, 12.9, 12.4]
    level = family_level(8, 0.95)
    c = stats_compare.change(before, now, True, level, 0.05)
    res = stats.ttest_ind(np.log(now), np.log(before), equal_var=False)
    lo, hi = res.confidence_interval(level)
    assert c["ratio"] == pytest.approx(math.exp(np.log(now).mean() - np.log(before).mean()))
    assert c["ci"] == pytest.approx([math.exp(lo), math.exp(hi)])
    # one-sided, as the gate's family takes it: each end is scipy's one-sided Welch bound at the level
    one = stats_compare.change(before, now, True, level, 0.05, one_sided=True)
    low = stats.ttest_ind(np.log(now), np.log(before), equal_var=False, alternative="greater").confidence_interval(level).low
    high = stats.ttest_ind(np.log(now), np.log(before), equal_var=False, alternative="less").confidence_interval(level).high
    assert one["ci"] == pytest.approx([math.exp(low), math.exp(high)]) and one["ci"][0] > c["ci"][0]
    # a tolerance (the machine's drift between the runs) raises the bar a regression must clear
    assert one["regression"] and one["threshold"] == pytest.approx(1.05)
    drifted = stats_compare.change(before, now, True, level, 0.05, tolerance=0.2, one_sided=True)
    assert not drifted["regression"] and drifted["verdict"] == "slower" and drifted["threshold"] == pytest.approx(1.26)
    assert drifted["detectable"] > one["detectable"]
    assert c["verdict"] == "slower" and c["regression"] and (c["trials_before"], c["trials"]) == (3, 3)
    # a rate: the same ratio now/before, slower where it is below 1 / (1 + margin)
    rate = stats_compare.change([100, 101, 99], [80, 81, 79.5], False, level, 0.05)
    assert rate["verdict"] == "slower" and rate["regression"] and rate["ci"][1] < 1 / 1.05
    within = stats_compare.change([100, 100.2, 99.9], [97.9, 98.0, 97.95], False, level, 0.05)
    assert within["verdict"] == "slower" and not within["beyond_margin"] and not within["regression"]


# Version records written by hand, as longctx.report.versions keeps them


def identity(**over) -> dict:
    base = {"engine": "reference", "engine_version": "0.1.0", "hardware": {"cpu": "Test CPU", "usable_cpus": 2, "gpus": []},
            "model": {"name": "refmla"}, "settings": {"engine": "reference", "args.page-size": 1, "model.name": "refmla",
                                                      "env": ["API_KEY"]},
            "settings_scheme": 2, "engine_build": {"version": "0.1.0", "source": "aaaa"}, "kernel": {"name": "k", "build_hash": "b1", "sources": {"kernels/k.py": "1111"}},
            "spec_hash": "s1"}
    return {**base, **over}


def version(n: int, trials: dict, identities: dict, run: str | None = None, against: str = "previous",
            margin: float = 0.05) -> dict:
    """trials: {(configuration, length): [(ttft_s, decode_tok_s), ...]}."""
    rows = [{"configuration": c, "length": length, "trial": i, "run_id": run or f"run-v{n}-{c}", "ttft_s": t,
             "tpot_s": 1 / d, "decode_tok_s": d} for (c, length), ts in trials.items() for i, (t, d) in enumerate(ts)]
    return {"n": n, "hash": f"{n:012x}", "name": f"longctx-v{n}-{n:012x}", "measured_at": "2026-12-05 00:00 UTC",
            "previous": {"n": n - 1, "hash": f"{n - 1:012x}"} if n > 1 else None,
            "entry": {"n": n, "hash": f"{n:012x}", "commit": "c" * 40},
            "measurements": {"configurations": identities, "trials": rows},
            "compare": {"against": against, "margin": margin, "confidence": 0.95}}


STEADY = [(0.100, 500.0), (0.102, 495.0), (0.099, 503.0)]


def slowed(ts, ttft=1.0, decode=1.0):
    return [(t * ttft, d / decode) for t, d in ts]


def test_unlike_configurations_are_not_compared_and_say_why():
    ids = {"a": identity(), "b": identity(), "c": identity(), "d": identity(), "e": identity()}
    before = version(1, {(c, 1024): STEADY for c in ids}, ids)
    now_ids = {"a": identity(engine_version="0.2.0"), "b": identity(settings={**identity()["settings"], "args.page-size": 64}),
               "c": identity(hardware={"cpu": "Other CPU", "usable_cpus": 2, "gpus": []}),
               "d": identity(settings={**identity()["settings"], "model.name": "llama"}),
               "e": identity(kernel={"name": "k", "build_hash": "b2", "sources": {"kernels/k.py": "2222"}})}
    now = version(2, {(c, 1024): slowed(STEADY, 1.01, 1.01) for c in ids}, now_ids)
    cmp = changes.compare(before, now)
    why = {u["configuration"]: u["why"] for u in cmp["unlike"]}
    assert why["a"] == "the engine's version differs (0.1.0 then 0.2.0)"
    assert why["b"] == "its settings differ (args.page-size: 1 then 64)"
    assert why["c"].startswith("the hardware differs (cpu: \"Test CPU\" then \"Other CPU\"")
    assert why["d"].startswith("the model differs (model.name")
    assert "e" not in why  # a kernel change is what is compared
    assert [r["configuration"] for r in cmp["rows"]] == ["e"] and cmp["tests"] == 2
    assert cmp["kernels"] == [{"configuration": "e", "kernel": "k", "before": "k", "files": ["kernels/k.py"]}]
    # the engine's code, where both versions recorded it
    code = unlike(identity(), identity(engine_build={"version": "0.1.0", "source": "bbbb"}))
    assert code == "the engine's code differs (source: aaaa then bbbb)"
    assert unlike(identity(), identity(engine_build=None)) is None  # a version from before builds were recorded
    # the environment's variable names are part of it, never their values (a rotated token changes nothing)
    env = unlike(identity(), identity(settings={**identity()["settings"], "env": ["API_KEY", "HF_TOKEN"]}))
    assert env == 'its settings differ (env: ["API_KEY"] then ["API_KEY", "HF_TOKEN"])'


def test_reused_measurements_say_so_instead_of_a_ratio_of_1():
    """A configuration the edit did not touch keeps the very same trials: 'same measurements', no interval, and it is
    not part of the family (the table of the configuration remeasured is corrected for its own rows only)."""
    ids = {"touched": identity(), "kept": identity()}
    trials = {("touched", 1024): STEADY, ("touched", 4096): STEADY, ("kept", 1024): STEADY, ("kept", 4096): STEADY}
    before = version(1, trials, ids, run="r1")
    after = {**trials, ("touched", 1024): slowed(STEADY, 1.0, 1.5), ("touched", 4096): slowed(STEADY, 1.0, 1.5)}
    now = version(2, after, ids, run="r1")
    for t in now["measurements"]["trials"]:
        if t["configuration"] == "touched":
            t["run_id"] = "r2"
    cmp = changes.compare(before, now)
    kept = [r for r in cmp["rows"] if r["configuration"] == "kept"]
    assert all(r["status"] == changes.SAME_MEASUREMENTS and r["ttft"] is None for r in kept)
    assert cmp["same"] == ["kept"] and cmp["tests"] == 4 and cmp["level"] == pytest.approx(1 - 0.05 / 4)
    assert [(g["configuration"], g["length"], g["figure"]) for g in cmp["regressions"]] == [("touched", 1024, "decode"),
                                                                                             ("touched", 4096, "decode")]


def test_the_kernel_sentence_says_the_effect_where_it_is_measurable():
    ids_b = {"twin": identity()}
    ids_n = {"twin": identity(kernel={"name": "k", "build_hash": "b2", "sources": {"kernels/k.py": "2222"}})}
    lengths = (1024, 16384)
    before = version(1, {("twin", L): STEADY for L in lengths}, ids_b)
    faster = version(2, {("twin", 1024): STEADY, ("twin", 16384): slowed(STEADY, 1.0, 1 / 1.8)}, ids_n)
    s = changes.compare(before, faster)["sentence"]
    assert s == ("The change to kernel k since v1 (measured in another run) made decode in twin 1.8x [1.76, 1.84] faster "
                 "at 16,384 tokens, n=3/3; no length got slower."), s
    slower = version(2, {("twin", 1024): slowed(STEADY, 1.0, 1.02), ("twin", 16384): slowed(STEADY, 1.0, 2.0)}, ids_n)
    s = changes.compare(before, slower)["sentence"]
    assert s.startswith("The change to kernel k since v1 (measured in another run) made decode in twin 2x [") and \
        s.endswith("slower at 16,384 tokens, n=3/3; slower beyond the 5% margin: decode in twin at 16,384 tokens."), s
    same = version(2, {("twin", L): slowed(STEADY[::-1]) for L in lengths}, ids_n)
    s = changes.compare(before, same)["sentence"]
    assert s.startswith("The change to kernel k since v1 (measured in another run) made no measurable change in twin at any "
                        "length (a change under "), s
    untouched = changes.compare(before, version(2, {("twin", L): STEADY for L in lengths}, ids_b))
    assert untouched["sentence"] is None and not untouched["kernels"]


def write_versions(vdir: Path, records: list[dict]) -> None:
    vdir.mkdir(parents=True, exist_ok=True)
    for r in records:
        (vdir / f"{r['name']}.json").write_text(json.dumps(r))
    (vdir / "log.json").write_text(json.dumps({"versions": [{"n": r["n"], "hash": r["hash"]} for r in records]}))


def longctx(cwd, *args):
    """`longctx <args>` run in cwd (in this process: the CLI's main, as the console script calls it)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_the_gate_exits_1_per_regression_0_without_and_2_with_nothing_to_compare(tmp_path):
    ids = {"page1": identity()}
    lengths = (1024, 4096, 16384)
    v1 = version(1, {("page1", L): STEADY for L in lengths}, ids)
    v2 = version(2, {("page1", 1024): STEADY[::-1], ("page1", 4096): slowed(STEADY, 1.0, 1.25),
                     ("page1", 16384): slowed(STEADY, 1.0, 1.6)}, ids)
    v3 = version(3, {("page1", L): slowed(STEADY[1:] + STEADY[:1]) for L in lengths}, ids, against="v1")
    report = tmp_path / "report"
    write_versions(report / "versions", [v1, v2, v3])
    (report / "version.json").write_text(json.dumps(v2))
    code, out, err = longctx(tmp_path, "gate")
    assert code == 1, out + err
    # the bounds as scipy gives Welch's, on the logs, one-sided at the family's level: 3 rows of 2 figures, 6 bounds
    level = 1 - 0.05 / 6
    expected = []
    for L, factor in ((4096, 1.25), (16384, 1.6)):
        b, n = np.log([d for _, d in STEADY]), np.log([d for _, d in slowed(STEADY, 1.0, factor)])
        lo = np.exp(stats.ttest_ind(n, b, equal_var=False, alternative="greater").confidence_interval(level).low)
        hi = np.exp(stats.ttest_ind(n, b, equal_var=False, alternative="less").confidence_interval(level).high)
        expected.append(f"page1 at {L:,} tokens: decode now/before {sig(1 / factor, 3)} [{sig(lo, 3)}, {sig(hi, 3)}], n=3/3, "
                        "slower beyond the 5% margin against v1")
    assert out.splitlines() == expected, out
    code, out, _ = longctx(tmp_path, "gate", "--json")
    answer = json.loads(out)
    assert code == 1 and answer["against"] == "v1" and answer["compared"] == 3
    assert [(g["configuration"], g["length"], g["figure"], g["n_before"], g["n_now"]) for g in answer["regressions"]] == \
        [("page1", 4096, "decode", 3, 3), ("page1", 16384, "decode", 3, 3)]
    assert set(answer["regressions"][0]) == {"configuration", "length", "figure", "ratio", "low", "high", "n_before", "n_now",
                                             "threshold", "unit"}
    assert answer["lost"] == [] and answer["not_compared"] == [] and len(answer["rows"]) == 3
    assert all(r["decode"]["detectable"] > 0 for r in answer["rows"])  # each row's detectable change
    g = answer["regressions"][1]
    assert g["low"] < g["ratio"] < g["high"] < 1 / 1.05
    # a wider margin: 4,096 (25% slower, its interval reaching above 1 / 1.25) is no longer beyond it; 16,384 is
    code, out, _ = longctx(tmp_path, "gate", "--margin", "0.25")
    assert code == 1 and "4,096" not in out and "16,384" in out
    # v3 (pinned against v1 by its record) is the same code again: no regression, exit 0
    (report / "version.json").write_text(json.dumps(v3))
    code, out, _ = longctx(tmp_path, "gate")
    assert code == 0 and out.startswith("no regression beyond the 5% margin against v1: 3 configuration and lengths"), out
    code, out, _ = longctx(tmp_path, "gate", "--against", "v2")  # against v2, v3 got faster again
    assert code == 0, out
    # nothing to compare: the first version, a version never built, no version record at all
    (report / "version.json").write_text(json.dumps(v1))
    assert longctx(tmp_path, "gate")[:2] == (2, "nothing to compare: v1 is the first version: nothing to compare with\n")
    code, out, _ = longctx(tmp_path, "gate", "--against", "v7")
    assert code == 2 and out.startswith("nothing to compare: there is no v7 in ") and "(kept: v1, v2, v3)" in out
    code, out, _ = longctx(tmp_path, "gate", "--against", "seven")
    assert code == 2 and "is not a version" in out
    code, out, _ = longctx(tmp_path / "report", "gate", "--json")
    assert code == 2 and "error" in json.loads(out)


def test_the_gate_says_when_nothing_was_measured_again_and_when_nothing_is_like(tmp_path):
    ids = {"page1": identity()}
    v1 = version(1, {("page1", 1024): STEADY}, ids, run="r1")
    same = version(2, {("page1", 1024): STEADY}, ids, run="r1")
    unlike = version(3, {("page1", 1024): STEADY}, {"page1": identity(engine_version="0.2.0")}, against="v1")
    write_versions(tmp_path / "report" / "versions", [v1, same, unlike])
    (tmp_path / "report" / "version.json").write_text(json.dumps(same))
    code, out, _ = longctx(tmp_path, "gate")
    assert code == 0 and "same measurements as v1" in out, out
    (tmp_path / "report" / "version.json").write_text(json.dumps(unlike))
    code, out, _ = longctx(tmp_path, "gate")
    assert code == 2 and out.strip() == "nothing to compare with v1: page1: the engine's version differs (0.1.0 then 0.2.0)"
    # no length in common; too few trials for an interval on both sides
    elsewhere = version(4, {("page1", 2048): STEADY}, ids, against="v1")
    v5 = version(5, {("page1", 1024): STEADY[:2]}, ids)
    two = version(6, {("page1", 1024): STEADY[1:]}, ids, against="v5")
    write_versions(tmp_path / "report" / "versions", [v1, same, unlike, elsewhere, v5, two])
    for record, said in ((elsewhere, "no configuration and length was measured by both v1 and v4"),
                         (two, "fewer than 3 successful trials a side wherever both measured")):
        (tmp_path / "report" / "version.json").write_text(json.dumps(record))
        code, out, _ = longctx(tmp_path, "gate")
        assert (code, out.strip()) == (2, f"nothing to compare with v{record['compare']['against'][1:]}: {said}"), out


def test_compare_any_two_kept_versions(tmp_path):
    ids = {"page1": identity()}
    v1 = version(1, {("page1", 1024): STEADY}, ids)
    v2 = version(2, {("page1", 1024): slowed(STEADY, 2.0, 1.0)}, ids)
    write_versions(tmp_path / "report" / "versions", [v1, v2])
    code, out, _ = longctx(tmp_path, "compare", "v1", "v2")
    assert code == 0 and "page1    1,024  n=3/3  TTFT 2 [" in out and "slower, beyond the margin" in out, out
    code, out, _ = longctx(tmp_path, "compare", "v2", "v1", "--json")
    cmp = json.loads(out)
    assert code == 0 and cmp["rows"][0]["ttft"]["ratio"] == pytest.approx(0.5) and cmp["rows"][0]["ttft"]["verdict"] == "faster"
    assert longctx(tmp_path, "compare", "v1", "v9")[0] == 2
    # a version kept before versions kept their trials: said, not a crash
    old = {k: v for k, v in v1.items() if k != "measurements"}
    write_versions(tmp_path / "old" / "versions", [old, v2])
    code, out, _ = longctx(tmp_path, "compare", "v1", "v2", "--versions", "old/versions")
    assert code == 2 and "kept only its medians" in out


def test_a_length_lost_since_the_baseline_fails_the_gate_and_says_why(tmp_path):
    """A length with trials enough before and none (or too few for an interval) now is the worst regression: exit 1,
    with the reason the version kept for it, not a pass because nothing was compared there."""
    ids = {"page1": identity()}
    v1 = version(1, {("page1", 1024): STEADY, ("page1", 4096): STEADY, ("page1", 16384): STEADY}, ids)
    v2 = version(2, {("page1", 1024): STEADY[::-1], ("page1", 4096): STEADY[:2]}, ids)
    v2["measurements"]["lengths"] = [
        {"configuration": "page1", "length": 1024, "ok": 3, "tried": 3, "why": None},
        {"configuration": "page1", "length": 4096, "ok": 2, "tried": 3, "why": "timed out after 60 s"},
        {"configuration": "page1", "length": 16384, "ok": 0, "tried": 4,
         "why": "the server died while measuring length 16384 (exit code -9); server log: data/logs/server/page1.log"}]
    write_versions(tmp_path / "report" / "versions", [v1, v2])
    (tmp_path / "report" / "version.json").write_text(json.dumps(v2))
    code, out, _ = longctx(tmp_path, "gate")
    assert code == 1, out
    assert out.splitlines() == [
        "page1 at 4,096 tokens: TTFT and decode lost since v1 (3 then 2 successful trials): timed out after 60 s",
        "page1 at 16,384 tokens: TTFT and decode lost since v1 (3 then 0 successful trials): the server died while "
        "measuring length "
        "16384 (exit code -9); server log: data/logs/server/page1.log"], out
    code, out, _ = longctx(tmp_path, "gate", "--json")
    lost = json.loads(out)["lost"]
    assert code == 1 and [(x["length"], x["n_now"]) for x in lost] == [(4096, 2), (16384, 0)]
    # a length the new version no longer measures (not in its lengths) is not lost
    v3 = version(3, {("page1", 1024): STEADY[::-1]}, ids, against="v1")
    v3["measurements"]["lengths"] = [{"configuration": "page1", "length": 1024, "ok": 3, "tried": 3, "why": None}]
    write_versions(tmp_path / "report" / "versions", [v1, v2, v3])
    (tmp_path / "report" / "version.json").write_text(json.dumps(v3))
    code, out, _ = longctx(tmp_path, "gate")
    assert code == 0 and out.startswith("no regression beyond the 5% margin against v1: 1 configuration and length"), out


def test_previous_is_the_version_before_the_measurements_changed(tmp_path):
    """A rebuild after a regressed version (a template edit: a new version, the same trials) is compared with the
    version before the regression, not with the regressed one (which would pass)."""
    ids = {"page1": identity()}
    v1 = version(1, {("page1", 4096): STEADY}, ids)
    v2 = version(2, {("page1", 4096): slowed(STEADY, 1.0, 1.6)}, ids)
    v3 = version(3, {("page1", 4096): slowed(STEADY, 1.0, 1.6)}, ids, run="run-v2-page1")
    for t in v2["measurements"]["trials"]:
        t["run_id"] = "run-v2-page1"
    write_versions(tmp_path / "report" / "versions", [v1, v2, v3])
    (tmp_path / "report" / "version.json").write_text(json.dumps(v3))
    code, out, _ = longctx(tmp_path, "gate")
    assert code == 1 and out.startswith("page1 at 4,096 tokens: decode now/before 0.625 [") and "against v1" in out, out


def test_the_pass_line_says_what_could_go_unseen(tmp_path):
    ids = {"page1": identity()}
    v1 = version(1, {("page1", L): STEADY for L in (1024, 4096)}, ids)
    v2 = version(2, {("page1", L): STEADY[::-1] for L in (1024, 4096)}, ids)
    write_versions(tmp_path / "report" / "versions", [v1, v2])
    (tmp_path / "report" / "version.json").write_text(json.dumps(v2))
    code, out, _ = longctx(tmp_path, "gate")
    cmp = changes.compare(v1, v2)
    worst = max(cmp["detectable"], key=lambda d: d["worst"])
    assert code == 0 and out.strip() == (
        "no regression beyond the 5% margin against v1: 2 configuration and lengths compared (4 one-sided bounds, "
        f"bonferroni over the table); a slowdown under {worst['worst'] * 100:.0f}% at page1 {worst['length']:,} tokens "
        f"({'TTFT' if worst['figure'] == 'ttft' else 'decode'}) could go unseen; the machine's drift between the runs was "
        "not measured for page1"), out  # these versions kept no metronome


SECRET = "sk-rotate-7f3e91c2-secret"


def test_a_configurations_settings_hold_no_secret_and_a_rotated_token_changes_nothing():
    """The settings a version keeps and hashes (its identity) hold no secret: env values, URL credentials and a
    secret flag's word are not in them, so a rotated token leaves the configuration like with like."""
    def spec(token: str, **over) -> ConfigurationSpec:
        base = dict(name="x", engine="vllm", lengths=[1024], protocol={"output_tokens": 8}, server={}, telemetry={},
                    model={"name": "m"}, args={"max-model-len": 8192}, env={"HF_TOKEN": token, "OMP_NUM_THREADS": "2"},
                    command=["vllm", "serve", "--api-key", token], url=f"http://user:{token}@host:8000/v1?api_key={token}",
                    extra_args=[f"--hf-token={token}"])
        return ConfigurationSpec(**{**base, **over})

    one, two = spec(SECRET).settings(), spec("sk-another-token-0000").settings()
    assert SECRET not in json.dumps(one) and "sk-another" not in json.dumps(two)
    assert one == two and one["shown"]["env"] == ["HF_TOKEN", "OMP_NUM_THREADS"]
    assert spec(SECRET, args={"max-model-len": 4096}).settings()["hash"] != one["hash"]
    ident = {**identity(), "settings": one["shown"]}
    assert unlike(ident, {**identity(), "settings": two["shown"]}) is None


def test_a_configuration_that_cannot_be_compared_is_always_listed(tmp_path):
    """One configuration like with like and one whose engine code changed: the gate passes on the first and lists the
    second with why; with the second alone it exits 2."""
    ids = {"same": identity(), "moved": identity()}
    v1 = version(1, {(c, 1024): STEADY for c in ids}, ids)
    v2 = version(2, {(c, 1024): STEADY[::-1] for c in ids},
                 {"same": identity(), "moved": identity(engine_build={"version": "0.1.0", "source": "bbbb"})})
    write_versions(tmp_path / "report" / "versions", [v1, v2])
    (tmp_path / "report" / "version.json").write_text(json.dumps(v2))
    code, out, _ = longctx(tmp_path, "gate")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("no regression beyond the 5% margin against v1: 1 configuration and length"), out
    assert lines[1:] == ["not compared: moved: the engine's code differs (source: aaaa then bbbb)"], out
    code, out, _ = longctx(tmp_path, "gate", "--json")
    assert json.loads(out)["not_compared"] == [{"configuration": "moved", "why": "the engine's code differs (source: aaaa then bbbb)"}]
