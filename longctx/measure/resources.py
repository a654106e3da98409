"""What one configuration's bench job asks of the machine it runs on: GPUs, memory, wall time.

These become the Snakemake resources `gpu`, `mem_mb` and `runtime` (minutes) of the job. Run
locally they only count against `--resources` limits; a cluster executor turns them into its own
requests. GPUs come from the engine's parallelism flags (engines.*.gpus), none where the server
computes on the CPU or elsewhere (the adapter's `device`: vLLM's CPU build, an external server, which
holds its own GPUs, whatever its `device`), memory and time scale
with the lengths the job measures (config key `resources`); `configurations.<name>.resources`
overrides any of them.
"""

from __future__ import annotations

import math

from ..config import configuration_spec, length_grid
from ..engines import get_adapter


def longest_context(config: dict) -> int:
    """The most tokens one request of the job holds: the longest length, or the ITL-against-depth request."""
    depth = config["protocol"]["itl_depth"]
    longest = max(length_grid(config))
    if depth["length"]:
        longest = max(longest, depth["length"] + depth["output_tokens"])
    return longest


def request_tokens(config: dict) -> tuple[int, int]:
    """(prompt tokens, output tokens) the job sends over all its requests: per length the warm-up,
    the trials, the concurrent batches and the needle probe; then the ITL-against-depth request."""
    proto = config["protocol"]
    per_length = proto["warmup"] + proto["trials"] + proto["trials"] * sum(proto["concurrency"])
    needle = proto["needle"]["enabled"]
    prompt = sum(length * (per_length + needle) for length in length_grid(config))
    output = len(length_grid(config)) * (per_length * proto["output_tokens"] + needle * proto["needle"]["output_tokens"])
    depth = proto["itl_depth"]
    if depth["length"]:
        prompt += depth["length"]
        output += depth["output_tokens"]
    return prompt, output


def bench_resources(config: dict, configuration: str) -> dict[str, int]:
    """{'gpu', 'mem_mb', 'runtime'} for the bench job of one configuration of a validated config."""
    conf = config["configurations"][configuration]
    res = config["resources"]
    override = conf["resources"]
    prompt, output = request_tokens(config)
    adapter = get_adapter(conf["engine"])
    computed = {
        "gpu": adapter.gpus(conf["args"]) if adapter.device(configuration_spec(config, configuration)) == "gpu" else 0,
        "mem_mb": res["mem_mb"]["base"] + res["mem_mb"]["per_1k_tokens"] * longest_context(config) / 1000,
        "runtime": res["runtime_min"]["base"] + res["runtime_min"]["per_1m_prompt_tokens"] * prompt / 1e6
        + res["runtime_min"]["per_1k_output_tokens"] * output / 1000,
    }
    names = {"gpu": "gpus", "mem_mb": "mem_mb", "runtime": "runtime_min"}
    return {key: int(math.ceil(value)) if override[names[key]] is None else override[names[key]]
            for key, value in computed.items()}
