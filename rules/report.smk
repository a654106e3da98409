rule plot_figures:
    input:
        results="data/results.csv",
        fits="data/fits.json",
        itl_depth="data/itl_depth.csv",
        style="templates/plot.mplstyle",
    output:
        expand("report/figures/{figure}.{ext}", figure=FIGURES, ext=FORMATS),
    log:
        "data/logs/plot_figures.log",
    params:
        outdir=lambda w, output: os.path.dirname(output[0]),
    conda:
        ENV
    shell:
        "longctx plot --results {input.results} --fits {input.fits} --style {input.style} "
        "--itl-depth {input.itl_depth} --outdir {params.outdir} > {log} 2>&1"


rule plot_analysis_figures:
    input:
        results="data/results.csv",
        fits="data/fits.json",
        planner="data/planner.json",
        style="templates/plot.mplstyle",
    output:
        expand("report/figures/{figure}.{ext}", figure=ANALYSIS_FIGURES, ext=FORMATS),
    log:
        "data/logs/plot_analysis_figures.log",
    params:
        outdir=lambda w, output: os.path.dirname(output[0]),
    conda:
        ENV
    shell:
        "longctx plot-analysis --results {input.results} --fits {input.fits} --planner {input.planner} "
        "--style {input.style} --outdir {params.outdir} > {log} 2>&1"


# The .tex and its version record (number, hash, previous version, the medians it keeps); the
# version is assigned from report/versions/log.json, which build_pdf appends to.
rule render_report:
    input:
        template="templates/longctx.tex.j2",
        templates=TEMPLATES,
        results="data/results.csv",
        fits="data/fits.json",
        provenance="data/provenance.json",
        itl_depth="data/itl_depth.csv",
        planner="data/planner.json",
    output:
        tex="report/longctx.tex",
        version="report/version.json",
    log:
        "data/logs/render_report.log",
    params:
        baseline=BASELINE,
        config=REPORT_CONFIG,
    conda:
        ENV
    shell:
        "longctx render --template {input.template} --results {input.results} --fits {input.fits} "
        "--provenance {input.provenance} --itl-depth {input.itl_depth} --planner {input.planner} "
        "--baseline {params.baseline:q} --config-json {params.config:q} --out {output.tex} --version-out {output.version} > {log} 2>&1"


# Also keeps the PDF as report/versions/longctx-v{N}-{hash}.pdf and logs it.
rule build_pdf:
    input:
        tex="report/longctx.tex",
        version="report/version.json",
        provenance="data/provenance.json",
        figures=expand("report/figures/{figure}.pdf", figure=FIGURES + ANALYSIS_FIGURES),
    output:
        "report/longctx.pdf",
    log:
        "data/logs/build_pdf.log",
    conda:
        ENV
    shell:
        "longctx pdf --tex {input.tex} --provenance {input.provenance} --version {input.version} "
        "--out {output} > {log} 2>&1"


rule render_markdown:
    input:
        template="templates/longctx.md.j2",
        partials=MARKDOWN_PARTIALS,
        version="report/version.json",
        pdf="report/longctx.pdf",
        figures=expand("report/figures/{figure}.png", figure=FIGURES + ANALYSIS_FIGURES),
        results="data/results.csv",
        fits="data/fits.json",
        provenance="data/provenance.json",
        itl_depth="data/itl_depth.csv",
        planner="data/planner.json",
    output:
        "report/longctx.md",
    log:
        "data/logs/render_markdown.log",
    params:
        baseline=BASELINE,
        config=REPORT_CONFIG,
    conda:
        ENV
    shell:
        "longctx markdown --template {input.template} --version {input.version} --results {input.results} "
        "--fits {input.fits} --provenance {input.provenance} --itl-depth {input.itl_depth} --planner {input.planner} "
        "--baseline {params.baseline:q} --config-json {params.config:q} --out {output} > {log} 2>&1"


# The Results section for plans/<name>.md (its links relative to plans/), rendered apart from the plan.
rule render_plan_section:
    input:
        template="templates/plan.md.j2",
        partials=MARKDOWN_PARTIALS,
        version="report/version.json",
        pdf="report/longctx.pdf",
        results="data/results.csv",
        fits="data/fits.json",
        provenance="data/provenance.json",
        itl_depth="data/itl_depth.csv",
        planner="data/planner.json",
    output:
        "report/plans/{plan}.md",
    log:
        "data/logs/render_plan_section/{plan}.log",
    params:
        baseline=BASELINE,
        config=REPORT_CONFIG,
        plan="plans/{plan}.md",
    conda:
        ENV
    shell:
        "longctx plan-section --template {input.template} --version {input.version} --results {input.results} "
        "--fits {input.fits} --provenance {input.provenance} --itl-depth {input.itl_depth} --planner {input.planner} "
        "--baseline {params.baseline:q} --config-json {params.config:q} --plan {params.plan} --out {output} > {log} 2>&1"


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
        "longctx attach-plan --plan {output} --section {input} > {log} 2>&1"
