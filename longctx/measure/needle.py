"""The needle probe: can the model still find a fact at this length? (The "Dog." check.)

A haystack of filler text of about L tokens with one needle sentence at a set depth, then the
question; the answer passes if it contains the expected word. The prompt is text, tokenized by the
server; its length is adjusted once from the server's own count. A model with random weights cannot
pass: where the server says its weights are random (or the config does), the probe is recorded as
not applicable and nothing is sent.
"""

from __future__ import annotations

import json

import httpx

from .bodies import JSON_HEADERS

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def haystack(chars: int, needle: str, depth: float, question: str) -> str:
    body = (FILLER * (chars // len(FILLER) + 1))[: max(0, chars)]
    cut = body.rfind(". ", 0, int(len(body) * depth)) + 2 if depth > 0 else 0
    return f"{body[:cut]}{needle} {body[cut:]}\n\n{question}"


def _ask(client: httpx.Client, base: str, api: str, model: str, text: str, max_tokens: int, timeout_s: float) -> tuple[int, str]:
    """(prompt tokens the server counted, generated text) for a greedy, non-streamed request."""
    if api == "sglang":
        body = {"text": text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0}}
        r = client.post(base + "/generate", content=json.dumps(body), headers=JSON_HEADERS, timeout=timeout_s)
        r.raise_for_status()
        out = r.json()
        return out["meta_info"]["prompt_tokens"], out["text"]
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0.0}
    r = client.post(base + "/v1/completions", content=json.dumps(body), headers=JSON_HEADERS, timeout=timeout_s)
    r.raise_for_status()
    out = r.json()
    return out["usage"]["prompt_tokens"], out["choices"][0]["text"]


def probe(client: httpx.Client, base: str, api: str, model: str, length: int, cfg: dict, timeout_s: float,
          random_weights: bool) -> dict:
    if random_weights:
        return {"status": "not applicable", "reason": "the model's weights are random"}
    chars = length * 4  # a first guess; corrected from the server's count
    tolerance = max(16, 0.02 * length)
    try:
        for _ in range(3):
            text = haystack(chars, cfg["needle"], cfg["depth"], cfg["question"])
            counted, answer = _ask(client, base, api, model, text, cfg["output_tokens"], timeout_s)
            if abs(counted - length) <= tolerance:
                break
            chars = int(chars * length / max(1, counted))
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    found = cfg["answer"].lower() in answer.lower()
    out = {"status": "pass" if found else "fail", "prompt_tokens": counted, "depth": cfg["depth"], "answer": answer.strip()[:200],
           "length_matched": abs(counted - length) <= tolerance}
    if not out["length_matched"]:  # the answer stands, but for another length than the one it is filed under
        out["reason"] = f"its prompt had {counted} tokens, not the {length} asked, after 3 tries"
    return out
