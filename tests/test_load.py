"""The load workloads (longctx.measure.load): arrival schedules, metrics parsing, open-loop sending that
does not wait for the server (no coordinated omission), and a real sweep with load on the reference engine."""

import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from longctx.engines import get_adapter
from longctx.measure import load as ld, scrape
from longctx.measure.prompts import Prompter, PromptPlan
from longctx.measure.sweep import run_configuration

from .conftest import bench_script, tiny_spec

# alone under -n (tests/conftest.py): its loops' send times are held to tens of milliseconds
pytestmark = pytest.mark.alone


def test_arrival_schedules_have_the_asked_rate_and_burstiness():
    n, rate = 20000, 50.0
    for arrival, cv in (("poisson", 1.0), ("gamma", 1.0), ("gamma", 3.0), ("gamma", 0.25)):
        t = np.array(ld.arrival_schedule(rate, n, arrival, cv, seed=1))
        gaps = np.diff(t)
        assert t[0] == 0.0 and np.all(gaps >= 0)
        assert abs(gaps.mean() - 1 / rate) / (1 / rate) < 0.03  # mean gap 20 ms
        assert abs(gaps.std() / gaps.mean() - cv) / cv < 0.05  # an exponential's CV is 1
    assert ld.arrival_schedule(2.0, 5, seed=3) == ld.arrival_schedule(2.0, 5, seed=3)  # seeded
    assert ld.arrival_schedule(2.0, 5, seed=3) != ld.arrival_schedule(2.0, 5, seed=4)


EXPOSITION = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",dp="0"} 3.0
sglang:num_running_reqs{model_name="m",dp="1"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.25
sglang:token_usage{model_name="m",tp_rank="1"} 0.25
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 4.0
# TYPE sglang:num_retracted_requests counter
sglang:num_retracted_requests_total{model_name="m"} 7.0
"""


def test_metrics_are_read_by_the_adapters_names_summed_or_replicated():
    names = get_adapter("external").metric_names  # SGLang's and vLLM's names both
    got = scrape.parse_metrics(EXPOSITION, names)
    # requests add up over data-parallel ranks; the pool's usage is the same on every tensor-parallel rank
    assert got == {"running": 5.0, "token_usage": 0.25, "queued": 4.0, "retracted_total": 7.0}
    assert scrape.parse_metrics(EXPOSITION, get_adapter("vllm").metric_names) == {"queued": 4.0}


def test_the_fast_reader_reads_what_prometheus_clients_own_parser_reads():
    """parse_metrics reads only the lines of the names wanted (a vLLM exposition is hundreds of kB, read every interval
    on the event loop that times the requests); held to prometheus_client's parser on an exposition that
    prometheus_client itself wrote: labels with spaces, braces, commas and escaped quotes, counters' _total and
    _created, histograms' buckets, 600 label sets of noise around the wanted names."""
    import time as clock

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    reg = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "r", ["model_name", "engine"], registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "w", ["model_name", "engine"], registry=reg)
    usage = Gauge("vllm:kv_cache_usage_perc", "u", ["model_name", "engine"], registry=reg)
    preempt = Counter("vllm:num_preemptions", "p", ["model_name", "engine"], registry=reg)
    noise = Histogram("vllm:noise_seconds", "n", ["model_name", "engine", "tag"], registry=reg)
    model = 'odd "model" {name}, with spaces\\'
    for engine in ("0", "1"):
        running.labels(model, engine).set(3 + int(engine))
        waiting.labels(model, engine).set(2)
        usage.labels(model, engine).set(0.125 * (1 + int(engine)))
        preempt.labels(model, engine).inc(5)
        for tag in range(300):
            noise.labels(model, engine, f"t{tag}").observe(0.01 * tag)
    text = generate_latest(reg).decode()
    names = get_adapter("vllm").metric_names
    by_name: dict = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append(sample.value)
    truth = {}
    for canonical, candidates in names.items():
        found = next((by_name[n] for n in candidates if n in by_name), None)
        if found:
            truth[canonical] = sum(found) if canonical in scrape.SUMMED else max(found)
    assert len(text) > 300_000 and truth["running"] == 7.0 and truth["token_usage"] == 0.25
    assert scrape.parse_metrics(text, names) == truth
    start = clock.perf_counter()
    for _ in range(10):
        scrape.parse_metrics(text, names)
    fast = (clock.perf_counter() - start) / 10
    start = clock.perf_counter()
    list(text_string_to_metric_families(text))
    slow = clock.perf_counter() - start
    print(f"\n{len(text):,} bytes: {fast * 1e3:.1f} ms (prometheus_client's parser {slow * 1e3:.1f} ms)")
    assert fast < slow / 5


