"""bench/stub_sse_server.py (a /generate server that answers at once, its events stamped at its
socket) and clientcheck.stream_errors (a client's times against those stamps), over real loopback."""

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import time

import httpx
import pytest

from longctx.measure import clientcheck as cc
from longctx.measure.bodies import sglang_body
from longctx.measure.stream import StreamRecord, astream_generate, stream_generate
from longctx.measure.transport import async_timed_client, timed_client

from .conftest import ROOT, bench_script

# alone under -n (tests/conftest.py): its times are held to milliseconds
pytestmark = pytest.mark.alone

KERNEL = "kernel" if sys.platform == "linux" else "socket"
INTERVAL = 0.004


stub_sse_server = bench_script("stub_sse_server")


def paced(ids, tokens, interval_s):
    return json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": tokens}, "stream": True,
                       "stub": {"interval_s": interval_s}}).encode()


@pytest.fixture(scope="module")
def stub():
    with stub_sse_server.running(interval_s=INTERVAL) as base:
        yield base


def test_events_follow_the_schedule_and_carry_the_servers_stamps(stub):
    with timed_client() as client:
        assert client.get(stub + "/health").status_code == 200
        stream_generate(client, stub + "/generate", sglang_body([1] * 8, 2), 10)  # connection warm
        t0 = time.perf_counter()
        body = json.dumps({"input_ids": [3] * 40, "sampling_params": {"max_new_tokens": 12}, "stream": True, "rid": "r1",
                           "stub": {"ttft_s": 0.05}}).encode()
        rec = stream_generate(client, stub + "/generate", body, 10)
        again = stream_generate(client, stub + "/generate", sglang_body([1] * 8, 3), 10)  # keep-alive: the same connection
        assert client.post(stub + "/nowhere").status_code == 404
    s = rec.summary()
    assert s["status"] == "ok", s["reason"]
    assert s["prompt_tokens"] == 40 and s["completion_tokens"] == 12 and rec.event_tokens == [1] * 12
    assert rec.meta["id"] == "r1" and s["finish_reason"] == {"type": "length", "length": 12}
    ts = s["server_timestamps"]
    assert t0 < rec.t_sent < ts["received"] < rec.t_sent + 0.02  # the kernel's stamp of the request's first bytes
    assert s["server_ttft_s"] == pytest.approx(0.05, abs=0.02) and 0 < s["ttft_s"] - s["server_ttft_s"] < 0.02
    assert all(u < t <= seen for u, t, seen in zip(rec.event_sent, rec.event_times, rec.event_seen))
    gaps = [b - a for a, b in zip(rec.event_sent, rec.event_sent[1:])]
    assert statistics.median(gaps) == pytest.approx(INTERVAL, abs=0.002)
    assert again.ok and again.summary()["completion_tokens"] == 3 and s["arrival_clock"] == KERNEL


def test_not_streamed_and_bad_requests(stub):
    r = httpx.post(stub + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 5
    bad = httpx.post(stub + "/generate", content=b"{nope", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and "bad JSON" in bad.json()["error"]["message"]


def test_32_async_streams_against_the_stub_and_their_errors(stub):
    async def many():
        async with async_timed_client() as client:
            await astream_generate(client, stub + "/generate", sglang_body([1] * 8, 2), 10)
            # 32 x 20 events over 1 s: well within what this client reads on a loaded 2-core machine
            return await asyncio.gather(*(astream_generate(client, stub + "/generate", paced([i] * (8 + i), 20, 0.05), 30)
                                          for i in range(32)))

    recs = asyncio.run(many())
    assert all(r.ok for r in recs), [r.error for r in recs if not r.ok]
    assert [r.summary()["prompt_tokens"] for r in recs] == [8 + i for i in range(32)]
    assert all(sum(r.event_tokens) == 20 and r.arrival_clock == KERNEL for r in recs)
    errors = cc.stream_errors(recs + [StreamRecord(error="boom")])
    assert errors["requests"] == 33 and errors["checked"] == 32
    assert errors["token_lag_s"]["n"] == 32 * 20 and errors["itl_error_s"]["n"] == 32 * 19
    # a 2-core machine shared with the server: loose bounds; bench/load_client.py prints the figures
    assert 0 < errors["ttft_error_s"]["p50"] < 0.02 and 0 < errors["send_lag_s"]["p50"] < 0.02
    assert 0 < errors["token_lag_s"]["p50"] < 0.02 and errors["read_delay_s"]["p50"] >= 0
    # from the summaries alone: the same TTFT errors, per-request lags
    from_summaries = cc.stream_errors([r.summary() for r in recs])
    assert from_summaries["ttft_error_s"] == errors["ttft_error_s"] and from_summaries["token_lag_s"]["n"] == 32


def test_stream_errors_by_hand():
    def rec(t_sent, received, first_sent, sent, arrivals):
        return StreamRecord(t_sent=t_sent, t_call=t_sent, arrival_clock="kernel", event_times=arrivals, event_seen=arrivals,
                            event_tokens=[1] * len(arrivals), event_sent=sent, t_done=arrivals[-1],
                            meta={"completion_tokens": len(arrivals),
                                  "timestamps": {"received": received, "first_token_sent": first_sent}})

    a = rec(1.0, 1.0001, 1.5, [1.5, 1.6], [1.5002, 1.6001])  # TTFT error 0.5002 - 0.4999 = 0.0003
    b = rec(2.0, 2.0002, 2.1, [2.1, 2.2], [2.1004, 2.2004])  # 0.1004 - 0.0998 = 0.0006
    e = cc.stream_errors([a, b, rec(3.0, 3.0, 3.0, [None], [3.1])])  # no send stamps on the events: not used
    assert e["requests"] == 3 and e["checked"] == 2
    assert e["ttft_error_s"]["p50"] == pytest.approx(0.00045) and e["ttft_error_s"]["max"] == pytest.approx(0.0006)
    assert e["send_lag_s"]["max"] == pytest.approx(0.0002)
    assert e["token_lag_s"]["n"] == 4
    assert e["token_lag_s"]["max"] == pytest.approx(0.0004) and e["token_lag_max_s"]["p50"] == pytest.approx(0.0003)
    assert e["itl_error_s"]["max"] == pytest.approx(0.0001) and e["read_delay_s"]["max"] == 0
    assert cc.stream_errors([])["ttft_error_s"] is None


def test_started_as_a_process_and_stopped_by_its_pid():
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "stub_sse_server.py"), "--port", "0", "--tokens", "4"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(stub_sse_server.READY) and line.split()[-1] == str(proc.pid)
        base = line[len(stub_sse_server.READY):].split()[0]
        with httpx.Client() as client:  # --tokens: events per request, whatever it asks
            assert stream_generate(client, base + "/generate", sglang_body([1], 50), 10).summary()["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
