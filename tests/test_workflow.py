"""The whole workflow, on a tiny config in a temp directory: real Snakemake, real engine, real TeX."""

import json
import re
import shutil
import subprocess

import pandas as pd
import pytest
import yaml

from longctx import config as lcfg
from longctx.report import plans as plan, latex as report
from longctx.report.context import ReportInputs
from longctx.report.numbers import display

from .conftest import CORES, ROOT, snakemake
from .test_report import md_rows, pdftotext, words

pytestmark = pytest.mark.slow


def planned_jobs(cwd) -> dict[str, int]:
    out = snakemake(cwd, "-n", "report/longctx.pdf", "--configfile", "tiny.yaml")
    stats = out.split("Job stats:")[-1] if "Job stats:" in out else ""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M) if m[1] != "total"}


@pytest.fixture(scope="module")
def workflow(tiny_workflow):
    return tiny_workflow


def test_pdf_holds_the_medians_of_results_csv(workflow):
    text = pdftotext(workflow / "report" / "longctx.pdf")
    rows = {tuple(line.split()) for line in text.splitlines()}
    df = pd.read_csv(workflow / "data" / "results.csv")
    assert len(df) == 3 * 4 * (2 + 2 * 2) and (df["status"] == "ok").all()  # 2 single trials, 2 batches of 2
    df = df[df["concurrency"] == 1]
    for (configuration, length), g in df.groupby(["configuration", "length"]):
        expected = (configuration, display(length, "int"), display(g["ttft_s"].median(), "ttft_ms"),
                    display(g["tpot_s"].median(), "tpot_ms"), display(g["decode_tok_s"].median(), "decode_tok_s"),
                    display(g["e2e_s"].median(), "e2e_s"), f"{len(g)}/{len(g)}")
        assert expected in rows, f"row {expected} not in the PDF"
    assert "Hardware and software" in text and "page1" in text
    # the needle probe on random weights: one row for the configurations whose every length reads the same
    assert re.search(r"every length, 64 to 512\s+not applicable", text)
    needle = (workflow / "report" / "longctx.md").read_text().split("## Needle probe", 1)[1].split("\n## ", 1)[0]
    assert needle.count("| not applicable |") == 1 and "page1, page16" in needle, needle
    spec = df[df["configuration"] == "page16-ngram"]
    for length, g in spec.groupby("length"):
        expected = ("page16-ngram", str(length), display(g["spec_accept_length"].median(), "accept_length"),
                    display(g["spec_accept_rate"].median(), "accept_rate"))
        assert expected in rows, f"acceptance row {expected} not in the PDF"
    assert df[df["configuration"] == "page1"]["spec_accept_length"].isna().all()


def test_two_builds_from_the_same_data_are_byte_identical(workflow, tmp_path):
    """The workflow's PDF, and one built again from its data in another directory: the same bytes."""
    out = tmp_path / "report"
    shutil.copytree(workflow / "report" / "figures", out / "figures")
    data = {k: workflow / "data" / f for k, f in (("results", "results.csv"), ("fits", "fits.json"),
                                                   ("provenance", "provenance.json"), ("itl_depth", "itl_depth.csv"),
                                                   ("planner", "planner.json"), ("load", "load.json"),
                                                   ("load_metrics", "load_metrics.csv"), ("prefix", "prefix_fits.json"),
                                                   ("whatif", "whatif.json"))}
    cfg = lcfg.report_config(lcfg.load(workflow / "tiny.yaml"))  # as the workflow passes it: env values hidden
    record = report.render_report(workflow / "templates" / "longctx.tex.j2", out / "longctx.tex", out / "version.json",
                                  ReportInputs(**data, baseline=lcfg.report_baseline(cfg), config=cfg))
    report.build_pdf(out / "longctx.tex", out / "longctx.pdf", data["provenance"], out / "version.json")
    built = (workflow / "report" / "longctx.pdf").read_bytes()
    assert (out / "longctx.pdf").read_bytes() == built
    kept = json.loads((workflow / "report" / "version.json").read_text())
    assert record["name"] == kept["name"] and kept["n"] == 1
    assert (workflow / "report" / "versions" / f"{kept['name']}.pdf").read_bytes() == built
    assert [e["n"] for e in json.loads((workflow / "report" / "versions" / "log.json").read_text())["versions"]] == [1]
    # the PDF's date is the last measurement's, not the build's
    info = subprocess.run(["pdfinfo", "-isodates", str(out / "longctx.pdf")], capture_output=True, text=True, check=True).stdout
    last = max(c["last_finished_at"] for c in json.loads(data["provenance"].read_text())["configurations"].values())
    assert re.search(r"CreationDate:\s+(\S+)", info)[1] == last.replace("+00:00", "Z")


def test_the_twin_and_a_plans_results_section_carry_the_pdfs_headline_table(workflow):
    text = pdftotext(workflow / "report" / "longctx.pdf")
    pdf_rows = {tuple(line.split()) for line in text.splitlines()}
    twin = md_rows((workflow / "report" / "longctx.md").read_text(), "configuration | L (tokens) | TTFT (ms) | decode (tok/s)")
    assert [r[0] for r in twin] == ["page1"] * 4 + ["page16"] * 4 + ["page16-ngram"] * 4  # the baseline first
    assert all(words(r) in pdf_rows for r in twin), "a headline row of the twin is not in the PDF"
    assert all(r[4:] == ["1.00", "1.00"] for r in twin[:4])  # page1 is the baseline: speedup 1
    plan_path = workflow / "plans" / "kernel.md"
    plan_path.parent.mkdir(exist_ok=True)
    before = b"# Kernel plan\n\n1. Defragment the KV cache.\n2. CUDA graphs.\n"
    plan_path.write_bytes(before)
    snakemake(workflow, "--cores", "1", "-f", "plans/kernel.md", "--configfile", "tiny.yaml")
    after = plan_path.read_bytes()
    assert after.startswith(before + b"\n" + plan.BEGIN.encode()) and after.endswith(plan.END.encode() + b"\n")
    section = after.decode()
    assert md_rows(section, "configuration | L (tokens) | TTFT (ms) | decode (tok/s)") == twin
    kept = json.loads((workflow / "report" / "version.json").read_text())
    assert f"](../report/versions/{kept['name']}.pdf)" in section
    assert (workflow / "plans" / f"../report/versions/{kept['name']}.pdf").is_file()
    # edits outside the section are kept; running again replaces only the section
    edited = after.replace(b"2. CUDA graphs.", b"2. CUDA graphs (edited).") + b"\n## Later\n"
    plan_path.write_bytes(edited.replace(b"| page1 | 64 |", b"| stale | 64 |"))
    snakemake(workflow, "--cores", "1", "-f", "plans/kernel.md", "--configfile", "tiny.yaml")
    assert plan_path.read_bytes() == edited


