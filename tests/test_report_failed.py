"""A failed run still reports: raw files where every length (of one configuration, or of all)
failed, a single successful length, or successful trials whose times read 0 or below go through
the report rules' commands (aggregate, fit, plan-memory, plot, plot-analysis, render, pdf,
markdown) to a PDF and its Markdown twin that say what was not measured and why. A real sweep that lost
two trials of one length reports that length as partial."""

from __future__ import annotations

import json
import re
import subprocess

import pytest


from .report_data import NASTY, config, run_report_chain

LENGTHS = (1000, 4000, 16000)
PROVENANCE = {  # what a sweep records once a server answered (longctx.measure.sweep)
    "protocol": {"warmup": 1, "trials": 3, "output_tokens": 32, "flush_cache": True},
    "model": {"name": "refmla", "kv_bytes_per_token": 160}, "args": {"page-size": 1},
    "hardware": {"host": "h", "cpu": "Test CPU", "logical_cpus": 4, "usable_cpus": 2, "memory_total_bytes": 2**34,
                 "gpus": [], "os": "Linux"},
    "kv_pool": {"tokens": 200000},
    "server_info": {"memory_total_bytes": 10**9, "weights_bytes": 468 * 10**6, "mem_fraction_static": 0.5,
                    "context_length": 65536},
}


def trial(L: int, ttft: float, tpot: float | None, tokens: int = 32) -> dict:
    return {"status": "ok", "ttft_s": ttft, "tpot_s": tpot, "decode_tok_s": 1 / tpot if tpot else None,
            "e2e_s": ttft + (tokens - 1) * (tpot or 0), "prompt_tokens": L, "completion_tokens": tokens}


def write_raw(data, name: str, L: int, trials=(), reason: str | None = None, started: bool = True) -> None:
    """data/raw/<name>/<L>.json as the sweep writes it: failed (with reason) where trials is empty;
    a server that never started leaves no provenance."""
    d = data / "raw" / name
    d.mkdir(parents=True, exist_ok=True)
    raw = {"format": "longctx.raw/1", "configuration": name, "engine": "reference", "length": L,
           "status": "ok" if trials else "failed", "reason": reason, "warmup": [], "trials": list(trials),
           "run_id": "r1", "spec_hash": "abc", "finished_at": "2026-01-02T03:04:05+00:00"}
    if started:
        raw["provenance"] = PROVENANCE
    (d / f"{L}.json").write_text(json.dumps(raw))


def case_all_failed(data):
    for name in ("base", "fast_kv"):
        for L in LENGTHS:
            write_raw(data, name, L, reason=f"not measured: the server of {name} did not start: {NASTY}", started=False)
    return ("base", "fast_kv")


def case_one_failed(data):
    for L in LENGTHS:
        write_raw(data, "base", L, reason=f"timeout after 30 s at {L}")
        write_raw(data, "fast_kv", L, [trial(L, 0.02 + 2e-5 * L + 4e-10 * L * L, 2e-3 + 1e-8 * L) for _ in range(3)])
    return ("base", "fast_kv")


def case_single_length(data):
    write_raw(data, "base", 1000, [trial(1000, 0.05, 2e-3) for _ in range(3)])
    write_raw(data, "base", 4000, reason="out of memory")
    return ("base",)


def case_non_positive(data):
    for L in LENGTHS:
        write_raw(data, "base", L, [trial(L, 0.0, None, tokens=1) for _ in range(3)])  # one output token: no decode rate
        write_raw(data, "fast_kv", L, [trial(L, -0.01, 0.0, tokens=1) for _ in range(3)])
    return ("base", "fast_kv")


def run_chain(data, out, names) -> None:
    """The report rules' commands (rules/report.smk, bench/report_from_data.sh), in order, uncalibrated."""
    run_report_chain(data, out, config(names), calibration={})


def text_of(pdf) -> str:
    return " ".join(subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True,
                                   check=True).stdout.split())


def unescape_md(text: str) -> str:
    return " ".join(re.sub(r"\\(.)", r"\1", text).split())


CASES = {"all_failed": case_all_failed, "one_failed": case_one_failed, "single_length": case_single_length,
         "non_positive": case_non_positive}


