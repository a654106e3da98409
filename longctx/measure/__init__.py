"""longctx.measure: the measurements (rules/bench.smk), server up once per configuration.

One configuration's run, from the outside in:
- sweep: run_configuration, the run itself: every length, then the ITL-depth request and the workloads.
- session: the server for the run (start, prompt probe, health, fault, restart, stop).
- protocol: one length: warm-up, trials, batches, needle probe; the ITL-depth request; request timeouts.
- adaptive: the adaptive sweep's planner (which length, how many trials next) and its driver.
- load, prefix, points, scrape: the workloads after the lengths (load; reused context), the loop they share,
  and the server's own /metrics through a load point.
- rawfiles: the raw files (written whole, kept in data/partial for resuming, written when absent).
One request, from the top down:
- prompts, workload, needle: prompts as the server takes them (the probe), exact-length ids, the needle probe.
- bodies: the request bodies per API.
- stream: a streamed request timed and parsed (StreamRecord, stream_generate, astream_generate).
- transport: httpx clients over timed connections, the asyncio keep-alive pool.
- wire: the connections themselves, timed at the socket (kernel receive stamps).
Around them:
- process, health: the server's process group; whether a server is ready (health probes, external servers).
- telemetry, provenance, progress: device samples, where a figure came from, progress lines.
- resources, calibration, rerun: what a bench job asks of the machine, measured ceilings, a stale lock cleared.
- clientcheck: our client and other benchmark clients against the reference engine's socket timestamps.
- imports: results other benchmark tools measured, as raw files.
"""
