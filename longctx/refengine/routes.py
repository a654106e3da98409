"""The reference engine's HTTP routes: SGLang's endpoints, request and streaming formats."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections import deque
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from . import tokenizer
from .engine import ENGINE_NAME, Engine
from .scheduler import Req
from .wire import PLACEHOLDER, WireLog, request_log



FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. "
              "(When there are running or waiting requests, the operation will not be performed.)\n")


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


class BadRequest(ValueError):
    pass


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _usage(meta: dict, cache_report: bool = False) -> dict:
    """OpenAI usage; with --enable-cache-report, prompt_tokens_details.cached_tokens where some were cached
    (SGLang's UsageProcessor: the details only when the count is above 0, none without the flag)."""
    usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
             "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}
    if cache_report and meta.get("cached_tokens", 0) > 0:
        usage["prompt_tokens_details"] = {"cached_tokens": meta["cached_tokens"]}
    return usage


def _finish_name(meta: dict) -> str | None:
    """OpenAI's finish_reason for an event's meta_info."""
    reason = meta["finish_reason"]
    return None if reason is None else {"length": "length", "stop": "stop"}.get(reason["type"], "abort")


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


class Routes:
    """One app's endpoints over one engine, with what they remember between requests."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.recent: deque[_Record] = deque(maxlen=256)  # the last requests, for GET /request_timestamps

    def remember(self, endpoint: str, req: Req, wire: WireLog | None) -> None:
        self.recent.append(_Record(endpoint, req.rid, len(req.input_ids), req.received, req.timestamps, req.event_tokens,
                                   req.output_ids, wire))

    def submit(self, input_ids, max_new: int, ignore_eos: bool, rid: str | None, received: float) -> tuple[Req, asyncio.Queue]:
        """Validate and queue a request; its events arrive on the returned queue."""
        if not isinstance(input_ids, list) or not all(isinstance(i, int) for i in input_ids):
            raise BadRequest("input_ids must be one list of integers (batched requests are not supported)")
        error = self.engine.validate(input_ids, max_new)
        if error:
            raise BadRequest(error)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = Req(
            rid=rid or uuid.uuid4().hex,
            input_ids=input_ids,
            # SGLang's clamp: the output fits the context and, with the prompt, the KV pool, so a
            # request alone always fits and is never aborted for want of pages
            max_new_tokens=min(max_new, self.engine.args.context_length - len(input_ids),
                               self.engine.pool.num_tokens - len(input_ids)),
            ignore_eos=ignore_eos,
            emit=lambda event: loop.call_soon_threadsafe(queue.put_nowait, event),
            received=received,
        )
        self.engine.scheduler.submit(req)
        return req, queue

    async def events(self, req: Req, queue: asyncio.Queue, wire: WireLog | None = None):
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
            self.engine.scheduler.abort(req)  # a no-op once finished; frees the pages of an abandoned request

    async def health(self, _: Request) -> Response:
        return Response(status_code=200)

    async def generate(self, request: Request) -> Response:
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
            req, queue = self.submit(input_ids, int(sp.get("max_new_tokens", 128)), bool(sp.get("ignore_eos", False)),
                                     body.get("rid"), received)
        except json.JSONDecodeError as exc:
            return _error(f"request body is not JSON: {exc}")
        except BadRequest as exc:
            return _error(str(exc))
        streamed = bool(body.get("stream"))
        self.remember("/generate", req, wire if streamed else None)

        if streamed:
            async def stream():
                async for event in self.events(req, queue, wire):
                    yield _sse(event)
                yield _sse(b"[DONE]")

            return StreamingResponse(stream(), media_type="text/event-stream")
        async for event in self.events(req, queue):
            last = event
        last["output_ids"] = req.output_ids
        return JSONResponse(last)

    async def completions(self, request: Request) -> Response:
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
            req, queue = self.submit(input_ids, int(body.get("max_tokens") or 16), bool(body.get("ignore_eos", False)),
                                     None, received)
        except json.JSONDecodeError as exc:
            return _error(f"request body is not JSON: {exc}")
        except BadRequest as exc:
            return _error(str(exc))
        cid, created, model = f"cmpl-{req.rid}", int(time.time()), self.engine.args.model_path
        streamed = bool(body.get("stream"))
        self.remember("/v1/completions", req, wire if streamed else None)

        def chunk(text: str, finish: str | None, meta: dict | None = None) -> dict:
            out = {"id": cid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
            if meta is not None:
                out["sent_ts"] = meta["sent_ts"]
            return out

        if streamed:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            report = self.engine.args.enable_cache_report

            async def stream():
                async for event in self.events(req, queue, wire):
                    meta = event["meta_info"]
                    yield _sse(chunk(tokenizer.decode(event["output_ids"]), _finish_name(meta), meta))
                    if include_usage and meta["finish_reason"] is not None:
                        yield _sse({**chunk("", None), "choices": [], "usage": _usage(meta, report)})
                yield _sse(b"[DONE]")

            return StreamingResponse(stream(), media_type="text/event-stream")
        async for event in self.events(req, queue):
            last = event
        return JSONResponse({**chunk(last["text"], _finish_name(last["meta_info"])),
                             "usage": _usage(last["meta_info"], self.engine.args.enable_cache_report)})

    async def health_generate(self, _: Request) -> Response:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        req = Req(rid="health-" + uuid.uuid4().hex, input_ids=[tokenizer.BOS_ID], max_new_tokens=1, ignore_eos=True,
                  emit=lambda event: loop.call_soon_threadsafe(done.set))
        self.engine.scheduler.submit(req)
        try:
            await asyncio.wait_for(done.wait(), timeout=20)
        except TimeoutError:
            return Response(status_code=503)
        return Response(status_code=200)

    async def server_info(self, _: Request) -> Response:
        return JSONResponse(self.engine.server_info())

    async def request_timestamps(self, _: Request) -> Response:
        """The last requests' timestamps (CLOCK_MONOTONIC seconds): when each arrived, the scheduler's
        steps, and for streams the send time of every event with the tokens it carried. A client
        that does not read our meta_info (vLLM's or GuideLLM's benchmark) is checked against these."""
        return JSONResponse({"clock": "CLOCK_MONOTONIC", "requests": [r.to_json() for r in list(self.recent)]})

    async def model_info(self, _: Request) -> Response:
        engine = self.engine
        return JSONResponse({"model_path": engine.args.model_path, "is_generation": True, "model_config": engine.cfg.to_dict()})

    async def models(self, _: Request) -> Response:
        engine = self.engine
        return JSONResponse({"object": "list", "data": [{"id": engine.args.model_path, "object": "model", "owned_by": ENGINE_NAME,
                                                         "max_model_len": engine.args.context_length}]})

    async def version(self, _: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def flush_cache(self, _: Request) -> Response:
        """SGLang's /flush_cache: the scheduler empties the prefix cache between two batches, or refuses while
        requests are queued or running; the same words either way, 200 or 400 (http_server.py)."""
        ok, _message = await asyncio.to_thread(self.engine.scheduler.flush)
        return PlainTextResponse(FLUSH_TEXT, status_code=200 if ok else 400)

    async def metrics(self, _: Request) -> Response:
        engine = self.engine
        if engine.metrics is None:
            return PlainTextResponse("metrics are off: start the server with --enable-metrics\n", status_code=404)
        engine.metrics.update_load(**engine.scheduler.load())
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def table(self) -> list[Route]:
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health_generate, methods=["GET"]),
            Route("/generate", self.generate, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/request_timestamps", self.request_timestamps, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]


class ApiKeyMiddleware:
    """SGLang's --api-key (sglang/srt/utils/auth.py): a request without the Bearer token is answered 401, but
    OPTIONS and the health, readiness and metrics paths (probes and Prometheus carry no secret)."""

    OPEN_PATHS = ("/health", "/ready", "/metrics")

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"].startswith(self.OPEN_PATHS):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() == b"bearer" and secrets.compare_digest(b"Bearer " + token, self.expected):
            return await self.app(scope, receive, send)
        await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)


def make_app(engine: Engine) -> Starlette:
    app = Starlette(routes=Routes(engine).table())
    if engine.args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=engine.args.api_key)
    return app
