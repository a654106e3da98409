"""The report of the load workloads (issue 18): a small data/load.json and data/load_metrics.csv written by
hand to the data contract (two configurations; closed and open points with known percentiles, a failed
request, an interference fit, a frontier, one flagged KV reconciliation sample) rendered into the LaTeX
report (built with latexmk once) and its Markdown twin; page one's frontier and interference sentences;
the load figures, from that data and from none."""

from __future__ import annotations

import json
from pathlib import Path
import re
import subprocess

import pandas as pd
import pytest

from longctx.report import latex as report
from longctx.report.context import DATA_FILES, ReportInputs, context
from longctx.report.figures import FORMATS, LOAD_FIGURES
from longctx.report.figures.load import plot_load

from .conftest import ROOT
from .report_data import NASTY, build_report, config, write_data
from .test_report import md_rows

TEMPLATES = ROOT / "templates"
TIMEOUT = f"timeout after 30 s: {NASTY}"


def est(value, low, high):
    return {"value": value, "low": low, "high": high}


def point(level, length, ttft50, ttft99, itl50, itl99, n=8, failed=0, reasons=(), lag99=None, goodput=(1.0, 0.7, 1.0, 8)):
    share, lo, hi, met = goodput
    p = {"level": level, "length": length, "n": n, "ok": n - failed, "failed": failed, "reasons": list(reasons),
         "ttft": {"p50": ttft50, "p90": ttft99, "p99": ttft99, "n": n - failed},
         "itl": {"p50": itl50, "p90": itl99, "p99": itl99, "n": 100 * (n - failed)},  # ITL: over every token gap
         "tpot": {"p50": est(0.021, 0.02, 0.023), "p90": None, "p99": None, "n": n - failed},
         "e2e": {"p50": est(2.5, 2.25, 2.75), "p90": None, "p99": None, "n": n - failed},
         "queue": {"p50": None, "p90": None, "p99": None, "n": 0},
         "output_tok_s": 123.4, "request_s": 0.5,
         "goodput": {"share": share, "low": lo, "high": hi, "rate_s": 0.4, "met": met, "n": n, "by": ["ttft_s", "itl_s"]}}
    p["schedule_lag"] = {"p50": None, "p90": None, "p99": lag99, "n": n} if lag99 else None
    return p


# a closed-loop point that did not keep its 4 requests in flight (longctx.analysis.load_summary.held_level)
HELD_BELOW = {"level": 4, "window_s": 2.0, "share": 0.41, "mean_in_flight": 2.3, "server_running_mean": 2.2, "below": True,
              "min_share": 0.9, "client_stall_max_s": 0.31, "client_stalled_s": 0.52}

