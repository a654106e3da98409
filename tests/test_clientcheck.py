"""Third-party benchmark clients' figures against the server's records (bench/client_overhead.py)."""

import json
import subprocess
import sys

import pytest

from longctx.measure import clientcheck as cc
from longctx.measure.stream import StreamRecord

from .conftest import ROOT


def server_record(rid, received, sent, endpoint="/v1/completions"):
    return {"rid": rid, "endpoint": endpoint, "prompt_tokens": 100, "received": received, "sent": sent,
            "event_tokens": [1] * len(sent)}


RECORDS = [server_record("b", 20.0, [20.5, 20.6, 20.8]), server_record("a", 10.0, [10.5, 10.6, 10.7]),
           server_record("g", 15.0, [15.1], endpoint="/generate")]


def test_vllm_results_are_matched_by_start_time_and_rebuilt_into_arrivals():
    # vLLM keeps each request's perf_counter start, TTFT and the gaps between chunks
    result = {"start_times": [9.999, 19.998], "ttfts": [0.502, 0.5025], "itls": [[0.1, 0.1], [0.1, 0.2]], "errors": ["", ""]}
    a, b = cc.vllm_checks(result, RECORDS, 100, set())
    assert a.ttft_error_s == pytest.approx(0.502 - 0.5) and b.ttft_error_s == pytest.approx(0.5025 - 0.5)
    assert a.send_lag_s == pytest.approx(0.001) and b.send_lag_s == pytest.approx(0.002)
    assert a.lags_s == pytest.approx([0.001] * 3)  # 9.999 + 0.502 = 10.501 against 10.5, and so on
    assert b.lags_s == pytest.approx([0.0005] * 3) and b.itl_errors_s == pytest.approx([0.0, 0.0])
    s = cc.summarize([a, b])
    assert s["requests"] == 2 and s["ttft_error_s_max"] == pytest.approx(0.0025) and s["prompt_tokens"] == [100]
    with pytest.raises(ValueError, match="failed a request"):
        cc.vllm_checks({**result, "errors": ["boom", ""]}, RECORDS, 100, set())
    with pytest.raises(ValueError, match="no streamed /v1/completions request received after"):
        cc.vllm_checks({**result, "start_times": [30.0, 31.0]}, RECORDS, 100, set())


def test_guidellm_wall_clock_times_are_moved_onto_the_monotonic_clock():
    offset = 1_700_000_000.0  # wall - monotonic
    req = {"info": {"timings": {"request_start": offset + 9.99, "first_token_iteration": offset + 10.503,
                                "last_token_iteration": offset + 10.706}}}
    report = {"benchmarks": [{"requests": {"successful": [req], "errored": []}}]}
    (c,) = cc.guidellm_checks(report, RECORDS, 100, offset, set())
    assert c.ttft_s == pytest.approx(0.513, abs=1e-6) and c.server_ttft_s == pytest.approx(0.5)
    assert c.send_lag_s == pytest.approx(0.01, abs=1e-6)
    assert c.lags_s == pytest.approx([0.003, 0.006], abs=1e-6)
    assert c.itl_errors_s == pytest.approx([(0.203 - 0.2) / 2], abs=1e-6)  # of the mean gap
    assert cc.wall_minus_mono() > 0


def test_our_record_gives_socket_level_and_httpx_level_checks():
    rec = StreamRecord(t_sent=1.001, t_call=1.0, arrival_clock="kernel", event_times=[2.0001, 2.1001],
                       event_seen=[2.0005, 2.1002], event_tokens=[1, 1], event_sent=[2.0, 2.1], t_done=2.2,
                       meta={"prompt_tokens": 50, "completion_tokens": 2,
                             "timestamps": {"received": 1.0015, "first_token_sent": 2.0}})
    sock, api = cc.own_checks(rec, 50)
    assert sock.ttft_error_s == pytest.approx((2.0001 - 1.001) - (2.0 - 1.0015))
    assert api.ttft_error_s == pytest.approx((2.0005 - 1.0) - (2.0 - 1.0015))
    assert sock.send_lag_s == pytest.approx(0.0005) and api.send_lag_s == pytest.approx(0.0015)
    assert sock.lags_s == pytest.approx([1e-4, 1e-4]) and api.itl_errors_s == pytest.approx([-3e-4])
    with pytest.raises(ValueError, match="no server timestamps"):
        cc.own_checks(StreamRecord(event_times=[1.0], event_seen=[1.0], event_tokens=[1], event_sent=[None], t_done=1.0), 50)


def run_bench(tmp_path, *args):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "client_overhead.py"), "--lengths", "300", "--trials", "2",
                           "--tokens", "8", "--json", str(out), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, {(row["client"], row["length"]): row for row in json.loads(out.read_text())}


def test_the_bench_script_checks_our_client_against_the_engine(tmp_path):
    stdout, rows = run_bench(tmp_path, "--vllm-python", "", "--guidellm", "")
    ours, httpx_level = rows[("longctx", 300)], rows[("longctx, httpx-level", 300)]
    assert ours["requests"] == httpx_level["requests"] == 2 and ours["prompt_tokens"] == [300]
    # the same requests: timed at the socket, the client's own costs drop out
    assert 0 < ours["ttft_error_s_median"] < httpx_level["ttft_error_s_median"]
    assert 0 < ours["lag_s_median"] < httpx_level["lag_s_median"]
    assert "skipped vllm bench serve: not installed here" in stdout and "skipped GuideLLM" in stdout
