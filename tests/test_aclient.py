"""The asyncio client (async_timed_client, astream_generate, Prompter.agenerate) against real
loopback servers: the same socket-level times as the blocking client, checked against the test
server's known delays and the reference engine's own send stamps (meta_info.sent_ts, CLOCK_MONOTONIC,
perf_counter's clock), many streams on one event loop, cancellation, and one parser for both."""

import asyncio
import json
import socket
import sys
import time

import httpcore
import pytest
from starlette.responses import StreamingResponse

from longctx.measure import transport as ltransport, wire as lwire
from longctx.measure.bodies import openai_body, sglang_body
from longctx.measure.stream import CANCELLED, StreamParser, StreamRecord, astream_generate, stream_generate
from longctx.measure.transport import async_timed_client, timed_client
from longctx.measure.wire import AsyncWireStream
from longctx.measure.prompts import PromptPlan, Prompter

from .conftest import serve_generate
from .openai_servers import openai_server
from .test_client import CUMULATIVE, GAP, TTFT
from .test_client import generate as known_delays

# alone under -n (tests/conftest.py): its TTFT and gaps are held to a few milliseconds
pytestmark = pytest.mark.alone

KERNEL = "kernel" if sys.platform == "linux" else "socket"
PARTIAL = 3  # events the stalling request gets before it stalls
ROUNDS = 3  # requests per client where two clients' times are compared


async def generate(request):
    """test_client's server (TTFT, then GAP between events), plus input_ids [2]: PARTIAL events, then a stall."""
    body = await request.json()
    if body.get("input_ids") != [2]:
        return await known_delays(request)

    async def events():
        for n in range(1, PARTIAL + 1):
            yield f"data: {json.dumps({'text': '', 'meta_info': {'completion_tokens': n}})}\n\n".encode()
            await asyncio.sleep(0.02)
        await asyncio.sleep(30)

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def stub():
    with serve_generate(generate) as base:
        yield base + "/generate"


def run(coro):
    return asyncio.run(coro)


async def _twice(url, body, timeout_s=30, rounds=None, **kw):
    """A request to warm the connection, then the one measured (a list of `rounds` of them, one after another, where
    rounds is given), on one client."""
    async with async_timed_client() as client:
        await astream_generate(client, url, sglang_body([5] * 10, 7), timeout_s)
        if rounds is None:
            return await astream_generate(client, url, body, timeout_s, **kw)
        return [await astream_generate(client, url, body, timeout_s, **kw) for _ in range(rounds)]


def test_ttft_and_gaps_match_the_servers_delays(stub):
    rec = run(_twice(stub, sglang_body([5] * 100, 7)))
    s = rec.summary()
    assert s["status"] == "ok", s["reason"]
    assert s["arrival_clock"] == KERNEL
    assert rec.t_call < rec.t_sent and all(t <= seen for t, seen in zip(rec.event_times, rec.event_seen))
    assert s["prompt_tokens"] == 100 and s["completion_tokens"] == 7
    assert TTFT <= s["ttft_s"] < TTFT + 0.05  # the tolerances of test_client's
    assert len(s["itl_s"]) == 6 and s["itl_s"][2] == s["itl_s"][3]
    for i, gap in enumerate(s["itl_s"]):
        assert abs(gap - (GAP / 2 if i in (2, 3) else GAP)) < 0.02, (i, gap)
    assert sum(s["itl_s"]) == pytest.approx(5 * GAP, abs=0.02)


def test_both_clients_give_the_same_summary_for_the_same_stream(stub):
    """The same fields from both clients, and the same times: the least of ROUNDS requests each. A stall
    of the machine only ever adds to a time, so the least is each client's own cost; a single request each, as before,
    differed by 25 ms once in a clean clone's `make test` (the async TTFT 0.327 s, the blocking one's 0.303 s)."""
    body = sglang_body([7] * 50, 7)
    with timed_client() as client:
        stream_generate(client, stub, body, 30)
        syncs = [stream_generate(client, stub, body, 30).summary() for _ in range(ROUNDS)]
    asyncs = [rec.summary() for rec in run(_twice(stub, body, rounds=ROUNDS))]
    sync, asyn = syncs[0], asyncs[0]
    assert sync.keys() == asyn.keys()
    timed = {"t_sent", "t_first_token", "t_last_token", "ttft_s", "e2e_s", "decode_s", "tpot_s", "decode_tok_s",
             "itl_median_s", "itl_max_s", "itl_s", "send_setup_s", "read_delay_mean_s"}
    untimed = [{k: v for k, v in s.items() if k not in timed} for s in syncs + asyncs]
    assert all(u == untimed[0] for u in untimed), untimed
    assert all(s["status"] == "ok" and s["arrival_clock"] == KERNEL for s in asyncs)
    assert all(len(s["itl_s"]) == sum(CUMULATIVE[-1:]) - 1 for s in syncs + asyncs)
    for k in ("ttft_s", "e2e_s", "decode_s"):
        least = min(s[k] for s in syncs), min(s[k] for s in asyncs)
        assert least[1] == pytest.approx(least[0], abs=0.02), (k, [s[k] for s in syncs], [s[k] for s in asyncs])


