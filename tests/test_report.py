"""The report without the workflow: headline table, versions, plan attachment, bands, template errors,
and one real PDF (matplotlib, Jinja, latexmk) and its Markdown twin from synthetic data."""

from __future__ import annotations

import itertools
import json
import re
import statistics
import shutil
import subprocess

import matplotlib
import numpy as np
import pandas as pd
import pytest

from longctx.analysis import bands
from longctx.report import changes, markdown, plans as plan, latex as report, versions
from longctx.report.context import ReportError, context, version_of
from longctx.report.numbers import display, group
from longctx.report.figures.style import length_axis, spans_decades

from .conftest import ROOT
from .report_data import LAWS, NASTY, PARTIAL_REASON, build_report, config, inputs, write_data

TEMPLATES = ROOT / "templates"
LENGTHS = (1000, 4000, 16000, 64000)


def pdftotext(pdf) -> str:
    return subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout


def md_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header starts with first_header, cells unescaped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([re.sub(r"\\(.)", r"\1", c.strip()) for c in cells])
    return rows


def test_numbers_group_as_siunitx_does():
    assert [group(s) for s in ("1234.5", "-12345", "+1234.0", "123", "1.23e-05", "1000000")] == [
        "1,234.5", "-12,345", "+1,234.0", "123", "1.23e-05", "1,000,000"]
    assert display(2.9405, "ttft_ms") == "2,940.5" and display(None, "ttft_ms") == "--"
    assert display(float("nan"), "speedup") == "--" and display(float("inf"), "speedup") == "--"


def test_headline_speedups_are_against_the_baseline(tmp_path):
    paths = write_data(tmp_path)
    df = pd.read_csv(paths["results_csv"])
    ok = df[df["status"].eq("ok") & df["concurrency"].eq(1)]
    # the speedup is the ratio of the trials' geometric means (longctx.analysis.compare), computed here by hand
    med = ok.groupby(["configuration", "length"])[["ttft_s", "decode_tok_s"]].agg(statistics.geometric_mean)
    h = context(inputs(paths, baseline="base", config=config()))["headline"]
    assert h["baseline"] == "base" and [r["configuration"] for r in h["rows"]][:len(LENGTHS)] == ["base"] * len(LENGTHS)
    rows = {(r["configuration"], r["length"]): r for r in h["rows"]}
    for L in LENGTHS:
        base, fast = med.loc[("base", L)], med.loc[("fast_kv", L)]
        assert rows[("base", L)]["ttft_speedup"] == 1 and rows[("base", L)]["decode_speedup"] == 1
        assert rows[("fast_kv", L)]["ttft_speedup"] == pytest.approx(base["ttft_s"] / fast["ttft_s"])
        assert rows[("fast_kv", L)]["decode_speedup"] == pytest.approx(fast["decode_tok_s"] / base["decode_tok_s"])
    (_, _, _, t0, beta), (*_, beta_fast) = LAWS["base"], LAWS["fast_kv"]
    assert rows[("fast_kv", 64000)]["decode_speedup"] == pytest.approx((t0 + beta * 64000) / (t0 + beta_fast * 64000), rel=0.05)
    # without report.baseline: the first configuration listed in the config
    h = context(inputs(paths, config=config(("fast_kv", "base"))))["headline"]
    assert h["baseline"] == "fast_kv" and h["rows"][0]["configuration"] == "fast_kv"


def _build_version(tmp_path, paths, vdir, templates=TEMPLATES):
    ctx = context(inputs(paths, config=config()), template_dir=templates)
    record = version_of(ctx, inputs(paths, config=config()), templates, vdir)
    pdf = tmp_path / "fake.pdf"
    pdf.write_bytes(b"%PDF-1.5 " + record["hash"].encode())  # register copies any file; the PDF itself is tested below
    versions.register(vdir, record, pdf)
    return record, ctx


def test_versions_count_up_a_rebuild_is_the_same_version_and_the_previous_is_compared(tmp_path):
    vdir = tmp_path / "versions"
    d1, d2 = write_data(tmp_path / "d1"), write_data(tmp_path / "d2", scale=0.5)
    r1, _ = _build_version(tmp_path, d1, vdir)
    assert (r1["n"], r1["previous"]) == (1, None) and re.fullmatch(r"longctx-v1-[0-9a-f]{12}", r1["name"])
    assert _build_version(tmp_path, d1, vdir)[0]["name"] == r1["name"]  # same inputs, same version
    r2, ctx2 = _build_version(tmp_path, d2, vdir)
    assert r2["n"] == 2 and r2["previous"]["hash"] == r1["hash"]
    assert [e["n"] for e in versions.read_log(vdir)] == [1, 2]
    assert (vdir / f"{r1['name']}.pdf").read_bytes().endswith(r1["hash"].encode())
    # each version keeps every successful trial, and v2 is compared with v1 (the previous) trial by trial
    kept = json.loads((vdir / f"{r1['name']}.json").read_text())["measurements"]["trials"]
    df1 = pd.read_csv(d1["results_csv"])
    ok1 = df1[df1["status"].eq("ok")]
    assert len(kept) == len(ok1) and sorted(t["ttft_s"] for t in kept) == sorted(ok1["ttft_s"])
    cmp = changes.compare(*[json.loads((vdir / f"{r['name']}.json").read_text()) for r in (r1, r2)])
    row = next(r for r in cmp["rows"] if (r["configuration"], r["length"]) == ("base", 64000))
    # same noise (the same seed), half the time: the ratios of geometric means are exactly 0.5 and 2
    assert row["ttft"]["ratio"] == pytest.approx(0.5) and row["decode"]["ratio"] == pytest.approx(2.0)
    assert row["ttft"]["verdict"] == "faster" and row["ttft"]["beyond_margin"] and not cmp["regressions"]
    assert len(cmp["rows"]) == len(LAWS) * len(LENGTHS) and not cmp["only_now"] and not cmp["lengths_only_now"]
    # a template edit is a new version as well
    edited = tmp_path / "templates"
    shutil.copytree(TEMPLATES, edited)
    (edited / "sections" / "failures.tex.j2").write_text((edited / "sections" / "failures.tex.j2").read_text() + "%# edit\n")
    assert _build_version(tmp_path, d2, vdir, edited)[0]["n"] == 3


