rule aggregate_results:
    input:
        raw_files(load=False),
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
        "--out-itl-depth {output.itl_depth} --partial-dir {params.partial} {input} --log {log}"


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
        "--settings {params.settings:q} --kernel-bench {input.kernels} --out {output} --log {log}"


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
        "--fractions {params.fractions} --out {output} --log {log}"


# The load workloads (longctx.analysis.load): a row per request, per interference stream and per
# /metrics sample, then their percentiles, goodput, interference fit, KV reconciliation and SLO frontier.
rule aggregate_load:
    input:
        load_files(),
    output:
        requests="data/load_requests.csv",
        interference="data/load_interference.csv",
        metrics="data/load_metrics.csv",
    log:
        "data/logs/aggregate_load.log",
    conda:
        ENV
    shell:
        "longctx aggregate-load --out-requests {output.requests} --out-interference {output.interference} "
        "--out-metrics {output.metrics} {input} --log {log}"


rule analyze_load:
    input:
        requests="data/load_requests.csv",
        interference="data/load_interference.csv",
        metrics="data/load_metrics.csv",
        fits="data/fits.json",
        provenance="data/provenance.json",
        planner="data/planner.json",
    output:
        "data/load.json",
    log:
        "data/logs/analyze_load.log",
    params:
        settings=lambda w: canonical_json({"slo": CFG["slo"], "load": CFG["load"], "analysis": CFG["analysis"]}),
    conda:
        ENV
    shell:
        "longctx analyze-load --requests {input.requests} --interference {input.interference} "
        "--metrics {input.metrics} --fits {input.fits} --provenance {input.provenance} --planner {input.planner} "
        "--settings {params.settings:q} --out {output} --log {log}"


# What if (longctx.analysis.whatif): the serving model of each configuration simulated against its measured load
# points, and the whatif grid of settings nobody measured.
rule whatif:
    input:
        fits="data/fits.json",
        load="data/load.json",
        provenance="data/provenance.json",
        requests="data/load_requests.csv",
        interference="data/load_interference.csv",
    output:
        "data/whatif.json",
    log:
        "data/logs/whatif.log",
    params:
        settings=lambda w: canonical_json({"whatif": CFG["whatif"], "slo": CFG["slo"], "load": CFG["load"]}),
    conda:
        ENV
    shell:
        "longctx whatif --fits {input.fits} --load {input.load} --provenance {input.provenance} "
        "--requests {input.requests} --interference {input.interference} --settings {params.settings:q} "
        "--out {output} --log {log}"


# The flags to restart with (longctx.analysis.advise, docs/advise.md): the memory planner and the serving model
# searched for the goal of config key advise. Where a goal is set the report prints it (REPORT_DATA); asked for by
# name (snakemake report/advice.json) it runs alone.
rule advise:
    input:
        results="data/results.csv",
        fits="data/fits.json",
        load="data/load.json",
        provenance="data/provenance.json",
        requests="data/load_requests.csv",
    output:
        "report/advice.json",
    log:
        "data/logs/advise.log",
    params:
        goal=lambda w: canonical_json(CFG["advise"]),
    conda:
        ENV
    shell:
        "longctx advise --data data --out {output} --log {log}"


# The reused-context workloads (longctx.analysis.prefix): a row per request, then the cost model
# TTFT = a + b (L - P) + c (L^2 - P^2) fitted over hit rates and cold trials, the saving against cold,
# every cached-count check and the conversation's turns against the model.
rule aggregate_prefix:
    input:
        prefix_files(),
    output:
        "data/prefix.csv",
    log:
        "data/logs/aggregate_prefix.log",
    conda:
        ENV
    shell:
        "longctx aggregate-prefix --out {output} {input} --log {log}"


rule analyze_prefix:
    input:
        prefix="data/prefix.csv",
        results="data/results.csv",
        fits="data/fits.json",
    output:
        "data/prefix_fits.json",
    log:
        "data/logs/analyze_prefix.log",
    params:
        settings=lambda w: canonical_json(CFG["analysis"]),
    conda:
        ENV
    shell:
        "longctx analyze-prefix --prefix {input.prefix} --results {input.results} --fits {input.fits} "
        "--settings {params.settings:q} --out {output} --log {log}"
