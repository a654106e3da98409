"""The reference engine's prefix cache (longctx/refengine/radix.py), as SGLang's radix cache behaves: page-aligned
hits at most len - 1 tokens, the same greedy tokens as without it, LRU eviction of unlocked prefixes only,
/flush_cache, cached_tokens in the responses and the counters in /metrics."""

import threading

import httpx
import pytest

from longctx.measure.process import ManagedServer, free_port
from longctx.refengine.kvpool import KVPool
from longctx.refengine.metrics import EngineMetrics
from longctx.refengine.radix import RadixCache
from longctx.refengine.scheduler import Req, Scheduler
from longctx.refengine.speculative import SpecConfig

from .conftest import refengine_command
from .test_refengine import CFG, KERNEL, MODEL, prompt
from .test_retraction import metric

# alone under -n (tests/conftest.py): a flush must arrive while a stream runs
pytestmark = pytest.mark.alone


class Engine:
    """A pool and a scheduler in this process, with or without the prefix cache."""

    def __init__(self, page_size, pool_tokens=4096, rows=4, chunk=8192, cache=True, **kwargs):
        self.pool = KVPool(CFG.num_hidden_layers, CFG.cell_dim, CFG.dtype, pool_tokens, page_size, rows, 2048, "random",
                           seed=1)
        self.cache = RadixCache(page_size, self.pool.free) if cache else None
        self.sched = Scheduler(MODEL, self.pool, KERNEL, chunk, rows, cache=self.cache,
                               metrics=EngineMetrics("refmla", pool_tokens), **kwargs)
        self.sched.start()

    def run(self, prompts, max_new=8, on_token=None):
        """Requests submitted together; returns their outputs and final meta_info."""
        done = [threading.Event() for _ in prompts]
        finals = [None] * len(prompts)
        reqs = []
        for i, p in enumerate(prompts):
            def emit(ev, i=i):
                if on_token is not None:
                    on_token(i, ev)
                if ev["meta_info"]["finish_reason"] is not None:
                    finals[i] = ev["meta_info"]
                    done[i].set()
            reqs.append(Req(f"r{i}", p, max_new, True, emit))
        for r in reqs:
            self.sched.submit(r)
        for d in done:
            assert d.wait(120)
        self.reqs = reqs
        return [r.output_ids for r in reqs], finals

    def one(self, p, max_new=8):
        (out,), (final,) = self.run([p], max_new)
        return out, final["cached_tokens"]

    def consistent(self):
        """Every page is free or in the tree once no request runs (nothing leaked, nothing twice)."""
        pages, tokens = list(self.pool.free_pages), 0
        stack = list(self.cache.root.children.values()) if self.cache else []
        while stack:
            node = stack.pop()
            pages += node.pages
            tokens += len(node.key)
            assert len(node.key) == len(node.pages) * self.pool.page_size and node.lock_ref == 0
            stack.extend(node.children.values())
        assert self.cache is None or (self.cache.total_tokens() == self.cache.evictable_tokens() == tokens)
        return sorted(pages) == list(range(1, self.pool.num_pages)) and len(self.pool.free_rows) == 4


BASE = prompt(1000, 1)


@pytest.mark.parametrize("page_size", [1, 64])
def test_the_same_greedy_tokens_with_the_cache_and_page_aligned_hits(page_size):
    cold, warm = Engine(page_size, cache=False), Engine(page_size)
    ext1, ext2 = BASE + prompt(37, 2), BASE + prompt(100, 3)
    # the first request caches its prompt and all its output but the last token (whole pages): 1000 + 8 - 1 = 1007
    # tokens, 960 of them in whole pages of 64; a prompt that extends it finds them, an identical one all but
    # its last token (999), in whole pages
    expected = {1: [0, 1000, 1000, 999], 64: [0, 960, 960, 960]}[page_size]
    for p, cached in zip([BASE, ext1, ext2, BASE], expected):
        out, c = warm.one(p)
        assert out == cold.one(p)[0] and c == cached
    assert cold.one(BASE)[1] == 0 and warm.consistent()
    # the tokens counted as used are those requests hold: none now, though the tree holds some
    assert warm.sched.load()["used_tokens"] == 0 and warm.cache.total_tokens() > 0
    assert warm.pool.free_tokens() + warm.cache.evictable_tokens() == warm.pool.num_tokens