PLAN = "# Kernel plan\r\n\r\nStep 1 \u2014 defragment the KV cache.\r\n\r\n## Notes\r\nkeep \xff this".encode("utf-8", "surrogateescape")


def test_plan_section_is_inserted_then_only_it_is_replaced(tmp_path):
    p = tmp_path / "plan.md"
    p.write_bytes(PLAN)
    plan.attach(p, "## Results\n\nv1 table\n")
    first = p.read_bytes()
    assert first.startswith(PLAN) and first.count(plan.BEGIN.encode()) == 1
    assert b"\r\n## Results\r\n\r\nv1 table\r\n" + plan.END.encode() in first  # the plan's own line endings
    edited = first + b"\r\n## Written after the results\r\nkeep this too\r\n"
    p.write_bytes(edited)
    plan.attach(p, "## Results\n\nv2 table\n")
    assert p.read_bytes() == edited.replace(b"v1 table", b"v2 table")
    plan.attach(p, "## Results\n\nv2 table\n")
    assert p.read_bytes() == edited.replace(b"v1 table", b"v2 table")
    p.write_text(f"# P\n\n{plan.BEGIN}\nhalf a section\n")
    with pytest.raises(plan.PlanError, match=r"plan\.md line 3: .*without its end marker"):
        plan.attach(p, "x")
    new = tmp_path / "new" / "plan.md"
    plan.attach(new, "## Results\n")
    assert new.read_text().startswith("# plan\n\n" + plan.BEGIN)


def test_bands_are_the_bootstrap_intervals_fits_json_carries(tmp_path):
    from longctx.analysis.fits import fit_all
    from longctx.core.fitting import Fit

    rng = np.random.default_rng(1)
    L = np.repeat(np.geomspace(1e3, 1.3e5, 8), 3)
    y = 0.05 + 3e-5 * L + 5e-10 * L**2
    df = pd.DataFrame({"configuration": "c", "length": L, "status": "ok", "concurrency": 1,
                       "ttft_s": y * (1 + rng.normal(0, 0.05, len(L))), "tpot_s": np.nan})
    analysis = fit_all(df, settings={"bootstrap": 300})
    fit = analysis["configurations"]["c"]
    knots = np.asarray(fit["curves"]["length"])
    lo, hi = bands.band(fit, "prefill", knots[[5, 30]])  # at the grid: the bootstrap's own percentiles
    ref = Fit("prefill", df["length"], df["ttft_s"], 300)
    rlo, rhi = ref.curve_interval(knots[[5, 30]])
    assert lo == pytest.approx(rlo) and hi == pytest.approx(rhi) and (lo < hi).all()
    mid = np.sqrt(knots[10] * knots[11])  # between grid lengths: interpolated on log L
    (m_lo,), (m_hi,) = bands.band(fit, "prefill", [mid])
    assert min(fit["curves"]["prefill"]["lo"][10:12]) <= m_lo <= max(fit["curves"]["prefill"]["lo"][10:12]) < m_hi
    outside = bands.band(fit, "prefill", [0.0, knots[-1] * 2])
    assert np.isnan(outside[0]).all() and np.isnan(outside[1]).all()  # no band where the fit has no interval
    assert bands.band(fit, "decode", knots) is None  # no decode fit
    assert bands.describe(analysis, "prefill") == "the fit's 95% bootstrap interval (300 resamples)"
    assert bands.describe(analysis, "decode") == "no fit, no band"
    none = fit_all(df, settings={"bootstrap": 0})
    assert bands.band(none["configurations"]["c"], "prefill", knots) is None
    assert bands.describe(none, "prefill").startswith("no band")


def test_plot_style_reads_in_grayscale_and_lengths_over_decades_get_log_axes():
    rc = matplotlib.rc_params_from_file(str(TEMPLATES / "plot.mplstyle"), use_default_template=False)
    cycle = rc["axes.prop_cycle"].by_key()
    pairs = list(zip(cycle["linestyle"], cycle["marker"]))
    assert len(set(pairs)) == len(pairs)  # each configuration told apart without colour
    gray = [np.dot(matplotlib.colors.to_rgb(c), [0.299, 0.587, 0.114]) for c in cycle["color"][:4]]
    assert min(abs(a - b) for a, b in itertools.combinations(gray, 2)) >= 0.12, gray
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2)
    length_axis(a, [1000, 185000])
    length_axis(b, [64, 512])
    assert (a.get_xscale(), b.get_xscale()) == ("log", "linear") and spans_decades([1, 10]) and not spans_decades([2, 19])
    plt.close(fig)


def _break(tmp_path, section: str, line: int, text: str):
    t = tmp_path / "templates"
    shutil.copytree(TEMPLATES, t)
    path = t / "sections" / section
    lines = path.read_text().splitlines()
    lines.insert(line - 1, text)
    path.write_text("\n".join(lines) + "\n")
    return t


@pytest.mark.parametrize("text, what", [(r"\BLOCK{if}", "Expected an expression"),
                                        (r"\VAR{no_such_value}", "'no_such_value' is undefined")])
def test_a_broken_template_fails_naming_the_template_and_line(tmp_path, text, what):
    paths = write_data(tmp_path / "data")
    t = _break(tmp_path, "prefill.tex.j2", 4, text)
    with pytest.raises(ReportError) as err:
        report.render_report(t / "longctx.tex.j2", tmp_path / "r" / "longctx.tex", tmp_path / "r" / "version.json",
                             inputs(paths, config=config()))
    assert "sections/prefill.tex.j2 line 4:" in str(err.value) and what in str(err.value)


