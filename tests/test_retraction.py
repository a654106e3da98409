"""The reference engine under KV pressure: decode retracts running requests as SGLang does, never aborts them."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

from longctx.measure.process import ManagedServer, free_port
from longctx.refengine.metrics import EngineMetrics
from longctx.refengine.scheduler import Req, retraction_order

from .conftest import refengine_command
from .test_refengine import run_requests



def prompt(n, seed=0):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(prompts, max_new, pool_tokens, page_size=4, rows=4, chunk=8192, spec=None):
    """Requests through a fresh pool and scheduler (tests/test_refengine.run_requests) with the engine's metrics;
    returns the outputs, the final events, the scheduler."""
    return run_requests(prompts, max_new, page_size, "random", chunk, pool_tokens=pool_tokens, rows=rows, wait_s=120,
                        spec=spec, metrics=EngineMetrics("refmla", pool_tokens))


def metric(text, name):
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


def test_retraction_order_is_sglangs():
    # SGLang sorts by (output length, -prompt length), descending, and retracts from the end
    def req(rid, n_in, n_out):
        r = Req(rid, [1] * n_in, 100, True, lambda ev: None)
        r.output_ids = [2] * n_out
        return r

    a, b, c, d = req("a", 50, 10), req("b", 80, 3), req("c", 20, 3), req("d", 10, 30)
    assert [r.rid for r in retraction_order([a, b, c, d])] == ["d", "a", "c", "b"]
    e = req("e", 20, 3)  # a tie in both keys: the earlier one stays, the later one goes first
    assert [r.rid for r in retraction_order([c, e])] == ["c", "e"]


def test_decode_out_of_pages_retracts_and_the_tokens_stay_those_of_each_request_alone():
    prompts = [prompt(100, 1), prompt(120, 2), prompt(90, 3)]
    # each alone needs about 100 + 120 tokens of the 512; the three together outgrow it mid-decode
    alone = [run([p], 120, 512)[0][0] for p in prompts]
    outs, finals, sched = run(prompts, 120, 512)
    assert outs == alone
    assert all(f["meta_info"]["finish_reason"] == {"type": "length", "length": 120} for f in finals)
    assert sum(r.retractions for r in sched.reqs) >= 1
    text = sched.metrics.render().decode()
    assert metric(text, "sglang:num_retracted_requests_total") == sum(r.retractions for r in sched.reqs)
    assert metric(text, "sglang:num_retracted_output_tokens_total") > 0
    assert max(sched.used) <= 512
    # the request with the most output is never the one retracted: the first admitted finished first
    order = sorted(range(3), key=lambda i: finals[i]["meta_info"]["e2e_latency"])
    assert order[0] == 0 and sched.reqs[0].retractions == 0


def test_retraction_with_chunked_prefill_page_size_1_and_speculation_keeps_the_tokens():
    from longctx.refengine.speculative import SpecConfig

    pattern = prompt(31, 4)
    prompts = [(pattern * 5)[:150], prompt(140, 5), (pattern * 4)[:110]]
    spec = SpecConfig("NGRAM", 4, 1, 12)
    alone = [run([p], 100, 400, page_size=1)[0][0] for p in prompts]
    outs, _, sched = run(prompts, 100, 400, page_size=1, chunk=32, spec=spec)
    assert outs == alone
    assert sum(r.retractions for r in sched.reqs) >= 1 and max(sched.used) <= 400


def _stream(base, body):
    tokens = []
    with httpx.stream("POST", base + "/generate", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                ev = json.loads(line[6:])
                tokens += ev["output_ids"]
                final = ev["meta_info"]
    return tokens, final


def test_server_retracts_concurrent_streams_and_counts_it_in_metrics(tmp_path):
    port = free_port()
    cmd = refengine_command(port, "--page-size", "4", "--kv-alloc-order", "random", "--enable-metrics")
    cmd[cmd.index("--max-total-tokens") + 1] = "512"
    server = ManagedServer(cmd, tmp_path / "server.log")
    server.start()
    base = f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy(base + "/health", 60)
        bodies = [{"input_ids": prompt(n, 10 + i), "sampling_params": {"max_new_tokens": 110, "ignore_eos": True},
                   "stream": True} for i, n in enumerate((100, 130, 80, 110))]
        alone = [_stream(base, b)[0] for b in bodies]
        assert httpx.get(base + "/metrics").status_code == 200
        used, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                used.append(metric(httpx.get(base + "/metrics").text, "sglang:num_used_tokens"))
                time.sleep(0.01)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            with ThreadPoolExecutor(len(bodies)) as ex:
                results = list(ex.map(lambda b: _stream(base, b), bodies))
        finally:
            stop.set()
            poller.join()
        for (tokens, final), ref in zip(results, alone):
            assert final["finish_reason"] == {"type": "length", "length": 110}  # none aborted
            assert tokens == ref
        text = httpx.get(base + "/metrics").text
        assert metric(text, "sglang:num_retracted_requests_total") >= 1
        assert "sglang:num_retracted_reqs{" in text
        assert used and max(used) <= 512
        assert "KV cache pool is full. Retract requests." in (tmp_path / "server.log").read_text()
        # a request that can never fit is still refused
        r = httpx.post(base + "/generate", json={"input_ids": [1] * 600, "sampling_params": {"max_new_tokens": 2}}, timeout=30)
        assert r.status_code == 400 and "KV cache pool" in r.json()["error"]["message"]
        # one that fits only without its whole output is cut to the pool, as SGLang does, not aborted
        final = _stream(base, {"input_ids": prompt(400), "sampling_params": {"max_new_tokens": 300, "ignore_eos": True},
                               "stream": True})[1]
        assert final["finish_reason"] == {"type": "length", "length": 112}
    finally:
        server.stop()
