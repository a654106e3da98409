"""Prompts as the server takes them, as the probe (measure.probe) decided.

Token ids where the server takes them; otherwise text built with the model's own Hugging Face
tokenizer (``model.tokenizer``, or ``model.path`` where it holds one; loaded from this machine with
``tokenizers``, or ``transformers`` where installed and the directory has no tokenizer.json) to exactly
the tokens wanted. One probe request before the sweep decides (``PromptPlan``, measure.probe):

- token ids or text (``protocol.prompt: auto``; ``token_ids`` or ``text`` forces one);
- how many tokens the server adds to every prompt (a BOS token and friends): k, so that a length L is
  sent as L - k tokens and the server holds L;
- where the counts come from: usage in the stream (``stream_options.include_usage``), else only in a
  non-streamed response (the probe asks once; trials then count prompt tokens with the tokenizer or
  as sent, plus k, and output tokens as events), else nowhere (both counted here, and said so);
- which stream events are tokens (``stream.EVENT_RULES``): every event, empty text included, where
  that matches the server's own count; else the rule that does; a server whose events carry several
  tokens has its per-event counts estimated.

Every answer the probe got is kept (``PromptPlan.answers``) for the raw files and the appendix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from ..core.errors import ConfigError
from .bodies import request_body
from .stream import StreamRecord, astream_generate, stream_generate
from .workload import PREFIX_TOKENS, key_seed, prompt_ids

STABLE_SAMPLE = 4000  # vocabulary entries tried for the text prompts' alphabet


class PromptError(RuntimeError):
    """No prompt of the length asked can be built, or the server takes none the probe tried."""


# --- the model's own tokenizer ----------------------------------------------------------------

class Tokenizer:
    """A Hugging Face tokenizer from this machine: encode without special tokens, decode."""

    def __init__(self, path: Path):
        self.path = path
        file = path / "tokenizer.json" if path.is_dir() else path
        if file.is_file():
            from tokenizers import Tokenizer as Fast

            self._fast = Fast.from_file(str(file))
            self.library = "tokenizers"
            self.vocab_size = self._fast.get_vocab_size(with_added_tokens=False)
            self.special = set(self._fast.get_added_tokens_decoder())
        else:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise ConfigError(f"model.tokenizer: {path} holds no tokenizer.json, and `transformers` (which reads "
                                  "other tokenizer files) is not installed") from None
            self._slow = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            self._fast = None
            self.library = "transformers"
            self.vocab_size = len(self._slow)
            self.special = set(self._slow.all_special_ids)

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self._slow.encode(text, add_special_tokens=False)

    def piece(self, i: int) -> str:
        """The vocabulary's own spelling of token i (byte-level BPE marks a leading space 'Ġ', SentencePiece '▁')."""
        if self._fast is not None:
            return self._fast.id_to_token(i) or ""
        return self._slow.convert_ids_to_tokens(i) or ""

    def decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=False)
        return self._slow.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def tokenizer_path(model: dict) -> tuple[Path | None, str | None]:
    """Where the model's tokenizer is (model.tokenizer, else model.path where it holds one), and the key."""
    given = model.get("tokenizer")
    if given:
        path = Path(given).expanduser()
        if not path.exists():
            raise ConfigError(f"config key 'model.tokenizer': {path} does not exist (a directory with tokenizer.json, "
                              "or the file)")
        return path, "model.tokenizer"
    if model.get("path"):
        path = Path(model["path"]).expanduser()
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            return path, "model.path"
    return None, None


def load_tokenizer(model: dict) -> Tokenizer | None:
    path, key = tokenizer_path(model)
    if path is None:
        return None
    try:
        return Tokenizer(path)
    except ConfigError:
        raise
    except Exception as exc:  # a broken file: the user's to fix, named
        raise ConfigError(f"config key '{key}': the tokenizer at {path} cannot be loaded ({type(exc).__name__}: {exc})") from None


def stable_words(tokenizer, candidates) -> tuple[list[int], list[int]]:
    """Of the candidate token ids, those whose text encodes back to them (three in a row, so that neighbours do not
    merge), and of those the whole words, where the vocabulary marks a piece that starts a word (byte-level BPE's
    'Ġ', SentencePiece's '▁')."""
    stable = [i for i in candidates if tokenizer.encode(tokenizer.decode([i] * 3)) == [i] * 3]
    return stable, [i for i in stable if len(p := tokenizer.piece(i)) > 1 and p[0] in "Ġ▁" and p[1:].isalpha()]


