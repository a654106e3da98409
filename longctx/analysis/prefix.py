"""data/raw/<configuration>/prefix.json (the prefix-cache workloads: hit rates and growing conversations,
issue 19) -> data/prefix.csv, one row per request.

A hit-rate point's requests are its trials (role "trial") and the request that put the shared prefix in the
cache first (role "warm", not a trial: no cached-count check, and the analysis leaves it out); a conversation's requests are its turns
(role "turn"). Each row keeps what the server should have cached (expected_cached: the prefix rounded down to
the cache's granularity, at most L - 1, 0 with the cache off; expected_cached_low, where the measurement gives
one, the least it may cache, the check then passing anywhere from it to expected_cached), what it says it cached (cached_tokens, empty
where it does not say) and the check of the two (cached_check: ok, mismatch or unreported), and new_tokens:
the prompt less the cached tokens, the server's count where it reports one, else the expected one (what the
cost model of longctx.analysis.prefix_model prefills).

A failed request stays a row with its reason; a point or a conversation that sent nothing is one failed row
(role empty) with the point's reason; a raw file that is missing or cannot be read, or a run that measured
nothing, is one failed row of its configuration (kind empty). A configuration whose status is
"not configured" has no row.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.errors import write_atomic
from ..core.numbers import finite
from .aggregate import read_raw

COLUMNS = [
    "configuration", "kind", "point", "role", "cache", "granularity", "length", "hit_rate", "prefix_tokens",
    "turn_tokens", "output_tokens", "max_context", "trial", "turn", "previous_tokens", "status", "reason",
    "point_status", "point_reason", "prompt_tokens", "expected_cached", "expected_cached_low", "cached_tokens", "cached_check", "new_tokens",
    "ttft_s", "server_ttft_s", "tpot_s", "decode_tok_s", "e2e_s", "completion_tokens", "itl_median_s", "itl_max_s",
    "tokens_estimated",
]
CHECKS = ("ok", "mismatch", "unreported")
RECORD_FIELDS = ("ttft_s", "server_ttft_s", "tpot_s", "decode_tok_s", "e2e_s", "completion_tokens", "itl_median_s",
                 "itl_max_s", "tokens_estimated")


def _int(x) -> int | None:
    v = finite(x)
    return int(round(v)) if v is not None else None


def cached_check(expected: int | None, cached: int | None, given: str | None = None) -> str:
    """The record's own check where it has one, else: unreported without a server count, ok where it equals
    the expected count, mismatch otherwise."""
    if given in CHECKS:
        return given
    if cached is None:
        return "unreported"
    return "ok" if expected is not None and cached == expected else "mismatch"


def request_row(base: dict, r: dict, prompt_default: int | None, expected: int | None) -> dict:
    """One request's row: the record's figures, its counts and new_tokens (prompt - the server's cached count,
    else - the expected one)."""
    prompt = _int(r.get("prompt_tokens"))
    prompt = prompt if prompt is not None else prompt_default
    cached = _int(r.get("cached_tokens"))
    expected = _int(r.get("expected_cached")) if r.get("expected_cached") is not None else expected
    used = cached if cached is not None else expected
    return {**base, **{k: r.get(k) for k in RECORD_FIELDS}, "status": r.get("status") or "failed",
            "reason": r.get("reason"), "prompt_tokens": prompt, "expected_cached": expected,
            "expected_cached_low": _int(r.get("expected_cached_low")), "cached_tokens": cached,
            "cached_check": cached_check(expected, cached, r.get("cached_check")),
            "new_tokens": prompt - used if prompt is not None and used is not None else None}


def _point_base(configuration: str, i: int, p: dict, granularity, cache) -> dict:
    return {"configuration": configuration, "kind": "hit_rate", "point": i, "cache": cache, "granularity": granularity,
            "length": _int(p.get("length")), "hit_rate": finite(p.get("hit_rate")), "prefix_tokens": _int(p.get("prefix_tokens")),
            "point_status": p.get("status"), "point_reason": p.get("reason")}


def _conversation_base(configuration: str, i: int, c: dict, granularity, cache) -> dict:
    return {"configuration": configuration, "kind": "conversation", "point": i,
            "cache": bool(c["cache"]) if c.get("cache") is not None else cache, "granularity": granularity,
            "turn_tokens": _int(c.get("turn_tokens")), "output_tokens": _int(c.get("output_tokens")),
            "max_context": _int(c.get("max_context")), "point_status": c.get("status"), "point_reason": c.get("reason")}


def raw_rows(path: Path) -> list[dict]:
    """The rows of one raw prefix file."""
    configuration = path.parent.name
    raw, problem = read_raw(path)
    if raw is None:
        return [{"configuration": configuration, "status": "failed", "reason": f"unreadable raw file {path} ({problem})"}]
    configuration = raw.get("configuration") or configuration
    if raw.get("status") == "not configured":
        return []
    points, conversations = raw.get("points") or [], raw.get("conversations") or []
    if not points and not conversations:
        return [{"configuration": configuration, "status": "failed" if raw.get("status") in (None, "ok") else raw["status"],
                 "reason": raw.get("reason") or "no prefix workload was run"}]
    granularity = _int(raw.get("granularity"))
    cache = bool(raw["cache"]) if raw.get("cache") is not None else None
    rows: list[dict] = []
    for i, p in enumerate(points):
        base = _point_base(configuration, i, p, granularity, cache)
        expected = _int(p.get("expected_cached"))
        warm, trials = p.get("warm"), p.get("requests") or []
        if warm:  # what it should have found cached is not this point's question: no check
            rows.append({**request_row({**base, "role": "warm"}, warm, base["length"], None), "expected_cached": None,
                         "cached_check": None, "new_tokens": None})
        for j, r in enumerate(trials):
            rows.append(request_row({**base, "role": "trial", "trial": r.get("trial", j)}, r, base["length"], expected))
        if not trials:
            rows.append({**base, "role": None, "expected_cached": expected, "status": "failed" if p.get("status") in (None, "ok")
                         else p["status"], "reason": p.get("reason") or "the point sent no trial"})
    for i, c in enumerate(conversations):
        base = _conversation_base(configuration, i, c, granularity, cache)
        turns = c.get("turns") or []
        for j, t in enumerate(turns):
            turn = _int(t.get("turn"))
            row = request_row({**base, "role": "turn", "turn": j if turn is None else turn,
                               "previous_tokens": _int(t.get("previous_tokens"))}, t, None,
                              0 if base["cache"] is False else None)
            row["length"] = row["prompt_tokens"]
            rows.append(row)
        if not turns:
            rows.append({**base, "role": None, "status": "failed" if c.get("status") in (None, "ok") else c["status"],
                         "reason": c.get("reason") or "the conversation sent no turn"})
    return rows


def aggregate_prefix(raw_files: list[str | Path], out_csv: str | Path) -> pd.DataFrame:
    """data/prefix.csv from every configuration's prefix.json (in the order of their configurations)."""
    rows: list[dict] = []
    for path in sorted(map(Path, raw_files), key=lambda p: (p.parent.name, p.name)):
        rows += raw_rows(path)
    df = pd.DataFrame(rows, columns=COLUMNS)
    Path(out_csv).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out_csv, df.to_csv(index=False))
    return df
