"""Prompts of exactly L token ids, with a prefix unique to each request so no cache can serve it."""

from __future__ import annotations

import hashlib

import numpy as np

PREFIX_TOKENS = 16


def key_seed(unique_key: str) -> int:
    """The seed a request's unique prefix is drawn from: its key's digest, the same in every run."""
    return int.from_bytes(hashlib.sha256(unique_key.encode()).digest()[:8], "little")


def prompt_ids(length: int, seed: int, unique_key: str, token_range: tuple[int, int] = (0, 256)) -> list[int]:
    """length token ids in [low, high): a prefix drawn from unique_key, then a body drawn from seed.

    The body is the same for every request of a run (a stable workload); the prefix differs,
    so even a prefix cache keyed on the first tokens finds nothing to reuse.
    """
    low, high = token_range
    prefix = np.random.default_rng(key_seed(unique_key)).integers(low, high, size=min(PREFIX_TOKENS, length))
    body = np.random.default_rng(seed).integers(low, high, size=max(0, length - PREFIX_TOKENS))
    return np.concatenate([prefix, body]).astype(int).tolist()