@pytest.fixture(scope="module", params=list(CASES))
def report(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    names = CASES[request.param](root / "data")
    run_chain(root / "data", root / "report", names)
    out = root / "report"
    return {"case": request.param, "out": out, "pdf": text_of(out / "longctx.pdf"),
            "md": unescape_md((out / "longctx.md").read_text()), "raw": root / "data" / "raw"}


def test_the_pdf_and_the_twin_are_built_with_every_figure(report):
    from longctx.report.figures import ANALYSIS_FIGURES, FIGURES, FORMATS

    for figure in FIGURES + ANALYSIS_FIGURES:
        for ext in FORMATS:
            assert (report["out"] / "figures" / f"{figure}.{ext}").is_file(), (figure, ext)
    assert report["pdf"] and report["md"].startswith("# longctx report v1")


def test_every_failure_is_listed_with_its_reason(report):
    reasons = {json.loads(p.read_text())["reason"] for p in report["raw"].glob("*/*.json")} - {None}
    pdf_failures = report["pdf"][re.search(r"\d+ Failures ", report["pdf"]).start():]
    md_failures = report["md"][report["md"].index("## Failures"):]
    for reason in reasons:
        assert " ".join(reason.split()) in pdf_failures, reason
        assert reason in md_failures, reason
    if not reasons:
        assert "Every trial of every length succeeded" in pdf_failures


def test_the_summary_says_what_was_not_measured(report):
    pdf, md, case = report["pdf"], report["md"], report["case"]
    summary = pdf[:pdf.index("2 Diagnosis")]
    nothing = "Nothing was measured"
    if case in ("all_failed", "non_positive"):
        assert nothing in summary and nothing in md
        assert "What bounds decode" not in summary
    else:
        assert nothing not in pdf and nothing not in md
    if case == "all_failed":
        for name in ("base", "fast_kv"):
            said = f"{name}: no length was measured successfully (at 1,000, 4,000 and 16,000 tokens: not measured: the server of {name} did not start"
            assert said in summary and said in md
        assert "Protocol: not recorded" in pdf
    if case == "one_failed":
        assert "base: no length was measured successfully (at 1,000 tokens: timeout after 30 s at 1000;" in summary
        assert "Decode: the rate falls from" in summary and "in fast_kv" in summary  # the measured configuration's answer
    if case == "single_length":
        assert "1 of 2 lengths failed (at 4,000 tokens: out of memory)." in pdf  # under its heading, base
        assert "fewer than three measured lengths: no fit" in pdf
    if case == "non_positive":
        assert "fast_kv: the time to first token reads at or below 0 at 1,000, 4,000 and 16,000 tokens" in summary
        assert "base: no decode rate was measured (no trial decoded a second token)." in summary


def test_figures_without_data_say_not_measured(report):
    if report["case"] not in ("all_failed", "non_positive"):
        pytest.skip("figures with data")
    figures = report["out"] / "figures"
    assert "not measured: no time to first token above 0" in text_of(figures / "ttft.pdf")
    assert "not measured: no decode rate" in text_of(figures / "decode_rate.pdf")
    assert "not measured: no decode step time" in text_of(figures / "step_time.pdf")
    # and the report does not spend a page on each: a line where the figure would be, in the PDF and its twin, and
    # no sentence points at a figure that is not there (an undefined reference prints ??)
    for said in ("No figure: no trial decoded a second token.", "No figure: no model was fitted."):
        assert said in report["pdf"] and said in report["md"], said
    if report["case"] == "all_failed":
        said = "No figure: no length has a time to first token above 0."
        assert said in report["pdf"] and said in report["md"]
    assert "??" not in report["pdf"]


@pytest.mark.alone  # under -n (tests/conftest.py): a real sweep's fits must find no regime change
def test_a_real_sweep_with_a_trial_lost_marks_that_length_and_leaves_it_out_of_the_fits(tmp_path, monkeypatch):
    """A real sweep of the reference engine in which two of the three trials of its longest length time out (a
    timeout of 0.1 ms, on the real client, for those requests alone): the raw file says partial, and the
    report chain marks that length in its tables, counts it on page one and fits without it."""
    import longctx.measure.prompts as prompts
    from longctx.measure.sweep import run_configuration

    from .conftest import tiny_spec

    lengths, lost_at = (32, 64, 128, 256), 256
    real, calls = prompts.Prompter.generate, []

    def generate(self, client, url, body, timeout_s, length, **kwargs):
        calls.append(length)
        # the second and third trial of that length (its first request is the server's prime, the sweep's longest)
        if length == lost_at and calls.count(lost_at) >= 3:
            timeout_s = 1e-4
        return real(self, client, url, body, timeout_s, length)

    monkeypatch.setattr(prompts.Prompter, "generate", generate)
    spec = tiny_spec("page1", lengths=list(lengths))
    spec.protocol.update({"warmup": 0, "trials": 3, "output_tokens": 4, "concurrency": []})
    spec.server["stop_timeout_s"] = 2
    data, out = tmp_path / "data", tmp_path / "report"
    run_configuration(spec, data / "raw" / "page1", tmp_path / "server.log", tmp_path / "partial")
    raw = json.loads((data / "raw" / "page1" / f"{lost_at}.json").read_text())
    assert raw["status"] == "partial" and [t["status"] for t in raw["trials"]] == ["ok", "failed", "failed"]
    run_chain(data, out, ("page1",))
    fits = json.loads((data / "fits.json").read_text())["configurations"]["page1"]
    assert fits["partial_lengths"]["lengths"] == [
        {"length": lost_at, "ok": 1, "trials": 3, "configured": 3, "fitted": {"prefill": False, "decode": False},
         "regime_detection": {"prefill": False, "decode": False}}]
    assert "prefill" in fits and "decode" in fits  # on the three full lengths
    pdf = text_of(out / "longctx.pdf")
    summary = pdf[:pdf.index("2 Diagnosis")]
    assert ("1 length was measured by fewer successful trials than configured (page1 at 256 tokens: 1 of 3 trials); it is "
            "marked † and left out of the fits and of the regime detection.") in summary
    assert "page1 256† " in summary and "128†" not in pdf
    assert "† Measured by fewer successful trials than configured: page1 at 256 tokens, measured by 1 of 3 trials." in summary
    # the longest length measured in full: page one's answer, its table, and the diagnosis
    assert "At 128 tokens, the longest length every configuration measured" in summary
    answer = summary.split("Prefill: ")[1].split(" (The evidence per configuration")[0]
    assert re.search(r"at 128\b", answer) and "256" not in answer
    assert "Decode at 128 tokens runs at" in pdf[pdf.index("2 Diagnosis"):]
    assert "slower than the fit" not in pdf and "256 tokens (measured by 1 of 3 trials)" not in pdf
    assert re.search(r"page1 256† [\d.,]+ [\d.,]+ [\d.,]+ [\d.,]+ 1/3", pdf)  # the results appendix
    md = unescape_md((out / "longctx.md").read_text())
    assert "| page1 | 256† |" in md and "it is marked † and left out of the fits" in md
