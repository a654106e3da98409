"""Small OpenAI-compatible servers written for the tests, each with one behaviour of servers we did
not write (issue 15, item 2): no /health, text-only prompts, a BOS token added to every prompt, no
usage anywhere or usage only in non-streamed responses, tokens in chunks with empty text, a final
empty event that is not a token; (`broken`) a server that answers its health paths but fails every
generation with HTTP 500 and the error it hit; and (`buffered`) one behind a buffering proxy, whose stream
arrives in one piece.

They count prompts with a real Hugging Face tokenizer (the `tokenizers` library, a byte-level BPE
trained here on English text, nothing downloaded): the count longctx must match is that library's,
not ours. Decoding is paced (DECODE_S per token) so that decode rates are finite and known.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections import Counter
from pathlib import Path

DECODE_S = 0.002
CORPUS = ("The grass is green and the sky is blue. Long context inference needs a large cache of keys "
          "and values, read once for every generated token. Prefill attends all pairs of tokens, decode reads "
          "the whole cache. Engineers measure time to first token, inter-token latency and throughput. ") * 40

BEHAVIOURS = {  # usage: "stream" (and in responses), "response" (non-streamed only) or "none"
    "no-health": dict(health=("/v1/models",), ids=True, bos=False, usage="stream", empty_every=0, final_event=False),
    "text-only": dict(health=("/health", "/v1/models"), ids=False, bos=False, usage="stream", empty_every=0, final_event=False),
    "bos": dict(health=("/health", "/v1/models"), ids=False, bos=True, usage="stream", empty_every=0, final_event=False),
    "no-usage": dict(health=("/health", "/v1/models"), ids=True, bos=False, usage="none", empty_every=0, final_event=False),
    "response-usage": dict(health=("/health",), ids=False, bos=False, usage="response", empty_every=3, final_event=False),
    "empty-text": dict(health=("/health", "/v1/models"), ids=True, bos=False, usage="stream", empty_every=3, final_event=False),
    "final-event": dict(health=("/health", "/v1/models"), ids=True, bos=True, usage="stream", empty_every=2, final_event=True),
}
BROKEN = "CUDA error: an illegal memory access was encountered"  # what a `broken` server answers, with HTTP 500


def make_tokenizer(directory: Path, bos: bool = False) -> Path:
    """A byte-level BPE tokenizer (vocabulary 400) trained on CORPUS, saved as directory/tokenizer.json;
    with bos, its post-processor adds <s> to every encoding with special tokens (as Llama's does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS], trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


class Seen(list):
    """The request bodies a server got, in order; .hits counts the requests per path (GET and POST)."""

    def __init__(self):
        super().__init__()
        self.hits: Counter = Counter()


@contextlib.contextmanager
def openai_server(behaviour: str, tokenizer_dir: Path, codes: dict[str, int] | None = None, default: int = 404,
                  broken: bool = False, refuse_ids_with: int = 422, basic: str | None = None, buffered: bool = False,
                  port: int = 0, dies_over: int | None = None, fail_lengths: dict[int, int] | None = None):
    """The server of one behaviour on loopback, counting prompts with tokenizer_dir/tokenizer.json
    (encoded with special tokens: a BOS server's tokenizer adds one). With `codes`, GET answers
    codes[path] (else `default`) instead of the behaviour's health paths; `broken`, every POST is HTTP 500
    with BROKEN; refuse_ids_with, the code a text-only server refuses token ids with; `basic`, the HTTP Basic
    credential every request must carry (else 401); `buffered`, a stream's events are decoded at the same pace
    but written in one write after the last, as a buffering proxy in front of the server (nginx's default
    proxy_buffering) hands them on; `port`, the port to listen on (0: any free one); `dies_over`, a prompt longer than
    that many tokens kills the server (the request's connection closed with no answer, nothing listens after: a
    server that dies on long input in a way no context length or KV pool foresees); `fail_lengths`, {prompt tokens: HTTP
    status} answered to every prompt of that many tokens (e.g. 503, overloaded, every time). Yields (base URL, Seen)."""
    from tokenizers import Tokenizer

    b = BEHAVIOURS[behaviour]
    tok = Tokenizer.from_file(str(make_tokenizer(tokenizer_dir / behaviour, bos=b["bos"]) / "tokenizer.json"))
    seen = Seen()
    answers = codes if codes is not None else {path: 200 for path in b["health"]}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as every asyncio server has it (uvicorn: vLLM's and SGLang's): without it, Nagle's algorithm held
        # a stream's small writes until the client's delayed ACK, and a warm-up's whole response arrived at once
        disable_nagle_algorithm = True

        def _json(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refused(self) -> bool:
            if basic is None or self.headers.get("Authorization") == f"Basic {basic}":
                return False
            if self.headers.get("Content-Length"):
                self.rfile.read(int(self.headers["Content-Length"]))
            self._json(401, {"detail": "Unauthorized"})
            return True

        def do_GET(self):
            seen.hits[self.path] += 1
            if self._refused():
                return
            code = answers.get(self.path, default if codes is not None else 404)
            self._json(code, {"object": "list", "data": [{"id": "m", "max_model_len": 8192}]} if code == 200 else {"detail": "no"})

        def do_POST(self):
            seen.hits[self.path] += 1
            if self._refused():
                return
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(req)
            if self.path != "/v1/completions":
                return self._json(404, {"detail": "Not Found"})
            if broken:
                return self._json(500, {"error": {"message": BROKEN, "type": "InternalServerError"}})
            prompt = req["prompt"]
            if isinstance(prompt, list):
                if not b["ids"]:  # what FastAPI answers for a pydantic model with `prompt: str` (422; llama-cpp-python: 500)
                    return self._json(refuse_ids_with, {"error": {"message": "1 validation error: prompt: Input should be a valid string"}})
                n_prompt = len(prompt) + (1 if b["bos"] else 0)
            else:
                n_prompt = len(tok.encode(prompt, add_special_tokens=True).ids)
            if fail_lengths and n_prompt in fail_lengths:
                return self._json(fail_lengths[n_prompt], {"error": {"message": f"no capacity for {n_prompt} tokens",
                                                                     "type": "ServiceUnavailable"}})
            if dies_over is not None and n_prompt > dies_over:
                self.close_connection = True
                threading.Thread(target=lambda: (server.shutdown(), server.server_close()), daemon=True).start()
                return
            n = req["max_tokens"]
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
            words = ["" if b["empty_every"] and i % b["empty_every"] == 1 else f" w{i}" for i in range(n)]
            if not req.get("stream"):
                time.sleep(DECODE_S * n)
                return self._json(200, {"choices": [{"text": "".join(words), "finish_reason": "length"}],
                                        **({"usage": usage} if b["usage"] != "none" else {})})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            held: list[bytes] = []  # `buffered`: every event, written at once after the last

            def send(data: bytes) -> None:
                if buffered:
                    held.append(data)
                else:
                    self.wfile.write(data)
                    self.wfile.flush()

            for i, w in enumerate(words):
                time.sleep(DECODE_S)
                last = i == n - 1 and not b["final_event"]
                send(f"data: {json.dumps({'choices': [{'text': w, 'finish_reason': 'length' if last else None}]})}\n\n".encode())
            if b["final_event"]:
                send(f"data: {json.dumps({'choices': [{'text': '', 'finish_reason': 'length'}]})}\n\n".encode())
            if b["usage"] == "stream" and (req.get("stream_options") or {}).get("include_usage"):
                send(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            send(b"data: [DONE]\n\n")
            if held:
                self.wfile.write(b"".join(held))
                self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":  # a server of its own process: python -m tests.openai_servers BEHAVIOUR TOKENIZER_DIR
    import sys

    with openai_server(sys.argv[1], Path(sys.argv[2])) as (url, _):
        print(url, flush=True)
        threading.Event().wait()
