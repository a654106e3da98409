"""Byte-level tokenizer: ids 0..255 are bytes, then BOS and EOS."""

from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