def test_every_stage_left_its_outputs_and_logs(workflow):
    for path in ("build/kernels/paged_mla_decode_torch/manifest.json", "data/raw/page16/512.json",
                 "data/fits.json", "data/provenance.json", "report/figures/ttft.png", "report/longctx.tex",
                 "report/version.json", "report/longctx.md", "data/logs/bench/page1.log", "data/logs/server/page16.log",
                 "data/logs/build_pdf.log", "data/logs/render_markdown.log",
                 "data/calibration.json", "data/logs/calibrate_hardware.log", "data/planner.json", "data/logs/plan_memory.log",
                 "report/figures/roofline.pdf", "report/figures/planner.png", "data/logs/plot_figures.log",
                 "report/history.json", "report/figures/history.pdf", "report/figures/history.png", "data/logs/plot_history.log"):
        assert (workflow / path).is_file(), path


def test_up_to_date_tree_has_nothing_to_do(workflow):
    assert planned_jobs(workflow) == {}


def test_template_edit_rerenders_without_measuring(workflow):
    template = workflow / "templates" / "longctx.tex.j2"
    original = template.read_text()
    template.write_text(original + "%# edited\n")
    try:
        assert planned_jobs(workflow) == {"render_report": 1, "plot_history": 1, "build_pdf": 1}
    finally:
        template.write_text(original)


def test_plans_named_in_the_config_are_attached_by_the_default_target(workflow):
    """A plan written after the report (newer than it) and named in report.plans: attached at once."""
    (workflow / "plans").mkdir(exist_ok=True)
    (workflow / "plans" / "named.md").write_text("# A plan\n")
    config = (workflow / "tiny.yaml").read_text() + "report: {plans: [plans/named.md]}\n"
    (workflow / "tiny-plans.yaml").write_text(config)
    out = snakemake(workflow, "-n", "--configfile", "tiny-plans.yaml")
    jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[-1], re.M)}
    assert jobs.get("render_plan_section") == 1 and jobs.get("attach_plan") == 1, out[-3000:]
    assert "bench_configuration" not in jobs


@pytest.mark.parametrize("source, configurations", [
    ("kernels/cpu/paged_mla_decode.cpp", ["page16"]),  # the CPU twin: only the configuration running it
    ("kernels/cuda/paged_mla_decode.cu", ["page16"]),
    ("kernels/reference/paged_mla_decode.py", ["page1", "page16-ngram"]),
])
def test_kernel_edit_reruns_its_build_the_configurations_using_it_and_downstream(workflow, source, configurations):
    source = workflow / source
    original = source.read_text()
    source.write_text(original + ("\n# edited\n" if source.suffix == ".py" else "\n// edited\n"))
    try:
        out = snakemake(workflow, "-n", "report/longctx.pdf", "--configfile", "tiny.yaml")
        benched = sorted(set(re.findall(r"wildcards: configuration=([\w.-]+)", out)))
        assert benched == configurations
        # the calibration stands: it measures the machine, not the kernel
        assert planned_jobs(workflow) == {
            "build_kernel": 1, "bench_configuration": len(configurations), "aggregate_results": 1, "fit_models": 1,
            "plan_memory": 1, "plot_figures": 1, "render_report": 1, "plot_history": 1,
            "build_pdf": 1, "aggregate_load": 1, "analyze_load": 1, "whatif": 1,
            "aggregate_prefix": 1, "analyze_prefix": 1,
            **({"bench_kernel": 1} if "page16" in configurations else {}),  # the native kernel, timed alone
        }
    finally:
        source.write_text(original)


def test_lint_is_clean():
    out = snakemake(ROOT, "--lint")
    assert "Lints for" not in out, out


def test_the_studys_deployment_config_plans_its_jobs_without_a_gpu(workflow):
    out = snakemake(workflow, "-n", "report/longctx.pdf", "--configfile", "config/examples/kimi-k2.6-rtx-pro-6000.yaml")
    stats = out.split("Job stats:")[-1]
    jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M) if m[1] != "total"}
    assert jobs == {"build_kernel": 1, "bench_kernel": 1, "bench_configuration": 3, "calibrate_hardware": 1,
                    "aggregate_results": 1, "fit_models": 1, "plan_memory": 1, "plot_figures": 1,
                    "render_report": 1, "plot_history": 1, "build_pdf": 1, "aggregate_load": 1,
                    "analyze_load": 1, "whatif": 1, "aggregate_prefix": 1, "analyze_prefix": 1}
    for configuration in ("triton-page1", "sm120-kernel", "sm120-kernel-defrag"):
        assert f"data/raw/{configuration}/185000.json" in out