def test_latex_error_is_traced_to_the_template_line(tmp_path):
    paths = write_data(tmp_path / "data")
    t = _break(tmp_path, "summary.tex.j2", 2, r"Measured \nosuchmacro{} here.")
    out = tmp_path / "r"
    report.render_report(t / "longctx.tex.j2", out / "longctx.tex", out / "version.json", inputs(paths, config=config()))
    with pytest.raises(ReportError) as err:
        report.build_pdf(out / "longctx.tex", out / "longctx.pdf", paths["provenance_json"])
    assert "sections/summary.tex.j2 line 2" in str(err.value) and "Undefined control sequence" in str(err.value)


PARTIAL = {("fast_kv", 64000): (1, 1.4)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One real report from synthetic data: figures, .tex, PDF, Markdown twin and a plan section; fast_kv's
    longest length is partial (PARTIAL: 1 of its 3 trials succeeded, 1.4 times slower than the law)."""
    root = tmp_path_factory.mktemp("built")
    paths = write_data(root / "data", partial=PARTIAL)
    out = root / "report"
    build_report(paths, out, inputs(paths, config=config()))
    section = markdown.plan_section(TEMPLATES / "plan.md.j2", root / "plans" / "p.md", out / "version.json",
                                    inputs(paths, config=config()))
    return {"out": out, "text": pdftotext(out / "longctx.pdf"), "md": (out / "longctx.md").read_text(), "section": section,
            "paths": paths}


def test_every_string_is_escaped_and_secrets_are_not_printed(built):
    flat = " ".join(built["text"].split())
    assert f"timeout: {NASTY}" in flat  # a failure's reason
    assert f"base: {NASTY}" in flat  # a configuration's description
    assert "hf_secret_value" not in flat and "HF_TOKEN: (hidden)" in flat
    failures = md_rows(built["md"], "configuration | L | lost | reason")
    assert failures == [["base", "64,000", "1 of 4", f"timeout: {NASTY}"],  # three trials ok, a fourth failed
                        ["fast_kv", "64,000", "2 of 3", PARTIAL_REASON]]  # the partial length


def words(row: list[str]) -> tuple[str, ...]:
    """A table row's words, as pdftotext lays them out (a speedup's cell has its interval: several words)."""
    return tuple(w for cell in row for w in cell.split())


def test_the_twin_and_the_plan_section_carry_the_pdfs_headline_table(built):
    pdf_rows = {tuple(line.split()) for line in built["text"].splitlines()}
    twin = md_rows(built["md"], "configuration | L (tokens) | TTFT (ms) | decode (tok/s)")
    assert len(twin) == len(LAWS) * len(LENGTHS)
    for row in twin:
        assert words(row) in pdf_rows, f"headline row {row} not in the PDF"
    assert md_rows(built["section"], "configuration | L (tokens) | TTFT (ms) | decode (tok/s)") == twin
    assert "2,9" in " ".join(c for r in twin for c in r)  # TTFT at 64k: thousands grouped alike in both
    link = re.search(r"\]\((\S+\.pdf)\)", built["section"])[1]
    assert link.startswith("../report/versions/longctx-v1-")


def test_a_speedup_whose_interval_includes_1_reads_as_no_difference_in_the_pdf_and_the_twin(built):
    """fast_kv's TTFT law differs from base's only in c (half): at 1,000 tokens the speedup is 1.005 under 2%
    noise, no measurable difference (≈); its decode reads the KV cache 4 times faster: at 16,000 tokens about 1.2
    times the rate (2.64 ms a step against 2.16), faster (no mark), with an interval about it; at 64,000 tokens fast_kv has 1 trial
    (PARTIAL), too few for an interval."""
    ctx = context(inputs(built["paths"], config=config()))
    rows = {(r["configuration"], r["length"]): r for r in ctx["headline"]["rows"]}
    assert rows[("fast_kv", 1000)]["ttft_verdict"] == "no measurable difference"
    assert rows[("fast_kv", 16000)]["decode_verdict"] == "faster" and 1.1 < rows[("fast_kv", 16000)]["decode_speedup_ci"][0]
    assert rows[("fast_kv", 64000)]["ttft_verdict"] == "no interval" and rows[("fast_kv", 64000)]["ttft_speedup_ci"] is None
    assert all(rows[("base", L)]["ttft_verdict"] is None for L in LENGTHS)
    cells = {(r[0], r[1].rstrip("†")): r[4:] for r in md_rows(built["md"], "configuration | L (tokens) | TTFT (ms) | decode (tok/s)")}
    assert re.fullmatch(r"≈1\.0\d \[0\.\d\d, 1\.\d\d\] n=\d/\d", cells[("fast_kv", "1,000")][0])
    assert re.fullmatch(r"1\.[12]\d \[1\.[01]\d, 1\.[23]\d\] n=3/3", cells[("fast_kv", "16,000")][1])
    assert cells[("fast_kv", "64,000")][0].endswith(" (no interval, n=1/3)") and cells[("base", "1,000")] == ["1.00", "1.00"]
    # the PDF: the same cells (pdftotext), the mark typeset as math in the .tex, and the caption in both
    flat = " ".join(built["text"].split())
    assert re.search(r"fast_kv 1,000 \S+ \S+ " + re.escape(cells[("fast_kv", "1,000")][0]), flat)
    assert r"$\approx$\num{" in (built["out"] / "longctx.tex").read_text()
    said = "≈ marks a speedup whose interval includes 1: no measurable difference from the baseline, neither a gain nor a loss."
    assert said in flat and "In brackets: its 95% interval (Welch’s t interval of the difference of the two sides’ mean log values" in flat
    assert "“(no interval)”: fewer than 3 successful trials on a side" in flat
    for md in (built["md"], built["section"]):
        text = " ".join(md.split())
        assert said in text and '"(no interval)": fewer than 3 successful trials on a side' in text


def test_the_twin_and_the_plan_section_carry_the_pdfs_diagnosis(built):
    """Page one's sentences (at most five) in the PDF's summary, the twin's and the plan's; every other
    sentence once, under its configuration, in the PDF's Diagnosis section and in the twin, each with its figure."""
    ctx = context(inputs(built["paths"]))
    d = ctx["diagnosis"]
    lead = [i["text"] for i in d["summary"]]
    items = [i for g in d["configurations"] for i in g["items"]] + d["planner"]
    sentences = [i["text"] for i in items]
    assert 3 <= len(lead) <= 5 and lead[0].startswith("Prefill: TTFT grows") and lead[1].startswith("Decode: the rate falls")
    assert any("KV reads" in s for s in sentences) and any("KV pool holds" in s for s in sentences)
    assert len(set(sentences)) == len(sentences)  # without repeats
    pdf = " ".join(built["text"].split())
    twin = [re.sub(r"\\(.)", r"\1", line[2:]) for line in built["md"].splitlines() if line.startswith("- ")]
    md = " ".join(re.sub(r"\\(.)", r"\1", built["md"]).split())
    plan = " ".join(re.sub(r"\\(.)", r"\1", built["section"]).split())
    summary, full = pdf[pdf.index("1 Summary"):pdf.index("2 Diagnosis")], pdf[pdf.index("2 Diagnosis"):pdf.index("3 Prefill")]
    for s in lead:
        flat = " ".join(s.split())
        assert flat[:60] in summary and flat[:60] not in full, s
        assert flat in md and flat in plan, s
    for i in items:
        s = i["text"]
        assert " ".join(s.split())[:60] in full, s
        shown = s + (f" ([figure: {i['figure']}](figures/{i['figure']}.png))" if i["figure"] else "")
        assert shown in twin, s
        # the plan carries page one's answer and the table, not the diagnosis
        assert " ".join(s.split())[:60] not in plan or "fewer successful trials" in s, s
    assert re.search(r"\(Figure \d+\)", full)
    for g in d["configurations"]:  # grouped under each configuration's name
        assert f"{g['name']} " in full and f"**{g['name']}**" in md