LOAD = {
    "slo": {"ttft_s": 10, "itl_s": 0.2, "tpot_s": None, "attainment": 0.9},
    "configurations": {
        "chunked": {
            # p99 of 8 requests: not a p99, their maximum (longctx.analysis.load_summary.min_samples)
            "closed": [point(1, 4096, est(1.234, 1.1, 1.4), {"value": None, "low": None, "high": None, "max": 2.5, "n": 8},
                             est(0.0123, 0.012, 0.0131), est(0.0456, 0.04, 0.05)),
                       point(4, 4096, est(3.21, 2.9, 3.6), {"value": None, "low": None, "high": None, "max": 9.87, "n": 7},
                             est(0.015, 0.014, 0.016), est(0.0789, 0.07, 0.09),
                             failed=1, reasons=[TIMEOUT], goodput=(0.75, 0.375, 1.0, 6)) | {"held": HELD_BELOW}],
            # 400 requests: enough for a p99 and its 95% interval (368 at least; fewer print none, whatever the input says)
            "open": [point(0.5, 4096, est(1.5, 1.4, 1.6), est(4.25, 3.5, 5.0), est(0.0125, 0.012, 0.013), est(0.0612, 0.05, 0.07),
                           lag99=est(0.0014, 0.001, 0.002), n=400, goodput=(1.0, 0.99, 1.0, 400))],
            "interference": {"points": [
                {"length": 8192, "n": 2, "background": 2, "worst_gap": est(0.9, 0.85, 1.0), "extra": est(0.8, 0.7, 0.9),
                 "steady_itl_s": 0.0205, "window_s": 1.1},
                {"length": 16384, "n": 2, "background": 2, "worst_gap": est(1.7, 1.6, 1.8), "extra": est(1.6, 1.5, 1.7),
                 "steady_itl_s": 0.0205, "window_s": 2.2, "injected_ttft_s": 3.4, "chunks": 2, "stalled_share": 0.5,
                 "mean_chunk_s": 1.7}],
                "fit": {"chunk": 8192, "per_chunk_s": 0.85, "low": 0.8, "high": 0.9, "r2": 0.998, "basis": "chunks"}},
            "frontier": [
                {"concurrency": 1, "max_length": 16384, "basis": "measured", "limited_by": "ttft", "pool_bound": 40960,
                 "passes": [4096, 16384], "fails": []},
                {"concurrency": 4, "max_length": 4096, "basis": "measured", "limited_by": "ttft", "pool_bound": 10240,
                 "passes": [4096], "fails": [16384]}],
            "below_level": [{"length": 4096, **HELD_BELOW}],
            "reconciliation": {"checked": 40, "margin": 0.1, "gauge": "used_tokens", "flagged": [
                {"t_s": 1.25, "kind": "closed", "level": 4, "length": 4096, "server_tokens": 9000, "client_low": 16400,
                 "client_high": 16520}]},
        },
        "whole": {
            "closed": [point(1, 4096, est(1.1, 1.0, 1.2), est(2.0, 1.8, 2.2), est(0.011, 0.0105, 0.0115), est(0.04, 0.035, 0.045)),
                       point(4, 4096, est(2.8, 2.6, 3.0), est(7.5, 7.0, 8.0), est(0.013, 0.012, 0.014), est(0.06, 0.055, 0.065))],
            "open": [],
            "interference": {"points": [{"length": 16384, "n": 2, "background": 2, "worst_gap": est(3.4, 3.2, 3.6),
                                         "extra": est(3.3, 3.1, 3.5), "steady_itl_s": 0.02, "window_s": 3.5,
                                         "injected_ttft_s": 3.5, "chunks": None, "stalled_share": 3.4 / 3.5,
                                         "mean_chunk_s": None}], "fit": None},
            "frontier": [
                {"concurrency": 1, "max_length": 8192, "basis": "model", "limited_by": "pool", "pool_bound": 8192,
                 "passes": [4096], "fails": []},
                {"concurrency": 4, "max_length": 2048, "basis": "model", "limited_by": "pool", "pool_bound": 2048,
                 "passes": [], "fails": [4096]}],
            "reconciliation": {"checked": 12, "low_above_zero": 0, "margin": 0.1, "gauge": "used_tokens", "flagged": []},
        },
        # a configuration whose server never answered: said, with its reason, and nowhere else
        "broken": {"status": "failed", "reason": f"server did not start: {NASTY}", "closed": [], "open": [], "interference": None,
                   "frontier": [], "reconciliation": None},
    },
}
# chunked's open point: its server reports the time queued
LOAD["configurations"]["chunked"]["open"][0]["queue"] = {"p50": est(0.25, 0.2, 0.3), "p90": None, "p99": None, "n": 8}
FRONTIER = ("At 4 concurrent requests, TTFT at most 10 s and ITL at most 200 ms (for 90% of requests) hold to 4,096 tokens in "
            "chunked (measured, limited by the TTFT) and to 2,048 tokens in whole (model, limited by the KV pool).")
# chunked: the streams waited through half of the prefill (one of its 2 chunks); whole: through all of it
# one sentence for both: the same prompt into as many streams, the stalls as a span (each one's own: the Load section)
INTERFERENCE = "A 16,384-token prompt stalls 2 running streams for 1.7–3.4 s (worst gap) in chunked and whole, 50–97% of its prefill."


def metrics_rows() -> list[dict]:
    """The server's series at chunked's two closed points (4 in flight: 16,400 to 16,520 tokens resident, the server
    saying 9,000 at 1.25 s) and at whole's one."""
    rows = []
    for name, level, running, used in (("chunked", 1, 1, 4100), ("chunked", 4, 4, 16450), ("whole", 4, 4, 16500)):
        for i in range(9):
            t = 0.25 * i
            u = 9000 if (name, level, i) == ("chunked", 4, 5) else used
            for n, v in (("running", running), ("queued", 1 if i < 3 else 0), ("used_tokens", u), ("token_usage", u / 40960),
                         ("client_resident_low", used - 50), ("client_resident_high", used + 70), ("retracted_total", 2 if i > 6 else 0)):
                rows.append({"configuration": name, "kind": "closed", "level": level, "length": 4096, "trial": 0, "t_s": t,
                             "name": n, "value": v})
    return rows


