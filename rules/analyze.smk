rule aggregate_results:
    input:
        raw_files(),
    output:
        csv="data/results.csv",
        provenance="data/provenance.json",
        itl_depth="data/itl_depth.csv",
    log:
        "data/logs/aggregate_results.log",
    conda:
        ENV
    shell:
        "longctx aggregate --out-csv {output.csv} --out-provenance {output.provenance} "
        "--out-itl-depth {output.itl_depth} {input} > {log} 2>&1"


rule fit_models:
    input:
        "data/results.csv",
    output:
        "data/fits.json",
    log:
        "data/logs/fit_models.log",
    conda:
        ENV
    shell:
        "longctx fit --results {input} --out {output} > {log} 2>&1"