def test_the_twin_links_its_figures_and_the_pdf_version(built):
    out = built["out"]
    for target in re.findall(r"\]\(([^)]+)\)", built["md"]):
        assert (out / target).is_file(), target
    for figure in ("ttft", "decode_rate", "step_time", "roofline", "residuals", "extrapolation", "planner"):
        assert f"figures/{figure}.png" in built["md"], figure
    text = built["text"]
    assert "longctx report v1" in text and "the first version" in text
    assert re.search(r"Change since an earlier version\s+This is the first version", text)


@pytest.mark.parametrize("flush_paths, protocol_flush, said", [
    ({}, True, "a prompt prefix unique to each request, the prefix cache flushed before each."),  # records before flush_path
    ({"base": "/flush_cache", "fast_kv": None}, True,
     "the prefix cache flushed before each on base; on fast_kv no flush (the server offers no flush endpoint): unique prefixes only."),
    ({"base": None, "fast_kv": None}, True, "no cache flush (the servers offer no flush endpoint): unique prefixes only."),
    ({"base": "/flush_cache", "fast_kv": "/flush_cache"}, False, "no cache flush (protocol.flush_cache is off): unique prefixes only."),
])
def test_the_report_says_which_caches_were_flushed(tmp_path, flush_paths, protocol_flush, said):
    """A server without a flush endpoint (the OpenAI API has none) is not said to have been flushed."""
    paths = write_data(tmp_path / "data")
    prov = json.loads(paths["provenance_json"].read_text())
    for name, entry in prov["configurations"].items():
        entry["protocol"]["flush_cache"] = protocol_flush
        if name in flush_paths:
            entry["flush_path"] = flush_paths[name]
    paths["provenance_json"].write_text(json.dumps(prov))
    report.render_report(TEMPLATES / "longctx.tex.j2", tmp_path / "longctx.tex", tmp_path / "version.json", inputs(paths, config=config()))
    tex = " ".join((tmp_path / "longctx.tex").read_text().split()).replace("fast\\_kv", "fast_kv").replace("protocol.flush\\_cache", "protocol.flush_cache")
    assert said in tex
    if flush_paths.get("fast_kv", "") is None or not protocol_flush:
        assert "flushed before each." not in tex


# --- engine-neutral words (issue 15, item 4) and the model as served (item 1) -----------------------
# Reports made by the report rules' commands from raw files as the sweep writes them: (a) a stock
# OpenAI-compatible server on this machine's CPU serving a GQA Llama-like model, (b) the reference
# engine as config/longctx.yaml runs it (MLA, SGLang's flags and sizing rule).
# Where "GPU" may stand in a CPU-only report: the machine has none, and the sources say so.
NO_GPU_PHRASES = ("Test CPU, no GPU", "psutil, no GPU telemetry", "GPUs none (NVML found no GPU)",
                  "No configuration computes on a GPU, and only GPUs have datasheet figures",
                  "GPM counters not read: no configuration's telemetry watches a GPU")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from .report_data import external_cpu_gqa, reference_default, run_report_chain

    out = {}
    # the reference engine listening on every address (server.host 0.0.0.0 with server.allow_remote): the report says so
    for case, make in (("external", external_cpu_gqa), ("reference", lambda d: reference_default(d, listen="0.0.0.0"))):
        root = tmp_path_factory.mktemp(case)
        paths = run_report_chain(root / "data", root / "report", make(root / "data"))
        out[case] = {"pdf": " ".join(pdftotext(paths["pdf"]).replace("\u2019", "'").split()),
                     "md": " ".join(re.sub(r"\\(.)", r"\1", paths["md"].read_text()).split()),
                     "sections": section_lists(paths["pdf"].with_suffix(".tex"), paths["md"]),
                     "page_one_words": page_one_words(paths["pdf"]), "pdf_path": paths["pdf"],
                     "page_one": " ".join(page_one(paths["pdf"]).replace("\u2019", "'").split())}
    return out


