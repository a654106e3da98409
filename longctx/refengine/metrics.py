"""Prometheus metrics under SGLang's names (served at /metrics with --enable-metrics)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
# SGLang's --decode-log-interval default: its scheduler logs decode stats (and sets the gauges) every 40 decode
# batches, and there sets sglang:cache_hit_rate to 0 (scheduler_metrics_mixin.py, log_decode_stats)
DECODE_LOG_INTERVAL = 40


class EngineMetrics:
    def __init__(self, model_name: str, max_total_tokens: int):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        self.num_running = gauge("sglang:num_running_reqs", "Requests running (prefill or decode)")
        self.num_queue = gauge("sglang:num_queue_reqs", "Requests waiting")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "KV cache slots in use")
        self.max_total = gauge("sglang:max_total_num_tokens", "KV cache pool size in tokens")
        self.token_usage = gauge("sglang:token_usage", "Fraction of the KV pool in use")
        self.gen_throughput = gauge("sglang:gen_throughput", "Generated tokens per second (last interval)")
        # as SGLang's log_prefill_stats sets it: the last prefill batch's cached tokens over its cached and new
        # tokens (a request's later chunks have none cached); 0 again at every DECODE_LOG_INTERVAL-th decode batch
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate")
        self.spec_accept_length = gauge("sglang:spec_accept_length", "Tokens per verify step of the last finished request")
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens processed", labels, registry=r).labels(model_name)
        self.generation_tokens = Counter("sglang:generation_tokens", "Tokens generated", labels, registry=r).labels(model_name)
        self.num_requests = Counter("sglang:num_requests", "Requests finished", labels, registry=r).labels(model_name)
        # SGLang's TokenizerMetricsCollector: prompt tokens (cached ones included) and the cached ones, per
        # finished request (newer SGLang adds a cache_source label; this one has only the device cache)
        self.cached_tokens = Counter("sglang:cached_tokens", "Number of cached prompt tokens", labels,
                                     registry=r).labels(model_name)
        # retraction, as SGLang counts it: the last retraction's size (gauge) and running totals
        self.num_retracted = gauge("sglang:num_retracted_reqs", "Requests retracted by the last retraction")
        self.retracted_total = Counter("sglang:num_retracted_requests", "Total number of retracted requests",
                                       labels, registry=r).labels(model_name)
        self.retracted_input_tokens = Counter("sglang:num_retracted_input_tokens", "Total number of retracted input tokens",
                                              labels, registry=r).labels(model_name)
        self.retracted_output_tokens = Counter("sglang:num_retracted_output_tokens", "Total number of retracted output tokens",
                                               labels, registry=r).labels(model_name)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Server-side time to first token", labels,
                              buckets=LATENCY_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Server-side request latency", labels,
                             buckets=LATENCY_BUCKETS, registry=r).labels(model_name)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Mean time per output token of a request",
                             labels, buckets=ITL_BUCKETS, registry=r).labels(model_name)
        self.max_total.set(max_total_tokens)
        self.cache_hit_rate.set(0.0)
        self._max_total = max_total_tokens
        self._tokens = 0
        self._last = (time.perf_counter(), 0)
        self._decode_batches = 0

    def observe_prefill(self, hit_tokens: int, new_tokens: int) -> None:
        """One prefill batch (one chunk here): SGLang's cache hit rate of it."""
        total = hit_tokens + new_tokens
        self.cache_hit_rate.set(hit_tokens / total if total else 0.0)

    def observe_decode(self) -> None:
        self._decode_batches += 1
        if self._decode_batches % DECODE_LOG_INTERVAL == 0:
            self.cache_hit_rate.set(0.0)

    def update_load(self, running: int, waiting: int, used_tokens: int) -> None:
        """The load gauges, set by the scheduler before and after each iteration's batch and by each scrape.

        ``running`` counts the request in prefill as well as the decoding ones (its prompt's pages are held;
        SGLang, at a prefill batch, counts its running batch and leaves the request in chunked prefill out
        of both gauges); ``waiting`` is the queue, retracted requests included."""
        self.num_running.set(running)
        self.num_queue.set(waiting)
        self.num_used_tokens.set(used_tokens)
        self.token_usage.set(used_tokens / self._max_total)
        now = time.perf_counter()
        t0, n0 = self._last
        if now - t0 >= 1.0:
            self.gen_throughput.set((self._tokens - n0) / (now - t0))
            self._last = (now, self._tokens)

    def count_retracted(self, reqs) -> None:
        self.num_retracted.set(len(reqs))
        self.retracted_total.inc(len(reqs))
        self.retracted_input_tokens.inc(sum(len(r.input_ids) for r in reqs))
        self.retracted_output_tokens.inc(sum(len(r.output_ids) for r in reqs))

    def count_generated(self, n: int) -> None:
        self._tokens += n

    def observe_finished(self, req) -> None:
        ts = req.timestamps
        n = len(req.output_ids)
        self.num_requests.inc()
        self.prompt_tokens.inc(len(req.input_ids))
        self.cached_tokens.inc(req.cached_tokens)
        self.generation_tokens.inc(n)
        if "first_token" in ts:
            self.ttft.observe(ts["first_token"] - req.received)
            if n > 1:
                self.itl.observe((ts["finished"] - ts["first_token"]) / (n - 1))
        self.e2e.observe(ts["finished"] - req.received)
        if req.verify_ct:
            self.spec_accept_length.set(n / req.verify_ct)

    def render(self) -> bytes:
        return generate_latest(self.registry)
