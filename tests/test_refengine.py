"""The reference engine: exact greedy output across KV layouts, pool sizing, and its HTTP API."""

import json
import threading

import httpx
import pytest
import torch

from longctx import kernels
from longctx.engines.base import SGLANG_KV_POOL_RE, SGLANG_READY_LINE
from longctx.refengine.kvpool import KVPool, PoolError, PoolSizing
from longctx.refengine.model import MLAModel
from longctx.refengine.modelconfig import ModelConfig
from longctx.refengine.scheduler import Req, Scheduler

from .conftest import ROOT, TINY_ARCH

KERNEL = kernels.load_module(ROOT / "kernels" / "reference" / "paged_mla_decode.py").paged_mla_decode
CFG = ModelConfig.from_overrides(TINY_ARCH)
MODEL = MLAModel(CFG, seed=0)


def run_requests(prompts, max_new, page_size=1, order="random", chunk=8192):
    pool = KVPool(CFG.num_hidden_layers, CFG.cell_dim, CFG.dtype, 4096, page_size, 4, 2048, order, seed=1)
    sched = Scheduler(MODEL, pool, KERNEL, chunk, 4)
    done = [threading.Event() for _ in prompts]
    finals: list[dict | None] = [None] * len(prompts)
    reqs = []
    for i, p in enumerate(prompts):
        def emit(ev, i=i):
            if ev["meta_info"]["finish_reason"] is not None:
                finals[i] = ev
                done[i].set()
        reqs.append(Req(f"r{i}", p, max_new, True, emit))
    for r in reqs:
        sched.submit(r)
    sched.start()
    for d in done:
        assert d.wait(60)
    assert pool.free_tokens() == 4096 and len(pool.free_rows) == 4  # every page and row released
    return [r.output_ids for r in reqs], finals


def prompt(n, seed=0):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_greedy_is_deterministic_and_identical_across_page_sizes_and_layouts():
    p = prompt(300)
    (ref,), finals = run_requests([p], 12, page_size=1, order="sequential")
    assert len(ref) == 12 and finals[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert finals[0]["meta_info"]["prompt_tokens"] == 300
    for page_size in (1, 16, 64):
        (out,), _ = run_requests([p], 12, page_size=page_size, order="random")
        assert out == ref, f"page_size {page_size} changed the tokens"


def test_chunked_prefill_and_batching_give_the_same_tokens():
    p1, p2 = prompt(300, 1), prompt(170, 2)
    (alone1,), _ = run_requests([p1], 10)
    (alone2,), _ = run_requests([p2], 10)
    (c1,), _ = run_requests([p1], 10, chunk=64)
    assert c1 == alone1
    both, _ = run_requests([p1, p2], 10, page_size=4)
    assert both == [alone1, alone2]


def test_pool_sizing_follows_the_budget_and_rounds_to_pages():
    s = PoolSizing(memory_total_bytes=10_000_000, mem_fraction_static=0.5, weights_bytes=1_000_000,
                   req_to_token_bytes=0, cell_bytes=1000, page_size=64, max_total_tokens=None)
    assert s.tokens() == 3968  # (5e6 - 1e6) / 1000 = 4000, down to a multiple of 64
    capped = PoolSizing(10_000_000, 0.5, 1_000_000, 0, 1000, 64, max_total_tokens=1000)
    assert capped.tokens() == 960
    with pytest.raises(PoolError, match="no memory left"):
        PoolSizing(10_000_000, 0.05, 1_000_000, 0, 1000, 64, None).tokens()


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
    text = ref_server["log"].read_text()
    m = SGLANG_KV_POOL_RE.search(text)
    assert m and int(m.group(1)) == 4096
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
