"""Real text for prompts: the Python standard library's own documentation and source (on every machine that
runs longctx, nothing downloaded), or the user's own files, stitched into one long document and cut to an exact
number of tokens as the server's tokenizer counts them (protocol.text_source).

- ``stdlib``: CPython's ``pydoc_data`` topics (the language reference and library documentation that ``help()``
  shows: prose with code), then the standard library's own modules (``*.py`` under ``sysconfig``'s stdlib path,
  by name; tests and site-packages left out): about 100k tokens of prose and millions of code.
- a path: one file, or every file under a directory (sorted by path; hidden entries and files that are not
  UTF-8 text left out), read until the text is long enough.

Documents are read and encoded in order, only as far as the longest prompt needs; each ends with a blank line.
A prompt is a head of HEAD_TOKENS tokens drawn at random from the text's own tokens (unique to the request, so
that no prefix cache can serve it, as measure.workload's random prompts), then the text from the start of the
source (``protocol.seed`` moves the start): every trial at a length reads the same document, as every trial of
the random prompts reads the same body.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from .prompts import stable_words
from .workload import PREFIX_TOKENS, key_seed

HEAD_TOKENS = PREFIX_TOKENS  # the unique head of every prompt
SEED_STRIDE = 4096  # tokens the text's start moves per protocol.seed
SEPARATOR = "\n\n"
RANDOM, STDLIB = "random", "stdlib"
MAX_FILE_BYTES = 8 << 20  # larger files are not prose or code (a dump, a log): left out of a directory
MAX_SPECIAL = 0.5  # a tokenizer that spells more of the text's start as special (unknown) tokens cannot spell it


class TextSourceError(RuntimeError):
    """The source holds too little text for a prompt of the length asked."""


def stdlib_documents():
    """(name, text) of the built-in source in order: pydoc_data's topics, then the stdlib's modules."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python packaged without it: the modules alone
        topics = {}
    for name in sorted(topics):
        yield f"pydoc_data.topics[{name!r}]", topics[name]
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3") or "test" in rel.parts:
            continue
        try:
            yield f"stdlib/{rel}", path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def file_documents(root: Path):
    """(name, text) of a file, or of every UTF-8 text file under a directory (sorted; hidden entries skipped)."""
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                 and not any(part.startswith(".") for part in p.relative_to(root).parts))
    for path in paths:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            raw = path.read_bytes()
        except OSError:
            continue
        if b"\0" in raw:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            yield str(path if root.is_file() else path.relative_to(root)), text


def source_path(setting: str) -> Path | None:
    """The path protocol.text_source names, or None for random and stdlib; ConfigError where it is not there."""
    if setting in (RANDOM, STDLIB):
        return None
    path = Path(setting).expanduser()
    if not path.exists():
        raise ConfigError(f"config key 'protocol.text_source': {setting!r} is neither a file nor a directory; allowed "
                          "values: random (random words or token ids), stdlib (the Python standard library's "
                          "documentation and source, built in), or the path of a file or directory of your documents")
    return path


@dataclass
class Document:
    name: str
    start: int  # its first token's index in the stitched text
    tokens: int
    chars: int


