"""The whole workflow, on a tiny config in a temp directory: real Snakemake, real engine, real TeX."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from longctx.report import FORMATS

from .conftest import ROOT, TINY, copy_workflow

pytestmark = pytest.mark.slow
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def snakemake(cwd, *args, check=True):
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{out[-6000:]}")
    return out


def planned_jobs(cwd) -> dict[str, int]:
    out = snakemake(cwd, "-n", "report/longctx.pdf", "--configfile", "tiny.yaml")
    stats = out.split("Job stats:")[-1] if "Job stats:" in out else ""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M) if m[1] != "total"}


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("wf"))
    shutil.copy(TINY, work / "tiny.yaml")
    snakemake(work, "--cores", "1", "report/longctx.pdf", "--configfile", "tiny.yaml")
    return work


def test_pdf_holds_the_medians_of_results_csv(workflow):
    text = subprocess.run(["pdftotext", "-layout", str(workflow / "report" / "longctx.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    rows = {tuple(line.split()) for line in text.splitlines()}
    df = pd.read_csv(workflow / "data" / "results.csv")
    assert len(df) == 3 * 4 * (2 + 2 * 2) and (df["status"] == "ok").all()  # 2 single trials, 2 batches of 2
    df = df[df["concurrency"] == 1]
    for (configuration, length), g in df.groupby(["configuration", "length"]):
        expected = (configuration, str(length), FORMATS["ttft_ms"](g["ttft_s"].median()),
                    FORMATS["tpot_ms"](g["tpot_s"].median()), FORMATS["decode_tok_s"](g["decode_tok_s"].median()),
                    f"{len(g)}/{len(g)}")
        assert expected in rows, f"row {expected} not in the PDF"
    assert "Provenance" in text and "page1" in text
    assert re.search(r"page16\s+512\s+not applicable", text)  # the needle probe on random weights
    spec = df[df["configuration"] == "page16-ngram"]
    for length, g in spec.groupby("length"):
        expected = ("page16-ngram", str(length), FORMATS["accept_length"](g["spec_accept_length"].median()),
                    FORMATS["accept_rate"](g["spec_accept_rate"].median()).replace("%", ""))
        assert any(r[:3] == expected[:3] for r in rows), f"acceptance row {expected} not in the PDF"
    assert df[df["configuration"] == "page1"]["spec_accept_length"].isna().all()


def test_every_stage_left_its_outputs_and_logs(workflow):
    for path in ("build/kernels/paged_mla_decode_torch/manifest.json", "data/raw/page16/512.json",
                 "data/fits.json", "data/provenance.json", "report/figures/ttft.png", "report/longctx.tex",
                 "data/logs/bench/page1.log", "data/logs/server/page16.log", "data/logs/build_pdf.log",
                 "data/calibration.json", "data/logs/calibrate_hardware.log", "data/planner.json", "data/logs/plan_memory.log",
                 "report/figures/roofline.pdf", "report/figures/planner.png", "data/logs/plot_analysis_figures.log"):
        assert (workflow / path).is_file(), path


def test_up_to_date_tree_has_nothing_to_do(workflow):
    assert planned_jobs(workflow) == {}


def test_template_edit_rerenders_without_measuring(workflow):
    template = workflow / "templates" / "longctx.tex.j2"
    original = template.read_text()
    template.write_text(original + "%# edited\n")
    try:
        assert planned_jobs(workflow) == {"render_report": 1, "build_pdf": 1}
    finally:
        template.write_text(original)


def test_kernel_edit_reruns_its_build_the_configurations_using_it_and_downstream(workflow):
    source = workflow / "kernels" / "reference" / "paged_mla_decode.py"
    original = source.read_text()
    source.write_text(original + "\n# edited\n")
    try:
        assert planned_jobs(workflow) == {
            "build_kernel": 1, "bench_configuration": 3, "aggregate_results": 1, "fit_models": 1, "plan_memory": 1,
            "plot_figures": 1, "plot_analysis_figures": 1, "render_report": 1, "build_pdf": 1,
        }  # the calibration stands: it measures the machine, not the kernel
    finally:
        source.write_text(original)


def test_lint_is_clean():
    out = snakemake(ROOT, "--lint")
    assert "Lints for" not in out, out


def test_the_studys_deployment_config_plans_its_jobs_without_a_gpu(workflow):
    out = snakemake(workflow, "-n", "report/longctx.pdf", "--configfile", "config/examples/kimi-k2.6-rtx-pro-6000.yaml")
    stats = out.split("Job stats:")[-1]
    jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M) if m[1] != "total"}
    assert jobs == {"bench_configuration": 1, "calibrate_hardware": 1, "aggregate_results": 1, "fit_models": 1,
                    "plan_memory": 1, "plot_figures": 1, "plot_analysis_figures": 1, "render_report": 1, "build_pdf": 1}
    assert "data/raw/triton-page1/185000.json" in out


def test_itl_against_depth_is_measured_plotted_and_reported(workflow):
    df = pd.read_csv(workflow / "data" / "itl_depth.csv")
    assert set(df["configuration"]) == {"page1", "page16", "page16-ngram"} and (df["status"] == "ok").all()
    plain = df[df["configuration"] == "page1"]
    assert list(plain["depth"]) == list(range(301, 301 + 59)) and (plain["itl_s"] > 0).all()
    assert (workflow / "report" / "figures" / "itl_depth.png").is_file()
    text = subprocess.run(["pdftotext", "-layout", str(workflow / "report" / "longctx.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    assert "Inter-token latency against KV depth" in text
    assert re.search(r"page1\s+301\s+359\s", text)


def test_batches_of_concurrent_requests_are_measured_and_reported(workflow):
    df = pd.read_csv(workflow / "data" / "results.csv")
    batch = df[(df["configuration"] == "page1") & (df["length"] == 512) & (df["concurrency"] == 2)]
    assert sorted(zip(batch["trial"], batch["request"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (batch["prompt_tokens"] == 512).all() and batch["batch_output_tok_s"].notna().all()
    text = subprocess.run(["pdftotext", "-layout", str(workflow / "report" / "longctx.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    expected = f"{batch['ttft_s'].median() * 1e3:.1f}"
    assert re.search(rf"page1\s+512\s+2\s+4\s+{re.escape(expected)}\s", text), expected


def test_analysis_diagnosis_first_roofline_and_planner_in_the_report(workflow):
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
    text = subprocess.run(["pdftotext", "-layout", str(workflow / "report" / "longctx.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"1\s+Diagnosis", text) and text.index("Diagnosis") < text.index("Summary")
    assert "(Figure 1)" in text and "KV pool holds 4,096 tokens" in text
    for heading in ("Roofline of decode attention", "KV memory planner", "Model and hardware ceilings", "Regime changes"):
        assert heading in text, heading