def test_the_parser_gives_the_same_record_however_the_bytes_are_split():
    events = [{"meta_info": {"completion_tokens": n, "sent_ts": float(n)}} for n in (1, 2, 4)]
    wire = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    records = []
    for size in (1, 7, 64, len(wire)):
        rec = StreamRecord()
        parser = StreamParser(rec)
        for i in range(0, len(wire), size):
            parser.feed(wire[i:i + size], 10.0 + i, 20.0 + i)
        parser.finish()
        records.append((rec.event_tokens, rec.event_sent, rec.meta, rec.error, rec.t_done is not None))
    assert all(r == records[0] for r in records)
    assert records[0][:2] == ([1, 1, 2], [1.0, 2.0, 4.0]) and records[0][3] is None


def test_http_errors_and_timeouts_are_failures_with_reasons(stub):
    async def both():
        async with async_timed_client() as client:
            bad = await astream_generate(client, stub, sglang_body([0], 4), 30)
            t0 = time.perf_counter()
            hung = await astream_generate(client, stub, sglang_body([1], 4), 0.5)
            return bad.summary(), hung.summary(), time.perf_counter() - t0

    bad, hung, took = run(both())
    assert bad["status"] == "failed" and "HTTP 400" in bad["reason"] and "bad input" in bad["reason"]
    assert hung["status"] == "failed" and "timed out" in hung["reason"] and took < 3


def test_a_cancelled_request_keeps_the_events_it_got(stub):
    rec = StreamRecord()

    async def cancel_after_partial():
        async with async_timed_client() as client:
            task = asyncio.create_task(astream_generate(client, stub, sglang_body([2], 8), 60, record=rec))
            while len(rec.event_times) < PARTIAL:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # the stream stalls
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the client still works: the cancelled connection was dropped, not reused half-read
            return await astream_generate(client, stub, sglang_body([5] * 20, 7), 30)

    after = run(cancel_after_partial())
    assert rec.error == CANCELLED and rec.t_done is None and not rec.ok
    assert rec.event_tokens == [1] * PARTIAL and len(rec.event_seen) == len(rec.event_sent) == PARTIAL
    s = rec.summary()
    assert s["status"] == "failed" and s["reason"] == CANCELLED and s["completion_tokens"] == PARTIAL
    assert s["arrival_clock"] == KERNEL and len(s["itl_s"]) == PARTIAL - 1
    assert after.ok and after.summary()["completion_tokens"] == 7


def test_against_the_reference_engine_events_arrive_after_the_server_sent_them(ref_server):
    """Socket-level times on both sides, one clock (perf_counter is CLOCK_MONOTONIC): the request
    leaves before the server reads it; each event arrives after the server wrote it, before the client
    parsed it, and within test_client's 20 ms of it; TTFT exceeds the server's own by under 50 ms."""
    url = ref_server["base"] + "/generate"
    rec = run(_twice(url, sglang_body([i % 256 for i in range(300)], 8)))
    s = rec.summary()
    assert s["status"] == "ok", s["reason"]
    assert s["arrival_clock"] == KERNEL
    ts = s["server_timestamps"]
    assert rec.t_call < rec.t_sent < ts["received"]
    assert len(rec.event_sent) == 8
    for sent, t, seen in zip(rec.event_sent, rec.event_times, rec.event_seen):
        assert sent < t <= seen and t - sent < 0.02
    assert 0 < s["ttft_s"] - s["server_ttft_s"] < 0.05
    assert 0 < s["recv_lag_median_s"] < 0.02 and 0 < s["send_lag_s"] < 0.02


