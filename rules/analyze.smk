rule aggregate_results:
    input:
        raw_files(),
    output:
        csv="data/results.csv",
        provenance="data/provenance.json",
        itl_depth="data/itl_depth.csv",
    log:
        "data/logs/aggregate_results.log",
    params:
        partial=PARTIAL,
    conda:
        ENV
    shell:
        "longctx aggregate --out-csv {output.csv} --out-provenance {output.provenance} "
        "--out-itl-depth {output.itl_depth} --partial-dir {params.partial} {input} > {log} 2>&1"


rule fit_models:
    input:
        results="data/results.csv",
        provenance="data/provenance.json",
        calibration="data/calibration.json",
        kernels=expand("data/kernels/{kernel}.json", kernel=NATIVE_KERNELS),
    output:
        "data/fits.json",
    log:
        "data/logs/fit_models.log",
    params:
        settings=lambda w: canonical_json({k: v for k, v in CFG["analysis"].items() if k != "mem_fractions"}),
    conda:
        ENV
    shell:
        "longctx fit --results {input.results} --provenance {input.provenance} --calibration {input.calibration} "
        "--settings {params.settings:q} --kernel-bench {input.kernels} --out {output} > {log} 2>&1"


rule plan_memory:
    input:
        provenance="data/provenance.json",
        results="data/results.csv",
    output:
        "data/planner.json",
    log:
        "data/logs/plan_memory.log",
    params:
        fractions=",".join(str(f) for f in CFG["analysis"]["mem_fractions"]),
    conda:
        ENV
    shell:
        "longctx plan-memory --provenance {input.provenance} --results {input.results} "
        "--fractions {params.fractions} --out {output} > {log} 2>&1"