def test_chunked_prefill_speculation_and_defrag_keep_the_tokens_over_a_cached_prefix():
    p = BASE + prompt(300, 4)
    pattern = prompt(23, 5)
    q = (pattern * 20)[:400]
    ref = {k: Engine(1, cache=False).one(x, 20)[0] for k, x in (("p", p), ("q", q))}
    # chunks of 128: each chunk is cached as it ends (SGLang's cache_unfinished_req), so a retraction or an
    # abort mid-prompt keeps them; the request's own later chunks count no cached tokens
    chunked = Engine(1, chunk=128)
    chunked.one(BASE, 1)
    assert chunked.one(p, 20) == (ref["p"], 1000)
    assert chunked.one(p, 20) == (ref["p"], 1299)
    spec = Engine(1, spec=SpecConfig("NGRAM", 4, 1, 12))
    spec.one(q[:200], 1)
    assert spec.one(q, 20) == (ref["q"], 200) and spec.reqs[0].proposed_drafts > 0
    # defrag moves only the request's own pages into one run; the cached prefix stays where it is
    defrag = Engine(1, defrag=True)
    defrag.one(BASE, 1)
    assert defrag.one(p, 20) == (ref["p"], 1000) and defrag.pool.defrag_moves == 2
    for e in (chunked, spec, defrag):
        assert e.consistent()


def test_tree_matches_in_whole_pages_and_never_evicts_a_locked_node():
    freed = []
    tree = RadixCache(4, freed.extend)
    assert tree.insert(list(range(10)), [7, 8]) == 0  # 8 tokens in 2 pages; the last 2 tokens are no page
    assert tree.match(list(range(7)))[0] == [7]  # one whole page of the 7 tokens
    assert tree.match([0, 1, 2, 3, 4, 5, 9, 9])[0] == [7]  # the second page differs in one token: no match
    assert tree.insert(list(range(4)) + [9] * 4, [1, 2]) == 4  # the first page was known (caller frees page 1)
    pages, node = tree.match(list(range(8)))
    assert pages == [7, 8]
    tree.lock(node)
    assert tree.evictable_tokens() == 4 and tree.protected_tokens() == 8
    assert tree.evict(100) == 4 and freed == [2]  # only the unlocked leaf goes
    assert tree.match(list(range(8)))[0] == [7, 8]
    tree.unlock(node)
    assert tree.evict(100) == 8 and sorted(freed) == [2, 7, 8] and tree.total_tokens() == 0
    one = RadixCache(1, freed.extend)  # page size 1: token by token
    one.insert([5, 6, 7], [10, 11, 12])
    assert one.match([5, 6, 9])[0] == [10, 11]


def test_eviction_frees_the_least_recently_used_prefix_and_spares_the_one_in_use():
    # 32 pages of 16 tokens; three prompts of 128 tokens cached (8 pages each, 1 output token: 128 cells committed)
    e = Engine(16, pool_tokens=512)
    a, b, c = prompt(128, 11), prompt(128, 12), prompt(128, 13)
    ref = Engine(16, pool_tokens=512, cache=False)
    for p in (a, b, c):
        e.one(p, 1)
    assert e.one(a, 1)[1] == 112  # A used again (127 tokens at most: 7 whole pages): B is now the oldest
    assert e.cache.total_tokens() == 384 and e.pool.free_tokens() == 128
    d = prompt(300, 14)  # 19 pages with its first token: 8 free, so B and then C are evicted
    assert e.one(d, 1) == (ref.one(d, 1)[0], 0)
    assert e.cache.evicted_tokens == 256  # 176 tokens were wanted: all of B (128), then all of C
    assert e.one(a, 1)[1] == 112 and e.one(c + [1], 1)[1] == 0 and e.one(b + [1], 1)[1] == 0
    assert e.consistent()

    # a prefix in use is locked: a request that needs room while another decodes over that prefix evicts
    # something else, and the running request's tokens stay right
    e = Engine(16, pool_tokens=512)
    e.one(a, 1)
    e.one(b, 1)  # cached: A (8 pages), B (8 pages); 16 free
    r1, r2 = a + prompt(60, 15), prompt(230, 16)
    want = [ref.one(r1, 40)[0], ref.one(r2, 2)[0]]
    later = threading.Event()

    def submit_r2(i, ev):  # once R1 decodes over A, R2 arrives (15 pages: more than are free)
        if i == 0 and ev["meta_info"]["completion_tokens"] == 2 and not later.is_set():
            later.set()
            e.sched.submit(r2_req)

    done = threading.Event()
    r2_req = Req("r2", r2, 2, True, lambda ev: ev["meta_info"]["finish_reason"] and done.set())
    outs, finals = e.run([r1], 40, on_token=submit_r2)
    assert done.wait(60)
    assert finals[0]["cached_tokens"] == 128 and outs[0] == want[0] and r2_req.output_ids == want[1]
    assert e.cache.evicted_tokens >= 128  # B went
    assert e.one(a, 1)[1] == 112 and e.one(b + [1], 1)[1] == 0
    assert e.consistent()