def section_lists(tex: Path, md: Path) -> tuple[list[str], list[str]]:
    """The PDF's sections (the \\section titles of its .tex) and the twin's (its level-two headings)."""
    pdf = re.findall(r"^\\section\*?\{([^}]*)\}", tex.read_text(), re.M)
    twin = re.findall(r"^## (.+)$", md.read_text(), re.M)
    return pdf, twin


def test_the_twin_has_every_section_the_pdf_has(built, served):
    """Issue 33: the Markdown twin is the whole report: each PDF section has its counterpart, in every report here
    (synthetic data with two configurations; an external CPU server; the reference engine's default)."""
    cases = {"built": section_lists(built["out"] / "longctx.tex", built["out"] / "longctx.md"),
             **{k: v["sections"] for k, v in served.items()}}
    for case, (pdf, twin) in cases.items():
        assert set(pdf) - set(twin) == set(), (case, sorted(set(pdf) - set(twin)))
        assert set(twin) - set(pdf) == set(), (case, sorted(set(twin) - set(pdf)))


def _section(text: str, title: str, after: str) -> str:
    start = re.search(rf"[A-Z0-9]+ {title} ", text).start()
    return text[start:re.search(rf"[A-Z0-9]+ {after} ", text[start:]).start() + start]


def test_a_cpu_server_with_a_gqa_model_reads_as_what_it_is(served):
    pdf, md = served["external"]["pdf"], served["external"]["md"]
    for text in (pdf, md):
        assert "MLA" not in text and "latent" not in text and "SGLang" not in text, "engine words of another engine"
        assert "server RSS" not in text and "server's resident memory" not in text  # it measured the whole machine
        assert not re.search(r"memory_bytes|weights_bytes|cell_bytes", text)  # no internal key names
    rest = pdf
    for phrase in NO_GPU_PHRASES:
        rest = rest.replace(phrase, "")
    assert "GPU" not in rest, rest[max(0, rest.index("GPU") - 200):rest.index("GPU") + 100]
    assert "model tiny-llama, GQA, 512 KV bytes per token" in pdf
    assert "engines llama_cpu: external (OpenAI API), version not reported, on the CPU" in pdf
    assert "whole machine's CPU (% of one core) whole machine's memory used (GB)" in pdf
    assert "no cache flush (the servers offer no flush endpoint): unique prefixes only." in pdf
    assert "flushed before each" not in pdf
    # the roofline's FLOPs, of this model's kind (a page break with its floats may follow at once)
    assert "MHAandGQA:2×heads×(dhead+dhead)" in pdf.replace(" ", "")
    assert "longctx/specs/hardware.yaml" in pdf and "longctx/hardware.yaml" not in pdf
    planner = _section(pdf, "KV memory planner", "Needle probe")
    assert "was started by someone else: its KV pool is sized by its own flags, which longctx does not know" in planner
    servers = _section(pdf, "Servers", "Model as served")
    assert "Device the CPU of the machine that measured." in servers
    assert 'The settings the server reported (at /v1/models): server setting value data [{"id": "tiny-llama"' in " ".join(servers.split())
    # the appendix: the model as served, each figure with where it came from
    model = _section(pdf, "Model as served", "Hardware and software")
    assert "tiny-llama: GQA (grouped-query attention), described exactly by model.architecture." in model
    for row in ("KV heads (num_key_value_heads) 2 model.architecture", "attention heads (num_attention_heads) 4 model.architecture",
                "head dimension (head_dim) 16 not given: hidden_size / num_attention_heads",
                "KV bytes per token (the analysis) 512 model.kv_bytes_per_token",
                "KV bytes per token (the memory planner) 512 model.kv_bytes_per_token",
                "decode attention FLOPs per KV token 512 the architecture"):
        assert row in model, row
    assert "| KV bytes per token (the analysis) | 512 | model.kv_bytes_per_token |" in md


def test_the_reference_engine_keeps_its_mla_and_sglang_words(served):
    pdf, md = served["reference"]["pdf"], served["reference"]["md"]
    assert "model refmla, MLA, 640 KV bytes per token" in pdf
    assert "engines page64: reference 0.1.0, on the CPU" in pdf
    assert "MLAabsorbed:2×heads×(dlatent+drope+dlatent)perlayer" in pdf.replace(" ", "") and "MHA and GQA" not in pdf
    assert "The KV pool of every configuration follows SGLang's sizing rule" in pdf
    assert "by SGLang's sizing rule, against mem-fraction-static" in md
    assert "per GPU" not in pdf and "per GPU" not in md  # it computes on the CPU
    assert "server's CPU (% of one core) server's resident memory (GB)" in pdf  # psutil over the server's process tree
    assert "a prompt prefix unique to each request, the prefix cache flushed before each." in pdf
    servers = _section(pdf, "Servers", "Model as served")
    assert "The settings the server reported (at /server_info):" in servers and "mem_fraction_static 0.5" in servers
    model = _section(pdf, "Model as served", "Hardware and software")
    assert "refmla: MLA (multi-head latent attention), described exactly by model.architecture." in model
    for row in ("KV latent rank (kv_lora_rank) 64 model.architecture", "rope dimensions of the key (qk_rope_head_dim) 16",
                "KV bytes per token (the analysis) 640", "KV bytes per token (the memory planner) 640",
                "decode attention FLOPs per KV token 1,152 the architecture"):
        assert row in model, row