SLOW_SERVER = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()

class Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input_ids"])
        with lock:
            time.sleep(0.3)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for k in (1, 2):
                meta = {"prompt_tokens": n, "completion_tokens": k, "finish_reason": None}
                self.wfile.write(b"data: " + json.dumps({"meta_info": meta}).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
print(server.server_port, flush=True)
server.serve_forever()
"""


@pytest.fixture
def slow_server():
    """SGLang's /generate, one request at a time, each 0.3 s before its first token: a server that falls
    behind. In a process of its own, so that its threads never hold this one's GIL while the client sends."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def _context(port: int, load: dict) -> ld.LoadContext:
    async_client = ld.new_client()
    prompter = Prompter("sglang", "m", {"seed": 0, "token_id_range": [0, 256]}, PromptPlan())
    return ld.LoadContext(async_client, f"http://127.0.0.1:{port}", "/generate", prompter,
                          get_adapter("external"), "test", load, lambda prompt, in_flight: 30.0)


LOAD = {"output_tokens": 2, "metrics": {"enabled": False, "interval_s": 0.1, "kv_margin": 0.1},
        "closed": {"concurrency": [1], "requests": 5, "duration_s": None},
        "open": {"rates": [20.0], "requests": 5, "arrival": "poisson", "burstiness": 1.0, "seed": 0}}


def test_the_open_loop_sends_on_schedule_while_the_server_falls_behind(slow_server):
    """Coordinated omission: a client that waits for the server would send the 5th request after 1.2 s of
    answers; the open loop sends each at its scheduled time, and the wait shows in the TTFTs instead."""
    async def run():
        ctx = _context(slow_server, LOAD)
        async with ctx.client:
            return await ld.open_loop(ctx, 40, 20.0)
    point = asyncio.run(run())
    reqs = point["requests"]
    assert point["status"] == "ok" and [r["index"] for r in reqs] == list(range(5))
    assert [r["scheduled_s"] for r in reqs] == ld.arrival_schedule(20.0, 5, "poisson", 1.0, 0)
    # each sent at its time, while the server had answered none: within 0.1 s however busy this machine is
    # (bench/load_client.py measures the lag itself), where a client that waited would lag by 0.3 s per request
    assert max(r["schedule_lag_s"] for r in reqs) < 0.1 and reqs[-1]["sent_s"] < 0.3
    # the server serves one at a time (in no set order), 0.3 s each: the last one served gets its first token
    # 5 x 0.3 s after the start, and its TTFT holds the wait
    last = max(reqs, key=lambda r: r["sent_s"] + r["ttft_s"])
    assert last["sent_s"] + last["ttft_s"] >= 1.45 and last["ttft_s"] > 1.0
    assert all(r["prompt_tokens"] == 40 for r in reqs)


def test_the_closed_loop_keeps_its_concurrency(slow_server):
    async def run():
        ctx = _context(slow_server, {**LOAD, "closed": {"concurrency": [2], "requests": 4, "duration_s": None}})
        async with ctx.client:
            return await ld.closed_loop(ctx, 40, 2)
    point = asyncio.run(run())
    reqs = sorted(point["requests"], key=lambda r: r["sent_s"])
    assert point["status"] == "ok" and len(reqs) == 4
    # two sent at once; each next one only when one of those has ended (the server serves one at a time)
    assert reqs[1]["sent_s"] - reqs[0]["sent_s"] < 0.05
    ends = sorted(r["sent_s"] + r["e2e_s"] for r in reqs)
    assert reqs[2]["sent_s"] >= ends[0] - 0.005 and reqs[3]["sent_s"] >= ends[1] - 0.005


def test_a_sweep_with_load_on_the_reference_engine(tmp_path):
    """A real run: closed and open points, an interference point, /metrics through each, load.json kept."""
    spec = tiny_spec("page1", lengths=[64, 128, 256])
    spec.protocol.update(warmup=0, trials=1, output_tokens=4, concurrency=[], itl_depth={"length": None, "output_tokens": 2})
    spec.protocol["needle"]["enabled"] = False
    spec = replace(spec, args={**spec.args, "chunked-prefill-size": 128, "max-running-requests": 4}, load={
        # each point most of a second (the engine decodes ~1,500 tokens/s here): several scrapes while it runs, though
        # each waits 9 times its last GET (Scraper), which a loaded machine makes slow (at 32 tokens a point took a
        # tenth of a second, and was once read only idle)
        "lengths": [128], "output_tokens": 320,
        "closed": {"concurrency": [2], "requests": 4, "duration_s": None},
        "open": {"rates": [10.0], "requests": 4, "arrival": "poisson", "burstiness": 1.0, "seed": 0},
        "interference": {"lengths": [1536], "background": 2, "background_length": 64, "steady_tokens": 4,
                         "tail_tokens": 4, "trials": 1},
        "metrics": {"enabled": True, "interval_s": 0.02, "kv_margin": 0.1}})
    assert run_configuration(spec, tmp_path / "raw", tmp_path / "server.log", tmp_path / "partial") == 0
    doc = json.loads((tmp_path / "raw" / "load.json").read_text())
    assert doc["status"] == "ok", doc["reason"]
    kinds = [(w["kind"], w["length"]) for w in doc["workloads"]]
    assert kinds == [("closed", 128), ("open", 128), ("interference", 1536)]
    closed, open_, inter = doc["workloads"]
    for point in (closed, open_):
        assert len(point["requests"]) == 4
        assert all(r["status"] == "ok" and r["prompt_tokens"] == 128 and r["completion_tokens"] == 320 for r in point["requests"])
        samples = point["metrics"]["samples"]
        assert samples and point["metrics"]["error"] is None
        assert max(s[1]["running"] for s in samples) >= 1 and all("used_tokens" in s[1] for s in samples)
    assert all(r["schedule_lag_s"] is not None for r in open_["requests"])
    # interference: both streams decoded before and after the injected prompt, and were ended by the client
    assert len(inter["victims"]) == 2 and inter["injected"]["prompt_tokens"] == 1536
    assert inter["chunked_prefill_size"] == 128
    sent, first = inter["injected"]["sent_s"], inter["injected"]["first_token_s"]
    for v in inter["victims"]:
        assert v["ended_by_client"] and v["status"] == "ok"
        times = v["event_times"]
        assert sum(1 for t in times if t < sent) >= 4 and sum(1 for t in times if t > first) >= 4
        # while the 12 chunks of the injected prompt are prefilled, SGLang runs no decode step (prefill first)
        gaps = np.diff(times)
        assert gaps.max() >= 0.5 * (first - sent)
    assert statistics.median(np.diff(inter["victims"][0]["event_times"])) < (first - sent)
    # resumed: a second run with the same spec reuses every point
    assert run_configuration(spec, tmp_path / "raw2", tmp_path / "server2.log", tmp_path / "partial") == 0
    again = json.loads((tmp_path / "raw2" / "load.json").read_text())
    assert all(w.get("resumed") for w in again["workloads"]) and again["workloads"][0]["requests"] == closed["requests"]


def test_load_config_is_validated_and_cut_per_configuration():
    from longctx import config as lcfg
    from longctx.core.errors import ConfigError

    from .conftest import TINY

    base = lcfg.read(TINY)
    del base["load"]
    spec = lcfg.configuration_spec(lcfg.validate(base), "page1")
    assert spec.load is None and "load" not in spec.to_dict()  # no workloads: the spec (and its hash) as before
    base["load"] = {"lengths": [128], "closed": {"concurrency": [2]}}
    c = lcfg.validate(base)  # tiny.yaml's page16 says load: false
    page1 = lcfg.configuration_spec(c, "page1")
    assert page1.load["closed"] == {"concurrency": [2], "requests": 8, "duration_s": None}
    assert page1.load["open"]["arrival"] == "poisson" and page1.load["metrics"]["enabled"]
    assert lcfg.configuration_spec(c, "page16").load is None
    # the metrics are turned on in the server's command line where the workloads scrape them
    cmd = get_adapter("reference").launch_command(replace(page1, kernel_build=None), "127.0.0.1", 1, None)
    assert "--enable-metrics" in cmd
    base["load"]["open"] = {"arrival": "weibull"}
    with pytest.raises(ConfigError, match="load.open.arrival.*allowed values: poisson, gamma"):
        lcfg.validate(base)
    base["load"]["open"] = {}
    base["load"]["lengths"] = [4000]  # tiny.yaml's context length is 2048
    with pytest.raises(ConfigError, match="config key 'load.lengths': 4000 prompt tokens"):
        lcfg.validate(base)


def test_the_async_client_keeps_connections_alive_and_opens_one_per_stream_in_flight(slow_server):
    from longctx.measure.transport import async_timed_client

    async def run():
        async with async_timed_client() as client:
            url = f"http://127.0.0.1:{slow_server}/generate"
            body = json.dumps({"input_ids": [1, 2, 3]}).encode()

            async def one():
                async with client.stream("POST", url, content=body) as resp:
                    await resp.aread()
                    return resp.extensions["network_stream"]
            first, second = await one(), await one()
            together = await asyncio.gather(one(), one())
            return first, second, together
    first, second, together = asyncio.run(run())
    # the slow server says Connection: close: nothing to keep; each request got a connection of its own
    assert first is not second and together[0] is not together[1]


def test_idle_connections_are_reused_newest_first(ref_server):
    from longctx.measure.transport import async_timed_client

    async def run():
        async with async_timed_client() as client:
            async def one():
                async with client.stream("GET", ref_server["base"] + "/health") as resp:
                    await resp.aread()
                    return resp.extensions["network_stream"]
            a = await one()
            b = await one()  # the same connection, kept alive
            c, d = await asyncio.gather(one(), one())  # two in flight: the kept one and a new one
            e = await one()  # the newest idle one
            return a, b, c, d, e
    a, b, c, d, e = asyncio.run(run())
    assert a is b and {id(c), id(d)} != {id(a)} and a in (c, d) and e in (c, d)


def _stub_module():
    return bench_script("stub_sse_server")


def test_the_next_request_goes_when_the_one_before_ends_even_while_the_event_loop_is_busy():
    """A closed loop's next request is built and held before the one before it ends, and written the moment that
    one's [DONE] reaches the socket, by a thread (wire.EndWatcher), not by the event loop: here the loop is busy
    (a task spinning, holding the GIL) from before that [DONE] until 0.6 s after it; the next request still goes
    within 50 ms of it (without the watcher it went when the loop came back: 0.6 s late)."""
    load = {**LOAD, "output_tokens": 8, "closed": {"concurrency": [1], "requests": 2, "duration_s": None}}

    async def busy(until: float) -> None:
        await asyncio.sleep(max(0.0, until - time.perf_counter()))
        while time.perf_counter() < until + 0.6:
            pass

    async def run(base: str):
        port = int(base.rsplit(":", 1)[1])
        ctx = _context(port, load)
        async with ctx.client:
            # the first request: its first token at once, then one every 0.1 s; its [DONE] comes ~0.7 s after its
            # send, and the loop is busy from 0.55 s (after the next request was armed, at its 4th token) to 1.15 s
            return (await asyncio.gather(ld.closed_loop(ctx, 40, 1), busy(time.perf_counter() + 0.55)))[0]

    with _stub_module().running(interval_s=0.1, tokens=8) as base:
        point = asyncio.run(run(base))
    first, second = sorted(point["requests"], key=lambda r: r["index"])
    assert point["status"] == "ok"
    end = first["sent_s"] + first["e2e_s"]
    assert 0.55 < end < 1.1, end  # the first one ended while the loop was busy
    assert 0 <= second["sent_s"] - end < 0.05, (second["sent_s"], end)


IDLE_CLOSING_SERVER = r"""
import asyncio, json, sys

async def handle(reader, writer):
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.1)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError):
        writer.close()  # a connection that sent nothing for 0.1 s is closed, as a proxy's idle timeout would
        return
    length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length"))
    n = len(json.loads(await reader.readexactly(length))["input_ids"])
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for k in range(1, 5):
        await asyncio.sleep(0.1)
        event = b"data: " + json.dumps({"meta_info": {"prompt_tokens": n, "completion_tokens": k}}).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
    writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


def test_a_held_request_whose_connection_the_server_closed_is_sent_again():
    """The next request is connected and held from the one before's 2nd token of 4; this server closes a
    connection that sent nothing for 0.1 s (a proxy's idle timeout), so the held connection is gone when the
    first request ends: the request is sent again on a new one, and both succeed."""
    proc = subprocess.Popen([sys.executable, "-c", IDLE_CLOSING_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        load = {**LOAD, "output_tokens": 4, "closed": {"concurrency": [1], "requests": 2, "duration_s": None}}

        async def run():
            ctx = _context(port, load)
            async with ctx.client:
                return await ld.closed_loop(ctx, 40, 1)

        point = asyncio.run(run())
    finally:
        proc.kill()
        proc.wait()
    first, second = sorted(point["requests"], key=lambda r: r["index"])
    assert point["status"] == "ok", point["reason"]
    assert second["sent_s"] >= first["sent_s"] + first["e2e_s"] and second["completion_tokens"] == 4


def test_the_loop_watch_tells_a_client_kept_off_its_cpus_from_a_busy_one():
    """_lag_watch against known stalls of the event loop: 0.15 s blocked in a sleep (no CPU: as when this machine
    runs something else) is a stall of about 0.15 s; 0.15 s of spinning (the client's own work) is late by as much
    but no stall; and held_level reports the longest stall inside a point's stretch."""
    from longctx.analysis.load import CLIENT_STALL
    from longctx.analysis.load_summary import held_level

    async def run():
        lags: list = []
        t0 = time.perf_counter()
        watch = asyncio.create_task(ld._lag_watch(t0, lags))
        await asyncio.sleep(0.05)
        time.sleep(0.15)  # the loop blocked, this process off the CPU
        await asyncio.sleep(0.05)
        end = time.perf_counter() + 0.15
        while time.perf_counter() < end:  # the loop blocked, this process busy
            pass
        await asyncio.sleep(0.05)
        watch.cancel()
        return lags

    lags = asyncio.run(run())
    assert len(lags) == 2, lags
    (t1, late1, cpu1), (t2, late2, cpu2) = lags
    assert 0.14 < late1 < 0.3 and cpu1 < 0.05 and 0.14 < late2 < 0.3 and cpu2 > 0.1
    rows = pd.DataFrame({"sent_s": [0.0, 0.0, 1.4, 2.5], "e2e_s": [1.0, 2.5, 1.6, 1.0]})  # one slot empty 1.0-1.4 s
    metrics = pd.DataFrame({"t_s": [1.5, 9.0], "name": [CLIENT_STALL] * 2, "value": [late1 - cpu1, 5.0]})
    held = held_level(rows, 2, metrics)
    assert held["client_stall_max_s"] == pytest.approx(late1 - cpu1) and held["below"]  # the 5 s one is outside


SLEEPY_SERVER = SLOW_SERVER.replace("""        with lock:
            time.sleep(0.3)""", """        with lock:
            # asleep once idle 150 ms since the last answer ended: 40 ms to wake, else 2 ms to the first token
            time.sleep(0.04 if time.perf_counter() - last[0] > 0.15 else 0.002)""").replace(
    "            for k in (1, 2):", "            for k in (1,):").replace(
    """            self.wfile.write(b"data: [DONE]\\n\\n")""", """            self.wfile.write(b"data: [DONE]\\n\\n")
            self.wfile.flush()
            last[0] = time.perf_counter()""").replace("lock = threading.Lock()", "lock = threading.Lock()\nlast = [0.0]")


def test_the_wake_probe_finds_what_a_server_that_sleeps_when_idle_costs():
    """A server that sleeps once idle 150 ms (40 ms to wake; 2 ms to a first token otherwise): single requests after
    20 ms and 300 ms of idle, 3 rounds; each request's idle as the client measured it is at least the gap asked, and
    what the analysis makes of them is the server's own 38 ms after 300 ms and nothing after 20 ms."""
    from longctx.analysis.load_summary import wake
    from longctx.measure.wake import wake_probe
    assert "0.04 if" in SLEEPY_SERVER and "last[0] = time.perf_counter()" in SLEEPY_SERVER
    proc = subprocess.Popen([sys.executable, "-c", SLEEPY_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())

        async def run():
            ctx = _context(port, {**LOAD, "wake": {"idle_s": [0.02, 0.3], "repeats": 3}})
            async with ctx.client:
                return await wake_probe(ctx, 40)
        point = asyncio.run(run())
    finally:
        proc.kill()
        proc.wait()
    reqs = point["requests"]
    assert point["status"] == "ok" and [r["gap_s"] for r in reqs] == [None, 0.02, 0.3, 0.02, 0.3, 0.02, 0.3]
    assert all(r["gap_s"] - 0.001 <= r["idle_s"] < r["gap_s"] + 0.1 for r in reqs[1:]), [r["idle_s"] for r in reqs]
    rows = pd.DataFrame([{"status": r["status"], "level": r["gap_s"], "ttft_s": r["ttft_s"], "idle_s": r["idle_s"],
                          "length": 40} for r in reqs])
    w = wake(rows)
    short, long_ = w["points"]
    assert (short["gap_s"], short["n"], short["extra_s"], long_["gap_s"], long_["n"]) == (0.02, 3, 0.0, 0.3, 3)
    assert 0.03 <= long_["extra_s"] <= 0.05 and w["length"] == 40
