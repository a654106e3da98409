"""How a list reads inside a sentence."""

from __future__ import annotations


def listed(items: list[str]) -> str:
    """Items as a sentence lists them: "a", "a and b", "a, b and c" (at least one item)."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
