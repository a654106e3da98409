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


def ratio(num, den) -> float | None:
    """num / den as a float where both are numbers (is_number) and den > 0, else None."""
    return float(num) / float(den) if is_number(num) and is_number(den) and float(den) > 0 else None


def json_plain(x):
    """x with numpy's scalars as Python's and non-finite floats as None, dict keys as strings: what
    json.dumps writes as strict JSON (the analyses' outputs)."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k): json_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_plain(v) for v in x]
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x
