"""The drafter question (longctx.analysis.drafting, longctx.report.drafting): which configuration is the drafting
one's twin, the family's intervals cover together what they say (simulated at the trial counts and noise in use),
verdicts follow intervals, where the drafter stops paying, and page one's sentence for each outcome."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from longctx.analysis.compare import family_level, welch_log_interval
from longctx.analysis.drafting import drafting, stops_paying, twin
from longctx.report.drafting import view


def entry(engine="reference", kernel="k", version="0.1", text=None, **args) -> dict:
    shown = {"engine": engine, "model.name": "m", "protocol.output_tokens": 32, **{f"args.{k}": v for k, v in args.items()}}
    return {"engine": engine, "engine_version": version, "kernel": {"name": kernel}, "settings": {"shown": shown},
            "model": {"name": "m"}, "prompt_probe": {"text_source": text}}


NGRAM = {"speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": 4}


def test_the_twin_has_the_same_settings_but_the_drafting_flags_kernel_and_version():
    entries = {"page64": entry(**{"page-size": 64}), "page1": entry(**{"page-size": 1}),
               "page64-ngram": entry(**{"page-size": 64}, **NGRAM)}
    assert twin("page64-ngram", entries, {"page64-ngram"}) == ("page64", "the same settings without drafting")
    entries["page64"] = entry(kernel="other", **{"page-size": 64})
    base, why = twin("page64-ngram", entries, {"page64-ngram"})
    assert base is None and "no configuration of this run has its settings without drafting" in why
    entries["page64"] = entry(version="0.2", **{"page-size": 64})
    assert twin("page64-ngram", entries, {"page64-ngram"})[0] is None
    # vLLM's flag is speculative-config; two external servers have no flags: the same settings
    vllm = {"v": entry("vllm", **{"max-model-len": 4096}), "v-ngram": entry("vllm", **{"max-model-len": 4096,
                                                                                      "speculative-config": {"method": "ngram"}})}
    assert twin("v-ngram", vllm, {"v-ngram"})[0] == "v"
    ext = {"real": entry("external"), "real-ngram": entry("external")}
    assert twin("real-ngram", ext, {"real-ngram"})[0] == "real"
    assert twin("x", {"x": {"engine": "reference"}}, {"x"})[1].startswith("its settings are not in the provenance")


FAST, NONE, SLOW, WIDE = [1.2, 1.5], [0.97, 1.04], [0.7, 0.9], [0.8, 1.6]  # intervals: faster, no gain, slower, unclear


@pytest.mark.parametrize("intervals, expected", [
    ([FAST, FAST, NONE, NONE], {"length": 4096, "after": 2048, "slower_from": None}),
    ([FAST, NONE, SLOW, SLOW], {"length": 2048, "after": 1024, "slower_from": 4096}),
    ([FAST] * 4, None),  # still pays at the longest length
    ([NONE] * 4, None),  # never paid
    ([NONE, FAST, NONE, FAST], None),  # faster at the longest
    ([FAST, None, NONE, None], {"length": 4096, "after": 1024, "slower_from": None}),  # no interval: not said
    ([FAST, FAST, WIDE, NONE], None),  # an interval too wide to tell is no evidence that it stopped
])
def test_where_the_drafter_stops_paying(intervals, expected):
    verdict = {id(FAST): "faster", id(NONE): "no measurable difference", id(SLOW): "slower", id(WIDE): "no measurable difference"}
    rows = [{"length": L, "ci": ci, "verdict": verdict.get(id(ci), "no interval")} for L, ci in zip([1024, 2048, 4096, 8192], intervals)]
    assert stops_paying(rows) == expected


def test_the_familys_intervals_cover_together_what_they_say():
    """Lognormal trials at 3 a side (the default trials) and the noise of decode rates in use (10% on vLLM's CPU
    server here, 25% on a busy machine), 4 lengths per family: all 4 intervals at the Bonferroni level cover their
    true ratios in at least 95% of 4,000 seeds (Welch's at 3 a side covers 93% to 97% alone, so a family of
    intervals at 95% each would not); a single interval at 95% misses far more often as a family."""
    rng = np.random.default_rng(44)
    m, n, seeds = 4, 3, 4000
    truth = np.log(np.array([1.6, 1.3, 1.0, 0.9]))
    for noise in (0.10, 0.25):
        on = truth[None, :, None] + rng.normal(0, noise, (seeds, m, n))
        off = rng.normal(0, noise, (seeds, m, n))
        for level, least in ((family_level(m, 0.95), 0.95), (0.95, None)):
            ci = np.log(welch_log_interval(np.exp(on), np.exp(off), level))
            covered = ((ci[..., 0] <= truth) & (truth <= ci[..., 1])).all(axis=1).mean()
            if least is not None:
                assert covered >= least, (noise, covered)
            else:
                assert covered < 0.93, (noise, covered)


def results(speedups: dict[int, float], n: int = 3, noise: float = 0.03, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for L, s in speedups.items():
        for name, factor in (("plain", 1.0), ("ngram", s)):
            for t in range(n):
                rows.append({"configuration": name, "engine": "external", "length": L, "concurrency": 1, "trial": t,
                             "request": np.nan, "status": "ok", "ttft_s": 0.1, "tpot_s": 0.05,
                             "decode_tok_s": 20 * factor * np.exp(rng.normal(0, noise)),
                             "spec_accept_length": (1 + s) if name == "ngram" else np.nan, "spec_accept_rate": 0.5 if name == "ngram" else np.nan})
    return pd.DataFrame(rows)


def test_verdicts_follow_the_intervals_and_page_one_says_where_it_stops_paying():
    df = results({1024: 1.8, 2048: 1.5, 4096: 1.0, 8192: 1.0}, noise=0.005)
    prov = {"configurations": {"plain": entry("external"), "ngram": entry("external", text={"kind": "text", "source": "stdlib"})}}
    out = drafting(df, prov, 0.95)
    c = out["configurations"]["ngram"]
    assert out["family"]["tests"] == 4 and out["family"]["level"] == pytest.approx(0.9875)
    for r in c["rows"]:
        assert r["verdict"] == ("faster" if r["ci"][0] > 1 else "slower" if r["ci"][1] < 1 else "no measurable difference")
    assert [r["verdict"] for r in c["rows"]][:2] == ["faster", "faster"] and c["stops_paying"]["length"] == 4096
    said = view(out)["sentence"]
    assert re.match(r"With drafting in ngram \(against plain\), decode is 1\.[78]\dx \[1\.\d\d, 1\.\d\d\] faster at 1,024 tokens", said)
    assert re.search(r"\(faster up to 2,048 tokens\) and stops paying from 4,096 on \(no gain above 5%: 1\.00x \[0\.9\d, 1\.0[0-4]\]\)", said)
    assert "acceptance falls from 2.8 to 2 tokens per step (n=3/3 per length, 98.8% intervals of one family)." in said
    assert "on real text: the Python standard library's documentation and source" in view(out)["configurations"][0]["caveat"]


@pytest.mark.parametrize("speedups, words", [
    ({1024: 1.8, 4096: 1.6}, r"decode is faster at every length, 1\.\d\dx \[[\d., ]+\] faster at 1,024 tokens to 1\.\d\dx"),
    ({1024: 1.0, 4096: 1.0}, r"decode has no gain above 5% at 1,024 and 4,096 tokens \([01]\.\d\dx \[[\d., ]+\] at 4,096 tokens\)"),
    ({1024: 1.0, 4096: 0.6}, r"decode has no gain above 5% at 1,024 and 4,096 tokens, slower at 4,096 \(0\.\d\dx \[[\d., ]+\] slower at 4,096"),
])
def test_page_one_says_what_drafting_did_whatever_it_did(speedups, words):
    prov = {"configurations": {"plain": entry("external"), "ngram": entry("external")}}
    said = view(drafting(results(speedups, noise=0.005), prov, 0.95))["sentence"]
    assert re.search(words, said), said


def test_an_interval_too_wide_to_tell_is_said_as_such():
    prov = {"configurations": {"plain": entry("external"), "ngram": entry("external")}}
    said = view(drafting(results({1024: 1.5, 4096: 1.3}, noise=0.4, seed=3), prov, 0.95))["sentence"]
    assert re.search(r"at [\d, and]+ tokens the interval is too wide to tell", said) and "stops paying" not in said, said


def test_a_drafting_configuration_without_a_twin_says_why_and_no_configuration_drafts_says_nothing():
    prov = {"configurations": {"plain": entry("external", **{"x": 1}), "ngram": entry("external")}}
    out = view(drafting(results({1024: 1.5}), prov, 0.95))
    assert "no twin without drafting to compare decode with" in out["sentence"]
    assert "add one to measure what drafting buys" in out["configurations"][0]["why"]
    df = results({1024: 1.5})
    df["spec_accept_length"] = np.nan
    none = view(drafting(df, prov, 0.95))
    assert none["configurations"] == [] and none["sentence"] is None and none["family"]["tests"] == 0


def test_the_report_renders_a_drafting_configuration_without_a_twin(tmp_path):
    """The PDF and its twin with a configuration whose trials carry acceptance and no twin (its settings differ from
    every other's): the speculative section says why, and no family figure is printed for a family of none."""
    import json

    from longctx.analysis.fits import fit_file

    from .report_data import build_report, config, inputs, write_data
    from .test_report import pdftotext

    paths = write_data(tmp_path / "data")
    df = pd.read_csv(paths["results_csv"])
    df.loc[df["configuration"] == "fast_kv", "spec_accept_length"] = 1.7
    df.to_csv(paths["results_csv"], index=False)
    prov = json.loads(paths["provenance_json"].read_text())
    prov["configurations"]["fast_kv"]["settings"]["shown"]["args.page-size"] = 64
    paths["provenance_json"].write_text(json.dumps(prov))
    fit_file(paths["results_csv"], paths["fits_json"], paths["provenance_json"], settings={"bootstrap": 50})
    out = tmp_path / "report"
    build_report(paths, out, inputs(paths, config=config()))
    for text in (" ".join(pdftotext(out / "longctx.pdf").split()), " ".join((out / "longctx.md").read_text().replace("\\_", "_").split())):
        assert "With drafting in fast_kv, acceptance is 1.7 tokens per step at every length (no twin without drafting" in text
        assert "No drafting configuration has a twin to compare with" in text or "no configuration has a twin" in text
