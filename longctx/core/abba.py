"""The order an A/B measures its two sides in: blocks alternating A B B A A B B A ..., so that neighbouring blocks
pair up, (1st, 2nd), (3rd, 4th), ..., each pair one block of each side taken back to back, and a drift that is linear
over four blocks cancels between a pair and the next. Measured by longctx.measure.ab (behind the servers) and
longctx.attention.kernel_ab (in one process); the pairs' interval is longctx.analysis.paired's."""

from __future__ import annotations

SIDES = ("A", "B")  # A: the baseline, B: the candidate


def schedule(blocks_per_side: int) -> list[str]:
    """The order of the blocks: A B B A A B ..., blocks_per_side of each side (at least 1)."""
    n = max(1, int(blocks_per_side))
    return [side for i in range(n) for side in (("A", "B") if i % 2 == 0 else ("B", "A"))]
