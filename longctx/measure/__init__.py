"""longctx.measure: the measurements (rules/bench.smk), server up once per configuration.

- sweep: one configuration's run: Session (start, health, restarts, stop), every length, raw files.
- client, workload, needle: timed streaming requests, exact-length prompts, the needle probe.
- process, telemetry, provenance: the server's process group, NVML/psutil samples, where a figure came from.
- resources, calibration: what a bench job asks of the machine, the devices' measured ceilings.
- clientcheck: our client and other benchmark clients against the reference engine's socket timestamps.
"""
