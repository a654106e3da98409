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
        "longctx build-kernel --name {wildcards.kernel} --kind {params.kind} --outdir {params.outdir} {params.archs} {input} > {log} 2>&1"