class TextPrompts:
    """Text of exactly n tokens (as the tokenizer counts them, no special tokens): words drawn from the
    tokenizer's own vocabulary that come back as themselves when their text is encoded again, whole
    words (a piece that starts a word) where the vocabulary marks them, so that neighbours do not merge."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        rng = np.random.default_rng(0)
        candidates = [i for i in rng.permutation(tokenizer.vocab_size)[:STABLE_SAMPLE].tolist() if i not in tokenizer.special]
        stable, words = stable_words(tokenizer, candidates)
        self.alphabet = words if len(words) >= 16 else stable
        if len(self.alphabet) < 16:
            raise PromptError(f"the tokenizer at {tokenizer.path} has too few tokens whose text encodes back to them "
                              f"({len(self.alphabet)} of {len(candidates)} tried)")

    def text(self, n: int, seed: int, unique_key: str, lead: int | None = None) -> str:
        """A prefix drawn from unique_key (no two requests share it), then a body drawn from seed; with lead,
        the first word is the alphabet's lead-th (longctx.measure.prefix: extensions that part at once)."""
        pick = self.alphabet
        prefix = np.random.default_rng(key_seed(unique_key)).choice(pick, size=min(PREFIX_TOKENS, n)).tolist()
        if lead is not None and prefix:
            prefix[0] = pick[lead % len(pick)]
        rng = np.random.default_rng(seed)
        ids = prefix + rng.choice(pick, size=max(0, n - PREFIX_TOKENS)).tolist()
        count = -1
        for _ in range(12):  # neighbours may merge: trim or extend until the count is exact
            text = self.tokenizer.decode(ids)
            count = len(self.tokenizer.encode(text))
            if count == n:
                return text
            ids = ids[: len(ids) - (count - n)] if count > n else ids + rng.choice(pick, size=n - count).tolist()
        raise PromptError(f"no text of exactly {n} tokens could be built with the tokenizer at {self.tokenizer.path} "
                          f"(the closest had {count})")


class RandomIds:
    """Random token ids in protocol.token_id_range (measure.workload.prompt_ids): for a server whose tokenizer is
    not known, or protocol.text_source: random."""

    def __init__(self, token_range):
        self.low, self.high = (int(x) for x in token_range)

    def ids(self, n: int, seed: int, unique_key: str, lead: int | None = None) -> list[int]:
        ids = prompt_ids(n, seed, unique_key, (self.low, self.high))
        if lead is not None and ids:
            ids[0] = self.low + lead % (self.high - self.low)
        return ids


# --- the probe's decisions ----------------------------------------------------------------------

@dataclass
class PromptPlan:
    prompt: str = "token_ids"  # "token_ids" | "text"
    added_tokens: int = 0  # k: tokens the server adds to every prompt; a length L is sent as L - k
    usage: str = "stream"  # where the server's counts are: "stream", "response" (non-streamed only) or "none"
    events: str = "every"  # which OpenAI stream events are tokens (stream.EVENT_RULES)
    events_exact: bool = True  # the event rule matched the server's own count in the probe
    tokenizer: str | None = None  # the tokenizer's path, where text prompts are built with it
    tokenizer_library: str | None = None
    answers: list[str] = field(default_factory=list)  # what each probe request got, in order
    text_source: dict = field(default_factory=dict)  # what the prompts are cut from (measure.probe.text_source)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """The decisions in words, for logs."""
        how = "token ids" if self.prompt == "token_ids" else f"text built with the tokenizer at {self.tokenizer}"
        counts = USAGE_WORDS[self.usage]
        exact = "" if self.events_exact else " (estimated)"
        return (f"prompts as {how}, {text_words(self.text_source)}; the server adds {self.added_tokens} token(s) to "
                f"each; counts from {counts}; events counted by rule {self.events!r}{exact}")


def text_words(source: dict | None) -> str:
    """What a configuration's prompts were cut from, in words (its PromptPlan.text_source)."""
    if not source:
        return "random token ids or words (recorded before protocol.text_source)"
    if source.get("kind") != "text":
        return f"{source.get('what', 'random')} ({source.get('why')})"
    where = ("the Python standard library's documentation and source" if source["source"] == "stdlib"
             else f"the documents at {source['source']}")
    if source.get("tokens") is None:
        return f"real text: {where}"
    span = f"{source['first']}" + (f" to {source['last']}" if source.get("last") != source.get("first") else "")
    return (f"real text: {where}, the first {source['tokens']:,} tokens of it ({source['documents']:,} "
            f"document{'s' if source['documents'] != 1 else ''}, {source['characters']:,} characters: {span})")


USAGE_WORDS = {"stream": "the stream's usage", "response": "non-streamed responses only (each trial counted here)",
               "none": "nowhere (each trial counted here)"}


