"""Byte-level tokenizer: ids 0..255 are bytes, then BOS and EOS."""

from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class ByteTokenizer:
    """The engine's tokenizer as a client builds prompts with it (longctx.measure.prompts.Tokenizer's interface):
    encode without special tokens, decode, a token's spelling."""

    path = "the reference engine's byte-level tokenizer"
    library = "longctx.refengine.tokenizer"
    vocab_size = 256
    special = frozenset({BOS_ID, EOS_ID})

    @staticmethod
    def encode(text: str) -> list[int]:
        return encode(text)

    @staticmethod
    def decode(ids: list[int]) -> str:
        return decode(ids)

    @staticmethod
    def piece(i: int) -> str:
        return decode([i])
