rule build_kernel:
    input:
        lambda w: CFG["kernels"][w.kernel]["sources"],
    output:
        "build/kernels/{kernel}/manifest.json",
    log:
        "data/logs/kernels/{kernel}.log",
    params:
        kind=lambda w: CFG["kernels"][w.kernel]["kind"],
        archs=lambda w: " ".join(f"--cuda-arch {a}" for a in CFG["kernels"][w.kernel]["cuda_archs"]),
        outdir=lambda w, output: os.path.dirname(output[0]),
    conda:
        ENV
    shell:
        "longctx build-kernel --name {wildcards.kernel} --kind {params.kind} --outdir {params.outdir} {params.archs} {input} --log {log}"


rule bench_kernel:
    input:
        "build/kernels/{kernel}/manifest.json",
    output:
        "data/kernels/{kernel}.json",
    log:
        "data/logs/kernels/bench_{kernel}.log",
    params:
        outdir=lambda w, input: os.path.dirname(input[0]),
        lengths=" ".join(map(str, LENGTHS)),
        shape=kernel_bench_shape,
    threads: workflow.cores
    conda:
        ENV
    shell:
        "longctx bench-kernel --kernel-dir {params.outdir} --lengths {params.lengths} {params.shape} "
        "--threads {threads} --out {output} --log {log}"
