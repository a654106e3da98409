# One job per configuration: its server comes up once, every length is measured, it goes down.
# It takes every core it is given, so that two measurements never share the machine. Lengths
# measured by an interrupted run are kept in data/partial/ and reused (same spec, kernel, engine).
rule bench_configuration:
    input:
        kernel=kernel_build,
    output:
        raw_files("{configuration}"),
    log:
        bench="data/logs/bench/{configuration}.log",
        server="data/logs/server/{configuration}.log",
    params:
        spec=bench_spec,
        outdir=lambda w, output: os.path.dirname(output[0]),
        resume="data/partial/{configuration}",
    threads: workflow.cores
    resources:
        gpu=bench_resource("gpu"),
        mem_mb=bench_resource("mem_mb"),
        runtime=bench_resource("runtime"),
    conda:
        ENV
    shell:
        "longctx bench --spec {params.spec:q} --outdir {params.outdir} --server-log {log.server} "
        "--resume-dir {params.resume} > {log.bench} 2>&1"
