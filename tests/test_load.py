"""The load workloads (longctx.measure.load): arrival schedules, metrics parsing, open-loop sending that
does not wait for the server (no coordinated omission), and a real sweep with load on the reference engine."""

import asyncio
import json
import statistics
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from longctx.engines import get_adapter
from longctx.measure import load as ld, scrape
from longctx.measure.prompts import Prompter, PromptPlan
from longctx.measure.sweep import run_configuration

from .conftest import tiny_spec


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
        "lengths": [128], "output_tokens": 32,  # each point a few tenths of a second: many scrapes while it runs
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
        assert all(r["status"] == "ok" and r["prompt_tokens"] == 128 and r["completion_tokens"] == 32 for r in point["requests"])
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
