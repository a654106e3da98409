"""NGRAM (prompt-lookup) drafts: the tokens that followed the latest earlier occurrence of the
sequence's suffix, trying the longest window first (SGLang's --speculative-algorithm NGRAM)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SpecConfig:
    algorithm: str
    num_draft_tokens: int
    min_window: int = 1
    max_window: int = 12


def ngram_drafts(seq: np.ndarray, k: int, min_window: int, max_window: int) -> list[int]:
    """Up to k draft tokens for the sequence seq (prompt + output so far), or [] without a match."""
    n = len(seq)
    for w in range(min(max_window, n - 1), min_window - 1, -1):
        suffix = seq[n - w :]
        # candidate starts i < n - w whose window seq[i:i+w] equals the suffix
        cand = np.flatnonzero(seq[: n - w] == suffix[0])
        for j in range(1, w):
            if cand.size == 0:
                break
            cand = cand[seq[cand + j] == suffix[j]]
        if cand.size:
            start = int(cand[-1]) + w  # the latest occurrence; what followed it
            return seq[start : start + k].tolist()
    return []
