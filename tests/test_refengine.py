"""The reference engine: exact greedy output across KV layouts, pool sizing, and its HTTP API."""

import json
import threading
import time

import httpx
import pytest
import torch

from longctx.attention import build as kernels
from longctx.engines.base import SGLANG_KV_POOL_RE, SGLANG_READY_LINE
from longctx.refengine.kvpool import KVPool
from longctx.specs.pool import PoolError, PoolSizing
from longctx.refengine.model import MLAModel
from longctx.refengine.modelconfig import ModelConfig
from longctx.refengine.scheduler import Req, Scheduler

from .conftest import ROOT, TINY_ARCH

# shared under -n (tests/conftest.py): nothing here is timed but a server's stop (under 15 s) and its ready line (within
# 10 s of its start); with two processes spinning on this 2-core machine beside it (twice what the other worker adds)
# the whole stop test took 4.3 s (2026-12-07)

KERNEL = kernels.load_kernel(ROOT / "kernels" / "reference")
CFG = ModelConfig.from_overrides(TINY_ARCH)
MODEL = MLAModel(CFG, seed=0)


def run_requests(prompts, max_new, page_size=1, order="random", chunk=8192, kernel=KERNEL, pool_tokens=4096, rows=4,
                 wait_s=60, **sched_kwargs):
    """Run requests through a fresh pool and scheduler; returns outputs, final events and the scheduler (with
    every event it emitted, `events`, and the pool's use at each, `used`)."""
    pool = KVPool(CFG.num_hidden_layers, CFG.cell_dim, CFG.dtype, pool_tokens, page_size, rows, 2048, order, seed=1)
    sched = Scheduler(MODEL, pool, kernel, chunk, rows, **sched_kwargs)
    done = [threading.Event() for _ in prompts]
    finals: list[dict | None] = [None] * len(prompts)
    events: list[tuple[int, float, dict]] = []
    used: list[int] = []
    reqs = []
    for i, p in enumerate(prompts):
        def emit(ev, i=i):
            events.append((i, time.perf_counter(), ev))
            used.append(pool.num_tokens - pool.free_tokens())
            if ev["meta_info"]["finish_reason"] is not None:
                finals[i] = ev
                done[i].set()
        reqs.append(Req(f"r{i}", p, max_new, True, emit))
    for r in reqs:
        sched.submit(r)
    sched.start()
    for d in done:
        assert d.wait(wait_s)
    assert pool.free_tokens() == pool_tokens and len(pool.free_rows) == rows  # every page and row released
    sched.events, sched.used, sched.reqs = events, used, reqs
    return [r.output_ids for r in reqs], finals, sched