def write_load(d):
    (d / "load.json").write_text(json.dumps(LOAD, indent=1))
    pd.DataFrame(metrics_rows()).to_csv(d / "load_metrics.csv", index=False)
    return d / "load.json", d / "load_metrics.csv"


def load_inputs(paths, load_json=None, metrics_csv=None) -> ReportInputs:
    return ReportInputs(results=paths["results_csv"], fits=paths["fits_json"], provenance=paths["provenance_json"],
                        itl_depth=paths["itl_depth_csv"], planner=paths["planner_json"], load=load_json,
                        load_metrics=metrics_csv, config=config())


def pdftotext(pdf) -> str:
    return subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The report of write_data's single-request measurements with the load data above: figures, .tex, PDF, twin."""
    root = tmp_path_factory.mktemp("load")
    paths = write_data(root / "data")
    load_json, metrics_csv = write_load(root / "data")
    out = root / "report"
    figures = plot_load(load_json, metrics_csv, TEMPLATES / "plot.mplstyle", out / "figures")
    inputs = load_inputs(paths, load_json, metrics_csv)
    build_report(paths, out, inputs)
    return {"out": out, "paths": paths, "inputs": inputs, "figures": figures, "tex": (out / "longctx.tex").read_text(),
            "pdf": " ".join(pdftotext(out / "longctx.pdf").split()), "md": (out / "longctx.md").read_text()}


def test_the_closed_and_open_tables_print_the_percentiles_with_their_intervals(built):
    latency = md_rows(built["md"], "configuration | c | L (tokens) | n | TTFT p50 (s)")
    assert latency[:2] == [["chunked", "1", "4,096", "8", "1.23 [1.1, 1.4]", "max of 8: 2.5", "12.3 [12, 13.1]", "45.6 [40, 50]", "--"],
                           ["chunked", "4", "4,096", "7", "3.21 [2.9, 3.6]", "max of 7: 9.87", "15 [14, 16]", "78.9 [70, 90]", "41‡"]]
    said = ("chunked: 4 in flight, 4,096 tokens held 41% of the time, 2.3 in flight on average (the server's running gauge: "
            "2.2), while this machine kept the client off its CPUs for up to 0.31 s (0.52 s in all), a slot it could not "
            "refill meanwhile.")
    assert said in built["md"] and said.replace("'", "\u2019") in built["pdf"]
    assert [r[0] for r in latency] == ["chunked", "chunked", "whole", "whole"]
    counts = md_rows(built["md"], "configuration | c | L (tokens) | ok / sent")
    # the timed-out request stays in goodput's denominator: 6 of the 8 sent met the SLOs
    assert counts[1] == ["chunked", "4", "4,096", "7/8", "6", "21 [20, 23]", "2.5 [2.25, 2.75]", "123", "0.5", "75 [37.5, 100]"]
    opened = md_rows(built["md"], "configuration | rate (req/s) | L (tokens)")
    assert opened == [["chunked", "0.5", "4,096", "400", "1.5 [1.4, 1.6]", "4.25 [3.5, 5]", "12.5 [12, 13]", "61.2 [50, 70]", "1.4 [1, 2]"]]
    # the PDF: the same cells (pdftotext reads siunitx's numbers as the twin prints them)
    assert "chunked 4 4,096 7 3.21 [2.9, 3.6] max of 7: 9.87 15 [14, 16] 78.9 [70, 90] 41‡" in built["pdf"]
    assert "chunked 1 4,096 8 1.23 [1.1, 1.4] max of 8: 2.5" in built["pdf"]
    assert "chunked 0.5 4,096 400 1.5 [1.4, 1.6] 4.25 [3.5, 5] 12.5 [12, 13] 61.2 [50, 70] 1.4 [1, 2]" in built["pdf"]
    assert r"\num{3.21} [\num{2.9}, \num{3.6}]" in built["tex"]