def test_retraction_still_works_when_eviction_cannot_free_enough():
    # tests/test_retraction's load with the cache on: three requests outgrow 512 tokens mid-decode; the tree
    # holds nothing they do not use, so retraction frees room; a retracted request prefills again over its own
    # cached prompt but reports none cached (SGLang counts cached tokens at the first admission only)
    prompts = [prompt(100, 1), prompt(120, 2), prompt(90, 3)]
    ref = Engine(4, pool_tokens=512, cache=False)
    alone = [ref.one(p, 120)[0] for p in prompts]
    e = Engine(4, pool_tokens=512)
    outs, finals = e.run(prompts, 120)
    assert outs == alone and sum(r.retractions for r in e.reqs) >= 1
    assert [f["cached_tokens"] for f in finals] == [0, 0, 0] and e.consistent()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("radix") / "server.log"
    srv = ManagedServer(refengine_command(port, "--page-size", "16", "--enable-metrics", "--enable-cache-report"), log)
    srv.start()
    try:
        srv.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        yield {"base": f"http://127.0.0.1:{port}", "log": log}
    finally:
        srv.stop()


def _generate(base, ids, max_new=4):
    r = httpx.post(base + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": max_new,
                                                                                   "ignore_eos": True}}, timeout=60)
    assert r.status_code == 200
    return r.json()["meta_info"]


def test_over_http_cached_tokens_metrics_openai_usage_and_flush(server):
    base = server["base"]
    assert httpx.post(base + "/flush_cache").status_code == 200  # whatever the health checks left
    p = prompt(500, 21)

    def counters():
        text = httpx.get(base + "/metrics").text
        return [metric(text, n) for n in ("sglang:prompt_tokens_total", "sglang:cached_tokens_total",
                                          "sglang:cache_hit_rate")]

    before = counters()
    assert _generate(base, p)["cached_tokens"] == 0
    # the first request cached 500 + 4 - 1 = 503 tokens, 496 in whole pages of 16; the next one extends it
    assert _generate(base, p + prompt(50, 22))["cached_tokens"] == 496
    after = counters()
    assert after[0] - before[0] == 1050 and after[1] - before[1] == 496
    assert after[2] == pytest.approx(496 / 550)  # its prefill batch: 496 cached, 54 computed
    info = httpx.get(base + "/server_info").json()
    assert info["radix_cache"]["cached_tokens"] >= 496 and info["disable_radix_cache"] is False
    # OpenAI usage, with --enable-cache-report: the cached tokens of the prompt
    r = httpx.post(base + "/v1/completions", json={"prompt": p, "max_tokens": 2, "ignore_eos": True}, timeout=60).json()
    assert r["usage"]["prompt_tokens"] == 500 and r["usage"]["prompt_tokens_details"] == {"cached_tokens": 496}
    # flush: the tree is emptied; the next request finds nothing
    f = httpx.post(base + "/flush_cache")
    assert f.status_code == 200 and f.text.startswith("Cache flushed.")
    assert httpx.get(base + "/server_info").json()["radix_cache"]["cached_tokens"] == 0
    assert _generate(base, p)["cached_tokens"] == 0
    # refused while a request runs, with the same words and 400, as SGLang
    body = {"input_ids": prompt(40, 23), "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}, "stream": True}
    with httpx.stream("POST", base + "/generate", json=body, timeout=60) as s:
        lines = s.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        busy = httpx.post(base + "/flush_cache")
        assert busy.status_code == 400 and busy.text == f.text
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    assert httpx.post(base + "/flush_cache").status_code == 200
    assert "Cache not flushed because there are pending requests. #queue-req: 0, #running-req: 1" in server["log"].read_text()


def test_disable_radix_cache_caches_nothing(tmp_path):
    port = free_port()
    srv = ManagedServer(refengine_command(port, "--page-size", "16", "--disable-radix-cache"), tmp_path / "server.log")
    srv.start()
    base = f"http://127.0.0.1:{port}"
    try:
        srv.wait_healthy(base + "/health", 60)
        p = prompt(300, 31)
        assert [_generate(base, p)["cached_tokens"] for _ in range(2)] == [0, 0]
        info = httpx.get(base + "/server_info").json()
        assert info["radix_cache"] is None and info["disable_radix_cache"] is True
        r = httpx.post(base + "/v1/completions", json={"prompt": p, "max_tokens": 2}, timeout=60).json()
        assert "prompt_tokens_details" not in r["usage"]  # no --enable-cache-report
        assert httpx.post(base + "/flush_cache").status_code == 200
    finally:
        srv.stop()