def test_itl_against_depth_is_measured_plotted_and_reported(workflow):
    df = pd.read_csv(workflow / "data" / "itl_depth.csv")
    assert set(df["configuration"]) == {"page1", "page16", "page16-ngram"} and (df["status"] == "ok").all()
    plain = df[df["configuration"] == "page1"]
    # a gap is never negative; events the kernel received together share one arrival time (a gap of 0)
    assert list(plain["depth"]) == list(range(301, 301 + 59)) and (plain["itl_s"] >= 0).all()
    assert (plain["itl_s"] > 0).mean() > 0.5
    assert (workflow / "report" / "figures" / "itl_depth.png").is_file()
    text = pdftotext(workflow / "report" / "longctx.pdf")
    assert "Inter-token latency against KV depth" in text
    assert re.search(r"page1\s+301\s+359\s", text)


def test_batches_of_concurrent_requests_are_measured_and_reported(workflow):
    df = pd.read_csv(workflow / "data" / "results.csv")
    batch = df[(df["configuration"] == "page1") & (df["length"] == 512) & (df["concurrency"] == 2)]
    assert sorted(zip(batch["trial"], batch["request"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (batch["prompt_tokens"] == 512).all() and batch["batch_output_tok_s"].notna().all()
    text = pdftotext(workflow / "report" / "longctx.pdf")
    expected = display(batch["ttft_s"].median(), "ttft_ms")
    assert re.search(rf"page1\s+512\s+2\s+4\s+{re.escape(expected)}\s", text), expected


def test_analysis_diagnosis_in_the_summary_roofline_and_planner_in_the_report(workflow):
    import json

    cal = json.loads((workflow / "data" / "calibration.json").read_text())["devices"]
    assert list(cal) == ["cpu"] and cal["cpu"]["status"] == "ok" and cal["cpu"]["copy_bytes"] == 16 * 2**20
    fits = json.loads((workflow / "data" / "fits.json").read_text())["configurations"]
    for name, fit in fits.items():
        assert fit["decode"]["ci"]["t0_s"] and fit["prefill"]["ci"]["a_s"], name
        assert fit["ceilings"]["device"] == "cpu" and fit["ceilings"]["measured"]["bandwidth_Bps"] == cal["cpu"]["copy_Bps"]
        assert [p["length"] for p in fit["roofline"]["points"]] == [64, 128, 256, 512]
        assert fit["extrapolation"]["length"] == 2048  # context-length 2048 < the 4096-token pool
    assert fits["page16-ngram"]["roofline"]["query_tokens"] == 4 and fits["page1"]["roofline"]["query_tokens"] == 1
    planner = json.loads((workflow / "data" / "planner.json").read_text())["configurations"]
    assert {p["check"] for p in planner.values()} == {"match"}  # the rule gives the pool each real server allocated
    text = pdftotext(workflow / "report" / "longctx.pdf")
    flat = " ".join(text.split())
    # page one answers across the configurations (how prefill and decode scale, what bounds each, where it
    # stops being usable), with the overview figure, before the headline table; the diagnosis, per
    # configuration, each sentence naming its figure, is the next section
    summary, headline = flat.index("1 Summary"), flat.index("TTFT speedup")
    diagnosis, prefill = flat.index("2 Diagnosis"), flat.index("3 Prefill")
    answer = flat[summary:headline]
    assert summary < answer.index("Prefill: TTFT grows from") + summary < answer.index("Decode: the rate falls from") + summary < headline
    assert "By the stated criterion (TTFT at most 10 s and decode at least 10 tok/s)" in answer
    # the caption names the dotted verticals exactly where fits.json has a regime change (on 4 lengths and 3 trials
    # a configuration's fit may or may not find one, run to run)
    changes = any((fit.get(kind) or {}).get("regime_change") for fit in fits.values() for kind in ("prefill", "decode"))
    caption = "Figure 1: TTFT and decode rate against L: medians (markers), fits with bootstrap bands (lines)"
    caption += "; dotted: a regime change (Section 5)." if changes else "."
    assert caption in answer
    assert len(re.findall(r"Decode at 512 tokens runs at", flat[diagnosis:prefill])) == 3  # one per configuration
    assert diagnosis < flat.index("KV pool holds 4,096 tokens", diagnosis) < prefill
    assert len(re.findall(r"\(Figure \d+\)", flat[diagnosis:prefill])) >= 6 and "Figure ??" not in flat
    # the kernels' subsection (its heading may sit beside a float, where pdftotext reads it among the figure's labels)
    assert "kernels timed alone" in (workflow / "report" / "longctx.tex").read_text() and "CPU twin over the PyTorch gather" in flat
    md = (workflow / "report" / "longctx.md").read_text()
    assert "KV pool holds 4,096 tokens" in md and "(figures/roofline.png)" in md
    for heading in ("Roofline of decode attention", "KV memory planner", "Model and hardware ceilings", "Regime changes"):
        assert heading in text, heading


def test_the_load_workloads_are_measured_analysed_and_reported(workflow):
    """tiny.yaml's load section on page1 (the others say load: false): every kind in load.json, in the
    PDF's Under load section with the server's view over time and the frontier, on page one too."""
    load = json.loads((workflow / "data" / "load.json").read_text())
    assert set(load["configurations"]) == {"page1"}
    page1 = load["configurations"]["page1"]
    assert [p["level"] for p in page1["closed"]] == [2] and [p["level"] for p in page1["open"]] == [20]
    assert all(p["ok"] == p["n"] for p in page1["closed"] + page1["open"])
    assert [p["length"] for p in page1["interference"]["points"]] == [1024]
    assert page1["frontier"] and page1["reconciliation"]["checked"] > 0
    raw = json.loads((workflow / "data" / "raw" / "page16" / "load.json").read_text())
    assert raw["status"] == "not configured" and raw["workloads"] == []
    series = pd.read_csv(workflow / "data" / "load_metrics.csv")
    assert {"running", "used_tokens"} <= set(series["name"]) and (series["configuration"] == "page1").all()
    text = pdftotext(workflow / "report" / "longctx.pdf")
    for title in ("Under load", "Closed loop: concurrency", "Open loop: arrival rate",
                  "Interference: one long prefill among running decodes", "view over time",
                  "The SLO frontier"):
        assert title in text, title
    # what the probe did is page one's sentence where it fits its 150 words beside the weightier findings (issue 33),
    # and always the Load section's table
    from longctx.report.summary import WORDS, _interference

    said = _interference(json.loads((workflow / "data" / "load.json").read_text()))
    assert said and "1,024-token prompt stalls 2 running streams" in said
    md = (workflow / "report" / "longctx.md").read_text()
    page_one = re.sub(r"\s*\([^()]*\)$", "", md.split("## Summary\n\n", 1)[1].split("\n\n", 1)[0])  # its tail aside
    # on page one, unless the weightier findings there left it too few of the 150 words
    assert said in page_one or len(page_one.split()) + len(said.split()) > WORDS, (said, page_one)
    assert "figures/frontier.png" in md and "figures/interference.png" in md


def test_every_measured_run_has_its_metronome_and_its_drift_in_the_report(workflow):
    """Issue 53, item 7: each measured configuration's bench job writes its metronome's readings (a raw file the
    workflow lists: rules/common.smk raw_names), at the points its run has; aggregation gives each run its drift
    figure; the appendix states it per configuration, and the what-if's check is quoted against it."""
    prov = json.loads((workflow / "data" / "provenance.json").read_text())["configurations"]
    for name, points in (("page1", ["start", "after_sweep", "after_load", "end"]), ("page16", ["start", "end"]),
                         ("page16-ngram", ["start", "end"])):
        raw = json.loads((workflow / "data" / "raw" / name / "metronome.json").read_text())
        assert raw["status"] == "ok" and [r["point"] for r in raw["readings"]] == points, (name, raw["reason"])
        assert all(r["ttft_s"] > 0 and r["probe"]["median_s"] > 0 for r in raw["readings"])
        assert prov[name]["metronome"]["readings"] == raw["readings"]
        assert prov[name]["metronome"]["drift"]["drift"] >= 0
        # the kernel call, where the kernel is native (page16's twin; the others run the PyTorch kernel): the build's
        manifest = json.loads((workflow / "build" / "kernels" / "paged_mla_decode_twin" / "manifest.json").read_text())
        calls = [r.get("kernel") for r in raw["readings"]]
        if name == "page16":
            assert all(c["median_s"] > 0 and c["build_hash"] == manifest["build_hash"] and c["length"] == 4096
                       and c["shape"] == {"heads": 2, "kv_lora_rank": 32, "rope": 16, "dtype": "float32", "batch": 1,
                                          "n_q": 1} for c in calls), calls
            assert "kernel call 1.00 to" in prov[name]["metronome"]["drift"]["words"]
        else:
            assert calls == [None] * len(points), (name, calls)
    # the PDF's words, a word LaTeX broke at a line's end joined again
    text = " ".join(re.sub(r"-\n\s*", "", pdftotext(workflow / "report" / "longctx.pdf")).split())
    md = (workflow / "report" / "longctx.md").read_text()
    assert text.count("Drift the machine moved by up to") == 3, text[-3000:]
    assert md.count("Drift: the machine moved by up to") == 3
    whatif = json.loads((workflow / "data" / "whatif.json").read_text())["configurations"]["page1"]
    words = whatif["drift"]["drift"]["words"]
    assert words.startswith("the machine moved by up to") and words in md
    # page1's load points were each bracketed by the sweep's lone request (load.sweep_twins): the model is set to
    # them, point by point, and read against the drift between the two blocks of each (issue 53, item 7)
    assert whatif["drift"]["anchored"] > 0 and any(r["anchor"] for r in whatif["check"])
    assert not any(r["anchor"] for r in whatif["check"] if r["kind"] == "interference")  # no twins beside a probe
    assert "so that its calibration and its check points are measured seconds apart, alternately, and the machine " \
           "moved by up to" in text


def test_the_reused_context_workloads_are_measured_analysed_and_reported(workflow):
    """tiny.yaml's prefix section on page1 (the others say prefix: false): both hit rates and both
    conversations in prefix.json, every cached count as the engine's page size 1 makes it (by hand: 90% of
    512 is 461 tokens; each turn finds the previous prompt and 7 of its 8 generated tokens), the model
    fitted, the section and its figures in the PDF and the twin."""
    raw = json.loads((workflow / "data" / "raw" / "page1" / "prefix.json").read_text())
    assert raw["status"] == "ok" and (raw["granularity"], raw["cache"]) == (1, True)
    assert [[r["cached_tokens"] for r in p["requests"]] for p in raw["points"]] == [[0, 0], [461, 461]]
    with_cache, control = raw["conversations"]
    assert [t["prompt_tokens"] for t in with_cache["turns"]] == [96, 200, 304]
    assert [t["cached_tokens"] for t in with_cache["turns"]] == [0, 103, 207]
    assert [t["cached_tokens"] for t in control["turns"]] == [0, 0, 0]
    assert json.loads((workflow / "data" / "raw" / "page16" / "prefix.json").read_text())["status"] == "not configured"
    fits = json.loads((workflow / "data" / "prefix_fits.json").read_text())["configurations"]
    checks = fits["page1"]["checks"]
    # every count as expected: the requests that expected a hit matched; those that expected none (h = 0, the first
    # turn, the control's turns) are controls, not matches (issue 32)
    assert set(fits) == {"page1"} and checks["ok"] + checks["controls"] == checks["n"] == 10 and checks["mismatch"] == 0
    assert checks["ok"] == checks["hit_expected"] >= 2
    assert fits["page1"]["model"]["n"] == 12  # 4 hit-rate trials and the 8 cold trials of page1
    # the text without its page numbers (a page break may fall inside a phrase: "cached 17 count")
    text = " ".join(" ".join(line for line in pdftotext(workflow / "report" / "longctx.pdf").splitlines()
                             if not line.strip().isdigit()).split())
    for title in ("Prefix cache and growing conversations", "Growing conversations", "cached count"):
        assert title in text, title
    md = (workflow / "report" / "longctx.md").read_text()
    assert all(f"figures/{f}.png" in md for f in ("prefix_ttft", "prefix_saving", "prefix_conversation"))


def test_imported_results_beside_measured_ones_give_one_report_and_a_changed_file_reruns_only_them(workflow, tmp_path):
    """tests/configs/imported.yaml beside tiny.yaml: the files vLLM's own `vllm bench serve` wrote against a server
    configured as page1 (tests/data/imports/vllm-bench) are imported; nothing is measured again, and the one PDF
    holds both, the tool's figures as it wrote them. A changed file reruns its import and what is downstream, only."""
    work = tmp_path / "wf"
    shutil.copytree(workflow, work, symlinks=True)  # the tiny run's data and Snakemake's records, times kept
    shutil.copytree(ROOT / "tests" / "data" / "imports", work / "imports")
    shutil.copy(ROOT / "tests" / "configs" / "imported.yaml", work / "imported.yaml")
    configs = ("--configfile", "tiny.yaml", "imported.yaml")
    before = json.loads((work / "report" / "version.json").read_text())["n"]
    # the tool's failed requests at 2100 leave that length without a measurement: the run says so, and exits 1
    out = snakemake(work, *CORES, *configs, check=False)
    assert ("longctx: 1 configured length(s) have no successful measurement: vllm-bench L=2100 (3 request(s): Bad Request)"
            in out), out[-3000:]
    ran = set(re.findall(r"^(?:local)?rule (\S+):", out, re.M))
    assert "import_results_vllm-bench" in ran and not ran & {"bench_configuration", "calibrate_hardware", "build_kernel"}, ran
    df = pd.read_csv(work / "data" / "results.csv")
    mine = df[df["configuration"] == "vllm-bench"]
    assert sorted(mine["length"].unique()) == [64, 128, 256, 512, 2100]
    for length in (64, 128, 256, 512):
        doc = json.loads((work / "imports" / "vllm-bench" / f"vllm-bench-{length}.json").read_text())
        rows = mine[mine["length"] == length]
        assert (rows["status"] == "ok").all() and list(rows["ttft_s"]) == pytest.approx(doc["ttfts"], rel=1e-12)
        assert list(rows["prompt_tokens"]) == doc["input_lens"] and (rows["concurrency"] == 1).all()
    failed = mine[mine["length"] == 2100]
    assert len(failed) == 3 and (failed["status"] == "failed").all() and (failed["reason"] == "Bad Request").all()
    assert len(df[df["configuration"] == "page1"]) == 4 * 6  # the measured rows as they were
    text = " ".join(pdftotext(work / "report" / "longctx.pdf").split())
    assert json.loads((work / "report" / "version.json").read_text())["n"] == before + 1
    assert "Imported results" in text and "vllm-bench: vllm bench serve" in text
    assert "0.32.0 (config key tool_version)" in text
    sha = json.loads((work / "data" / "provenance.json").read_text())["configurations"]["vllm-bench"]["imported"]["files"][0]["sha256"]
    assert sha[:12] in text
    assert "Lacks each request's prompt length as the server counted it" in text
    assert "Bad Request" in text  # the tool's failures, in the failures table
    fits = json.loads((work / "data" / "fits.json").read_text())["configurations"]
    assert "prefill" in fits["vllm-bench"] and "decode" in fits["vllm-bench"]
    md = (work / "report" / "longctx.md").read_text()
    assert "## Imported results" in md and sha[:12] in md
    # a changed file: its import reruns, and what reads it; no measurement
    path = work / "imports" / "vllm-bench" / "vllm-bench-64.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "label": "relabelled"}))
    out = snakemake(work, "-n", *configs)
    jobs = {m[1] for m in re.finditer(r"^(\S+)\s+(\d+)$", out.split("Job stats:")[-1], re.M)} - {"total"}
    assert "import_results_vllm-bench" in jobs and {"render_report", "build_pdf"} <= jobs, out[-2000:]
    assert not jobs & {"bench_configuration", "calibrate_hardware", "build_kernel", "bench_kernel"}, jobs


def test_every_report_has_the_prediction_check(workflow):
    """How well the models fitted to the first half of the lengths predicted the longest, per configuration, in the
    PDF and its twin, with the figures fits.json holds."""
    fits = json.loads((workflow / "data" / "fits.json").read_text())["configurations"]
    text = " ".join(pdftotext(workflow / "report" / "longctx.pdf").split())
    md = " ".join((workflow / "report" / "longctx.md").read_text().split())
    assert "Prediction check" in text and "## Prediction check" in md
    for name, fit in fits.items():
        h = fit["prediction"]["prefill"]["headline"]
        assert (h["fitted_up_to"], h["length"]) == (256, 512)  # tiny.yaml's 4 lengths: 3 fitted, the longest predicted
        said = f"{h['length']:,}'s TTFT within {abs(h['deviation']):.0%}"
        assert said in text and said in md, name
    assert (workflow / "report" / "figures" / "prediction.pdf").exists()


@pytest.fixture(scope="module")
def adaptive_workflow(tmp_path_factory):
    """tests/configs/adaptive.yaml (the adaptive sweep on page1) through the whole workflow."""
    from .conftest import copy_workflow

    work = copy_workflow(tmp_path_factory.mktemp("adaptive"))
    shutil.copy(ROOT / "tests" / "configs" / "adaptive.yaml", work / "adaptive.yaml")
    snakemake(work, *CORES, "--configfile", "adaptive.yaml")
    return work


def test_the_adaptive_sweep_chooses_confirms_at_max_and_is_reported(adaptive_workflow):
    work = adaptive_workflow
    raw = work / "data" / "raw" / "page1"
    sweep = json.loads((raw / "sweep.json").read_text())
    path = sweep["path"]
    assert [(p["length"], p["trials"]) for p in path[:3]] == [(64, 3), (128, 3), (256, 3)]
    assert all(p["reason"] and p["spent_s"] > 0 for p in path)
    confirm = [p for p in path if p["phase"] == "confirm"]
    # the confirmation at max, then (if its trial left an interval wider than the target) more trials there, each confirming
    assert confirm and all(p["length"] == 512 and p["trials"] == 1 for p in confirm)
    assert all("more trial(s) at max" in p["reason"] for p in confirm[1:])
    assert sweep["outcome"]["checks"] and sweep["outcome"]["confirmations"] == len(confirm)
    assert sweep["spent_s"] <= 60 + confirm[0]["spent_s"]
    # one raw file per grid length: each holds every trial the sweep chose there, or says it was not chosen
    df = pd.read_csv(work / "data" / "results.csv")
    for L in (64, 128, 256, 512):
        rec = json.loads((raw / f"{L}.json").read_text())
        chose = sum(p["trials"] for p in path if p["length"] == L)
        assert len(rec["trials"]) == chose and len(df[df["length"] == L]) == chose
        assert rec["status"] == ("not chosen" if not chose else "ok")
    # no length counts as partial for having fewer trials than protocol.trials: the sweep chose them
    fits = json.loads((work / "data" / "fits.json").read_text())["configurations"]["page1"]
    assert fits["partial_lengths"]["lengths"] == []
    text = " ".join(pdftotext(work / "report" / "longctx.pdf").split())
    assert "Adaptive sweep" in text and " ".join(path[3]["reason"].split())[:60] in text
    md = (work / "report" / "longctx.md").read_text()
    assert "## Adaptive sweep" in md


def test_the_adaptive_sweep_resumes_without_measuring_again_and_a_kernel_edit_reruns_it(adaptive_workflow, tmp_path):
    work = tmp_path / "wf"
    shutil.copytree(adaptive_workflow, work, symlinks=True)
    before = json.loads((work / "data" / "raw" / "page1" / "sweep.json").read_text())["path"]
    # the measurements lost (as if interrupted before they were written out), their copies in data/partial kept
    shutil.rmtree(work / "data" / "raw" / "page1")
    out = snakemake(work, "data/raw/page1/sweep.json", "--cores", "1", "--configfile", "adaptive.yaml")
    assert "longctx bench: page1: sweep done" in out, out[-2000:]  # the bench job ran again
    after = json.loads((work / "data" / "raw" / "page1" / "sweep.json").read_text())["path"]
    assert [(p["length"], p["trials"], p["reason"]) for p in after] == [(p["length"], p["trials"], p["reason"]) for p in before]
    server_log = work / "data" / "logs" / "server" / "page1.log"  # Snakemake touches a log the job left unwritten
    assert not server_log.exists() or not server_log.read_text()  # every trial reused: no server started
    # the sweep stands (what reads it is newer work to do); a kernel edit reruns the sweep
    assert not {"bench_configuration", "build_kernel", "calibrate_hardware"} & set(planned(work))
    source = work / "kernels" / "reference" / "paged_mla_decode.py"
    source.write_text(source.read_text() + "\n# edited\n")
    jobs = planned(work)
    assert jobs.get("build_kernel") == 1 and jobs.get("bench_configuration") == 1 and "calibrate_hardware" not in jobs


def planned(cwd) -> dict[str, int]:
    out = snakemake(cwd, "-n", "--configfile", "adaptive.yaml")
    stats = out.split("Job stats:")[-1] if "Job stats:" in out else ""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)\s+(\d+)$", stats, re.M) if m[1] != "total"}


def test_the_twin_has_every_section_of_the_pdf(workflow):
    """Issue 33: the default workflow's twin (load, reused context, speculative decoding and every appendix
    section measured or said not to be) has a counterpart of each PDF section."""
    from .test_report import section_lists

    pdf, twin = section_lists(workflow / "report" / "longctx.tex", workflow / "report" / "longctx.md")
    assert set(pdf) == set(twin), (sorted(set(pdf) - set(twin)), sorted(set(twin) - set(pdf)))


def test_no_page_runs_off_its_bottom(workflow):
    """A page whose content is taller than the page (LaTeX's 'Overfull \\vbox ... while \\output is active') loses the
    text below its bottom edge: no reader sees it, and pdftotext does not find it. A longtable set while figures were
    pending did that to the prefix section (235 pt)."""
    log = (workflow / "report" / "build" / "longctx.log").read_text(errors="replace")
    assert "has occurred while \\output is active" not in log


def test_the_reference_engines_load_points_are_predicted(workflow):
    """The tiny workflow's measured load points on the reference engine (a closed loop of 2, an open loop at 20/s,
    an injected 1,024-token prefill into 2 streams), each simulated from the configuration's own fits and rules:
    every point has its rows and its error. The tiny run's fits fail their quality gate (decode steps of a
    millisecond and less, R^2 near 0.2), and the report says the model stands on them; where they pass, so do the
    predictions: the 15% target is met on the default run (docs/analysis.md) and on vLLM's (tests/test_thirdparty.py)."""
    doc = json.loads((workflow / "data" / "whatif.json").read_text())
    c = doc["configurations"]["page1"]
    rows = [r for r in c["check"] if r["which"] == "p50"]
    assert {(r["kind"], r["quantity"]) for r in rows} == {("closed", "ttft"), ("closed", "tpot"), ("open", "ttft"),
                                                          ("open", "tpot"), ("interference", "worst_gap")}
    # every row predicted and checked where it was measured. A TPOT of 0 is a point whose requests each had their 4
    # tokens in one read of the stream (sub-millisecond steps, the client's process descheduled that long on a busy
    # machine: seen once in a suite run): it measured no time between tokens, and is not counted as an error
    assert all(r["predicted"] > 0 and r["measured"] >= 0 for r in rows), rows
    assert all(r["error"] == (r["predicted"] / r["measured"] - 1 if r["measured"] else None) for r in rows), rows
    assert all(r["measured"] > 0 for r in rows if r["quantity"] != "tpot"), rows  # a TTFT or a gap is never 0
    assert c["rules"]["policy"] == "prefill_first" and c["rules"]["one_prefill"] and c["rules"]["chunk"] == 8192
    # the wake probe ran before the open loop (a lead request, then 20 ms and 300 ms of idle, twice), and the serving
    # model carries its figures: the first step after an idle stretch pays what a request after as long an idle paid
    raw = json.loads((workflow / "data" / "raw" / "page1" / "load.json").read_text())
    assert [w["kind"] for w in raw["workloads"]][:3] == ["wake", "closed", "open"]
    assert [r["gap_s"] for r in raw["workloads"][0]["requests"]] == [None, 0.02, 0.3, 0.02, 0.3]
    woke = json.loads((workflow / "data" / "load.json").read_text())["configurations"]["page1"]["wake"]
    assert [(p["gap_s"], p["n"]) for p in woke["points"]] == [(0.02, 2), (0.3, 2)] and woke["points"][0]["extra_s"] == 0
    assert c["costs"]["wake"] == [[p["idle_s"], p["extra_s"]] for p in woke["points"]]
    quality = json.loads((workflow / "data" / "fits.json").read_text())["configurations"]["page1"]["quality"]
    failed = [k for k in ("prefill", "decode") if not quality[k]["usable"]]
    assert c["rules_notes"] == [f"the {k} fit failed its quality gate: the model stands on it" for k in failed]
    md = " ".join((workflow / "report" / "longctx.md").read_text().split())
    assert "## What if: the deployment under load, predicted" in md and "Median absolute error at p50" in md
    assert all(f"The {k} fit failed its quality gate" in md for k in failed)


def test_advise_answers_a_workload_goal_with_the_reference_engines_flags(workflow, tmp_path):
    """`longctx advise` on the tiny run (issue 55): a closed loop of 2 at 128 tokens, an SLO, a search of 3 x 2 settings
    (the rest, mem-fraction-static, around the measured). The answer is in the reference engine's own flags (SGLang's
    names) and within the search, with predicted figures that meet the SLO, each with its interval. Whether the pick is
    the best setting is for a brute-force sweep of the same settings to say (issue 55, still to come). An SLO no setting
    can meet (a TPOT of a microsecond) gets the honest no, exit 0, the SLO binding."""
    import sys

    from .conftest import ENV

    goal = {"context": 2000, "workload": {"concurrency": 2, "prompt": 128, "output": 8},
            "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
            "search": {"max-running-requests": [1, 2, 4], "chunked-prefill-size": [64, 8192]}}

    def advise(goal: dict) -> dict:
        (tmp_path / "goal.yaml").write_text(yaml.safe_dump({"advise": goal}))
        proc = subprocess.run([sys.executable, "-m", "longctx.cli", "advise", "--configfile", "tiny.yaml", "--configfile",
                               str(tmp_path / "goal.yaml"), "--configuration", "page1", "--json"],
                              cwd=workflow, env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["configurations"]["page1"]

    a = advise(goal)
    assert a["feasible"] and a["engine"] == "the reference engine"
    rec = a["recommended"]
    assert set(rec["flags"]) == {"max-running-requests", "chunked-prefill-size", "mem-fraction-static"}
    assert rec["flags"]["max-running-requests"] in (1, 2, 4) and rec["flags"]["chunked-prefill-size"] in (64, 8192)
    assert rec["context_fits"] and a["searched"]["max-running-requests"] == [1, 2, 4]
    for key in ("ttft_s_p50", "tpot_s_p50", "goodput_rps"):  # each with the interval of the model's 24 draws
        p = rec["predicted"][key]
        assert p["value"] > 0 and 0 < p["interval"][0] <= p["interval"][1], (key, p)
    assert rec["predicted"]["ttft_s_p50"]["value"] <= 0.5 and rec["slo"] == {"ttft_s": True, "tpot_s": True}
    assert a["runner_up"] and a["runner_up"]["flags"] != rec["flags"]
    # the Snakemake target keeps the same answer, and asks for nothing else to run
    out = snakemake(workflow, *CORES, "report/advice.json", "--configfile", "tiny.yaml", str(tmp_path / "goal.yaml"))
    assert re.search(r"^advise\s+1$", out, re.M) and re.search(r"^total\s+1$", out, re.M), out[-2000:]
    kept = json.loads((workflow / "report" / "advice.json").read_text())["configurations"]["page1"]
    assert kept["recommended"] == rec and kept["runner_up"] == a["runner_up"]
    no = advise({**goal, "slo": {"tpot_s": 1e-6}})
    assert not no["feasible"] and no["recommended"] is None and no["binding"].startswith("the SLO: tpot_s"), no["binding"]
    assert set(no["nearest"]["flags"]) == set(rec["flags"])
    # with the goal in the config the report says it (in a copy: the module's other tests read this run's report): the
    # flags to restart with and the runner-up, each predicted figure with its interval, what the pick changes against
    # the setting measured; the PDF and its twin alike
    work = tmp_path / "with-goal"
    shutil.copytree(workflow, work, symlinks=True)
    (tmp_path / "goal.yaml").write_text(yaml.safe_dump({"advise": goal}))  # the goal the pick answers (not the no's)
    snakemake(work, *CORES, "report/longctx.pdf", "report/longctx.md", "--configfile", "tiny.yaml", str(tmp_path / "goal.yaml"))
    said = lambda flags: " ".join(f"--{k} {v:g}" for k, v in flags.items())  # noqa: E731
    md = (work / "report" / "longctx.md").read_text()
    section = md[md.index("## Which flags to restart with"):]
    section = section[:section.index("\n## ", 1)]
    assert f"**page1.** Restart the reference engine with `{said(rec['flags'])}`." in section, section
    assert f"The runner-up: `{said(a['runner_up']['flags'])}`." in section
    for what, key in (("TTFT p50 \\(s\\)", "ttft_s_p50"), ("goodput \\(req/s\\)", "goodput_rps")):
        row = re.search(rf"\| {what} \| ([\d.e-]+) \| \[([\d.e-]+), ([\d.e-]+)\] \|", section)
        p = rec["predicted"][key]
        assert row and [float(x) for x in row.groups()] == pytest.approx([p["value"], *p["interval"]], rel=0.01), section
    moved = [f"| --{k} | {kept['measured'][k]:g} | {v:g} |" for k, v in rec["flags"].items() if kept["measured"][k] != v]
    assert all(m in section for m in moved) and ("against the setting measured" in section) == bool(moved), section
    pdf = " ".join(pdftotext(work / "report" / "longctx.pdf").split())
    assert "Which flags to restart with" in pdf and f"Restart the reference engine with {said(rec['flags'])}" in pdf, pdf[-3000:]
    assert "Not verified yet" in section

    # one run proves it: --verify restarts page1's server with the flags (a configuration that verifies it, in a file
    # that names the flags and nothing else of page1's: its environment holds tests/test_secrets.py's marker), measures
    # the goal's workload and a request at the goal's context, and the advice says predicted against measured; the
    # run is a version like any other, and page1's own measurements are not taken again
    page1_raw = (work / "data" / "raw" / "page1" / "128.json").read_bytes()
    versions = len(json.loads((work / "report" / "versions" / "log.json").read_text())["versions"])
    proc = subprocess.run([sys.executable, "-m", "longctx.cli", "advise", "--verify", "--configuration", "page1",
                           "--configfile", "tiny.yaml", "--configfile", str(tmp_path / "goal.yaml"), "--cores", "2",
                           "--out", "verified.json"], cwd=work, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    written = (work / "advise-verify.yaml").read_text()
    assert "mk-7f3e91c2" not in written and yaml.safe_load(written)["configurations"] == {"page1-advised": {
        "verifies": "page1", "args": rec["flags"], "description": "page1 restarted with the advised flags (verifies its advice)"}}
    assert (work / "data" / "raw" / "page1" / "128.json").read_bytes() == page1_raw
    doc = json.loads((work / "verified.json").read_text())
    assert "page1-advised" not in doc["configurations"]  # a verifying run is not advised in turn
    v = doc["configurations"]["page1"]["verified"]
    assert doc["configurations"]["page1"]["recommended"] == rec  # the same advice: page1's data did not change
    assert v["configuration"] == "page1-advised" and v["flags_match"]
    # third-party truth: the pool the reference engine allocated at the flags (its log), against the planner's
    provenance = json.loads((work / "data" / "provenance.json").read_text())["configurations"]["page1-advised"]
    assert provenance["verifies"] == "page1" and provenance["args"]["max-running-requests"] == rec["flags"]["max-running-requests"]
    assert v["pool"]["measured"] == provenance["kv_pool"]["tokens"] and v["pool"]["predicted"] == rec["pool_tokens"]
    assert v["context"] == {"length": 2000 - 8, "fits": True, "reason": None}  # tiny.yaml's 8 output tokens
    figures = {f["key"]: f for f in v["figures"]}
    assert set(figures) == {"ttft_s_p50", "tpot_s_p50", "goodput_rps"}
    load = json.loads((work / "data" / "load.json").read_text())["configurations"]["page1-advised"]
    (point,) = [p for p in load["closed"] if p["level"] == 2 and p["length"] == 128]
    assert figures["ttft_s_p50"]["measured"]["value"] == point["ttft"]["p50"]["value"]
    for f in figures.values():  # each figure against the prediction: the error, and whether it held
        assert f["error"] == pytest.approx(f["predicted"]["value"] / f["measured"]["value"] - 1)
    assert v["slo_held"] == (figures["ttft_s_p50"]["measured"]["value"] <= 0.5 and figures["tpot_s_p50"]["measured"]["value"] <= 0.05)
    assert v["missed"] == ([] if v["pool"]["held"] else ["pool_tokens"]) + [k for k, f in figures.items() if f["held"] is False]
    # a figure that missed is read against the drift between page1's run and this one (both runs' metronomes)
    assert v["drift"] is not None and v["drift"]["drift"] >= 0 and "between the two runs" in v["drift"]["words"]
    assert v["inconclusive"] == [k for k, f in figures.items() if f["held"] is None and f.get("inconclusive")]
    assert v["proven"] == (not v["missed"] and not v["inconclusive"])
    log = json.loads((work / "report" / "versions" / "log.json").read_text())["versions"]
    assert len(log) == versions + 1
    md = (work / "report" / "longctx.md").read_text()
    assert "**Verified by one run** (configuration page1-advised, the same server restarted with these flags): " + (
        "proven" if v["proven"] else "unproven" if v["missed"] else "inconclusive") in md, md[md.index("## Which flags"):][:3000]