def test_a_failed_request_is_a_row_with_its_reason(built):
    rows = md_rows(built["md"], "configuration | workload | L | failed | reason")
    assert rows == [["chunked", "closed, 4 in flight", "4,096", "1 of 8", TIMEOUT]]
    assert f"closed, 4 in flight 4,096 1 of 8 {TIMEOUT}" in built["pdf"]


def test_interference_reconciliation_and_frontier_tables(built):
    inter = md_rows(built["md"], "configuration | L injected")
    assert inter == [["chunked", "8,192", "2", "0.9 [0.85, 1]", "0.8 [0.7, 0.9]", "20.5", "1.1"],
                     ["chunked", "16,384", "2", "1.7 [1.6, 1.8]", "1.6 [1.5, 1.7]", "20.5", "2.2"],
                     ["whole", "16,384", "2", "3.4 [3.2, 3.6]", "3.3 [3.1, 3.5]", "20", "3.5"]]
    # the fixture's fit has no intercept: the model's words without it
    assert "- chunked: time lost ≈ ⌈L / 8,192⌉ × 0.85 [0.8, 0.9] s per chunk (R² 0.998)." in built["md"]
    assert "- whole: no stall model fitted" in built["md"]
    # the flagged gauge, with both numbers
    assert md_rows(built["md"], "configuration | workload | L | t (s)") == [
        ["chunked", "closed, 4 in flight", "4,096", "1.25", "9,000", "16,400–16,520"]]
    assert "chunked: 40 samples checked (gauge `used_tokens`), 1 outside the margin of 10%" in built["md"]
    assert ("whole: 12 samples checked (gauge `used_tokens`), every one within the margin of 10% (none with a lower "
            "bound above 0: a gauge reading 0 would have passed, so the check could catch only a gauge reading too high)") in built["md"]
    assert "none with a lower bound above 0: a gauge reading 0 would have passed" in " ".join(built["pdf"].split())
    assert "chunked closed, 4 in flight 4,096 1.25 9,000 16,400–16,520" in built["pdf"]
    peaks = md_rows(built["md"], "configuration | samples | running")
    # 9 scrapes at each of 2 points; 16,450 / 40,960; retractions rose by 2 in a point; no preemption counter
    assert peaks == [["chunked", "18", "4", "1", "16,450", "0.402", "2", "--"], ["whole", "9", "4", "1", "16,500", "0.403", "2", "--"]]
    front = md_rows(built["md"], "configuration | c | L_max (tokens)")
    assert front == [["chunked", "1", "16,384", "measured", "ttft", "40,960", "4,096, 16,384", "--"],
                     ["chunked", "4", "4,096", "measured", "ttft", "10,240", "4,096", "16,384"],
                     ["whole", "1", "8,192", "model", "pool", "8,192", "4,096", "--"],
                     ["whole", "4", "2,048", "model", "pool", "2,048", "--", "4,096"]]
    assert "chunked 4 4,096 measured ttft 10,240 4,096 16,384" in built["pdf"]
    # the series figure names its point: chunked's closed loop at 4 in flight, the most resident
    assert "chunked: the closed loop at 4 in flight, 4,096 tokens; whole: the closed loop" in built["md"]


def test_what_only_some_points_or_configurations_have_is_said_where_they_have_it(built):
    md = " ".join(built["md"].split())
    assert f"broken: not measured under load: server did not start: {NASTY}." in re.sub(r"\\(.)", r"\1", md)
    assert f"broken: not measured under load: server did not start: {NASTY}." in built["pdf"]
    assert "Time queued at the server (p50, s), where it reports it: chunked at 0.5 req/s, 4,096 tokens: 0.25 [0.2, 0.3]; the others do not say." in md
    view = built["md"].split("### The server's view over time")[1].split("### The SLO frontier")[0]
    assert "chunked" in view and "broken" not in view and "| broken |" not in built["md"]


