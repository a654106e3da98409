"""The order an interleaved A/B measures its blocks in: A B B A A B B A ... (ABBA).

Here, on the floor, because the stages that measure (attention's kernel A/B, measure's server-level A/B) run the
blocks in this order and may not import analysis, where the paired interval over the blocks is computed
(longctx.analysis.paired, which re-exports both names).
"""

from __future__ import annotations

SIDES = ("A", "B")


def schedule(blocks_per_side: int) -> list[str]:
    """The order of the blocks: A B B A A B B A ..., blocks_per_side of each side (at least 1)."""
    n = max(1, int(blocks_per_side))
    return [side for i in range(n) for side in (("A", "B") if i % 2 == 0 else ("B", "A"))]