def test_32_concurrent_streams_on_one_event_loop(ref_server):
    url = ref_server["base"] + "/generate"
    n, out = 32, 6

    async def many():
        async with async_timed_client() as client:
            bodies = [sglang_body([(7 * i + j) % 256 for j in range(40 + i)], out) for i in range(n)]
            return await asyncio.gather(*(astream_generate(client, url, b, 120) for b in bodies))

    recs = run(many())
    for i, rec in enumerate(recs):
        s = rec.summary()
        assert s["status"] == "ok", (i, s["reason"])
        assert s["prompt_tokens"] == 40 + i and s["completion_tokens"] == out and sum(rec.event_tokens) == out
        assert s["arrival_clock"] == KERNEL and len(s["itl_s"]) == out - 1
        assert all(sent < t <= seen for sent, t, seen in zip(rec.event_sent, rec.event_times, rec.event_seen))
    # the streams ran together, not one after another
    assert max(r.event_times[0] for r in recs) < max(r.event_times[-1] for r in recs)
    starts = sorted(r.t_sent for r in recs)
    assert starts[-1] - starts[0] < min(r.event_times[-1] for r in recs) - starts[0]


def test_agenerate_completes_counts_as_generate_does(tmp_path):
    """An OpenAI server with no usage anywhere: both count the prompt as built and the events as tokens."""
    plan = PromptPlan(usage="none", events="every", events_exact=False)
    prompter = Prompter("openai", "m", {"seed": 0, "token_id_range": [3, 300]}, plan)
    with openai_server("no-usage", tmp_path) as (base, _):
        url, body = base + "/v1/completions", openai_body(list(range(3, 43)), 9, "m")
        with timed_client() as client:
            sync = prompter.generate(client, url, body, 30, 40)

        async def one():
            async with async_timed_client() as client:
                rec = StreamRecord()
                summary = await prompter.agenerate(client, url, body, 30, 40, record=rec)
                return summary, rec

        asyn, rec = run(one())
    for s in (sync, asyn):
        assert s["status"] == "ok", s["reason"]
        assert s["usage_source"] == "client" and s["prompt_tokens"] == 40 and s["completion_tokens"] == 9
        assert s["tokens_estimated"] is True and len(s["itl_s"]) == 8
    assert rec.event_tokens == [1] * 9 and asyn["arrival_clock"] == KERNEL


def test_without_kernel_timestamps_the_async_stream_times_its_reads(monkeypatch, stub):
    monkeypatch.setattr(lwire, "_SO_TIMESTAMPNS", None)
    rec = run(_twice(stub, sglang_body([5] * 30, 7)))
    s = rec.summary()
    assert s["status"] == "ok" and s["arrival_clock"] == "socket"
    assert TTFT <= s["ttft_s"] < TTFT + 0.05


def test_the_connections_are_ours():
    async def connect():
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        stream = await ltransport.AsyncWireBackend().connect_tcp("127.0.0.1", listener.getsockname()[1], timeout=5)
        peer, _ = await asyncio.get_running_loop().sock_accept(listener)
        try:
            assert isinstance(stream, AsyncWireStream) and stream.arrival_clock == KERNEL
            assert stream.get_extra_info("is_readable") is False
            with pytest.raises(httpcore.ReadTimeout):
                await stream.read(100, timeout=0.05)
            before = time.perf_counter()
            await stream.write(b"GET / HTTP/1.1\r\n\r\n")
            assert before < stream.request_sent < time.perf_counter()
            assert peer.recv(100) == b"GET / HTTP/1.1\r\n\r\n"
            peer.sendall(b"data: a\n\ndata: b\n\n")
            await asyncio.sleep(0.02)
            assert await stream.read(100, timeout=1) == b"data: a\n\n"  # one event a read
            assert await stream.read(100, timeout=1) == b"data: b\n\n"
            peer.close()
            assert stream.get_extra_info("is_readable") is True and await stream.read(100, timeout=1) == b""
        finally:
            await stream.aclose()
            listener.close()

    run(connect())



def test_the_chunked_body_reader_gives_the_payload_however_the_bytes_are_split():
    """The direct body reader's decoding of HTTP/1.1 chunks, against bytes framed by hand (two events in one
    chunk, an event over two chunks, a chunk extension, the last chunk and a trailer), split at every byte."""
    from longctx.measure.direct import ChunkedBody

    payload = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    framed = (b"20\r\n" + payload[:32] + b"\r\n" + b"5;ext=1\r\n" + payload[32:37] + b"\r\n"
              + b"%x\r\n" % (len(payload) - 37) + payload[37:] + b"\r\n" + b"0\r\nx-trailer: 1\r\n\r\n")
    assert len(payload[:32]) == 0x20
    for cut in range(len(framed) + 1):
        body = ChunkedBody()
        got = body.feed(framed[:cut])
        assert not body.done or cut >= framed.index(b"0\r\nx-trailer")
        got += body.feed(framed[cut:])
        assert got == payload and body.done, cut
    one_by_one = ChunkedBody()
    assert b"".join(one_by_one.feed(framed[i:i + 1]) for i in range(len(framed))) == payload and one_by_one.done