class Prompter:
    """Request bodies of a length L as the server counts it, and each trial's counts completed as planned. `source`
    makes the prompts: ids(n, seed, key, lead) where the server takes token ids, text(...) where it takes text
    (measure.text.DocumentText, real text; TextPrompts, random words; RandomIds, random token ids: the default)."""

    def __init__(self, api: str, model: str, proto: dict, plan: PromptPlan, source=None, tokenizer: "Tokenizer | None" = None):
        self.api, self.model, self.proto, self.plan, self.tokenizer = api, model, proto, plan, tokenizer
        self.source = source or RandomIds(proto["token_id_range"])

    def _tokens(self, n: int, key: str, lead: int | None = None, after=None):
        """n tokens from the source; after: a prompt this one extends (a document source reads on from where that
        one's text stopped, so that a conversation reads through the document, not the same passage every turn)."""
        make = self.source.text if self.plan.prompt == "text" else self.source.ids
        if after is None or not hasattr(self.source, "body"):
            return make(n, self.proto["seed"], key, lead)
        return make(n, self.proto["seed"], key, lead, skip=self.count(after) - self.plan.added_tokens)

    def prompt(self, length: int, unique_key: str) -> list[int] | str:
        n = length - self.plan.added_tokens
        if n < 1:
            raise PromptError(f"a length of {length} leaves no room beside the {self.plan.added_tokens} token(s) "
                              "the server adds to every prompt")
        return self._tokens(n, unique_key)

    def body(self, length: int, unique_key: str, output_tokens: int) -> bytes:
        return request_body(self.api, self.prompt(length, unique_key), output_tokens, self.model)

    def generate(self, client: httpx.Client, url: str, body: bytes, timeout_s: float, length: int,
                 record: StreamRecord | None = None, stall_s: float | None = None) -> dict:
        """One timed request of `length` tokens: its summary, the counts completed where the server gave
        none (the prompt as built plus the tokens the server adds, the events as counted), with their
        source (usage_source "server" or "client"); event counts the probe could not check are estimated.
        `record` (a StreamRecord) is filled where given: what was generated stays on it; stall_s, the stream's
        stall bound (stream.stream_generate)."""
        rec = stream_generate(client, url, body, timeout_s, self.api, self.plan.events, record=record, stall_s=stall_s)
        return self.completed(rec, length)

    # --- prompts that share a head (longctx.measure.prefix) ---

    def head(self, tokens: int, key: str):
        """The first `tokens` tokens of a prompt as the server counts them, shared by every prompt built on it
        with `extend`: the tokens the server adds to every prompt (at most `tokens`) and ours after them."""
        n = tokens - self.plan.added_tokens
        if n <= 0:
            return "" if self.plan.prompt == "text" else []
        return self._tokens(n, key)

    def extend(self, head, tokens: int, key: str, lead: int):
        """head followed by `tokens` new tokens drawn from key, the first of them chosen by `lead`: two
        extensions of one head with different leads part at their first new token (a prefix cache can match
        nothing of one in the other beyond the head)."""
        new = self._tokens(tokens, key, lead, after=head)
        return head + new if self.plan.prompt == "text" else [*head, *new]

    def count(self, prompt) -> int:
        """Tokens of a prompt as the server counts them: the ones it adds, and ours (text encoded with the
        tokenizer the prompts are built with)."""
        ours = len(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else len(prompt)
        return self.plan.added_tokens + ours

    def body_of(self, prompt, output_tokens: int, extra: dict | None = None) -> bytes:
        return request_body(self.api, prompt, output_tokens, self.model, extra=extra)

    async def agenerate(self, client: httpx.AsyncClient, url: str, body: bytes, timeout_s: float, length: int,
                        record: StreamRecord | None = None) -> dict:
        """generate on asyncio (stream.astream_generate, `record` filled as events arrive; a cancelled
        request raises CancelledError and leaves what it got in `record`)."""
        rec = await astream_generate(client, url, body, timeout_s, self.api, self.plan.events, record=record)
        return self.completed(rec, length)

    def completed(self, rec: StreamRecord, length: int) -> dict:
        """A finished request's summary with its counts completed as planned (see generate)."""
        summary = rec.summary()
        summary["usage_source"] = "server" if summary["prompt_tokens"] is not None else "client"
        if summary["prompt_tokens"] is None and rec.ok:
            summary["prompt_tokens"] = length
        if summary["completion_tokens"] is None and rec.ok:
            summary["completion_tokens"] = sum(rec.event_tokens)
            summary["tokens_estimated"] = summary["tokens_estimated"] or not self.plan.events_exact
        return summary


def check_counts(summary: dict, length: int, output_tokens: int) -> dict:
    """A trial whose prompt the server counted otherwise than asked fails (prompt_count_checked: False where the
    server gave no count, which is then not checked); one that stopped before
    output_tokens (an early stop: a server that ignores ignore_eos) is flagged `early_stop`, and its
    decode figures are over fewer tokens than asked."""
    if summary["status"] != "ok":
        return summary
    # a count the server did not give (usage_source "client": taken as the length asked) cannot be checked
    summary["prompt_count_checked"] = summary.get("usage_source") != "client"
    if summary["prompt_count_checked"] and summary["prompt_tokens"] != length:
        summary["status"] = "failed"
        summary["reason"] = f"the server counted {summary['prompt_tokens']} prompt tokens, expected {length}"
    done = summary.get("completion_tokens")
    summary["early_stop"] = done is not None and done < output_tokens
    if summary["early_stop"]:
        summary["reason"] = f"stopped after {done} of {output_tokens} output tokens"
    return summary