@dataclass
class DocumentText:
    """The source's documents encoded with `tokenizer` and stitched, as far as asked: ids(n, ...) and text(n, ...)."""

    tokenizer: object  # encode(text) -> ids, decode(ids) -> text (measure.prompts.Tokenizer or an adapter's)
    setting: str  # stdlib or the path
    ids_: list[int] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)
    exhausted: bool = False

    def __post_init__(self):
        path = source_path(self.setting)
        self._docs = stdlib_documents() if path is None else file_documents(path)
        self.ensure(2048)
        if not self.ids_:
            raise ConfigError(f"config key 'protocol.text_source': {self.setting!r} holds no text (no UTF-8 text file)")
        # the head's alphabet: tokens of the text's first part that come back as themselves when their text is encoded
        # again, whole words where the vocabulary marks them (measure.prompts.stable_words), so that the head's
        # tokens do not merge with each other or with what follows
        tok = self.tokenizer
        special = set(getattr(tok, "special", ()) or ())
        first = self.ids_[:2048]
        unknown = sum(i in special for i in first) / len(first)
        seen = sorted(set(first) - special)
        if unknown > MAX_SPECIAL or len(seen) < 16:  # a vocabulary that cannot spell this text (a test model's words)
            raise TextSourceError(f"the tokenizer at {getattr(tok, 'path', '?')} spells {unknown:.0%} of the text source "
                                  f"{self.setting!r} as special or unknown tokens ({len(seen)} distinct others): it "
                                  "cannot spell this text")
        stable, words = stable_words(tok, seen)
        self.alphabet = next((a for a in (words, stable) if len(a) >= 16), seen)

    def ensure(self, n: int) -> None:
        """Encode documents until the stitched text holds n tokens (or the source ends)."""
        while len(self.ids_) < n and not self.exhausted:
            try:
                name, text = next(self._docs)
            except StopIteration:
                self.exhausted = True
                break
            ids = self.tokenizer.encode(text + SEPARATOR)
            self.documents.append(Document(name, len(self.ids_), len(ids), len(text)))
            self.ids_.extend(ids)

    def body(self, n: int, seed: int, skip: int = 0) -> list[int]:
        """n tokens of the text from the seed's start, `skip` tokens on."""
        if seed < 0:
            raise ConfigError(f"config key 'protocol.seed': {seed} moves the start of the text source; allowed values: 0 or more")
        start = seed * SEED_STRIDE + skip
        self.ensure(start + n)
        if start + n > len(self.ids_):
            docs = f"{len(self.documents)} document{'s' if len(self.documents) != 1 else ''}"
            raise TextSourceError(f"the text source {self.setting!r} holds {len(self.ids_):,} tokens ({docs}) as this "
                                  f"tokenizer counts them; a prompt of {n + HEAD_TOKENS:,} tokens needs {start + n:,} of "
                                  f"them{f' (from protocol.seed {seed})' if seed else ''}: add documents to it, or set "
                                  "protocol.text_source: stdlib")
        return self.ids_[start:start + n]

    def head(self, n: int, unique_key: str, lead: int | None) -> list[int]:
        head = np.random.default_rng(key_seed(unique_key)).choice(self.alphabet, size=n).tolist()
        if lead is not None and head:
            head[0] = self.alphabet[lead % len(self.alphabet)]
        return head

    def ids(self, n: int, seed: int, unique_key: str, lead: int | None = None, skip: int = 0) -> list[int]:
        """n token ids: a head drawn from unique_key (with lead, its first token the alphabet's lead-th), then the text
        (`skip` tokens into it: an extension reads on where the prompt before it stopped)."""
        h = min(HEAD_TOKENS, n)
        return self.head(h, unique_key, lead) + self.body(n - h, seed, skip)

    def text(self, n: int, seed: int, unique_key: str, lead: int | None = None, skip: int = 0) -> str:
        """Text of exactly n tokens as the tokenizer encodes it: ids(...) decoded, the text trimmed or extended at its
        end until its encoding has n tokens (tokens may merge where the head meets the text). Where no end of the text
        gives n (a cut inside a character that a byte-level tokenizer spells in several tokens), the head is shortened
        by a token, then two, and the text asked for that many more."""
        h = min(HEAD_TOKENS, n)
        head = self.head(h, unique_key, lead)
        count = -1
        for shorter in range(min(4, h) + 1):
            part = head[:h - shorter]
            take, tried = n - len(part), set()
            while take not in tried and len(tried) < 12:
                tried.add(take)
                text = self.tokenizer.decode(part + self.body(max(0, take), seed, skip))
                count = len(self.tokenizer.encode(text))
                if count == n:
                    return text
                take = max(0, take + n - count)
        raise TextSourceError(f"no text of exactly {n} tokens could be cut from {self.setting!r} (the closest had {count})")

    def describe(self, longest: int, seed: int = 0) -> dict:
        """Which source and how much of it the longest prompt (`longest` tokens) reads: the documents its text reaches
        into, their number and characters, and the tokens of the text it takes."""
        start = seed * SEED_STRIDE
        end = start + max(0, longest - HEAD_TOKENS)
        self.ensure(end)
        used = [d for d in self.documents if d.start < end and d.start + d.tokens > start]
        return {"kind": "text", "source": self.setting, "tokens": max(0, min(end, len(self.ids_)) - start),
                "available": None if not self.exhausted else len(self.ids_),
                "documents": len(used), "characters": sum(d.chars for d in used),
                "first": used[0].name if used else None, "last": used[-1].name if used else None,
                "tokenizer": str(getattr(self.tokenizer, "path", "")) or None}
