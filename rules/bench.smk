# One job per configuration: its server comes up once, every length is measured, it goes down.
# It takes every core it is given, so that two measurements never share the machine. Lengths
# measured by an interrupted run are kept in data/partial/ and reused (same spec, kernel, engine).
rule bench_configuration:
    input:
        kernel=kernel_build,
        # where the last run lost something that may pass (a length failed by a timeout, a refused connection, a
        # server error or death; a raw file that cannot be read), the next data/partial/<configuration>/retry-<n>.json
        # (rule note_retry): the same command, run again, reruns this job, which measures those again and reuses the rest
        retry=lambda w: retry_input(f"data/raw/{w.configuration}", f"{PARTIAL}/{w.configuration}",
                                    raw_names(w.configuration)),
    output:
        raw_files("{configuration}"),
    log:
        bench="data/logs/bench/{configuration}.log",
        server="data/logs/server/{configuration}.log",
    params:
        spec_hash=bench_spec_hash,
        outdir=lambda w, output: os.path.dirname(output[0]),
        resume=f"{PARTIAL}/{{configuration}}",
    wildcard_constraints:
        configuration="|".join(re.escape(c) for c in MEASURED if c not in VERIFYING) or "(?!)",
    threads: workflow.cores
    resources:
        gpu=bench_resource("gpu"),
        mem_mb=bench_resource("mem_mb"),
        runtime=bench_resource("runtime"),
    conda:
        ENV
    shell:
        "longctx bench --configuration {wildcards.configuration} --spec-hash {params.spec_hash} "
        "--outdir {params.outdir} --server-log {log.server} --resume-dir {params.resume} --log {log.bench}"


# A configuration that verifies the advice (configurations.<name>.verifies) measures the goal's lengths, not the
# config's: the same job, its files named for those lengths (the same for every such configuration: the goal's).
if VERIFYING:

    use rule bench_configuration as bench_verifying with:
        output:
            [f"data/raw/{{configuration}}/{n}.json" for n in raw_names(VERIFYING[0])],
        wildcard_constraints:
            configuration="|".join(re.escape(c) for c in VERIFYING),


# What the last run of a configuration lost, noted (and said) where the same command measures it again.
rule note_retry:
    output:
        f"{PARTIAL}/{{configuration}}/retry-{{key}}.json",
    log:
        "data/logs/note_retry/{configuration}-{key}.log",
    params:
        raw=lambda w: f"data/raw/{w.configuration}",
        names=lambda w: raw_names(w.configuration),
    wildcard_constraints:
        configuration="|".join(re.escape(c) for c in MEASURED) or "(?!)",
        key="[0-9a-f]+",
    localrule: True
    conda:
        ENV
    shell:
        "longctx retry-note --out {output} --raw {params.raw} --names {params.names} --log {log}"


# An imported configuration's result files (another tool's, longctx.measure.imports) as raw files, one per
# length they hold: a rule per configuration, since each has its own lengths; a changed file reruns it.
for _name in IMPORTED:

    rule:
        name:
            f"import_results_{_name}"
        input:
            IMPORTED_FILES[_name],
        output:
            raw_files(_name),
        log:
            f"data/logs/import/{_name}.log",
        params:
            configuration=_name,
            spec_hash=lambda w, _n=_name: lcfg.configuration_spec(CFG, _n).spec_hash(),
            outdir=lambda w, output: os.path.dirname(output[0]),
        localrule: True
        conda:
            ENV
        shell:
            "longctx import --configuration {params.configuration} --spec-hash {params.spec_hash} "
            "--outdir {params.outdir} --log {log}"


# Measured ceilings of the devices of this machine that the servers compute on (managed servers, and
# external ones with device: cpu | gpu; a remote server's are not this machine's, and the calibration
# says so). It takes every core, as a bench job
# does, so that it never shares the machine with a measurement; on a cluster it is a job of its own
# on a compute node (with a GPU where a configuration's server computes on one).
rule calibrate_hardware:
    output:
        "data/calibration.json",
    log:
        "data/logs/calibrate_hardware.log",
    params:
        plan=lambda w: canonical_json(calibration_plan(CFG)),
    threads: workflow.cores
    resources:
        gpu=int("cuda" in calibration_plan(CFG)["devices"]),
    conda:
        ENV
    shell:
        "longctx calibrate --plan {params.plan:q} --out {output} --log {log}"


# The kernel A/B (`snakemake --cores 1 report/ab.json`; longctx.report.ab): the kernel sources of the working tree
# against ab.against's (a kept version) or ab.against_rev's (a git revision), both measured in this one job,
# interleaved in blocks. An edit to a kernel source, or to the A/B's settings, reruns it. Each length's blocks are kept
# in data/ab/<configuration>/ as they are measured.
rule measure_ab:
    input:
        sources=ab_sources,
    output:
        "data/ab/measurements.json",
    log:
        "data/logs/measure_ab.log",
    params:
        settings=lambda w: canonical_json({**CFG["ab"], "rev": ab_revision()}),
    threads: workflow.cores
    conda:
        ENV
    shell:
        "longctx ab --measure-only --measurements {output} --log {log}"
