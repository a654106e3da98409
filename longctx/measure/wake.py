"""The wake probe, a load workload measured before the open loops: single requests of one output token, each sent
once the server has idled a gap of load.wake.idle_s since the one before ended (its actual idle, from the client's
record, kept beside it), `repeats` rounds over the gaps. What a request that finds the server idle pays (an engine
that sleeps when idle, a GPU whose clocks dropped) is what an open loop's arrivals meet and the sweep's back-to-back
trials do not; longctx.analysis.whatif adds it to the first step after an idle stretch. Unscraped: a /metrics GET
would wake the server.
"""

from __future__ import annotations

import asyncio
import time

from .load import LoadContext, point_status, send_request, warm


async def wake_probe(ctx: LoadContext, length: int) -> dict:
    """Single requests of `length` tokens and one output token, each sent once the server has idled one of
    load.wake.idle_s since the one before ended (a first one, its gap unknown, leads), round after round."""
    cfg = ctx.load["wake"]
    timeout = ctx.timeout_s(length, 1)
    gaps = [None] + [g for _ in range(cfg["repeats"]) for g in cfg["idle_s"]]
    await warm(ctx)
    t0 = time.perf_counter()
    requests: list[dict] = []
    ended = None  # when the request before ended (offset from t0)
    for i, gap in enumerate(gaps):
        if ended is not None:
            await asyncio.sleep(max(0.0, t0 + ended + gap - time.perf_counter()))
        body = ctx.prompter.body(length, f"{ctx.key}/wake/L{length}/{i}", 1)
        r = await send_request(ctx, body, length, 1, t0, timeout, index=i, gap_s=gap)
        sent = r.get("sent_s")
        r["idle_s"] = round(sent - ended, 6) if gap is not None and sent is not None and ended is not None else None
        # its stream's end ([DONE]: sent + e2e), else its last event, else now (it failed before either)
        if sent is not None and r.get("e2e_s") is not None:
            ended = sent + r["e2e_s"]
        else:
            ended = (r.get("event_times") or [time.perf_counter() - t0])[-1]
        requests.append(r)
    status, reason = point_status(requests)
    return {"kind": "wake", "length": length, "level": 0, "output_tokens": 1, "idle_s": list(cfg["idle_s"]),
            "repeats": cfg["repeats"], "status": status, "reason": reason, "t0": t0,
            "duration_s": round(time.perf_counter() - t0, 6), "requests": requests}


def wake_wanted(load: dict) -> bool:
    """Whether the load stage probes the server's waking: open loops asked, and at least two gaps."""
    w = load.get("wake") or {}
    return bool(load["lengths"] and load["open"]["rates"] and w.get("repeats") and len(w.get("idle_s") or []) >= 2)
