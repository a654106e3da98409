"""What counts as a number in the data (NaN and None do not)."""

from __future__ import annotations

import math


def is_number(x) -> bool:
    """A finite number (not None, NaN or infinite)."""
    if x is None or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def finite(x) -> float | None:
    """x as a finite float, else None."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
