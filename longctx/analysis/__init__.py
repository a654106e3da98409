"""longctx.analysis: from raw files to the figures the report states (rules/analyze.smk).

- aggregate: raw files -> results.csv, provenance.json, itl_depth.csv.
- tables: single-request rows, medians per length, concurrency, step time.
- fits: per configuration, the scaling models (longctx.core.fitting) against the model and the ceilings.
- compare: each configuration's speedups against the baseline, with Welch intervals on the logs and verdicts.
- roofline, bands, memory (the KV memory planner), kernel_records (kernels timed alone).
- paired: the paired interval of an interleaved A/B (ABBA blocks); kernel_ab: the kernel micro-benchmark A/B's
  verdicts per length from the blocks longctx.attention.kernel_ab measured.
"""