def test_page_one_says_what_the_frontier_and_the_interference_probe_measured(built):
    """Issue 33: page one takes its findings by weight within five sentences and 150 words (report.summary): the
    frontier outweighs the winners (which the compact table beside it shows) and the interference probe; here the
    scaling, where it stops and the frontier fill the words, and the probe, said in one sentence for both
    configurations, is left to the Load section."""
    from longctx.report.summary import WORDS, _interference

    lead = [s["text"] for s in context(built["inputs"])["diagnosis"]["summary"]]
    assert lead[0].startswith("Prefill: TTFT grows") and FRONTIER in lead and len(lead) <= 5
    assert sum(len(t.split()) for t in lead) <= WORDS
    assert INTERFERENCE not in lead and sum(len(t.split()) for t in lead + [INTERFERENCE]) > WORDS  # the words left out
    assert _interference(json.loads(Path(built["inputs"].load).read_text())) == INTERFERENCE
    for text in (FRONTIER,):
        assert text in " ".join(built["md"].split())
        assert text in built["pdf"]
    summary = built["pdf"][built["pdf"].index("1 Summary"):built["pdf"].index("2 Diagnosis")]
    assert FRONTIER in summary


def _said(load: dict) -> list[str]:
    """Page one's sentences of load alone (no single-request measurement)."""
    from longctx.report.summary import summary

    return [s["text"] for s in summary(pd.DataFrame(), {}, None, {}, [], load)]


def test_one_configuration_and_one_slo_reads_as_one_clause():
    one = {"slo": {"ttft_s": 10, "attainment": 1.0}, "configurations": {"a": {
        "frontier": [{"concurrency": 4, "max_length": 41000, "basis": "measured", "limited_by": "ttft", "pool_bound": 50000}],
        "interference": {"points": [{"length": 16384, "background": 2, "worst_gap": est(3.4, 3, 4), "injected_ttft_s": 3.5,
                                     "chunks": 2, "stalled_share": 3.4 / 3.5, "mean_chunk_s": 1.75}],
                         "fit": {"chunk": 8192, "per_chunk_s": 1.7, "basis": "chunks"}}}}}
    assert _said(one) == ["At 4 concurrent requests, TTFT at most 10 s holds to 41,000 tokens (measured, limited by the TTFT).",
                          "A 16,384-token prompt stalls 2 running streams for 3.4 s (worst gap), the whole of its prefill "
                          "(TTFT 3.5 s: its 2 chunks run back to back, 1.75 s each on average)."]
    # frontiers without a concurrency in common: each at its own highest
    two = {"slo": {"ttft_s": 5}, "configurations": {"a": one["configurations"]["a"], "b": {"frontier": [
        {"concurrency": 2, "max_length": None, "basis": "measured", "limited_by": "ttft"}]}}}
    assert _said(two)[0] == ("TTFT at most 5 s holds to 41,000 tokens in a at 4 concurrent requests (measured, limited by the TTFT) "
                             "and at no length measured in b at 2 concurrent requests (measured, limited by the TTFT).")
    assert _said({"configurations": {"a": {"frontier": [], "interference": {"points": []}}}}) == [] and _said({}) == []


def test_the_load_figures_exist_from_the_data_and_from_none(built, tmp_path):
    names = {p.name for p in built["figures"]}
    assert names == {f"{s}.{ext}" for s in LOAD_FIGURES for ext in FORMATS}
    assert all(p.stat().st_size > 1000 for p in built["figures"])
    for s in LOAD_FIGURES:
        assert f"figures/{s}.png" in built["md"] and f"figures/{s}.pdf" in built["tex"]
    # no load data at all (no file, an empty analysis, a metrics file of its header only): every figure, each saying so
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "load.json").write_text(json.dumps({"slo": {}, "configurations": {}}))
    (empty / "load_metrics.csv").write_text("configuration,kind,level,length,trial,t_s,name,value\n")
    for load_json, metrics_csv in ((None, None), (empty / "load.json", empty / "load_metrics.csv")):
        out = plot_load(load_json, metrics_csv, TEMPLATES / "plot.mplstyle", tmp_path / "figs")
        assert sorted(p.name for p in out) == sorted(names) and all(p.exists() for p in out)
    # a configuration with no interference probe and no frontier: its panels say so, the others draw
    partial = json.loads(json.dumps(LOAD))
    for c in partial["configurations"].values():
        c["frontier"], c["open"] = [], []
    (empty / "partial.json").write_text(json.dumps(partial))
    plot_load(empty / "partial.json", None, TEMPLATES / "plot.mplstyle", tmp_path / "figs2")
    assert (tmp_path / "figs2" / "frontier.png").exists()


def test_the_same_data_gives_the_same_figure_bytes(built, tmp_path):
    plot_load(built["inputs"].load, built["inputs"].load_metrics, TEMPLATES / "plot.mplstyle", tmp_path)
    for ext in FORMATS:
        assert (tmp_path / f"frontier.{ext}").read_bytes() == (built["out"] / "figures" / f"frontier.{ext}").read_bytes()


