# Every figure of the data (the measured, the analysis', the load workloads' and the reused context's) in one process:
# four processes took 15.8 s for what one takes in 8.9 on a tiny run (bench/figure_time.py): matplotlib's start-up
# and first drawing paid once.
rule plot_figures:
    input:
        results="data/results.csv",
        fits="data/fits.json",
        itl_depth="data/itl_depth.csv",
        provenance="data/provenance.json",
        planner="data/planner.json",
        load="data/load.json",
        metrics="data/load_metrics.csv",
        prefix="data/prefix_fits.json",
        style="templates/plot.mplstyle",
    output:
        expand("report/figures/{figure}.{ext}", figure=DATA_FIGURES, ext=FORMATS),
    log:
        "data/logs/plot_figures.log",
    params:
        outdir=lambda w, output: os.path.dirname(output[0]),
    conda:
        ENV
    shell:
        "longctx plot --results {input.results} --fits {input.fits} --style {input.style} "
        "--itl-depth {input.itl_depth} --provenance {input.provenance} --planner {input.planner} --load {input.load} "
        "--metrics {input.metrics} --prefix {input.prefix} --outdir {params.outdir} --log {log}"


# The .tex, its version record (number, hash, previous version, the trials it keeps) and its history (every kept
# version up to it, with the change points: longctx.report.history); the version is assigned from
# report/versions/log.json, which build_pdf appends to, so the history is known here and not before.
rule render_report:
    input:
        **REPORT_DATA,
        template="templates/longctx.tex.j2",
        templates=TEMPLATES,
    output:
        tex="report/longctx.tex",
        version="report/version.json",
        history="report/history.json",
    log:
        "data/logs/render_report.log",
    params:
        **REPORT_PARAMS,
    conda:
        ENV
    shell:
        report_shell("render", "--out {output.tex} --version-out {output.version} --history-out {output.history}")


# The history figure: each version's TTFT and decode rate per configuration and length, its steps marked.
rule plot_history:
    input:
        history="report/history.json",
        style="templates/plot.mplstyle",
    output:
        expand("report/figures/{figure}.{ext}", figure=HISTORY_FIGURES, ext=FORMATS),
    log:
        "data/logs/plot_history.log",
    params:
        outdir=lambda w, output: os.path.dirname(output[0]),
    conda:
        ENV
    shell:
        "longctx plot-history --history {input.history} --style {input.style} --outdir {params.outdir} --log {log}"


# Also keeps the PDF as report/versions/longctx-v{N}-{hash}.pdf and logs it.
rule build_pdf:
    input:
        tex="report/longctx.tex",
        version="report/version.json",
        provenance="data/provenance.json",
        figures=expand("report/figures/{figure}.pdf", figure=DATA_FIGURES + HISTORY_FIGURES),
    output:
        "report/longctx.pdf",
    log:
        "data/logs/build_pdf.log",
    conda:
        ENV
    shell:
        "longctx pdf --tex {input.tex} --provenance {input.provenance} --version {input.version} "
        "--out {output} --log {log}"


rule render_markdown:
    input:
        **REPORT_DATA,
        template="templates/longctx.md.j2",
        partials=MARKDOWN_PARTIALS,
        version="report/version.json",
        pdf="report/longctx.pdf",
        figures=expand("report/figures/{figure}.png", figure=DATA_FIGURES + HISTORY_FIGURES),
    output:
        "report/longctx.md",
    log:
        "data/logs/render_markdown.log",
    params:
        **REPORT_PARAMS,
    conda:
        ENV
    shell:
        report_shell("markdown", "--version {input.version} --out {output}")


# The Results section for plans/<name>.md (its links relative to plans/), rendered apart from the plan.
rule render_plan_section:
    input:
        **REPORT_DATA,
        template="templates/plan.md.j2",
        partials=MARKDOWN_PARTIALS,
        version="report/version.json",
        pdf="report/longctx.pdf",
    output:
        "report/plans/{plan}.md",
    log:
        "data/logs/render_plan_section/{plan}.log",
    params:
        **REPORT_PARAMS,
        plan="plans/{plan}.md",
    conda:
        ENV
    shell:
        report_shell("plan-section", "--version {input.version} --plan {params.plan} --out {output}")


# `snakemake --cores 1 -f plans/<name>.md` inserts or updates the plan's delimited Results section;
# the rest of the plan stays byte for byte (update() keeps Snakemake from deleting the plan first).
# Without -f it runs only when the report is newer than the plan. Plans named in report.plans are
# kept up to date by the default target, which asks for their sections too (a plan added there is
# attached at once).
rule attach_plan:
    input:
        "report/plans/{plan}.md",
    output:
        update("plans/{plan}.md"),
    log:
        "data/logs/attach_plan/{plan}.log",
    conda:
        ENV
    shell:
        "longctx attach-plan --plan {output} --section {input} --log {log}"


# `snakemake --cores 1 report/gate.json`: this report version against the one it is compared with (report.compare_to,
# the previous version unless pinned), as `longctx gate`: the job fails, naming every configuration and length that got
# slower beyond report.regression_margin (or saying why nothing could be compared); report/gate.json holds the answer.
rule check_regressions:
    input:
        pdf="report/longctx.pdf",
        version="report/version.json",
    output:
        "report/gate.json",
    log:
        "data/logs/check_regressions.log",
    conda:
        ENV
    shell:
        "longctx gate --version {input.version} --out {output} --log {log}"


# The A/B's verdict (longctx.report.gate, as `longctx ab`): the job fails where a length got slower beyond
# report.regression_margin or was lost, naming each; report/ab.md is its page (what it compared, which level the
# verdict comes from, what it cost).
rule check_ab:
    input:
        "data/ab/measurements.json",
    output:
        json="report/ab.json",
        page="report/ab.md",
    log:
        "data/logs/check_ab.log",
    conda:
        ENV
    shell:
        "longctx ab --from-measurements {input} --out {output.json} --markdown {output.page} --log {log}"
