"""The streaming client's timings against real local servers.

A small SGLang-format server with known delays (a real HTTP server on loopback, written for the
test so that the truth is known), then the reference engine itself.
"""

import asyncio
import json
import socket
import sys
import time

import httpcore
import httpx
import pytest
from starlette.responses import JSONResponse, StreamingResponse

from longctx.measure import wire as lwire
from longctx.measure.bodies import sglang_body
from longctx.measure.stream import stream_generate
from longctx.measure.transport import timed_client
from longctx.measure.wire import WireStream

from .conftest import serve_generate

# alone under -n (tests/conftest.py): its TTFT and gaps are held to a few milliseconds
pytestmark = pytest.mark.alone

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


@pytest.mark.parametrize("make_client", [httpx.Client, timed_client], ids=["httpx-level", "socket-level"])
def test_ttft_and_gaps_match_the_servers_delays(timed_server, make_client):
    with make_client() as client:
        stream_generate(client, timed_server, sglang_body([5] * 10, 7), 30)  # connection warm
        rec = stream_generate(client, timed_server, sglang_body([5] * 100, 7), 30)
        s = rec.summary()
    assert s["status"] == "ok", s["reason"]
    if make_client is timed_client:
        assert s["arrival_clock"] == ("kernel" if sys.platform == "linux" else "socket")
        assert rec.t_call < rec.t_sent and all(t <= seen for t, seen in zip(rec.event_times, rec.event_seen))
    else:
        assert s["arrival_clock"] == "call" and s["send_setup_s"] == 0
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


def test_timed_client_against_the_reference_engine_is_causal(ref_server):
    """Socket-level times on both sides, one clock: the request leaves before the server reads it,
    each event arrives after the server wrote it and before the client parsed it."""
    with timed_client() as client:
        rec = stream_generate(client, ref_server["base"] + "/generate", sglang_body([i % 256 for i in range(300)], 8), 30)
    s = rec.summary()
    assert s["status"] == "ok", s["reason"]
    ts = s["server_timestamps"]
    assert rec.t_call < rec.t_sent < ts["received"]
    assert len(rec.event_sent) == 8 and all(sent < t <= seen for sent, t, seen in zip(rec.event_sent, rec.event_times, rec.event_seen))
    assert 0 < s["ttft_s"] - s["server_ttft_s"] and s["recv_lag_median_s"] > 0


def _wire_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    stream = WireStream(httpcore.SyncBackend().connect_tcp("127.0.0.1", listener.getsockname()[1], timeout=5))
    peer, _ = listener.accept()
    listener.close()
    return stream, peer


@pytest.mark.skipif(sys.platform != "linux", reason="kernel receive timestamps (SO_TIMESTAMPNS) are Linux's")
def test_a_late_read_still_gets_the_kernels_arrival_time():
    stream, peer = _wire_pair()
    with peer:
        # Linux turns receive timestamps on lazily when a socket asks and none had: the packets of
        # the first few milliseconds may carry none (read_stamped False, the read's own time kept)
        for _ in range(200):
            peer.sendall(b"x\n\n")
            stream.read(65536, timeout=5)
            if stream.read_stamped:
                break
            time.sleep(0.005)
        assert stream.read_stamped
        before = time.perf_counter()
        stream.write(b"POST / HTTP/1.1\r\n\r\n")
        assert before < stream.request_sent < time.perf_counter()
        assert stream.arrival_clock == "kernel"
        for name in b"ab":  # the client reads each event 50 ms after it came
            sent = time.perf_counter()
            peer.sendall(b"5\r\ndata: " + bytes([name]) * 1000 + b"\n\n\r\n")
            time.sleep(0.05)
            data = b""
            while not data.endswith(b"\n\n\r\n"):
                data += stream.read(65536, timeout=5)
            assert stream.read_stamped and sent < stream.read_at < sent + 0.02
        # events waiting together are read one at a time, up to their blank line and the chunk's own CRLF
        # (chunked encoding: not a read of its own)
        for name in b"cd":
            peer.sendall(b"5\r\ndata: " + bytes([name]) * 1000 + b"\n\n\r\n")
        time.sleep(0.05)
        reads = [stream.read(65536, timeout=5) for _ in range(2)]
        assert reads[0] == b"5\r\ndata: " + b"c" * 1000 + b"\n\n\r\n" and reads[1].endswith(b"d\n\n\r\n")
        stream.close()


def test_without_kernel_timestamps_arrival_is_when_the_read_returned(monkeypatch):
    monkeypatch.setattr(lwire, "_SO_TIMESTAMPNS", None)
    stream, peer = _wire_pair()
    with peer:
        assert stream.arrival_clock == "socket"
        stream.write(b"x")
        peer.sendall(b"data: a\n\n")
        time.sleep(0.1)
        t0 = time.perf_counter()
        assert stream.read(65536, timeout=5) == b"data: a\n\n"
        assert t0 < stream.read_at < time.perf_counter()
        stream.close()
