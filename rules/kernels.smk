rule build_kernel:
    input:
        lambda w: CFG["kernels"][w.kernel]["sources"],
    output:
        "build/kernels/{kernel}/manifest.json",
    log:
        "data/logs/kernels/{kernel}.log",
    params:
        kind=lambda w: CFG["kernels"][w.kernel]["kind"],
        outdir=lambda w, output: os.path.dirname(output[0]),
    conda:
        ENV
    shell:
        "longctx build-kernel --name {wildcards.kernel} --kind {params.kind} --outdir {params.outdir} {input} > {log} 2>&1"
