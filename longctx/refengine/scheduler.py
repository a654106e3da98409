"""Scheduler: admits requests, prefills them chunk by chunk, decodes all running requests together.

Each iteration runs one batch, chosen as SGLang's ``Scheduler.get_next_batch_to_run`` chooses it
(python/sglang/srt/managers/: scheduler.py, read at sgl-project/sglang 0003215c, and its older
``run_step`` at d51c1c21; schedule_policy.py's ``PrefillAdder``; schedule_batch.py's ``ScheduleBatch``):

- Prefill first. Whenever a prefill batch can be formed (``get_new_batch_prefill``: a request in
  chunked prefill continues, or a waiting request is admitted), that batch runs ("Run prefill first
  if possible") and the running requests get no decode step in that iteration. A request in chunked
  prefill is put back into every next prefill batch (``PrefillAdder.add_chunked_req``) until its last
  chunk, so while a long prompt is prefilled, chunk after chunk, every running stream stalls for the
  whole prefill: the long-context interference users report. Decode (``update_running_batch``, with
  its retraction) runs only in iterations with no prefill work: no waiting request can be admitted
  (running at --max-running-requests, or its pages are not free) and none is in chunked prefill.
- ``--enable-mixed-chunk`` (SGLang's flag, ``Scheduler.is_mixed_chunk``: set when chunked prefill is
  on and the flag is given): the prefill batch takes the running requests in as one-token extends
  (``ScheduleBatch.mix_with_running``), so they advance by one token per prefill chunk. The chunk
  shrinks by one token per running request (``PrefillAdder``: ``rem_chunk_tokens`` less
  ``mixed_with_decode_tokens``, the running batch size under mixing). Here the chunk and the decode
  step are two forward passes of one iteration (SGLang runs one MIXED pass); the requests decoded are
  those running when the chunk's batch was formed, not the one whose prefill this chunk ends. Under
  NGRAM speculation SGLang turns mixing off with a warning (server_args.py), and so does the engine.

Newer SGLang also has ``--prefill-decode-interval`` (default 0: off; ``_should_defer_prefill``), decode
rounds forced between prefill batches; the engine does not have it.

Admission differs from SGLang's in two ways, kept for simplicity: a prefill batch holds one request
(SGLang's ``PrefillAdder`` puts several waiting requests into one prefill batch, up to the chunk
budget), so waiting requests are prefilled one after another, still before any decode; and a request
is admitted when the pages of its prompt are free (``PrefillAdder`` also reserves the running
requests' expected output, ``new_token_ratio``), so the pool can run out at decode time sooner and
retraction, below, frees it. With NGRAM speculation a decode step verifies the drafts of each request
in one forward pass. It runs in one thread; the HTTP side hands it requests and receives events
through each request's thread-safe ``emit``.

When a decode step needs more pages than the pool has free, running requests are retracted as
SGLang retracts them (``ScheduleBatch.retract_decode``): sorted by output length, then by shorter
prompt, the ones that sort last go first, until the rest fit; their pages are freed and they go
back to the waiting queue, behind the requests already there (SGLang's ``_add_request_to_queue``
appends). A retracted request is prefilled again later over its prompt and the tokens it had
generated, so its output goes on exactly as it would have (greedy decoding).

The prefix cache (radix.py; off with --disable-radix-cache) is used where SGLang uses its RadixCache:
admission matches the longest cached page-aligned prefix of at most len - 1 tokens (schedule_batch.py's
``init_next_round_input``/``adjust_max_prefix_ids``), locks it, points the row at its pages and prefills
the rest; each finished chunk and the finished prompt are inserted (``cache_unfinished_req``, the row then
points at the tree's pages where the tree had them), a finished request's committed tokens too
(``cache_finished_req``: duplicates and the page-unaligned tail freed, its lock dropped), a retracted one
inserts nothing and keeps only what the tree owns (``release_kv_cache(is_insert=False)``). Room is counted
as free plus evictable pages (scheduler.py's ``_get_token_info``), and the pool evicts before an allocation
fails. ``cached_tokens`` is counted at a request's first admission only (a re-prefill after retraction adds
none, SGLang's ``retracted_stain``). Two rules keep shared pages in place: NGRAM verification writes only at
positions past the prompt, never in the tree's pages (a prefix is at most len - 1 tokens and whole pages);
the defragmenter moves only the request's own pages, those after its cached prefix, and with
--enable-kv-defrag a request's chunks are inserted only when its prefill ends, after the move (so a cold
prompt is still moved whole; the cost: a prefill retracted midway keeps none of its chunks cached).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from . import tokenizer
from .kvpool import KVPool
from ..attention.build import Kernel
from .model import MLAModel
from .radix import RadixCache
from .speculative import SpecConfig, ngram_drafts

log = logging.getLogger("longctx.refengine")


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool
    emit: Callable[[dict], None]
    received: float = field(default_factory=time.perf_counter)  # CLOCK_MONOTONIC, comparable across processes
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    row: int = -1
    prefilled: int = 0
    aborted: bool = False
    timestamps: dict = field(default_factory=dict)
    event_tokens: list[int] = field(default_factory=list)  # tokens carried by each event handed to the client
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    seq: np.ndarray | None = None  # prompt + output, for draft lookup
    ids: torch.Tensor | None = None  # what is prefilled: the prompt, after a retraction the prompt and output
    retractions: int = 0  # times this request was retracted back to the waiting queue
    # the prefix cache (radix.py): the leading pages of `pages` that the tree owns, the tree node that this
    # request locks (SGLang's last_node), and the prompt tokens found cached at its first admission
    prefix_pages: int = 0
    last_node: object = None
    cached_tokens: int = 0
    hit_tokens: int = 0  # cached tokens the next prefill batch reports (SGLang's log_hit_tokens), then 0

    def position(self) -> int:
        """Position of the token to be fed next (the last generated one)."""
        return len(self.input_ids) + len(self.output_ids) - 1

    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)


def retraction_order(reqs: list[Req]) -> list[Req]:
    """The requests in SGLang's retraction order: the last ones are retracted first.

    SGLang (ScheduleBatch.retract_decode) sorts by (len(output_ids), -len(origin_input_ids)) in
    reverse: most output first, ties broken by the shorter prompt; it pops from the end.
    """
    return sorted(reqs, key=lambda r: (len(r.output_ids), -len(r.input_ids)), reverse=True)


class Scheduler:
    def __init__(self, model: MLAModel, pool: KVPool, kernel: Kernel, chunked_prefill_size: int,
                 max_running_requests: int, spec: SpecConfig | None = None, defrag: bool = False,
                 metrics=None, mixed_chunk: bool = False, cache: RadixCache | None = None):
        self.model = model
        self.pool = pool
        self.kernel = kernel
        self.chunk = chunked_prefill_size
        self.max_running = max_running_requests
        self.spec = spec
        self.defrag = defrag
        self.metrics = metrics
        self.mixed_chunk = mixed_chunk  # --enable-mixed-chunk: running requests decode along each prefill chunk
        self.cache = cache  # the radix prefix cache; None with --disable-radix-cache
        if cache is not None:
            pool.evict = cache.evict  # an allocation evicts cached pages before it says "full"
        self.flushes: list[tuple[threading.Event, dict]] = []  # /flush_cache calls, answered between batches
        self.waiting: deque[Req] = deque()
        self.prefilling: Req | None = None
        self.running: list[Req] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    # --- called from other threads -------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def submit(self, req: Req) -> None:
        with self.cond:
            self.waiting.append(req)
            self.cond.notify()

    def abort(self, req: Req) -> None:
        req.aborted = True

    def flush(self, timeout: float = 30.0) -> tuple[bool, str]:
        """/flush_cache: empty the prefix cache, between two batches; refused while requests are queued or
        run (SGLang's Scheduler.flush_cache). Returns (done, what was logged)."""
        done, box = threading.Event(), {}
        with self.cond:
            self.flushes.append((done, box))
            self.cond.notify()
        if not done.wait(timeout):
            return False, "Cache not flushed: the scheduler did not answer in time"
        return box["ok"], box["message"]

    def available_tokens(self) -> int:
        """Free tokens plus the cached ones that eviction can free (SGLang's _get_token_info: available_size +
        evictable_size): what scheduling may count on."""
        return self._available_pages() * self.pool.page_size

    def _available_pages(self) -> int:
        return len(self.pool.free_pages) + (self.cache.evictable_pages() if self.cache is not None else 0)

    def load(self) -> dict:
        # tokens held by requests: the pool less what is free or evictable (num_used in SGLang's _get_token_info)
        return {"running": len(self.running) + (self.prefilling is not None), "waiting": len(self.waiting),
                "used_tokens": self.pool.num_tokens - self.available_tokens()}

    # --- scheduler thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.running and self.prefilling is None and not self.flushes:
                    self.cond.wait()
                if self.flushes:
                    self._flush_cache()
                self._admit()
            self._update_metrics()  # a scrape during this iteration's batch sees the request admitted as running
            try:
                self._step()
            except Exception as exc:  # keep serving: fail the requests in flight, not the server
                log.error("scheduler step failed: %s\n%s", exc, traceback.format_exc())
                for req in [self.prefilling, *self.running]:
                    if req is not None and req.row >= 0:  # its cells may be half written: nothing goes into the cache
                        self._finish(req, {"type": "abort", "message": f"engine error: {exc}"}, insert=False)
                self.prefilling, self.running = None, []
            self._update_metrics()

    def _flush_cache(self) -> None:
        """Answer the pending /flush_cache calls (under self.cond): the requests the clients abandoned go first,
        then the tree is emptied if nothing is queued or running, as SGLang's flush_cache."""
        self.waiting = deque(r for r in self.waiting if not r.aborted)
        self.running = [r for r in self.running if not self._reap(r)]
        if self.prefilling is not None and self.prefilling.aborted:
            self._finish(self.prefilling, {"type": "abort", "message": "client disconnected"})
            self.prefilling = None
        busy = len(self.running) + (self.prefilling is not None)
        if self.waiting or busy:
            ok = False
            message = (f"Cache not flushed because there are pending requests. #queue-req: {len(self.waiting)}, "
                       f"#running-req: {busy}")
            log.warning(message)
        else:
            ok = True
            freed = self.cache.reset() if self.cache is not None else 0
            message = "Cache flushed successfully!"
            log.info("%s (%d cached tokens freed)", message, freed)
        for done, box in self.flushes:
            box.update(ok=ok, message=message)
            done.set()
        self.flushes = []

    def _update_metrics(self) -> None:
        if self.metrics:
            self.metrics.update_load(**self.load())

    def _step(self) -> None:
        """One iteration's batch (SGLang's get_next_batch_to_run, then run_batch): a prefill chunk when there
        is one (with the running requests' decode step under --enable-mixed-chunk), else a decode step."""
        self.running = [r for r in self.running if not self._reap(r)]
        if self.prefilling is None:
            if self.running:
                self._decode_step()
        elif not self.mixed_chunk:  # prefill first: the running requests wait for the prefill batches
            done = self._prefill_chunk(self.prefilling, self.chunk)
            if done is not None:
                self.running.append(done)
        else:
            # mix_with_running: the requests running as the batch is formed take one token each from the chunk's budget
            done = self._prefill_chunk(self.prefilling, max(1, self.chunk - len(self.running)))
            try:
                if self.running:
                    self._decode_step()
            finally:  # the request whose prefill ended decodes from the next iteration on (SGLang merges it then)
                if done is not None:
                    self.running.append(done)
        self.running = [r for r in self.running if not self._reap(r)]

    def _admit(self) -> None:
        while self.prefilling is None and self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                continue
            n = len(req.input_ids) + len(req.output_ids)  # a retracted request prefills its output too
            if req.seq is None:
                req.seq = np.empty(len(req.input_ids) + req.max_new_tokens, dtype=np.int64)
                req.seq[: len(req.input_ids)] = req.input_ids
            # the longest cached page-aligned prefix, at most n - 1 tokens (one is computed for the logits:
            # SGLang's adjust_max_prefix_ids), locked before the room is counted so it is not counted as evictable
            prefix, node = self.cache.match(req.seq[: n - 1]) if self.cache is not None else ([], None)
            if node is not None:
                self.cache.lock(node)
            if -(-(n + 1) // self.pool.page_size) - len(prefix) > self._available_pages():
                if node is not None:
                    self.cache.unlock(node)
                return  # wait for running requests to free their pages
            self.waiting.popleft()
            req.row = self.pool.alloc_row()
            req.pages[:] = prefix  # the row points at the cached pages: no copy
            self.pool.point(req.row, 0, prefix)
            req.prefix_pages, req.last_node = len(prefix), node
            if not self.pool.reserve(req.row, req.pages, n):
                raise RuntimeError("KV pool exhausted during admission")
            req.timestamps.setdefault("scheduled", time.perf_counter())
            req.ids = torch.tensor(req.seq[:n], dtype=torch.int64, device=self.model.device)
            req.prefilled = len(prefix) * self.pool.page_size  # only the rest is prefilled
            req.hit_tokens = req.prefilled
            if not req.retractions:  # a prefill after a retraction adds none (SGLang's retracted_stain)
                req.cached_tokens = req.prefilled
            self.prefilling = req

    def _prefill_chunk(self, req: Req, budget: int) -> Req | None:
        """Prefill the next ``budget`` tokens of ``req``; after its last chunk, its first token is out and it is
        returned, to join the running requests."""
        if req.aborted:
            self._finish(req, {"type": "abort", "message": "client disconnected"})
            self.prefilling = None
            return None
        n = len(req.ids)
        start, end = req.prefilled, min(req.prefilled + budget, n)
        logits = self.model.prefill_chunk(self.pool, req.row, req.ids[start:end], start)
        req.prefilled = end
        if self.metrics:
            self.metrics.observe_prefill(req.hit_tokens, end - start)
        req.hit_tokens = 0
        if end < n:
            if self.cache is not None and not self.defrag:
                self._cache_unfinished(req, end)  # SGLang's cache_unfinished_req(chunked=True) after each chunk
            return None
        self.prefilling = None
        req.timestamps.setdefault("prefill_done", time.perf_counter())
        if self.defrag:  # only the request's own pages move: the cached ones are shared
            self.pool.defragment(req.row, req.pages, n, len(req.input_ids) + req.max_new_tokens, first=req.prefix_pages)
        if self.cache is not None:
            self._cache_unfinished(req, n)  # the prompt is cached at once, so that others can match it
        self._append(req, [int(torch.argmax(logits[-1]))])
        return req

    def _cache_unfinished(self, req: Req, computed: int) -> None:
        """Insert the request's first ``computed`` tokens (whole pages) into the tree and point its row at the
        tree's pages where the tree had them already; the request then locks the longer path (SGLang's
        cache_unfinished_req)."""
        k = computed // self.pool.page_size
        if k <= req.prefix_pages:
            return
        tokens = req.seq[: k * self.pool.page_size]
        known = self.cache.insert(tokens, req.pages[:k]) // self.pool.page_size
        self.pool.free(req.pages[req.prefix_pages : known])  # cached already: the tree keeps its own
        pages, node = self.cache.match(tokens)
        assert len(pages) == k, (len(pages), k)
        req.pages[:k] = pages
        self.pool.point(req.row, req.prefix_pages, pages[req.prefix_pages :])
        self.cache.lock(node)
        self.cache.unlock(req.last_node)
        req.prefix_pages, req.last_node = k, node

    def _release(self, req: Req, insert: bool) -> None:
        """Give back the request's pages and row. With the prefix cache: its computed tokens (whole pages) go
        into the tree when ``insert`` (SGLang's cache_finished_req), its pages the tree had already and the
        rest are freed, and its lock is dropped; a retracted request inserts nothing (is_insert=False)."""
        if self.cache is None or req.last_node is None:
            self.pool.release(req.row, req.pages)
            return
        ps = self.pool.page_size
        # cells written and valid: the prefilled ones mid-prefill, else all but the last token's (not yet fed)
        committed = req.prefilled if req.ids is not None and req.prefilled < len(req.ids) else req.position()
        keep = committed // ps if insert else 0
        if keep > req.prefix_pages:
            known = self.cache.insert(req.seq[: keep * ps], req.pages[:keep]) // ps
            self.pool.free(req.pages[req.prefix_pages : known] + req.pages[keep:])
        else:
            self.pool.free(req.pages[req.prefix_pages :])
        self.cache.unlock(req.last_node)
        req.pages.clear()
        req.prefix_pages, req.last_node = 0, None
        self.pool.release(req.row, req.pages)

    def _decode_step(self) -> None:
        if self.metrics:
            self.metrics.observe_decode()
        self._retract_if_full()
        for req in self.running:  # every request's next cell first (there is room after retraction)
            if not self.pool.reserve(req.row, req.pages, req.position() + 1):
                self._finish(req, {"type": "abort", "message": "KV cache pool is full"})
        self.running = [r for r in self.running if r.row >= 0]
        plain, drafted = [], []
        for req in self.running:  # then the drafts' cells, where pages are left
            drafts = self._drafts(req) if self.spec else []
            if drafts and self.pool.reserve(req.row, req.pages, req.position() + 1 + len(drafts)):
                drafted.append((req, drafts))
            else:  # without room for the drafts, a plain step: the same tokens (greedy)
                plain.append(req)
        if plain:
            ids = torch.tensor([r.output_ids[-1] for r in plain], dtype=torch.int64, device=self.model.device)
            logits = self.model.decode(self.pool, [r.row for r in plain], ids, [r.position() for r in plain], self.kernel.decode)
            for req, tok in zip(plain, torch.argmax(logits, dim=-1).tolist()):
                req.verify_ct += 1
                self._append(req, [tok])
        for req, drafts in drafted:
            self._verify(req, drafts)

    def _pages_next_step(self, reqs: list[Req]) -> int:
        """Pages the next decode step of ``reqs`` needs beyond those they hold (one cell each)."""
        ps = self.pool.page_size
        return sum(max(0, -(-(r.position() + 1) // ps) - len(r.pages)) for r in reqs)

    def _retract_if_full(self) -> None:
        """SGLang's check_decode_mem and retract_decode: free the pages of the requests sorted last
        (fewest output tokens, then longest prompt) until the others' next step fits. The last
        running request stays, as in SGLang; if it still does not fit, the prompt in prefill goes."""
        if self._pages_next_step(self.running) <= self._available_pages():
            return
        keep = retraction_order(self.running)
        retracted = []
        while len(keep) > 1 and self._pages_next_step(keep) > self._available_pages():
            retracted.append(keep.pop())
            self._retract(retracted[-1])
        if self.prefilling is not None and self._pages_next_step(keep) > self._available_pages():
            retracted.append(self.prefilling)
            self._retract(self.prefilling)
            self.prefilling = None
        kept = set(map(id, keep))
        self.running = [r for r in self.running if id(r) in kept]  # the running order stays
        if not retracted:
            return
        log.info("KV cache pool is full. Retract requests. #retracted_reqs: %d, #running-req: %d, #free_tokens: %d",
                 len(retracted), len(self.running), self.available_tokens())
        if self.metrics:
            self.metrics.count_retracted(retracted)

    def _retract(self, req: Req) -> None:
        self._release(req, insert=False)
        req.row, req.prefilled, req.ids = -1, 0, None
        req.retractions += 1
        with self.cond:
            self.waiting.append(req)  # behind the queue, as SGLang's _add_request_to_queue

    def _drafts(self, req: Req) -> list[int]:
        k = min(self.spec.num_draft_tokens, req.remaining() - 1)
        if k <= 0:
            return []
        length = len(req.input_ids) + len(req.output_ids)
        return ngram_drafts(req.seq[:length], k, self.spec.min_window, self.spec.max_window)

    def _verify(self, req: Req, drafts: list[int]) -> None:
        """One forward pass over [last token] + drafts; keep the drafts the model agrees with, plus its next token."""
        p = req.position()
        ids = torch.tensor([req.output_ids[-1], *drafts], dtype=torch.int64, device=self.model.device)
        if self.kernel.verify is not None:
            logits = self.model.verify(self.pool, req.row, ids, p, self.kernel.verify)
        else:  # a kernel without a verify variant: the prefill path checks the drafts
            logits = self.model.prefill_chunk(self.pool, req.row, ids, p, all_logits=True)
        preds = torch.argmax(logits, dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == preds[accepted]:
            accepted += 1
        req.verify_ct += 1
        req.proposed_drafts += len(drafts)
        req.correct_drafts += accepted
        # cells written past the accepted tokens are overwritten by the next step, never read
        self._append(req, preds[: accepted + 1])

    def _append(self, req: Req, tokens: list[int]) -> None:
        reason = None
        if not req.output_ids:
            req.timestamps["first_token"] = time.perf_counter()
        if self.metrics:
            self.metrics.count_generated(len(tokens))
        for token in tokens:
            req.seq[len(req.input_ids) + len(req.output_ids)] = token
            req.output_ids.append(token)
            if not req.ignore_eos and token == tokenizer.EOS_ID:
                reason = {"type": "stop", "matched": token}
            elif len(req.output_ids) >= req.max_new_tokens:
                reason = {"type": "length", "length": req.max_new_tokens}
            if reason:
                break
        if reason is not None:
            self._finish(req, reason, new=len(tokens))
        else:
            req.emit(self._chunk(req, None, len(tokens)))

    def _finish(self, req: Req, reason: dict, new: int = 0, insert: bool = True) -> None:
        req.timestamps["finished"] = time.perf_counter()
        event = self._chunk(req, reason, new)
        if self.metrics:
            self.metrics.observe_finished(req)
        self._release(req, insert)  # before the event: a flush the client sends next finds the pages back
        req.row = -1
        req.emit(event)

    def _reap(self, req: Req) -> bool:
        """Drop finished requests and release the pages of those the client abandoned."""
        if req.row < 0:
            return True
        if req.aborted:
            self._finish(req, {"type": "abort", "message": "client disconnected"})
            return True
        return False

    def _chunk(self, req: Req, finish_reason: dict | None, new: int) -> dict:
        meta = {
            "id": req.rid,
            "finish_reason": finish_reason,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "e2e_latency": time.perf_counter() - req.received,
        }
        if self.spec and finish_reason is not None:
            meta.update(
                spec_verify_ct=req.verify_ct,
                spec_accept_length=len(req.output_ids) / req.verify_ct if req.verify_ct else 0.0,
                spec_accept_rate=req.correct_drafts / req.proposed_drafts if req.proposed_drafts else 0.0,
                spec_num_correct_drafts=req.correct_drafts,
                spec_num_proposed_drafts=req.proposed_drafts,
            )
        return {
            "text": tokenizer.decode(req.output_ids),
            "output_ids": req.output_ids[len(req.output_ids) - new :] if new else [],
            "meta_info": meta,
            "index": 0,
        }