def prompt(n, seed=0):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_greedy_is_deterministic_and_identical_across_page_sizes_and_layouts():
    p = prompt(300)
    (ref,), finals, _ = run_requests([p], 12, page_size=1, order="sequential")
    assert len(ref) == 12 and finals[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert finals[0]["meta_info"]["prompt_tokens"] == 300
    for page_size in (1, 16, 64):
        (out,), _, _ = run_requests([p], 12, page_size=page_size, order="random")
        assert out == ref, f"page_size {page_size} changed the tokens"


def test_paged_engine_matches_a_dense_model_without_kv_cache():
    p = prompt(150, 11)
    (paged,), _, _ = run_requests([p], 8, page_size=16, order="random")
    seq = list(p)
    for _ in range(8):  # greedy, recomputing the whole sequence every step
        seq.append(int(torch.argmax(MODEL.forward_dense(torch.tensor(seq))[-1])))
    assert paged == seq[150:]


def test_chunked_prefill_and_batching_give_the_same_tokens():
    p1, p2 = prompt(300, 1), prompt(170, 2)
    (alone1,), _, _ = run_requests([p1], 10)
    (alone2,), _, _ = run_requests([p2], 10)
    (c1,), _, _ = run_requests([p1], 10, chunk=64)
    assert c1 == alone1
    both, _, _ = run_requests([p1, p2], 10, page_size=4)
    assert both == [alone1, alone2]


def test_pool_sizing_is_sglangs_rule():
    # rest = (M - weights) - M * (1 - f); tokens = rest // cell, capped, rounded down to the page size
    s = PoolSizing(memory_total_bytes=10_000_000, mem_fraction_static=0.5, weights_bytes=1_000_000,
                   cell_bytes=1000, page_size=64, max_total_tokens=None)
    assert s.tokens() == 3968  # (5e6 - 1e6) / 1000 = 4000, down to a multiple of 64
    assert PoolSizing(10_000_000, 0.5, 1_000_000, 1000, 64, max_total_tokens=1000).tokens() == 960
    assert PoolSizing(10_000_000, 0.5, 1_000_000, 1000, 1, None).tokens() == 4000
    # the study's deployment: 61 layers x 576 bf16 values = 70,272 bytes per token per rank. SGLang's
    # profile_max_num_token worked by hand: M = 95 GiB = 102,005,473,280 B, weights 74 GiB = 79,456,894,976 B,
    # rest = 22,548,578,304 - 102,005,473,280 x 0.06 (6,120,328,396.8) = 16,428,249,907.2 B;
    # // 70,272 = 233,780 (70,272 x 233,780 = 16,428,188,160, 61,747 B left over), page size 1
    kimi = PoolSizing(102_005_473_280, 0.94, 79_456_894_976, 70_272, 1, None)
    assert kimi.tokens() == 233_780
    with pytest.raises(PoolError, match="Not enough memory. Please try to increase --mem-fraction-static"):
        PoolSizing(10_000_000, 0.05, 1_000_000, 1000, 64, None).tokens()


def test_server_refuses_to_start_without_room_for_one_page(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "longctx.refengine", "--memory-total-gb", "0.001", "--mem-fraction-static", "0.01",
                           "--json-model-override-args", json.dumps(TINY_ARCH)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Please try to increase --mem-fraction-static" in proc.stderr


def test_scattered_allocation_gives_scattered_slots():
    pool = KVPool(1, 8, torch.float32, 1024, 1, 1, 1024, "random", seed=0)
    row, pages = pool.alloc_row(), []
    assert pool.reserve(row, pages, 100)
    slots = pool.slots(row, 0, 100)
    assert (slots.diff() != 1).float().mean() > 0.9  # almost no two neighbours adjacent
    assert int(slots.min()) >= 1  # slot 0 is the padding slot
    seq = KVPool(1, 8, torch.float32, 1024, 16, 1, 1024, "sequential")
    r2, p2 = seq.alloc_row(), []
    assert seq.reserve(r2, p2, 40)
    assert seq.slots(r2, 0, 40).tolist() == list(range(16, 56))


# --- over HTTP, a real server process -------------------------------------------------------

def test_server_logs_sglang_lines_and_reports_its_pool(ref_server):
    deadline = time.monotonic() + 10  # the ready line follows uvicorn's start (a watcher thread logs it)
    while SGLANG_READY_LINE not in (text := ref_server["log"].read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    m = SGLANG_KV_POOL_RE.search(text)
    assert m and int(m["tokens"]) == 4096
    assert SGLANG_READY_LINE in text
    info = httpx.get(ref_server["base"] + "/server_info").json()
    assert info["max_total_num_tokens"] == 4096 and info["page_size"] == 4
    assert info["model_config"]["kv_lora_rank"] == TINY_ARCH["kv_lora_rank"]
    assert httpx.get(ref_server["base"] + "/get_server_info").json()["max_total_num_tokens"] == 4096
    assert httpx.get(ref_server["base"] + "/health_generate", timeout=30).status_code == 200
    assert httpx.post(ref_server["base"] + "/flush_cache").status_code == 200


def test_generate_streams_sglang_events(ref_server):
    body = {"input_ids": prompt(50), "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}, "stream": True}
    with httpx.stream("POST", ref_server["base"] + "/generate", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert [e["meta_info"]["completion_tokens"] for e in events] == [1, 2, 3, 4, 5]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    final = events[-1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 5}
    assert final["prompt_tokens"] == 50 and final["cached_tokens"] == 0 and final["e2e_latency"] > 0
    # the same request without streaming gives the same tokens
    body["stream"] = False
    whole = httpx.post(ref_server["base"] + "/generate", json=body, timeout=30).json()
    assert whole["output_ids"] == [e["output_ids"][0] for e in events]
    # text input is tokenized byte by byte
    t = httpx.post(ref_server["base"] + "/generate", json={"text": "héllo", "sampling_params": {"max_new_tokens": 2}}, timeout=30)
    assert t.json()["meta_info"]["prompt_tokens"] == len("héllo".encode())


def test_requests_that_cannot_fit_are_refused_and_the_server_keeps_serving(ref_server):
    too_long = {"input_ids": [1] * 2048, "sampling_params": {"max_new_tokens": 2}}
    r = httpx.post(ref_server["base"] + "/generate", json=too_long, timeout=30)
    assert r.status_code == 400 and "context length (2048 tokens)" in r.json()["error"]["message"]
    r = httpx.post(ref_server["base"] + "/generate", json={"input_ids": [999]}, timeout=30)
    assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]
    ok = httpx.post(ref_server["base"] + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}, timeout=30)
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2


# --- scheduling, defragmentation, speculation ------------------------------------------------

def test_a_long_chunked_prefill_stalls_running_decodes_unless_mixed_chunk():
    # SGLang's scheduling (tests/test_chunked_prefill.py has the order of events chunk by chunk): the short
    # request is admitted first; then the long one prefills 64 tokens at a time
    short, long = prompt(20, 3), prompt(1500, 4)
    for mixed, expected in ((True, 15), (False, 1)):
        (out_short, out_long), finals, sched = run_requests([short, long], 15, chunk=64, mixed_chunk=mixed)
        long_first_token = min(t for i, t, ev in sched.events if i == 1)
        short_tokens_before = [ev for i, t, ev in sched.events if i == 0 and t < long_first_token]
        # mixed: it decodes one token per chunk and finishes during the long prefill; prefill first: it has
        # its first token (from its own prefill) and waits for all the long prompt's chunks
        assert len(short_tokens_before) == expected, f"mixed_chunk={mixed}"
        (alone,), _, _ = run_requests([long], 15)
        assert out_long == alone


def test_defrag_compacts_scattered_slots_without_changing_tokens():
    p = prompt(400, 5)
    (scattered,), _, s1 = run_requests([p], 20, page_size=1, order="random")
    (compact,), _, s2 = run_requests([p], 20, page_size=1, order="random", defrag=True)
    assert compact == scattered
    assert s2.pool.defrag_moves == 1 and s1.pool.defrag_moves == 0


def test_defrag_moves_cells_into_one_run():
    pool = KVPool(1, 4, torch.float32, 256, 1, 1, 256, "random", seed=3)
    row, pages = pool.alloc_row(), []
    assert pool.reserve(row, pages, 50)
    old_slots = pool.slots(row, 0, 50).clone()
    pool.kv[0, old_slots] = torch.arange(50, dtype=torch.float32)[:, None].expand(50, 4)
    assert pool.defragment(row, pages, 50, 80)
    new_slots = pool.slots(row, 0, 80)
    assert (new_slots.diff() == 1).all() and len(pages) == 80
    assert torch.equal(pool.kv[0, new_slots[:50], 0], torch.arange(50, dtype=torch.float32))
    assert pool.free_tokens() == 256 - 80  # the old pages went back


def test_concurrent_decoding_interleaves_page_size_1_slots():
    """Churn: two requests decoding together take turns at the free list, so each one's slots scatter."""
    _, _, sched = run_requests([prompt(30, 6), prompt(30, 7)], 40, page_size=1, order="sequential")
    # after both finished the free list holds their interleaved slots; a new request reuses them later
    free = list(sched.pool.free_pages)
    tail = free[-80:]
    assert any(b - a != 1 for a, b in zip(tail, tail[1:]))


def test_ngram_drafts_follow_the_latest_earlier_occurrence():
    import numpy as np

    from longctx.refengine.speculative import ngram_drafts

    seq = np.array([7, 1, 2, 3, 9, 1, 2, 4, 5, 1, 2])
    assert ngram_drafts(seq, 3, 1, 4) == [4, 5, 1]  # suffix [1, 2] last seen at 5, followed by 4 5 1
    assert ngram_drafts(np.array([1, 2, 3]), 3, 1, 4) == []
    assert ngram_drafts(np.array([5, 6, 5]), 2, 1, 4) == [6, 5]


def test_speculation_gives_the_same_tokens_and_reports_acceptance():
    from longctx.refengine.speculative import SpecConfig

    pattern = prompt(37, 8)
    p = (pattern * 8)[:280]  # repetitive: prompt lookup finds drafts
    (plain,), _, _ = run_requests([p], 40)
    spec = SpecConfig("NGRAM", 4, 1, 12)
    (fast,), finals, _ = run_requests([p], 40, spec=spec)
    assert fast == plain
    meta = finals[0]["meta_info"]
    assert meta["spec_num_proposed_drafts"] > 0
    assert 0 <= meta["spec_num_correct_drafts"] <= meta["spec_num_proposed_drafts"]
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"])
    assert meta["spec_accept_length"] == pytest.approx(40 / meta["spec_verify_ct"])
    # every token came from a prefill or a verify step: accepted drafts save steps
    assert meta["spec_verify_ct"] == 40 - 1 - meta["spec_num_correct_drafts"]
    # a batch with speculation gives each request its own tokens
    (b1, b2), _, _ = run_requests([p, prompt(90, 9)], 40, spec=spec)
    (alone2,), _, _ = run_requests([prompt(90, 9)], 40)
    assert (b1, b2) == (plain, alone2)


# --- interfaces -----------------------------------------------------------------------------

def test_openai_completions_stream_with_usage(ref_server):
    body = {"model": "refmla", "prompt": prompt(40), "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", ref_server["base"] + "/v1/completions", json=body, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44}
    whole = httpx.post(ref_server["base"] + "/v1/completions", json={**body, "stream": False, "prompt": "abc"}, timeout=30).json()
    assert whole["object"] == "text_completion" and whole["usage"]["prompt_tokens"] == 3


def test_final_event_carries_ordered_server_timestamps(ref_server):
    body = {"input_ids": prompt(60), "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    ts = httpx.post(ref_server["base"] + "/generate", json=body, timeout=30).json()["meta_info"]["timestamps"]
    # the scheduler's stamps in order; first_token_sent is the HTTP layer's, after first_token but racing
    # `finished` when the whole output is generated before the first token leaves
    order = ["received", "scheduled", "prefill_done", "first_token", "finished"]
    assert ts["clock"] == "CLOCK_MONOTONIC"
    assert [ts[k] for k in order] == sorted(ts[k] for k in order)
    assert ts["first_token"] <= ts["first_token_sent"]
    assert ts["received"] < time.perf_counter()  # the same clock as this process's perf_counter


def test_metrics_use_sglang_names(ref_server):
    before = httpx.get(ref_server["base"] + "/metrics").text
    httpx.post(ref_server["base"] + "/generate", json={"input_ids": prompt(30), "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}, timeout=30)
    text = httpx.get(ref_server["base"] + "/metrics").text

    def value(t, name):
        line = next(line for line in t.splitlines() if line.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert value(text, "sglang:max_total_num_tokens") == 4096
    assert value(text, "sglang:generation_tokens_total") - value(before, "sglang:generation_tokens_total") == 3
    assert value(text, "sglang:prompt_tokens_total") - value(before, "sglang:prompt_tokens_total") == 30
    for name in ("sglang:num_used_tokens", "sglang:gen_throughput", "sglang:time_to_first_token_seconds_count",
                 "sglang:e2e_request_latency_seconds_count", "sglang:num_running_reqs", "sglang:token_usage"):
        assert name + "{" in text, name


def test_wire_stamp_writes_the_time_over_the_placeholder_in_the_same_width():
    from longctx.refengine.wire import PLACEHOLDER, stamp

    event = {"text": 'a "sent_ts": -1.0000000000000002 in the text', "meta_info": {"sent_ts": PLACEHOLDER},
             "timestamps": {"first_token_sent": PLACEHOLDER}}
    raw = json.dumps(event).encode()
    out = stamp(raw, 12345.123456789)
    assert len(out) == len(raw)  # the HTTP chunk's length, already written, stays right
    back = json.loads(out)
    assert back["meta_info"]["sent_ts"] == back["timestamps"]["first_token_sent"] == pytest.approx(12345.123456789, abs=1e-9)
    assert back["text"] == event["text"]  # quotes are escaped inside a JSON string: never stamped
    assert stamp(json.dumps({"sent_ts": 1.5}).encode(), 1.0) is None


def test_stream_events_carry_their_socket_send_times(ref_server):
    """Each event's sent_ts is when its bytes reached the socket: after the request arrived, in
    order, before this client read them; the final timestamps agree; /request_timestamps has them."""
    base = ref_server["base"]
    body = {"input_ids": prompt(70), "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}, "stream": True}
    with httpx.Client() as client:
        t0 = time.perf_counter()
        events, read_at = [], []
        with client.stream("POST", base + "/generate", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    read_at.append(time.perf_counter())
        sent = [e["meta_info"]["sent_ts"] for e in events]
        assert len(sent) == 6 and sent == sorted(sent) and all(s > t0 for s in sent)
        assert all(s < t for s, t in zip(sent, read_at))
        ts = events[-1]["meta_info"]["timestamps"]
        assert t0 < ts["received"] < ts["scheduled"] and ts["first_token_sent"] == sent[0]
        # OpenAI chunks carry sent_ts too, stamped the same way; single-event streams as well
        one = {"model": "refmla", "prompt": prompt(30), "max_tokens": 1, "stream": True}
        with client.stream("POST", base + "/v1/completions", json=one, timeout=30) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert len(chunks) == 1 and t0 < chunks[0]["sent_ts"] < time.perf_counter()
        records = {rec["rid"]: rec for rec in client.get(base + "/request_timestamps").json()["requests"]}
    rec = records[events[-1]["meta_info"]["id"]]
    assert rec["endpoint"] == "/generate" and rec["sent"] == sent and rec["event_tokens"] == [1] * 6
    assert rec["received"] == ts["received"] and rec["first_token_sent"] == sent[0]
    assert any(r["endpoint"] == "/v1/completions" and r.get("sent") == [chunks[0]["sent_ts"]] for r in records.values())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("t, start", [(300, 0), (64, 1000), (1, 4000), (1500, 2500)])
def test_fused_cpu_prefill_attention_equals_the_explicit_form(dtype, tol, t, start):
    # the first chunk (one causal call), later chunks (earlier keys merged with the chunk's own), a
    # single query; the explicit form materialises the scores, the fused one never does
    from longctx.attention.dense import mla_attention

    g = torch.Generator().manual_seed(t + start)
    kv = torch.randn(start + t + 9, 80, generator=g).to(dtype)  # cells past the queries are never seen
    q = torch.randn(t, 2, 80, generator=g).to(dtype)
    fused = mla_attention(q, kv, start, 64, 0.1)
    explicit = mla_attention(q, kv, start, 64, 0.1, fused=False)
    assert fused.shape == explicit.shape == (t, 2, 64) and fused.dtype == dtype
    err = (fused.float() - explicit.float()).abs().max() / explicit.float().abs().max()
    assert err < tol


def test_sigterm_stops_the_server_while_a_client_holds_a_stalled_stream(tmp_path):
    # a client that stopped reading a long stream must not keep the server alive past SIGTERM
    # (uvicorn would wait for the response forever; the bench would need SIGKILL)
    import socket

    from longctx.measure.process import ManagedServer, free_port

    from .conftest import refengine_command

    port = free_port()
    server = ManagedServer(refengine_command(port), tmp_path / "server.log", stop_timeout_s=30)
    server.start()
    try:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        body = json.dumps({"input_ids": prompt(200), "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True},
                           "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert s.recv(100).startswith(b"HTTP/1.1 200")  # streaming; never read again
            t0 = time.monotonic()
            server.stop()
            took = time.monotonic() - t0
        assert not server.group_alive() and took < 15, f"the server took {took:.1f} s to stop"
    finally:
        server.stop()
