"""The streaming client's timings against real local servers.

A small SGLang-format server with known delays (a real HTTP server on loopback, written for the
test so that the truth is known), then the reference engine itself.
"""

import asyncio
import json
import time

import httpx
import pytest
from starlette.responses import JSONResponse, StreamingResponse

from longctx.client import sglang_body, stream_generate

from .conftest import serve_generate

TTFT = 0.30
GAP = 0.05
# completion_tokens after each event: the fourth event carries two tokens (as under speculation)
CUMULATIVE = [1, 2, 3, 5, 6, 7]


async def generate(request):
    body = await request.json()
    if body.get("input_ids") == [0]:
        return JSONResponse({"error": {"message": "bad input"}}, status_code=400)
    hang = body.get("input_ids") == [1]

    async def events():
        await asyncio.sleep(10 if hang else TTFT)
        for i, n in enumerate(CUMULATIVE):
            if i:
                await asyncio.sleep(GAP)
            meta = {"prompt_tokens": len(body["input_ids"]), "completion_tokens": n, "cached_tokens": 0,
                    "finish_reason": {"type": "length", "length": n} if i == len(CUMULATIVE) - 1 else None}
            yield f"data: {json.dumps({'text': '', 'meta_info': meta})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def timed_server():
    with serve_generate(generate) as base:
        yield base + "/generate"


def test_ttft_and_gaps_match_the_servers_delays(timed_server):
    with httpx.Client() as client:
        stream_generate(client, timed_server, sglang_body([5] * 10, 7), 30)  # connection warm
        s = stream_generate(client, timed_server, sglang_body([5] * 100, 7), 30).summary()
    assert s["status"] == "ok", s["reason"]
    assert s["prompt_tokens"] == 100 and s["completion_tokens"] == 7
    assert TTFT <= s["ttft_s"] < TTFT + 0.05
    # 6 decode tokens over 5 gaps; the two-token event's gap is split between its tokens
    assert len(s["itl_s"]) == 6
    for i, gap in enumerate(s["itl_s"]):  # one late event shortens the next gap: +-20 ms each
        expected = GAP / 2 if i in (2, 3) else GAP
        assert abs(gap - expected) < 0.02, (i, gap)
    assert s["itl_s"][2] == s["itl_s"][3]  # the two tokens of one event share its gap
    assert sum(s["itl_s"]) == pytest.approx(5 * GAP, abs=0.02)
    assert s["tpot_s"] == pytest.approx(5 * GAP / 6, rel=0.2)
    assert s["decode_tok_s"] == pytest.approx(1 / s["tpot_s"])
    assert s["e2e_s"] >= s["ttft_s"] + 5 * GAP


def test_http_errors_and_timeouts_are_failures_with_reasons(timed_server):
    with httpx.Client() as client:
        bad = stream_generate(client, timed_server, sglang_body([0], 4), 30).summary()
        assert bad["status"] == "failed" and "HTTP 400" in bad["reason"] and "bad input" in bad["reason"]
        t0 = time.perf_counter()
        hung = stream_generate(client, timed_server, sglang_body([1], 4), 0.5).summary()
        assert hung["status"] == "failed" and "timed out" in hung["reason"]
        assert time.perf_counter() - t0 < 3


def test_against_the_reference_engine(ref_server):
    with httpx.Client() as client:
        s = stream_generate(client, ref_server["base"] + "/generate", sglang_body(list(range(200)), 6), 30).summary()
    assert s["status"] == "ok", s["reason"]
    assert s["prompt_tokens"] == 200 and s["completion_tokens"] == 6 and len(s["itl_s"]) == 5
    # the server's own end-to-end latency cannot exceed what the client saw
    assert 0 < s["server_e2e_latency_s"] <= s["e2e_s"]
