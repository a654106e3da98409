"""Scheduler: admits requests, prefills them in chunks, decodes all running requests together.

It runs in one thread; the HTTP side hands it requests and receives output events through
each request's ``emit`` callback (which must be thread-safe).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import tokenizer
from .kvpool import KVPool
from .model import DecodeKernel, MLAModel

log = logging.getLogger("longctx.refengine")


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool
    emit: Callable[[dict], None]
    created: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    row: int = -1
    aborted: bool = False

    def position(self) -> int:
        """Position of the token to be fed next (the last generated one)."""
        return len(self.input_ids) + len(self.output_ids) - 1


class Scheduler:
    def __init__(self, model: MLAModel, pool: KVPool, kernel: DecodeKernel, chunked_prefill_size: int, max_running_requests: int):
        self.model = model
        self.pool = pool
        self.kernel = kernel
        self.chunk = chunked_prefill_size
        self.max_running = max_running_requests
        self.waiting: deque[Req] = deque()
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

    def num_running(self) -> int:
        return len(self.running)

    # --- scheduler thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.running:
                    self.cond.wait()
                new = self._admit()
            try:
                for req in new:
                    self._prefill(req)
                self.running = [r for r in self.running if not self._reap(r)]
                if self.running:
                    self._decode_step()
                    self.running = [r for r in self.running if not self._reap(r)]
            except Exception as exc:  # keep serving: fail the requests in flight, not the server
                log.error("scheduler step failed: %s\n%s", exc, traceback.format_exc())
                for req in new + self.running:
                    if req.row >= 0:
                        self._finish(req, {"type": "abort", "message": f"engine error: {exc}"})
                self.running = []

    def _admit(self) -> list[Req]:
        new: list[Req] = []
        while self.waiting and len(self.running) + len(new) < self.max_running:
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                continue
            need = -(-(len(req.input_ids) + 1) // self.pool.page_size) * self.pool.page_size
            if need > self.pool.free_tokens():
                break  # wait for running requests to free their pages
            self.waiting.popleft()
            req.row = self.pool.alloc_row()
            new.append(req)
        return new

    def _prefill(self, req: Req) -> None:
        n = len(req.input_ids)
        if not self.pool.reserve(req.row, req.pages, n):
            raise RuntimeError("KV pool exhausted during admission")
        ids = torch.tensor(req.input_ids, dtype=torch.int64, device=self.model.device)
        logits = None
        for start in range(0, n, self.chunk):
            logits = self.model.prefill_chunk(self.pool, req.row, ids[start : start + self.chunk], start)
        self._append(req, int(torch.argmax(logits)))
        self.running.append(req)

    def _decode_step(self) -> None:
        batch = []
        for req in self.running:
            if self.pool.reserve(req.row, req.pages, req.position() + 1):
                batch.append(req)
            else:
                self._finish(req, {"type": "abort", "message": "KV cache pool is full"})
        if not batch:
            return
        ids = torch.tensor([r.output_ids[-1] for r in batch], dtype=torch.int64, device=self.model.device)
        logits = self.model.decode(self.pool, [r.row for r in batch], ids, [r.position() for r in batch], self.kernel)
        for req, tok in zip(batch, torch.argmax(logits, dim=-1).tolist()):
            self._append(req, tok)

    def _append(self, req: Req, token: int) -> None:
        req.output_ids.append(token)
        reason = None
        if not req.ignore_eos and token == tokenizer.EOS_ID:
            reason = {"type": "stop", "matched": token}
        elif len(req.output_ids) >= req.max_new_tokens:
            reason = {"type": "length", "length": req.max_new_tokens}
        if reason is not None:
            self._finish(req, reason)
        else:
            req.emit(self._chunk(req, None))

    def _finish(self, req: Req, reason: dict) -> None:
        req.emit(self._chunk(req, reason))
        self.pool.release(req.row, req.pages)
        req.row = -1

    def _reap(self, req: Req) -> bool:
        """Drop finished requests and release the pages of those the client abandoned."""
        if req.row < 0:
            return True
        if req.aborted:
            self._finish(req, {"type": "abort", "message": "client disconnected"})
            return True
        return False

    def _chunk(self, req: Req, finish_reason: dict | None) -> dict:
        return {
            "text": tokenizer.decode(req.output_ids),
            "output_ids": req.output_ids[-1:],
            "meta_info": {
                "id": req.rid,
                "finish_reason": finish_reason,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.output_ids),
                "cached_tokens": 0,
                "e2e_latency": time.perf_counter() - req.created,
            },
            "index": 0,
        }