def test_without_load_data_there_is_no_load_section_and_the_version_covers_the_load_files(tmp_path):
    from longctx.report.context import version_of

    assert {"load", "load_metrics", "whatif"} <= set(DATA_FILES)  # each a part of the version's hash
    paths = write_data(tmp_path / "data")
    ctx = context(load_inputs(paths), template_dir=TEMPLATES)
    assert not ctx["load"]["any"] and "load" in ctx["sections"]["body"]
    env = report.environment(TEMPLATES)
    assert "Under load" not in env.get_template("sections/load.tex.j2").render(**{**ctx, "version": {"n": 1}})
    assert not any("concurrent request" in s["text"] for s in ctx["diagnosis"]["summary"])
    # the version's hash covers load.json: another load analysis is another version
    load_json, metrics_csv = write_load(tmp_path / "data")
    vdir = tmp_path / "versions"
    first = version_of(ctx, load_inputs(paths, load_json, metrics_csv), TEMPLATES, vdir)["hash"]
    changed = json.loads(load_json.read_text())
    changed["configurations"]["chunked"]["frontier"][1]["max_length"] = 2048
    load_json.write_text(json.dumps(changed))
    second = version_of(ctx, load_inputs(paths, load_json, metrics_csv), TEMPLATES, vdir)["hash"]
    metrics_csv.write_text(metrics_csv.read_text().replace("9000", "9001"))
    third = version_of(ctx, load_inputs(paths, load_json, metrics_csv), TEMPLATES, vdir)["hash"]
    assert len({first, second, third}) == 3


def test_the_stall_curve_is_the_analysis_model_with_its_intercept():
    from longctx.report.load import stall_curve

    chunks = {"basis": "chunks", "chunk": 8192, "a_s": 0.1, "per_chunk_s": 0.85, "low": 0.8, "high": 0.9}
    value, (low, high) = stall_curve([4096, 8192, 16384], chunks)
    assert list(value) == pytest.approx([0.95, 0.95, 1.8]) and list(high) == pytest.approx([1.0, 1.0, 1.9])
    linear = {"basis": "linear", "chunk": None, "a_s": 0.05, "per_token_s": 1e-4, "per_chunk_s": None}
    value, _ = stall_curve([10000], linear)
    assert list(value) == pytest.approx([1.05])


def test_the_renderer_gates_a_percentile_its_input_gives_without_the_requests_for_it():
    """Issue 46, item 8: a load.json written before the gate (a p99 of 6 requests with an interval, a p90 of 6 with
    one) is printed as the analysis would print it now: no p99 or p90 value below 100 or 10 requests (their maximum
    instead) and no interval n cannot give; the p50 of 6 keeps its interval at 95%, which 5 cannot give. The words
    follow the level the analysis used: 90% needs 5 requests for the median's interval, not 6."""
    from longctx.report.load import gate, median_min_n, view

    old = {"n": 6, "max": 0.09, "p50": {"value": 0.05, "low": 0.04, "high": 0.07, "n": 6},
           "p90": {"value": 0.08, "low": 0.07, "high": 0.09, "n": 6}, "p99": {"value": 0.089, "low": 0.08, "high": 0.09, "n": 6}}
    g = gate(old, 0.95)
    assert g["p50"]["low"] == 0.04 and g["p90"]["value"] is None and g["p99"]["value"] is None
    assert g["p99"]["max"] == 0.09 and g["p99"]["low"] is None and g["p90"]["high"] is None
    five = gate({**old, "n": 5, "p50": {**old["p50"], "n": 5}}, 0.95)
    assert five["p50"]["value"] == 0.05 and five["p50"]["low"] is None  # 5 requests: no median interval at 95%
    assert (median_min_n(0.95), median_min_n(0.9)) == (6, 5)
    doc = {"settings": {"confidence": 0.9}, "configurations": {"x": {"closed": [
        {"level": 2, "length": 1024, "n": 6, "ok": 6, "ttft": old}]}}}
    v = view(doc)
    (p,) = v["configurations"][0]["closed"]
    assert p["ttft"]["p99"]["value"] is None and (v["level_pct"], v["median_min_n"]) == ("90", 5)
