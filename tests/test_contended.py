"""Conditions of a trial (issue 32, item 4): a trial whose server got markedly less of its device than the
configuration's other trials is flagged from the telemetry it carries, named with the figure, and left out of the
fits. The case is the issue's: on a third-party CPU server, the 512-token trials ran while the machine was busy
(the server's own CPU share 106% against 188% at every other length) and the prefill fit took them in."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from longctx.analysis.aggregate import COLUMNS, flag_contended
from longctx.analysis.fits import fit_all
from longctx.report.wording import trial_flags

LENGTHS = [256, 512, 1024, 2048, 4096]
A, B, C = 0.05, 2e-4, 2e-8  # TTFT = a + b L + c L^2, by construction


def results(slow_length: int | None = 512, samples: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for L in LENGTHS:
        for trial in range(3):
            busy = L == slow_length
            ttft = (A + B * L + C * L * L) * (1.8 if busy else 1.0) * (1 + 0.01 * rng.standard_normal())
            rows.append({"configuration": "cpu", "engine": "external", "length": L, "concurrency": 1, "trial": trial,
                         "request": 0, "status": "ok", "ttft_s": ttft, "tpot_s": 0.02, "decode_tok_s": 50.0,
                         "prefill_cpu_util_pct_mean": 106.0 if busy else 188.0 + rng.normal(0, 3),
                         "decode_cpu_util_pct_mean": 190.0, "prefill_samples": samples, "decode_samples": 10})
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


PROCESS = {"configurations": {"cpu": {"telemetry_scope": {"over": "process"}}}}


def test_a_trial_whose_server_got_less_of_its_cpu_is_flagged_with_the_figure():
    df = flag_contended(results(), PROCESS)
    flagged = df[df["contended"].eq(True)]
    assert sorted(flagged["length"]) == [512, 512, 512]
    assert flagged["contended_reason"].iloc[0].startswith("the server's CPU share during prefill 106% of a core against "
                                                          "the configuration's median 18")
    said = " ".join(trial_flags(df))
    assert "3 of 15 trials ran while the server got markedly less of its device" in said and "at 512 tokens, trial 0" in said
    # the whole machine's CPU rises with contention, it does not fall: nothing is read from it
    machine = {"configurations": {"cpu": {"telemetry_scope": {"over": "machine"}}}}
    assert not flag_contended(results(), machine)["contended"].any()
    # a window of 1 or 2 samples (a short prefill) says too little to flag anything
    assert not flag_contended(results(samples=2), PROCESS)["contended"].any()
    assert not flag_contended(results(slow_length=None), PROCESS)["contended"].any()


def test_the_contended_trials_stay_out_of_the_fits():
    """With the 512-token trials in, the fit invents a fixed cost; without them it finds a, b and c as built."""
    df = results()
    kept = fit_all(flag_contended(df, PROCESS), None, None, {"bootstrap": 50})["configurations"]["cpu"]
    taken = fit_all(df, None, None, {"bootstrap": 50})["configurations"]["cpu"]
    assert kept["trials_contended"] == 3
    p = kept["prefill"]
    assert p["a_s"] == pytest.approx(A, rel=0.2) and p["c_s_per_token2"] == pytest.approx(C, rel=0.2)
    assert abs(taken["prefill"]["a_s"] - A) > 3 * abs(p["a_s"] - A)  # the defect: the slow trials fitted in


def test_a_length_whose_every_trial_was_contended_stands_in_a_fit_that_would_have_too_few_lengths_without_it():
    """The CI run of 2026-12-07 (llama.cpp on SmolLM2, lengths 256, 512 and 1,024, two trials each): both trials at
    256 ran while the machine was busy (the server's CPU share 101% and 97% against its median 185%), and the prefill
    fit, which needs three lengths, was left with two: no prefill model, no what-if. Without them too few lengths are
    left, so they stand at 256 (nothing else was measured there), the fit lists that length and the report says so;
    a contended trial at a length with uncontended ones still stays out."""
    df = results(slow_length=256)
    df = df[df["length"].isin([256, 512, 1024])].reset_index(drop=True)
    df.loc[df["length"] == 256, "ttft_s"] *= 1.2 / 1.8  # 1.2 times as slow: a curve with a, b, c > 0 passes through
    extra = df[(df["length"] == 1024) & (df["trial"] == 0)].copy()  # one more trial at 1,024, contended
    extra["trial"], extra["ttft_s"], extra["prefill_cpu_util_pct_mean"] = 3, extra["ttft_s"] * 2, 95.0
    df = pd.concat([df, extra], ignore_index=True)
    prov = {"configurations": {"cpu": {"telemetry_scope": {"over": "process"}}}}
    flagged = flag_contended(df, prov)
    assert int(flagged["contended"].sum()) == 4
    fit = fit_all(flagged, None, None, {"bootstrap": 50})["configurations"]["cpu"]
    p = fit["prefill"]
    assert p["on_flagged_lengths"] == [256]
    # the 256-token trials are in, the contended one at 1,024 (2 times as slow) is not: three lengths, three
    # coefficients, the curve passes through the trials as built at 1,024 and 1.2 times above them at 256
    at = lambda L: p["a_s"] + p["b_s_per_token"] * L + p["c_s_per_token2"] * L * L  # noqa: E731
    assert at(1024) == pytest.approx(A + B * 1024 + C * 1024 ** 2, rel=0.03)
    assert at(256) == pytest.approx(1.2 * (A + B * 256 + C * 256 ** 2), rel=0.03)
    said = " ".join(trial_flags(flagged, prov["configurations"]["cpu"], fit))
    assert "out of the fits unless too few lengths are left without them" in said
    assert "Without the flagged trials too few lengths are left for a fit: the prefill fit stands on those at 256 tokens" in said
    # with a fourth length measured cleanly the fit needs no contended trial, and stands on none
    more = results(slow_length=256)
    more = flag_contended(more[more["length"].isin([256, 512, 1024, 2048])].reset_index(drop=True), prov)
    alone = fit_all(more, None, None, {"bootstrap": 50})["configurations"]["cpu"]
    assert alone["prefill"]["on_flagged_lengths"] == []
    assert alone["prefill"]["c_s_per_token2"] == pytest.approx(C, rel=0.2)
    assert "Without the flagged trials" not in " ".join(trial_flags(more, prov["configurations"]["cpu"], alone))


def test_contended_trials_stay_out_of_the_medians_and_speedups_where_others_were_measured():
    """Issue 46, item 6: a contended trial is left out of what page one prints too (the medians, the speedups and
    their verdicts: tables.ok_rows), where its length has uncontended trials; where every trial of a length was
    contended they stand (nothing else was measured), and the report says so. A configuration whose telemetry cannot
    show contention (the whole machine's CPU, no GPU clock) is said not to have been checked."""
    from longctx.analysis.tables import medians, ok_rows

    df = results(slow_length=None)
    one = df.index[(df["length"] == 1024) & (df["trial"] == 0)][0]
    df.at[one, "ttft_s"] = df.at[one, "ttft_s"] * 3
    df.at[one, "prefill_cpu_util_pct_mean"] = 90.0
    prov = {"configurations": {"cpu": {"telemetry_scope": {"over": "process"}}}}
    flagged = flag_contended(df, prov)
    assert flagged.loc[one, "contended"] and prov["configurations"]["cpu"]["contention"]["checked"]
    kept = ok_rows(flagged)
    assert one not in kept.index and len(kept) == len(df) - 1 and len(ok_rows(flagged, contended=True)) == len(df)
    clean = [t for t in flagged[(flagged["length"] == 1024)].index if t != one]
    m = medians(flagged).set_index(["configuration", "length"])
    assert m.loc[("cpu", 1024), "ttft_s"] == pytest.approx(float(np.median(df.loc[clean, "ttft_s"])))
    # every trial of a length contended: they stand
    all512 = flag_contended(results(), PROCESS)
    assert (ok_rows(all512)["length"] == 512).sum() == 3
    machine = {"configurations": {"cpu": {"telemetry_scope": {"over": "machine"}, "device": "cpu"}}}
    flag_contended(results(), machine)
    said = " ".join(trial_flags(results()[results()["status"].eq("ok")], machine["configurations"]["cpu"]))
    assert "could not be checked (the telemetry does not watch the server's own process)" in said


def test_a_trial_while_another_process_took_the_gpu_is_contended():
    """NVML's per-process utilisation (telemetry's others_sm_util_pct): a decode window in which other processes took
    35% of the server's GPUs' SMs flags the trial, whatever the clock said."""
    df = results(slow_length=None)
    df["decode_others_sm_util_pct_mean"] = 0.0
    one = df.index[(df["length"] == 2048) & (df["trial"] == 1)][0]
    df.at[one, "decode_others_sm_util_pct_mean"] = 35.0
    prov = {"configurations": {"cpu": {"telemetry_scope": {"over": "gpus"}, "device": "gpu"}}}
    flagged = flag_contended(df, prov)
    assert list(flagged.index[flagged["contended"]]) == [one]
    assert flagged.at[one, "contended_reason"] == "other processes' SM utilisation on its GPUs during decode 35%"
    assert "other processes' SM utilisation on its GPUs during decode" in prov["configurations"]["cpu"]["contention"]["checked"]
