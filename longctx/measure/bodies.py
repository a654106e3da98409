"""The request bodies, per API: SGLang's native /generate and OpenAI's /v1/completions.

Each is serialised to bytes before a request's clock starts (measure.stream times from the first byte
written). Greedy, ``ignore_eos``: a request decodes exactly the tokens asked for.
"""

from __future__ import annotations

import json

# what every request body is sent with: a server that parses by the header (FastAPI: llama.cpp's, vLLM's)
# answers HTTP 500 or 422 to a JSON body sent without it
JSON_HEADERS = {"Content-Type": "application/json"}


def sglang_body(prompt: list[int] | str, max_new_tokens: int, rid: str | None = None, stream: bool = True) -> bytes:
    """/generate with a token-id prompt (input_ids) or a text one (text)."""
    body = {
        "input_ids" if isinstance(prompt, list) else "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0},
        "stream": stream,
    }
    if rid:
        body["rid"] = rid
    return json.dumps(body).encode()


def openai_body(prompt: list[int] | str, max_new_tokens: int, model: str, stream: bool = True,
                extra: dict | None = None) -> bytes:
    """/v1/completions with a token-id or text prompt; usage in the last chunk where the server honours
    stream_options (vLLM, SGLang, llama.cpp); `extra`: fields a given engine takes beside (the adapter's)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": stream, **(extra or {})}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def request_body(api: str, prompt: list[int] | str, max_new_tokens: int, model: str, stream: bool = True,
                 extra: dict | None = None) -> bytes:
    if api == "sglang":
        return sglang_body(prompt, max_new_tokens, stream=stream)
    return openai_body(prompt, max_new_tokens, model, stream=stream, extra=extra)
