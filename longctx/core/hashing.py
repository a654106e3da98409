"""Canonical JSON and short content digests (spec hashes, resume keys, report versions)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def digest(obj: Any, n: int = 16) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]
