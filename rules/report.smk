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


rule render_report:
    input:
        template="templates/longctx.tex.j2",
        sections=TEMPLATE_SECTIONS,
        results="data/results.csv",
        fits="data/fits.json",
        provenance="data/provenance.json",
        itl_depth="data/itl_depth.csv",
        planner="data/planner.json",
    output:
        "report/longctx.tex",
    log:
        "data/logs/render_report.log",
    conda:
        ENV
    shell:
        "longctx render --template {input.template} --results {input.results} --fits {input.fits} "
        "--provenance {input.provenance} --itl-depth {input.itl_depth} --planner {input.planner} --out {output} > {log} 2>&1"


rule build_pdf:
    input:
        tex="report/longctx.tex",
        provenance="data/provenance.json",
        figures=expand("report/figures/{figure}.pdf", figure=FIGURES + ANALYSIS_FIGURES),
    output:
        "report/longctx.pdf",
    log:
        "data/logs/build_pdf.log",
    conda:
        ENV
    shell:
        "longctx pdf --tex {input.tex} --provenance {input.provenance} --out {output} > {log} 2>&1"
