"""HTTP front of the reference engine: SGLang's endpoints, request and streaming formats."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

import psutil
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..attention import hostmem, build as kernels
from . import tokenizer
from .args import build_parser
from .kvpool import KVPool, PoolError, PoolSizing
from .model import MLAModel
from .modelconfig import ModelConfig
from .metrics import EngineMetrics
from .scheduler import Req, Scheduler
from .speculative import SpecConfig
from .wire import PLACEHOLDER, WireH11Protocol, WireLog, request_log

log = logging.getLogger("longctx.refengine")

ENGINE_NAME = "longctx-refengine"


def load_kernel(kernel_dir: str, backend: str, device: str) -> kernels.Kernel:
    try:
        kernel = kernels.load_kernel(kernel_dir, device)
    except FileNotFoundError as exc:
        raise SystemExit(f"attention kernel not loaded: {exc} (build it or pass --kernel-dir)") from None
    if (backend == "native") != (kernel.target != "torch"):
        raise SystemExit(f"--attention-backend {backend} does not match the kernel in {kernel_dir} ({kernel.name}, "
                         f"{kernel.target}): native needs a native kernel build, torch a PyTorch kernel")
    log.info("Attention kernel: %s (%s) from %s", kernel.name, kernel.target, kernel_dir)
    return kernel


def _free_memory(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


GRACEFUL_SHUTDOWN_S = 2.0  # after SIGTERM, open responses get this long before the server exits


class Engine:
    def __init__(self, args: argparse.Namespace):
        # A client timing the stream on a busy core sees late tokens, and OpenMP threads that share
        # a core with it stall each other: by default one CPU is left free.
        torch.set_num_threads(args.num_threads or max(1, len(os.sched_getaffinity(0)) - 1))
        for name in ("page_size", "chunked_prefill_size", "max_running_requests", "context_length"):
            if getattr(args, name) < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
        self.args = args
        self.cfg = ModelConfig.from_overrides(args.json_model_override_args)
        self.model = MLAModel(self.cfg, seed=args.random_seed, device=args.device)
        # SGLang sizes the pool from the memory free before loading (torch.cuda.mem_get_info); here:
        # the given total, or the device's free memory, or the host's available memory
        memory_total = int(args.memory_total_gb * 2**30) if args.memory_total_gb else _free_memory(args.device)
        self.sizing = PoolSizing(
            memory_total_bytes=memory_total,
            mem_fraction_static=args.mem_fraction_static,
            weights_bytes=self.model.weights_bytes(),
            cell_bytes=self.cfg.kv_bytes_per_token(),
            page_size=args.page_size,
            max_total_tokens=args.max_total_tokens,
        )
        self.pool = KVPool(
            num_layers=self.cfg.num_hidden_layers,
            cell_dim=self.cfg.cell_dim,
            dtype=self.cfg.dtype,
            num_tokens=self.sizing.tokens(),
            page_size=args.page_size,
            max_running_requests=args.max_running_requests,
            context_length=args.context_length,
            alloc_order=args.kv_alloc_order,
            seed=args.random_seed,
            device=args.device,
        )
        log.info(
            "KV Cache is allocated. dtype: %s, #tokens: %d, KV size: %.2f GB",
            self.cfg.torch_dtype, self.pool.num_tokens, self.pool.bytes() / 1e9,
        )
        if args.device == "cpu":
            log.info("KV pool on 2 MiB pages: %.0f%% (transparent huge pages: %s)",
                     100 * self.pool.huge_page_bytes() / max(1, self.pool.bytes()), hostmem.thp_mode())
        self.kernel = load_kernel(args.kernel_dir, args.attention_backend, args.device)
        self.spec = None
        if args.speculative_algorithm:
            if args.speculative_num_draft_tokens < 1:
                raise ValueError("--speculative-num-draft-tokens must be at least 1")
            self.spec = SpecConfig(args.speculative_algorithm, args.speculative_num_draft_tokens,
                                   args.speculative_ngram_min_match_window_size, args.speculative_ngram_max_match_window_size)
        self.metrics = EngineMetrics(args.model_path, self.pool.num_tokens) if args.enable_metrics else None
        self.scheduler = Scheduler(self.model, self.pool, self.kernel, args.chunked_prefill_size, args.max_running_requests,
                                   spec=self.spec, defrag=args.enable_kv_defrag, metrics=self.metrics)

    def server_info(self) -> dict:
        return {
            **vars(self.args),
            "engine": ENGINE_NAME,
            "version": __version__,
            "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "max_total_num_tokens": self.pool.num_tokens,
            "max_req_input_len": min(self.args.context_length - 1, self.pool.num_tokens - 1),
            "kv_cache_dtype": self.cfg.torch_dtype,
            "kv_cache_bytes": self.pool.bytes(),
            "kv_cache_huge_page_bytes": self.pool.huge_page_bytes(),
            "kv_bytes_per_token": self.cfg.kv_bytes_per_token(),
            "weights_bytes": self.model.weights_bytes(),
            "memory_total_bytes": self.sizing.memory_total_bytes,
            "req_to_token_bytes": self.pool.req_to_token_bytes(),
            "model_config": self.cfg.to_dict(),
            "sampling": "greedy",
            "random_weights": True,
            "kv_defrag": {"moves": self.pool.defrag_moves, "misses": self.pool.defrag_misses},
        }

    def validate(self, input_ids: list[int], max_new_tokens: int) -> str | None:
        n = len(input_ids)
        if n == 0:
            return "the request has no input tokens"
        if min(input_ids) < 0 or max(input_ids) >= self.cfg.vocab_size:
            return f"input token ids must lie in [0, {self.cfg.vocab_size})"
        if n >= self.args.context_length:
            return f"The input ({n} tokens) is longer than the model's context length ({self.args.context_length} tokens)."
        if n + 1 > self.pool.num_tokens:
            return f"The input ({n} tokens) does not fit in the KV cache pool ({self.pool.num_tokens} tokens)."
        if max_new_tokens < 1:
            return "sampling_params.max_new_tokens must be at least 1"
        return None


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


class BadRequest(ValueError):
    pass


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


@dataclass
class _Record:
    """What GET /request_timestamps says about one request (not the request itself: its prompt may be 200k ids)."""
    endpoint: str
    rid: str
    prompt_tokens: int
    received: float
    timestamps: dict  # the request's own, filled in as it runs
    event_tokens: list[int]
    output_ids: list[int]
    wire: WireLog | None  # streams: the socket times

    def to_json(self) -> dict:
        out = {"rid": self.rid, "endpoint": self.endpoint, "prompt_tokens": self.prompt_tokens,
               "completion_tokens": len(self.output_ids), "received": self.received, **self.timestamps,
               "event_tokens": list(self.event_tokens)}
        if self.wire is not None:
            out.update(first_token_sent=self.wire.first_sent, sent=list(self.wire.sent))
        return out


def make_app(engine: Engine) -> Starlette:
    recent: deque[_Record] = deque(maxlen=256)  # the last requests, for GET /request_timestamps

    def remember(endpoint: str, req: Req, wire: WireLog | None) -> None:
        recent.append(_Record(endpoint, req.rid, len(req.input_ids), req.received, req.timestamps, req.event_tokens,
                              req.output_ids, wire))

    def submit(input_ids, max_new: int, ignore_eos: bool, rid: str | None, received: float) -> tuple[Req, asyncio.Queue]:
        """Validate and queue a request; its events arrive on the returned queue."""
        if not isinstance(input_ids, list) or not all(isinstance(i, int) for i in input_ids):
            raise BadRequest("input_ids must be one list of integers (batched requests are not supported)")
        error = engine.validate(input_ids, max_new)
        if error:
            raise BadRequest(error)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = Req(
            rid=rid or uuid.uuid4().hex,
            input_ids=input_ids,
            max_new_tokens=min(max_new, engine.args.context_length - len(input_ids)),
            ignore_eos=ignore_eos,
            emit=lambda event: loop.call_soon_threadsafe(queue.put_nowait, event),
            received=received,
        )
        engine.scheduler.submit(req)
        return req, queue

    async def events(req: Req, queue: asyncio.Queue, wire: WireLog | None = None):
        """The request's events until the final one; the final one carries the server's timestamps.

        Each event says when it was sent (meta_info.sent_ts) so that a client on this machine can
        time its own lag. Streamed through the stamping protocol (`wire`), that is the moment its
        bytes reach the socket (the protocol writes it over PLACEHOLDER; see wire.py), and the
        request's "received" is when its first bytes were read; otherwise both are taken here.
        """
        try:
            while True:
                event = await queue.get()
                meta = event["meta_info"]
                final = meta["finish_reason"] is not None
                req.event_tokens.append(len(event["output_ids"]))
                if wire is not None:
                    req.timestamps["first_token_sent"] = wire.first_sent or PLACEHOLDER  # PLACEHOLDER: this event is the first
                    meta["sent_ts"] = PLACEHOLDER
                else:
                    req.timestamps.setdefault("first_token_sent", time.perf_counter())
                    meta["sent_ts"] = time.perf_counter()
                if final:
                    meta["timestamps"] = {"clock": "CLOCK_MONOTONIC", "received": req.received, **req.timestamps}
                yield event
                if final:
                    return
        finally:
            engine.scheduler.abort(req)  # a no-op once finished; frees the pages of an abandoned request

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def generate(request: Request) -> Response:
        wire = request_log(request.scope)
        received = wire.received if wire else time.perf_counter()  # before the body is read and parsed
        try:
            body = await request.json()
            if "input_ids" in body:
                input_ids = body["input_ids"]
            elif "text" in body:
                input_ids = tokenizer.encode(body["text"])
            else:
                raise BadRequest("the request needs input_ids or text")
            sp = body.get("sampling_params") or {}
            req, queue = submit(input_ids, int(sp.get("max_new_tokens", 128)), bool(sp.get("ignore_eos", False)),
                                body.get("rid"), received)
        except json.JSONDecodeError as exc:
            return _error(f"request body is not JSON: {exc}")
        except BadRequest as exc:
            return _error(str(exc))
        streamed = bool(body.get("stream"))
        remember("/generate", req, wire if streamed else None)

        if streamed:
            async def stream():
                async for event in events(req, queue, wire):
                    yield _sse(event)
                yield _sse(b"[DONE]")

            return StreamingResponse(stream(), media_type="text/event-stream")
        async for event in events(req, queue):
            last = event
        last["output_ids"] = req.output_ids
        return JSONResponse(last)

    async def completions(request: Request) -> Response:
        """OpenAI /v1/completions: prompt as text or token ids; usage on request (stream_options).

        Streamed chunks carry one field beyond OpenAI's, sent_ts, as /generate's events do."""
        wire = request_log(request.scope)
        received = wire.received if wire else time.perf_counter()
        try:
            body = await request.json()
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            input_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
            if input_ids is None:
                raise BadRequest("the request needs a prompt")
            req, queue = submit(input_ids, int(body.get("max_tokens") or 16), bool(body.get("ignore_eos", False)), None, received)
        except json.JSONDecodeError as exc:
            return _error(f"request body is not JSON: {exc}")
        except BadRequest as exc:
            return _error(str(exc))
        cid, created, model = f"cmpl-{req.rid}", int(time.time()), engine.args.model_path
        streamed = bool(body.get("stream"))
        remember("/v1/completions", req, wire if streamed else None)

        def chunk(text: str, finish: str | None, meta: dict | None = None) -> dict:
            out = {"id": cid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
            if meta is not None:
                out["sent_ts"] = meta["sent_ts"]
            return out

        def usage(meta: dict) -> dict:
            return {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                    "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}

        def finish_name(meta: dict) -> str | None:
            reason = meta["finish_reason"]
            return None if reason is None else {"length": "length", "stop": "stop"}.get(reason["type"], "abort")

        if streamed:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            async def stream():
                async for event in events(req, queue, wire):
                    meta = event["meta_info"]
                    yield _sse(chunk(tokenizer.decode(event["output_ids"]), finish_name(meta), meta))
                    if include_usage and meta["finish_reason"] is not None:
                        yield _sse({**chunk("", None), "choices": [], "usage": usage(meta)})
                yield _sse(b"[DONE]")

            return StreamingResponse(stream(), media_type="text/event-stream")
        async for event in events(req, queue):
            last = event
        return JSONResponse({**chunk(last["text"], finish_name(last["meta_info"])), "usage": usage(last["meta_info"])})

    async def health_generate(_: Request) -> Response:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        req = Req(rid="health-" + uuid.uuid4().hex, input_ids=[tokenizer.BOS_ID], max_new_tokens=1, ignore_eos=True,
                  emit=lambda event: loop.call_soon_threadsafe(done.set))
        engine.scheduler.submit(req)
        try:
            await asyncio.wait_for(done.wait(), timeout=20)
        except TimeoutError:
            return Response(status_code=503)
        return Response(status_code=200)

    async def server_info(_: Request) -> Response:
        return JSONResponse(engine.server_info())

    async def request_timestamps(_: Request) -> Response:
        """The last requests' timestamps (CLOCK_MONOTONIC seconds): when each arrived, the scheduler's
        steps, and for streams the send time of every event with the tokens it carried. A client
        that does not read our meta_info (vLLM's or GuideLLM's benchmark) is checked against these."""
        return JSONResponse({"clock": "CLOCK_MONOTONIC", "requests": [r.to_json() for r in list(recent)]})

    async def model_info(_: Request) -> Response:
        return JSONResponse({"model_path": engine.args.model_path, "is_generation": True, "model_config": engine.cfg.to_dict()})

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": engine.args.model_path, "object": "model", "owned_by": ENGINE_NAME,
                                                         "max_model_len": engine.args.context_length}]})

    async def version(_: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def flush_cache(_: Request) -> Response:
        # There is no prefix cache: every request prefills in full, as with --disable-radix-cache.
        return PlainTextResponse("Cache flushed.\n")

    async def metrics(_: Request) -> Response:
        if engine.metrics is None:
            return PlainTextResponse("metrics are off: start the server with --enable-metrics\n", status_code=404)
        engine.metrics.update_load(**engine.scheduler.load())
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/health_generate", health_generate, methods=["GET"]),
            Route("/generate", generate, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/server_info", server_info, methods=["GET"]),
            Route("/request_timestamps", request_timestamps, methods=["GET"]),
            Route("/get_server_info", server_info, methods=["GET"]),
            Route("/model_info", model_info, methods=["GET"]),
            Route("/get_model_info", model_info, methods=["GET"]),
            Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(message)s")
    if args.device not in ("cpu",) and not args.device.startswith("cuda"):
        raise SystemExit(f"--device {args.device!r}; allowed: cpu, cuda[:N]")
    try:
        engine = Engine(args)
    except (PoolError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from exc
    log.info("server_args=%s", json.dumps(vars(args), sort_keys=True))
    engine.scheduler.start()
    # On SIGTERM uvicorn waits for open responses; a stream whose client stopped reading never ends,
    # so the wait is bounded (SGLang, too, exits promptly on SIGTERM)
    config = uvicorn.Config(make_app(engine), host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                            http=WireH11Protocol, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = uvicorn.Server(config)

    def announce_ready() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.01)
        log.info("The server is fired up and ready to roll!")

    threading.Thread(target=announce_ready, daemon=True).start()
    server.run()