def test_words_for_what_the_records_say():
    from longctx.report import wording

    # a planner.json from before its reasons were worded names its inputs by key: they become words
    old = {"rows": [], "memory": {}, "reason": "the pool cannot be modelled: unknown memory_bytes, weights_bytes"}
    assert wording.planner_reason(old) == "the pool cannot be modelled: the memory size and the weights' size are unknown"
    assert wording.planner_reason({"rows": [], "memory": {"memory_bytes": None, "weights_bytes": 1, "cell_bytes": 512}}) == (
        "the pool cannot be modelled: the memory size is unknown")
    assert wording.planner_reason({"rows": [{}], "memory": {}}) is None
    sglang_named = {"rows": [], "memory": {"sizing_rule": None, "cell_bytes": 512}, "allocated": {"pool_tokens": 1000},
                    "reason": "the planner tabulates SGLang's sizing rule, by mem-fraction-static, which the external server does not have"}
    assert wording.planner_reason(sglang_named) == ("the pool is not modelled: the server sizes it by a rule of its own, "
                                                    "which the planner does not tabulate; the pool it allocated holds 1,000 tokens")
    # telemetry: labelled by what it measured, whether the description is a sentence or a record
    machine = "psutil, no GPU telemetry: CPU utilisation (% of one core) and resident memory of the whole machine"
    process = "psutil, no GPU telemetry: CPU utilisation (% of one core) and resident memory of the server's process tree (pid 7)"
    assert wording.telemetry_labels([machine], gpu=False)["mem"] == "whole machine's memory used (GB)"
    assert wording.telemetry_labels([process], gpu=False)["mem"] == "server's resident memory (GB)"
    assert wording.telemetry({"source": "psutil", "scope": "machine", "description": "x"})["scope"] == "machine"
    assert wording.telemetry_labels(["NVML, GPUs [0] (mean over them)"], gpu=True)["mem"] == "GPU memory used (GB)"
    # the version as the server offers it; the device as recorded, else as the engine's flags give it
    assert wording.engine_version({"engine": "external", "server_info": {"version": "0.32.0"}}) == "0.32.0"
    assert wording.engine_text({"engine": "external", "api": "openai"}) == "external (OpenAI API), version not reported"
    assert wording.device({"engine": "external", "device": "remote"}, {"ceilings": {"device": "gpu"}}) == "remote"
    assert wording.device({"engine": "reference", "args": {"device": "cpu"}}) == "cpu"
    # the settings as reported, nested ones too; longctx's note of the endpoints is not one of them
    assert wording.server_settings({"a": 1, "b": {"c": [1, 2]}, "endpoints": ["/x"]}) == [("a", "1"), ("b", '{"c": [1, 2]}')]
    assert wording.server_settings({}) == []


def test_a_server_that_reports_no_settings_is_said_so(tmp_path):
    from .report_data import external_cpu_gqa

    paths = write_data(tmp_path / "data")
    prov = json.loads(paths["provenance_json"].read_text())
    prov["configurations"]["base"]["server_info"] = {}
    prov["configurations"]["fast_kv"]["server_info"] = {"version": "9.9", "endpoints": ["/version"]}
    prov["configurations"]["fast_kv"]["engine_version"] = None
    paths["provenance_json"].write_text(json.dumps(prov))
    report.render_report(TEMPLATES / "longctx.tex.j2", tmp_path / "longctx.tex", tmp_path / "version.json", inputs(paths, config=config()))
    tex = " ".join((tmp_path / "longctx.tex").read_text().split())
    assert "Server settings: the server reported none." in tex
    assert "reference 9.9" in tex  # the version the server offers, where the record has none
    assert external_cpu_gqa  # (the helper the PDF tests above build from)


def test_a_partial_length_is_marked_in_every_table_and_counted_on_page_one(built):
    """fast_kv at 64,000 tokens is partial by construction (PARTIAL: 1 of 3 trials); base at 64,000 lost a
    fourth trial but has its 3 of 3, so it is not."""
    text, md, section = built["text"], built["md"], built["section"]
    flat = " ".join(text.split())
    note = "Measured by fewer successful trials than configured: fast_kv at 64,000 tokens, measured by 1 of 3 trials."
    said = ("1 length was measured by fewer successful trials than configured (fast_kv at 64,000 tokens: 1 of 3 trials); "
            "it is marked † and left out of the fits and of the regime detection.")
    # page one counts it; the twin and the plan section say the same
    page_one = text[:text.index("\f")]
    assert said in " ".join(page_one.split())
    assert said in re.sub(r"\\(.)", r"\1", md) and said in re.sub(r"\\(.)", r"\1", section)
    # the headline table (PDF, twin, plan section): the mark on that row alone, and its note
    for rows in (md_rows(md, "configuration | L (tokens) | TTFT (ms) | decode (tok/s)"),
                 md_rows(section, "configuration | L (tokens) | TTFT (ms) | decode (tok/s)")):
        assert [r[:2] for r in rows if r[1].endswith("†")] == [["fast_kv", "64,000†"]]
    # page one's table is at the longest length both measured in full (16,000); every length is on the next page
    page_two = text[text.index("\f") + 1:].split("\f")[0]
    assert re.search(r"^\s*fast_kv\s+64,000†\s+\S", page_two, re.M) and not re.search(r"base\s+64,000†", text)
    assert note in " ".join(page_two.split()) and "† " + note in re.sub(r"\\(.)", r"\1", md)
    # the results appendix (PDF and twin), the telemetry and needle tables: marked, with the note
    assert re.search(r"fast_kv\s+64,000†\s+3,0\d\d\.\d\s+\S+\s+\S+\s+\S+\s+1/3", text)
    [results] = [r for r in md_rows(md, "configuration | L (tokens) | TTFT (ms) | TPOT (ms)") if r[1].endswith("†")]
    assert results[0] == "fast_kv" and results[-1] == "1/3"
    assert re.search(r"fast_kv\s+64,000†\s+not applicable", text)  # the needle table
    assert flat.count("† " + note) == 4  # headline, telemetry, needle, results appendix
    # fits.json: left out of both fits; the diagnosis does not set its one trial against them
    fits = json.loads(built["paths"]["fits_json"].read_text())["configurations"]
    assert fits["fast_kv"]["partial_lengths"]["lengths"][0]["fitted"] == {"prefill": False, "decode": False}
    assert fits["base"]["partial_lengths"]["lengths"] == []
    assert fits["fast_kv"]["decode"]["regime_change"] is None
    [group] = [g for g in context(inputs(built["paths"]))["diagnosis"]["configurations"] if g["name"] == "fast_kv"]
    texts = [i["text"] for i in group["items"]]
    assert any(t.startswith("Decode at 16,000 tokens runs at") for t in texts) and not any("ecode at 64,000" in t for t in texts)


