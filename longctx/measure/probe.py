"""The probe: one request before the sweep (twice or three times where the first answers say to) that asks the
server how it takes prompts and counts tokens, and decides the PromptPlan that measure.prompts follows (token ids or
text, the tokens the server adds, where the counts come from, which stream events are tokens). A server error
(HTTP 5xx) is said as one, with what it answered, never taken for a prompt the server refuses.
"""

from __future__ import annotations

import logging

import httpx

from .bodies import JSON_HEADERS, request_body
from .health import ServerError
from .prompts import PromptError, Prompter, PromptPlan, RandomIds, TextPrompts, load_tokenizer
from .text import RANDOM, STDLIB, DocumentText, TextSourceError
from .stream import EVENT_RULES, StreamRecord, stream_generate
from .workload import prompt_ids

log = logging.getLogger("longctx.measure.probe")
PROBE_TOKENS = 32  # prompt tokens of the probe request
PROBE_OUTPUT = 6  # output tokens of the probe request
MAX_ADDED = 16  # more than this many tokens added per prompt: the server's tokenizer is not the model's


def _answer(rec: StreamRecord | None, what: str, status: int | None = None, text: str = "") -> str:
    if rec is not None:
        status, text = rec.http_status, rec.error or "ok"
    return f"{what}: {'HTTP ' + str(status) if status else 'no answer'}" + (f" ({text[:160]})" if text and text != "ok" else "")


def _non_streamed(client: httpx.Client, url: str, api: str, prompt, model: str, timeout_s: float) -> tuple[dict | None, str]:
    """The server's counts (prompt, completion) from one non-streamed request, and what it answered."""
    try:
        r = client.post(url, content=request_body(api, prompt, PROBE_OUTPUT, model, stream=False),
                        headers=JSON_HEADERS, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return None, f"non-streamed request: {type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return None, f"non-streamed request: HTTP {r.status_code} ({r.text[:160]})"
    try:
        body = r.json()
    except ValueError:
        return None, "non-streamed request: HTTP 200, not JSON"
    usage = body.get("usage") or body.get("meta_info") or {}
    if usage.get("prompt_tokens") is None:
        return None, "non-streamed request: HTTP 200, no usage"
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage.get("completion_tokens")}, \
        "non-streamed request: HTTP 200 with usage"


def _event_rule(rec: StreamRecord, completion: int) -> tuple[str, bool]:
    """The event rule that gives the server's count of output tokens, and whether one does."""
    every = len(rec.event_text)
    texts = sum(rec.event_text)
    final_empty = every > 0 and not rec.event_text[-1]
    if every == completion:
        return "every", True
    if texts == completion:
        return "text", True
    if final_empty and every - 1 == completion:
        return "every-but-final", True
    return "every", False


def _authorized(rec: StreamRecord, client: httpx.Client) -> None:
    """PromptError where the server refused the request as unauthorized (401, 403): a missing or wrong API key,
    not a prompt it cannot take (no other prompt is tried)."""
    if rec.http_status in (401, 403):
        sent = "authorization" in client.headers
        raise PromptError(f"the server refused the request as unauthorized (HTTP {rec.http_status}): "
                          + ("it refused the API key sent (is the variable api_key_env names the server's key?)" if sent
                             else "it wants an API key; name the environment variable that holds it in the "
                                  "configuration's api_key_env"))


PLAIN_TEXT = "The grass is green and the sky is blue."  # what the probe sends to learn whether a server works at all


def _server_failed(rec: StreamRecord, sent: str) -> None:
    """ServerError where the server failed the probe's `sent` with an error of its own (HTTP 5xx): a server error,
    with what it answered, not a prompt it refuses (a 4xx), which would point at the wrong fix."""
    if rec.http_status is not None and rec.http_status >= 500:
        raise ServerError(f"the server failed the prompt probe's {sent} with a server error ({(rec.error or '')[:300]}): "
                          "not a refusal of the prompt's form; its own log says why")


def _works_at_all(client: httpx.Client, url: str, api: str, model: str, timeout_s: float, plan: PromptPlan) -> None:
    """After a token-id prompt failed with HTTP 5xx where no text prompt of an exact length can follow (no tokenizer,
    or protocol.prompt: token_ids): a plain text prompt tells a server that fails everything (ServerError, a server
    error) from one that answers 5xx to token ids alone (llama-cpp-python's validation does), which takes none."""
    rec = stream_generate(client, url, request_body(api, PLAIN_TEXT, 1, model), timeout_s, api, "every")
    plan.answers.append(_answer(rec, "a short text prompt"))
    _server_failed(rec, "token-id prompt and a short text prompt alike")


NO_TOKENIZER = ("the server's tokenizer is not known here (model.tokenizer, or model.path holding the model's "
                "tokenizer.json, makes it known)")


