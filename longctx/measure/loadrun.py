"""The load workloads of a configuration on the sweep's session (measure.load's points, in order), each kept as it
is measured."""

from __future__ import annotations

import asyncio
from typing import Callable

import httpx

from ..specs.pool import observed_pool
from .load import LoadContext, background_tokens, describe, failed_point, log, new_client, point_key, run_point
from .points import measure_points
from .protocol import one_request
from .wake import wake_probe, wake_wanted


def run_load(session, spec, run_id: str, predict: Callable[[int], tuple[float, float] | None],
             keep: Callable[[list[dict]], None], kept: list[dict] | None = None, retries=None) -> list[dict]:
    """Every load point of spec.load on the sweep's session (longctx.measure.session.Session: its server up,
    its prompter probed), in one event loop; keep(points) is called after each point, so that nothing
    measured is lost. A point after which the server does not answer its health path fails with the
    server's fault, the server is restarted (within the session's restarts) and the next point goes on."""
    load = spec.load
    chunk = session.adapter.chunked_prefill_size(spec.args, session.prov.get("server_info") or {})
    inter = load["interference"]
    try:
        context = session.adapter.context_length(spec.args, session.prov.get("server_info") or {})
    except (TypeError, ValueError):
        context = None
    pool, _ = observed_pool(session.prov)
    def measure(item: tuple[str, int, float]) -> dict:
        kind, length, level = item
        bg = 0
        if kind == "interference":
            # the streams and the injected prompt must fit the pool together: a server would hold the prompt
            # back until a stream ends, and the streams end only after it
            limits = [int(context) - inter["background_length"]] if context else []
            if pool:
                limits.append((int(pool) - length - 2) // inter["background"] - inter["background_length"])
            bg = background_tokens(inter, predict, length, min(limits) if limits else None)
            least = inter["steady_tokens"] + inter["tail_tokens"] + 16
            if limits and min(limits) < least:
                return failed_point(kind, length, level, (
                    f"not sent: {inter['background']} streams of {inter['background_length']} tokens decoding {least} "
                    f"and a prompt of {length} do not fit the KV pool of {pool} tokens (or the context length of "
                    f"{context})"), background=inter["background"])

        def timeout(prompt: int, in_flight: int) -> float:
            expected = predict(prompt)
            one = spec.protocol["request_timeout_s"]
            if expected:
                one = max(one, spec.protocol["timeout_factor"] * (expected[0] + load["output_tokens"] * expected[1]))
            return one * max(1, in_flight)

        async def run() -> dict:
            async with new_client(session.headers) as client:
                flush = None
                if spec.protocol["flush_cache"] and session.api.flush_path:
                    async def flush():
                        try:
                            await client.post(session.base + session.api.flush_path, timeout=30)
                        except httpx.HTTPError as exc:
                            log.warning("%s: flush_cache failed: %s", spec.name, exc)
                ctx = LoadContext(client, session.base, session.api.generate_path, session.prompter, session.adapter,
                                  f"{run_id}/{spec.name}", load, timeout, flush, session.health_path)
                if kind == "wake":
                    return await wake_probe(ctx, length)
                return await run_point(ctx, kind, length, level, chunk, bg)

        twins = load.get("sweep_twins", 0) if kind in ("closed", "open") else 0
        tag = f"{run_id}/{spec.name}/load/twin/{kind}{level:g}/L{length}"
        before = sweep_twins(session, spec, length, f"{tag}/before", twins, timeout(length, 1))
        point = asyncio.run(run())
        if twins:
            point["sweep_twins"] = before + sweep_twins(session, spec, length, f"{tag}/after", twins,
                                                        timeout(length, 1), "after")
        return point

    return measure_points(session, spec.name, points(load), point_key, measure, lambda item, why: failed_point(*item, why),
                          describe, keep, kept, retries)


def sweep_twins(session, spec, length: int, tag: str, n: int, timeout_s: float, side: str = "before") -> list[dict]:
    """The sweep's lone request (measure.protocol.one_request, the sweep's own code), n times at `length`, just before
    or just after a closed- or open-loop point there (`side`), so that the lone request and the point are measured
    seconds apart, alternately, whatever the machine does over the minutes of the stages: the what-if's calibration
    beside each of its check points (longctx.analysis.whatif), and beside the loop of one the sweep's side of the
    comparison of the two stages (longctx.analysis.drift.lone_request). Each summary says its side and index; none
    after a flush that found the server gone quiet."""
    out = []
    for i in range(n):
        summary = one_request(session, spec, length, f"{tag}/{i}", timeout_s)
        if summary is None:
            break
        out.append({**summary, "twin": side, "index": i})
    return out


def points(load: dict) -> list[tuple[str, int, float]]:
    """Every point of the load workloads, in the order measured: (kind, length, level); interference's
    level is its trial; the wake probe (one, at the shortest load length) comes first."""
    out: list[tuple[str, int, float]] = [("wake", min(load["lengths"]), 0)] if wake_wanted(load) else []
    for length in load["lengths"]:
        out += [("closed", length, c) for c in load["closed"]["concurrency"]]
        out += [("open", length, r) for r in load["open"]["rates"]]
    out += [("interference", L, t) for L in load["interference"]["lengths"] for t in range(load["interference"]["trials"])]
    return out