def test_with_partial_lengths_included_page_one_says_they_are_fitted(tmp_path):
    paths = write_data(tmp_path, partial=PARTIAL, settings={"partial_lengths": "include"})
    ctx = context(inputs(paths, config=config()))
    assert ctx["partial"]["use"] == (" and fitted like every other length (analysis.partial_lengths is include), "
                                     "in the regime detection too.")
    regime = [i["text"] for g in ctx["diagnosis"]["configurations"] if g["name"] == "fast_kv" for i in g["items"]
              if i["figure"] == "residuals"]
    assert regime and all("at 64,000 tokens (measured by 1 of 3 trials) it is" in t for t in regime)
    # the overview's dotted verticals (issue 56): said in its caption, where each one is in the extrapolation section
    report.render_report(TEMPLATES / "longctx.tex.j2", tmp_path / "longctx.tex", tmp_path / "version.json",
                         inputs(paths, config=config()))
    tex = " ".join((tmp_path / "longctx.tex").read_text().split())
    assert ("medians (markers), fits with bootstrap bands (lines); hollow: a partial length; dotted: a regime change "
            "(Section~\\ref{sec:extrapolation}).}\\label{fig:overview}") in tex, tex[:3000]


PAGE_ONE_WORDS = 450


def page_one(pdf: Path) -> str:
    """Page one's text as pdftotext reads it."""
    return subprocess.run(["pdftotext", "-f", "1", "-l", "1", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout


def page_one_words(pdf: Path) -> int:
    """The words on page one as pdftotext reads them (the title block, the sentences, the figure's text, the table)."""
    return len(page_one(pdf).split())


def test_page_one_holds_at_most_450_words_with_its_figure_and_compact_table(built, served):
    """Issue 33: page one is the title block, the answer, the overview figure and one row per configuration at the
    longest length they share (the per-length table is on the next page), at most 450 words in every report here."""
    counts = {"built": page_one_words(built["out"] / "longctx.pdf"), **{k: v["page_one_words"] for k, v in served.items()}}
    print(f"\npage one words: {counts}")
    assert all(n <= PAGE_ONE_WORDS for n in counts.values()), counts
    page_one = built["text"][:built["text"].index("\f")]
    assert "Figure 1" in page_one and re.search(r"^\s*fast_kv\s+386\.1\s+449\.5\s+1\.1\d \[", page_one, re.M), page_one
    assert "At 16,000 tokens, the longest length every configuration measured" in " ".join(page_one.split())


MIN_FIGURE_PT = 7.0  # issue 56: page one's figure, axis labels, ticks and legend at 7 pt or more as printed
MIN_FIGURE_WIDTH = 0.8  # of the text width


def page_one_figure(pdf: Path) -> dict:
    """Page one as poppler lays it out (pdftohtml -xml, zoomed: positions and font sizes in pixels of the page's
    width in points times the zoom, which poppler caps at 3): the text width (the span of the body text, set in
    Latin Modern), and the figure's text (set by matplotlib in DejaVu Sans): its smallest size in points, the span
    of its text as a share of the text width, and its words."""
    xml = subprocess.run(["pdftohtml", "-xml", "-i", "-q", "-f", "1", "-l", "1", "-zoom", "3", "-stdout", str(pdf)],
                         capture_output=True, text=True, check=True).stdout
    info = subprocess.run(["pdfinfo", "-f", "1", "-l", "1", str(pdf)], capture_output=True, text=True, check=True).stdout
    zoom = int(re.search(r'<page number="1"[^>]* width="(\d+)"', xml)[1]) / float(re.search(r"Page\s+1 size:\s+([\d.]+)", info)[1])
    fonts = {m["id"]: (int(m["size"]), m["family"]) for m in
             re.finditer(r'<fontspec id="(?P<id>\d+)" size="(?P<size>-?\d+)" family="(?P<family>[^"]+)"', xml)}
    runs = [(int(m["left"]), int(m["width"]), fonts[m["font"]], re.sub(r"<[^>]+>", "", m["text"])) for m in
            re.finditer(r'<text top="-?\d+" left="(?P<left>-?\d+)" width="(?P<width>\d+)" height="\d+" '
                        r'font="(?P<font>\d+)">(?P<text>.*?)</text>', xml)]
    body = [(left, width) for left, width, (_, family), _ in runs if "LM" in family]
    figure = [(left, width, size, text) for left, width, (size, family), text in runs if "DejaVu" in family]
    text_width = max(l + w for l, w in body) - min(l for l, _ in body)
    return {"smallest_pt": min(size for *_, size, _ in figure) / zoom,
            "width": (max(l + w for l, w, *_ in figure) - min(l for l, *_ in figure)) / text_width,
            "words": [text for *_, text in figure]}


def test_page_one_figure_prints_at_text_width_and_7_pt_or_more(built, served):
    """Issue 56, item 1: page one's figure (the overview) at 80% of the text width or more, its smallest text (tick
    labels, axis labels, legend) at 7 pt or more as printed, and no note inside it: what its marks are is the
    caption's. Read from the PDF as printed. The note that was in the figure (one long line of what its markers,
    lines and hollow markers are, and where each regime changes) made it wider and so smaller on the page: 3 pt in
    the default run, 2.4 pt here in `built`, whose fast_kv has a partial length."""
    for name, pdf in (("built", built["out"] / "longctx.pdf"),
                      *((k, v["pdf_path"]) for k, v in served.items())):
        fig = page_one_figure(pdf)
        print(name, fig["smallest_pt"], f"{fig['width']:.0%}")
        assert fig["smallest_pt"] >= MIN_FIGURE_PT and fig["width"] >= MIN_FIGURE_WIDTH, (name, fig)
        assert not any(w in " ".join(fig["words"]) for w in ("markers", "dotted", "hollow")), (name, fig["words"])
    caption = " ".join(page_one(built["out"] / "longctx.pdf").split())
    assert ("Figure 1: TTFT and decode rate against L: medians (markers), fits with bootstrap bands (lines); hollow: a "
            "partial length.") in caption, caption
    twin = " ".join(built["md"].split())
    assert ("TTFT and decode rate against the context length: medians (markers), fits with bootstrap bands (lines); "
            "hollow: a partial length.") in twin


def test_a_cpu_run_states_no_counter_it_did_not_read(built, served):
    """Issue 56: the GPU's own counters are said only where they were read (tests/test_gpm.py); these reports ran on
    a CPU: no counter's words, and the one line that says why none were read."""
    for text in (" ".join(built["text"].split()), built["md"], *(v[k] for v in served.values() for k in ("pdf", "md"))):
        assert not re.search(r"GPU's own counters \(GPM\), decode|SMs busy|tensor pipes [\d.]+% active|DRAM at [\d.]+%", text)
        assert "GPM counters not read: no configuration's telemetry watches a GPU; the diagnosis stands on the fits alone." \
            in " ".join(text.split()), text[-2000:]


def test_a_server_listening_beyond_loopback_is_named(served):
    """Issue 34, item 5: a server longctx started on an address other than loopback is named in the report (and a
    config asks for it in so many words: tests/test_config.py); a loopback one is not."""
    for text in (served["reference"]["pdf"], served["reference"]["md"]):
        assert "listening on 0.0.0.0: reachable from the network (server.allow_remote)" in text.replace("`", "")
    assert "reachable from the network" not in served["external"]["pdf"]


def test_a_server_listening_beyond_loopback_is_named_on_page_one(served):
    """Issue 47, item 5: not only in the appendix: page one of the PDF and the twin's summary say that a server
    longctx started listened beyond loopback (server.allow_remote), and where; a report with none says nothing."""
    said = ("Reachable from the network: page64's server listened on 0.0.0.0 (every address of its machine), not on "
            "loopback only, while measured (server.allow_remote: true).")
    assert said in served["reference"]["page_one"], served["reference"]["page_one"]
    md = served["reference"]["md"].replace("*", "")
    assert said in md[md.index("## Summary"):md.index("### Every length against the baseline")], md
    assert "Reachable from the network" not in served["external"]["page_one"] + served["external"]["md"]


def test_a_servers_settings_are_printed_once_and_the_others_as_what_differs():
    """Pages earned: the servers appendix prints the first server's settings in full; a server whose settings are
    mostly the same prints those that differ (and those it lacks); one mostly different prints all of its own."""
    from longctx.report.context import settings_against_first

    base = [(f"k{i}", str(i)) for i in range(10)]
    configs = [{"name": "a", "server_args": base},
               {"name": "b", "server_args": [("k0", "x")] + base[1:9]},  # k0 differs, k9 missing
               {"name": "c", "server_args": [(k, "y") for k, _ in base]},  # all differ
               {"name": "d", "server_args": []},  # reported none
               {"name": "e", "server_args": list(base)}]  # the same
    settings_against_first(configs)
    got = {c["name"]: (c["settings_base"], c["settings_shown"]) for c in configs}
    assert got["a"] == (None, base) and got["c"] == (None, configs[2]["server_args"]) and got["d"] == (None, [])
    assert got["b"] == ("a", [("k0", "x"), ("k9", "not reported")])
    assert got["e"] == ("a", [])


def test_a_character_latex_cannot_typeset_prints_as_a_question_mark_and_the_pdf_builds(tmp_path):
    """A model's answer (the needle table) or a server's error may hold any character: U+FFFD where its bytes were
    not UTF-8, another script, a control character. pdflatex stops at one it has no glyph set up for; the escape
    prints those as '?' and keeps what T1 fonts set (Latin-1, Latin Extended-A, dashes and quotes)."""
    from longctx.report.latex import TEX

    said = "answer: \ufffd\u4e2d caf\u00e9 \u0141\u00f3d\u017a \u2014 \u201cok\u201d\x07\tend"
    assert TEX.escape(said) == "answer: ?? caf\u00e9 \u0141\u00f3d\u017a \u2014 \u201cok\u201d? end"
    (tmp_path / "t.tex").write_text("\\documentclass{article}\\usepackage[T1]{fontenc}\\usepackage{lmodern}\\pagestyle{empty}"
                                    f"\\begin{{document}}{TEX.escape(said)}\\end{{document}}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    assert " ".join(pdftotext(tmp_path / "t.pdf").split()) == "answer: ?? caf\u00e9 \u0141\u00f3d\u017a \u2014 \u201cok\u201d? end"
