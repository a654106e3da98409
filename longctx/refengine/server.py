"""HTTP front of the reference engine: SGLang's endpoints, request and streaming formats."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import threading
import time
import uuid
from pathlib import Path

import psutil
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from . import tokenizer
from .args import KERNEL_MODULE, build_parser
from .kvpool import KVPool, PoolError, PoolSizing
from .model import MLAModel
from .modelconfig import ModelConfig
from .scheduler import Req, Scheduler

log = logging.getLogger("longctx.refengine")

ENGINE_NAME = "longctx-refengine"


def load_kernel(kernel_dir: str):
    path = Path(kernel_dir) / KERNEL_MODULE
    if not path.is_file():
        raise SystemExit(f"attention kernel not found: {path} (build it or pass --kernel-dir)")
    spec = importlib.util.spec_from_file_location("longctx_kernel_paged_mla_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.paged_mla_decode


class Engine:
    def __init__(self, args: argparse.Namespace):
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        for name in ("page_size", "chunked_prefill_size", "max_running_requests", "context_length"):
            if getattr(args, name) < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
        self.args = args
        self.cfg = ModelConfig.from_overrides(args.json_model_override_args)
        self.model = MLAModel(self.cfg, seed=args.random_seed, device=args.device)
        memory_total = int(args.memory_total_gb * 2**30) if args.memory_total_gb else psutil.virtual_memory().total
        self.sizing = PoolSizing(
            memory_total_bytes=memory_total,
            mem_fraction_static=args.mem_fraction_static,
            weights_bytes=self.model.weights_bytes(),
            req_to_token_bytes=KVPool.req_to_token_bytes(args.max_running_requests, args.context_length),
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
        self.kernel = load_kernel(args.kernel_dir)
        self.scheduler = Scheduler(self.model, self.pool, self.kernel, args.chunked_prefill_size, args.max_running_requests)

    def server_info(self) -> dict:
        return {
            **vars(self.args),
            "engine": ENGINE_NAME,
            "version": __version__,
            "torch_version": torch.__version__,
            "max_total_num_tokens": self.pool.num_tokens,
            "max_req_input_len": min(self.args.context_length - 1, self.pool.num_tokens - 1),
            "kv_cache_dtype": self.cfg.torch_dtype,
            "kv_cache_bytes": self.pool.bytes(),
            "kv_bytes_per_token": self.cfg.kv_bytes_per_token(),
            "weights_bytes": self.model.weights_bytes(),
            "memory_total_bytes": self.sizing.memory_total_bytes,
            "model_config": self.cfg.to_dict(),
            "sampling": "greedy",
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


def make_app(engine: Engine) -> Starlette:
    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            return _error(f"request body is not JSON: {exc}")
        if "input_ids" in body:
            input_ids = body["input_ids"]
        elif "text" in body:
            input_ids = tokenizer.encode(body["text"])
        else:
            return _error("the request needs input_ids or text")
        if not isinstance(input_ids, list) or not all(isinstance(i, int) for i in input_ids):
            return _error("input_ids must be one list of integers (batched requests are not supported)")
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        error = engine.validate(input_ids, max_new)
        if error:
            return _error(error)
        max_new = min(max_new, engine.args.context_length - len(input_ids))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = Req(
            rid=body.get("rid") or uuid.uuid4().hex,
            input_ids=input_ids,
            max_new_tokens=max_new,
            ignore_eos=bool(sp.get("ignore_eos", False)),
            emit=lambda event: loop.call_soon_threadsafe(queue.put_nowait, event),
        )
        engine.scheduler.submit(req)

        if body.get("stream"):
            async def events():
                try:
                    while True:
                        event = await queue.get()
                        yield b"data: " + json.dumps(event).encode() + b"\n\n"
                        if event["meta_info"]["finish_reason"] is not None:
                            break
                    yield b"data: [DONE]\n\n"
                finally:
                    engine.scheduler.abort(req)  # no-op once finished; frees the pages otherwise

            return StreamingResponse(events(), media_type="text/event-stream")
        while True:
            event = await queue.get()
            if event["meta_info"]["finish_reason"] is not None:
                event["output_ids"] = req.output_ids
                return JSONResponse(event)

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

    async def model_info(_: Request) -> Response:
        return JSONResponse({"model_path": engine.args.model_path, "is_generation": True, "model_config": engine.cfg.to_dict()})

    async def flush_cache(_: Request) -> Response:
        # There is no prefix cache: every request prefills in full, as with --disable-radix-cache.
        return PlainTextResponse("Cache flushed.\n")

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/health_generate", health_generate, methods=["GET"]),
            Route("/generate", generate, methods=["POST"]),
            Route("/server_info", server_info, methods=["GET"]),
            Route("/get_server_info", server_info, methods=["GET"]),
            Route("/model_info", model_info, methods=["GET"]),
            Route("/get_model_info", model_info, methods=["GET"]),
            Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
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
    config = uvicorn.Config(make_app(engine), host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    server = uvicorn.Server(config)

    def announce_ready() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.01)
        log.info("The server is fired up and ready to roll!")

    threading.Thread(target=announce_ready, daemon=True).start()
    server.run()