def text_source(proto: dict, tok) -> tuple[DocumentText | None, dict]:
    """The real text prompts are cut from (protocol.text_source), or None for random prompts, and the words that say
    which (PromptPlan.text_source): random where the setting says so, or, for stdlib, where no tokenizer is known
    (a path without one is a config error, said before any server starts: measure.session)."""
    setting = proto.get("text_source", STDLIB)
    if setting == RANDOM:
        return None, {"kind": "random", "source": RANDOM, "why": "protocol.text_source: random"}
    if tok is None:
        if setting != STDLIB:
            raise PromptError(f"protocol.text_source names {setting!r}, but {NO_TOKENIZER}")
        return None, {"kind": "random", "source": RANDOM, "why": NO_TOKENIZER}
    try:
        return DocumentText(tok, setting), {"kind": "text", "source": setting}
    except TextSourceError as exc:  # a tokenizer that cannot spell the text: the built-in falls back, yours is said
        if setting != STDLIB:
            raise PromptError(str(exc)) from None
        return None, {"kind": "random", "source": RANDOM, "why": str(exc)}


def probe(client: httpx.Client, url: str, api: str, model: str, proto: dict, model_cfg: dict, timeout_s: float,
          engine_tokenizer=None) -> tuple[PromptPlan, Prompter]:
    """Ask the server once (twice or three times where the first answers say to) how it takes
    prompts and counts tokens; the plan and the Prompter that follows it. PromptError where it takes
    none, with every answer. The prompts are cut from real text (measure.text) where a tokenizer is known: the
    model's (model.tokenizer, model.path), else the engine's own (`engine_tokenizer`, the adapter's)."""
    plan = PromptPlan()
    wanted = proto.get("prompt", "auto")
    tok = load_tokenizer(model_cfg) or engine_tokenizer
    document, plan.text_source = text_source(proto, tok)
    source = document or RandomIds(proto["token_id_range"])
    ids = prompt_ids(PROBE_TOKENS, proto["seed"], "probe", tuple(proto["token_id_range"]))
    # the OpenAI client counts every event while probing, to learn which ones are tokens
    rec = None
    if wanted != "text":
        rec = stream_generate(client, url, request_body(api, ids, PROBE_OUTPUT, model), timeout_s, api, "every")
        plan.answers.append(_answer(rec, f"token-id prompt of {PROBE_TOKENS}"))
        _authorized(rec, client)
        if not rec.ok and (rec.http_status or 0) >= 500 and (wanted == "token_ids" or tok is None):
            _works_at_all(client, url, api, model, timeout_s, plan)
        if not rec.ok and wanted == "token_ids":
            raise PromptError(f"the server takes no token-id prompt (protocol.prompt: token_ids): {'; '.join(plan.answers)}")
    prompt: list[int] | str = ids
    if rec is None or not rec.ok:
        if tok is None:
            raise PromptError(f"the server takes no token-id prompt ({'; '.join(plan.answers) or 'protocol.prompt: text'}); "
                              "text prompts of exact lengths need the model's own tokenizer: set model.tokenizer to a "
                              "directory with its tokenizer.json (or model.path to the model's directory)")
        source = document or TextPrompts(tok)
        prompt = source.text(PROBE_TOKENS, proto["seed"], "probe")
        rec = stream_generate(client, url, request_body(api, prompt, PROBE_OUTPUT, model), timeout_s, api, "every")
        plan.answers.append(_answer(rec, f"text prompt of {PROBE_TOKENS} tokens"))
        _authorized(rec, client)
        if not rec.ok:
            _server_failed(rec, f"text prompt of {PROBE_TOKENS} tokens")
            raise PromptError("the server took neither prompt the probe sent: " + "; ".join(plan.answers))
        plan.prompt, plan.tokenizer, plan.tokenizer_library = "text", str(tok.path), tok.library
    counts = {"prompt_tokens": rec.meta.get("prompt_tokens"), "completion_tokens": rec.meta.get("completion_tokens")}
    if counts["prompt_tokens"] is not None:
        plan.answers.append(f"usage in the stream: {counts['prompt_tokens']} prompt, {counts['completion_tokens']} output tokens")
    else:
        got, said = _non_streamed(client, url, api, prompt, model, timeout_s)
        plan.answers.append(said)
        plan.usage = "response" if got else "none"
        counts = got or counts
    if counts["prompt_tokens"] is not None:
        plan.added_tokens = int(counts["prompt_tokens"]) - PROBE_TOKENS
        if not 0 <= plan.added_tokens <= MAX_ADDED:
            raise PromptError(f"the server counted {counts['prompt_tokens']} prompt tokens for {PROBE_TOKENS} sent"
                              + (" as text (is model.tokenizer the served model's?)" if plan.prompt == "text" else ""))
    if api == "openai":
        if counts.get("completion_tokens") is not None:
            plan.events, plan.events_exact = _event_rule(rec, int(counts["completion_tokens"]))
            plan.answers.append(f"{len(rec.event_text)} stream events ({sum(rec.event_text)} with text) for "
                                f"{counts['completion_tokens']} output tokens: rule {plan.events!r}"
                                + ("" if plan.events_exact else ", none matches: per-event counts estimated"))
        else:
            plan.events_exact = False
            plan.answers.append(f"{len(rec.event_text)} stream events, no output count from the server: every event "
                                "taken as one token (estimated)")
    assert plan.events in EVENT_RULES
    log.info("prompt probe: %s", plan.describe())
    if plan.text_source["kind"] == "random":
        plan.text_source["what"] = "random words" if plan.prompt == "text" else "random token ids"
    return plan, Prompter(api, model, proto, plan, source, tok)
