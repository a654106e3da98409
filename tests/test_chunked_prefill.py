"""Chunked prefill scheduled as SGLang schedules it: prefill first (running streams stall for a whole prefill),
or with --enable-mixed-chunk the running requests decode one token per prefill chunk."""

import json
import threading
import time

import httpx
import pytest

from longctx import config as lcfg
from longctx.engines import get_adapter
from longctx.measure.process import ManagedServer, free_port
from longctx.refengine.args import build_parser
from longctx.refengine.kvpool import KVPool
from longctx.refengine.metrics import EngineMetrics
from longctx.refengine.scheduler import Req, Scheduler

from .conftest import TINY_ARCH, refengine_command
from .test_config import base
from .test_refengine import CFG, KERNEL, MODEL, prompt, run_requests

# alone under -n (tests/conftest.py): a short stream must still decode when a long prefill ends
pytestmark = pytest.mark.alone

CHUNK = 128
LONG = 1200  # ten chunks of 128 (of 127 under mixing, one token of each going to the running request)


class Recorder(Scheduler):
    """A scheduler that logs, in the order they happen on its thread, each prefill chunk and each event it emits."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []  # ("chunk", rid, end, seconds, metrics at the chunk) | ("token", rid, t)

    def _prefill_chunk(self, req, budget):
        t0 = time.perf_counter()
        done = super()._prefill_chunk(req, budget)
        seen = dict(self.metrics_seen()) if self.metrics else None
        self.log.append(("chunk", req.rid, req.prefilled, time.perf_counter() - t0, seen))
        return done

    def metrics_seen(self):
        """The load gauges as a scrape during this chunk reads them (the routes update them from load() too)."""
        text = self.metrics.render().decode()
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:cache_hit_rate", "sglang:num_used_tokens"):
            line = next(line for line in text.splitlines() if line.startswith(name + "{"))
            yield name, float(line.rsplit(" ", 1)[1])


def interference(mixed: bool, queued: int = 0):
    """One short request decoding; once it has 3 tokens, a long prompt (LONG tokens, several chunks) and
    `queued` more short ones arrive. Returns the outputs (short, long, queued...) and the scheduler with its log."""
    pool = KVPool(CFG.num_hidden_layers, CFG.cell_dim, CFG.dtype, 4096, 4, 8, 2048, "random", seed=1)
    sched = Recorder(MODEL, pool, KERNEL, CHUNK, 8, metrics=EngineMetrics("refmla", 4096), mixed_chunk=mixed)
    prompts = [prompt(20, 3), prompt(LONG, 4)] + [prompt(16, 10 + i) for i in range(queued)]
    done = [threading.Event() for _ in prompts]
    started = threading.Event()
    reqs = []
    for i, p in enumerate(prompts):
        def emit(ev, i=i):
            sched.log.append(("token", f"r{i}", time.perf_counter()))
            if i == 0 and len(reqs[0].output_ids) >= 3:
                started.set()
            if ev["meta_info"]["finish_reason"] is not None:
                done[i].set()
        reqs.append(Req(f"r{i}", p, 40 if i == 0 else 4, True, emit))
    sched.submit(reqs[0])
    sched.start()
    assert started.wait(60)
    for r in reqs[1:]:
        sched.submit(r)
    for d in done:
        assert d.wait(120)
    assert pool.free_tokens() == 4096 and len(pool.free_rows) == 8
    return [r.output_ids for r in reqs], sched


def chunks_of(log, rid):
    return [k for k, e in enumerate(log) if e[0] == "chunk" and e[1] == rid]


def tokens_of(log, rid):
    return [k for k, e in enumerate(log) if e[0] == "token" and e[1] == rid]


def largest_gap(log, rid):
    times = [log[k][2] for k in tokens_of(log, rid)]
    return max(b - a for a, b in zip(times, times[1:]))


@pytest.fixture(scope="module")
def runs():
    return {mixed: interference(mixed) for mixed in (False, True)}


def test_without_mixed_chunk_a_long_prefill_stalls_the_running_stream_for_all_its_chunks(runs):
    (short, long_), sched = runs[False]
    log = sched.log
    chunks, short_tokens = chunks_of(log, "r1"), tokens_of(log, "r0")
    assert len(chunks) == -(-LONG // CHUNK) >= 4
    assert [log[k][2] for k in chunks] == [min(LONG, CHUNK * (j + 1)) for j in range(len(chunks))]
    # no token of the decoding request from the long prompt's first chunk to its last: prefill first
    assert not [k for k in short_tokens if chunks[0] < k < chunks[-1]]
    before = [k for k in short_tokens if k < chunks[0]]
    after = [k for k in short_tokens if k > chunks[-1]]
    assert len(before) >= 3 and after and len(before) + len(after) == 40
    # one of its gaps holds the whole prefill, so its largest gap spans at least the sum of the chunks' times
    # (which follows from the order above; no wall-clock threshold)
    stall = log[after[0]][2] - log[before[-1]][2]
    assert largest_gap(log, "r0") >= stall >= sum(log[k][3] for k in chunks)
    # the long prompt's first token comes out with its last chunk, before the stalled stream goes on
    assert tokens_of(log, "r1")[0] < after[0]


def test_with_mixed_chunk_the_running_stream_gets_one_token_per_chunk(runs):
    (short, long_), sched = runs[True]
    log = sched.log
    chunks, short_tokens = chunks_of(log, "r1"), tokens_of(log, "r0")
    # each chunk gives up one token of its budget to the running request (SGLang's PrefillAdder under mixing)
    assert [log[k][2] for k in chunks] == [min(LONG, (CHUNK - 1) * (j + 1)) for j in range(len(chunks))]
    assert len(chunks) == -(-LONG // (CHUNK - 1)) >= 4
    # exactly one token of the decoding request after each chunk, before the next one
    for a, b in zip(chunks, chunks[1:]):
        assert len([k for k in short_tokens if a < k < b]) == 1
    assert len([k for k in short_tokens if k > chunks[-1]]) >= 1
    # the request whose prefill a chunk ends does not decode in that iteration: its second token comes after
    # the next batch, not right behind its first
    long_tokens = tokens_of(log, "r1")
    assert [k for k in short_tokens if long_tokens[0] < k < long_tokens[1]]
    # no gap of the decoding request holds two chunks
    for a, b in zip(short_tokens, short_tokens[1:]):
        assert len([k for k in chunks if a < k < b]) <= 1


def test_the_tokens_are_the_same_with_and_without_mixed_chunk(runs):
    assert runs[False][0] == runs[True][0]
    (alone_short,), _, _ = run_requests([prompt(20, 3)], 40, page_size=4)
    (alone_long,), _, _ = run_requests([prompt(LONG, 4)], 4, page_size=4)
    assert runs[False][0] == [alone_short, alone_long]


def test_during_a_long_prefill_the_gauges_show_it_running_and_the_rest_queued():
    (short, long_, *rest), sched = interference(False, queued=2)
    seen = [e[4] for e in sched.log if e[0] == "chunk" and e[1] == "r1"]
    assert len(seen) >= 4
    for s in seen[:-1]:  # while it prefills: the decoding one and the prefilling one run, two wait
        assert s["sglang:num_running_reqs"] == 2 and s["sglang:num_queue_reqs"] == 2
        assert s["sglang:cache_hit_rate"] == 0.0 and s["sglang:num_used_tokens"] >= LONG
    # the queued ones are prefilled next, one per batch, before the running ones decode again
    log = sched.log
    r0_after = [k for k in tokens_of(log, "r0") if k > chunks_of(log, "r1")[-1]]
    assert tokens_of(log, "r2")[0] < r0_after[0] and tokens_of(log, "r3")[0] < r0_after[0]


# --- the flag through the configuration and the server -------------------------------------

def test_configuration_args_take_enable_mixed_chunk():
    conf = base()
    conf["configurations"]["a"]["args"]["enable-mixed-chunk"] = True
    spec = lcfg.configuration_spec(lcfg.validate(conf), "a")
    cmd = get_adapter("reference").launch_command(spec, "127.0.0.1", 1, None)
    assert "--enable-mixed-chunk" in cmd
    assert build_parser().parse_args(cmd[cmd.index("--host"):]).enable_mixed_chunk is True
    conf["configurations"]["a"]["args"]["enable-mixed-chunk"] = False
    cmd = get_adapter("reference").launch_command(lcfg.configuration_spec(lcfg.validate(conf), "a"), "127.0.0.1", 1, None)
    assert "--enable-mixed-chunk" not in cmd


def test_ngram_speculation_turns_mixed_chunk_off_as_sglang_does(caplog):
    import torch

    from longctx.refengine.engine import Engine

    args = build_parser().parse_args(["--json-model-override-args", json.dumps(TINY_ARCH), "--max-total-tokens", "1024",
                                      "--context-length", "512", "--num-threads", str(torch.get_num_threads()),
                                      "--enable-mixed-chunk", "--speculative-algorithm", "NGRAM"])
    engine = Engine(args)
    assert engine.scheduler.mixed_chunk is False and engine.server_info()["enable_mixed_chunk"] is False
    assert "mixed chunked prefill are disabled because of using ngram speculative decoding" in caplog.text


# The decoding stream's length: it must outlast the long prompt's prefill, sent after its third event. 300 tokens
# (0.13 s here) once ended 70 ms before that prefill did, the long request sent late in a busy suite run;
# 2,000 (under 1 s) leave the margin, within the context length (2,048).
SHORT_TOKENS = 2000
# The long prompt's decode after its prefill: both requests then run together while /metrics is scraped. With 1
# token, the two ran together only for the prefill (about 40 ms here), and the scrapes (a new connection each, one
# every 10-15 ms) caught num_running_reqs at 2 once per run, and in 2 runs of 10 not at all; with 100 tokens and one
# kept connection, 18 to 22 scrapes of a run see it. 100 keep the prompt within the context length (1,900 + 100)
# and both requests within the pool (2,020 + 2,000 of 4,096 tokens).
LONG_TOKENS = 100


@pytest.mark.parametrize("mixed", [False, True], ids=["prefill-first", "mixed-chunk"])
def test_over_http_the_stream_stalls_for_the_whole_prefill_unless_mixed(tmp_path, mixed):
    """A real server: a stream decoding, then a long prompt (about 60 chunks of 32). The stream's events sent while
    the long prompt was prefilled (its server timestamps, scheduled to prefill_done): none without the flag
    (at most one already on its way to the socket), about one per chunk with it. /metrics scraped meanwhile
    shows both running, and a cache hit rate of 0."""
    port = free_port()
    cmd = refengine_command(port, "--page-size", "4", "--enable-metrics", "--chunked-prefill-size", "32",
                            *(["--enable-mixed-chunk"] if mixed else []))
    server = ManagedServer(cmd, tmp_path / "server.log")
    server.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy(base_url + "/health", 60)
        assert httpx.get(base_url + "/server_info").json()["enable_mixed_chunk"] is mixed
        events = {"short": [], "long": []}
        three, stop, samples = threading.Event(), threading.Event(), []

        def stream(name, body, first=None):
            with httpx.stream("POST", base_url + "/generate", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        events[name].append(json.loads(line[6:]))
                        if len(events[name]) == 1 and first:
                            first()
                        if len(events[name]) >= 3:
                            three.set()

        def poll():  # one kept connection: a new one per GET took most of the time between scrapes
            with httpx.Client() as client:
                while not stop.is_set():
                    scrape(client.get(base_url + "/metrics").text)
                    time.sleep(0.005)

        def scrape(text: str) -> None:
            samples.append({line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                            if line.startswith(("sglang:num_running_reqs{", "sglang:cache_hit_rate{"))})

        short = threading.Thread(target=stream, args=("short", {"input_ids": prompt(20, 3), "stream": True,
                                                                "sampling_params": {"max_new_tokens": SHORT_TOKENS, "ignore_eos": True}}))
        short.start()
        assert three.wait(60)
        poller = threading.Thread(target=poll)
        poller.start()
        # and one scrape at the long prompt's first token, its prefill done and its 99 other tokens to come, the stream
        # still decoding: both run then whatever the poller's thread was given of the CPU (in one busy suite run, none
        # of its scrapes fell between the long prompt's admission and its end)
        with httpx.Client() as at_first:
            stream("long", {"input_ids": prompt(1900, 4), "stream": True, "sampling_params": {"max_new_tokens": LONG_TOKENS, "ignore_eos": True}},
                   first=lambda: scrape(at_first.get(base_url + "/metrics").text))
        stop.set()
        poller.join()
        short.join(120)
        ts = events["long"][-1]["meta_info"]["timestamps"]
        sent = [e["meta_info"]["sent_ts"] for e in events["short"]]
        during = [t for t in sent if ts["scheduled"] < t < ts["prefill_done"]]
        assert len(sent) == SHORT_TOKENS and sent[-1] > ts["prefill_done"]  # it was still decoding when the prefill ended
        if mixed:
            assert len(during) >= 30, during
        else:
            assert len(during) <= 1, during
        assert any(s["sglang:num_running_reqs"] == 2 for s in samples), samples
        assert samples and all(s["sglang:cache_hit_rate"] == 0.0 for s in samples)
    finally:
        server.stop()
