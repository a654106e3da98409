"""An A/B's measurements as one family: per configuration and length, the candidate (B) against the baseline (A) from
pairs of neighbouring blocks (longctx.analysis.paired), gated as any comparison (longctx.analysis.sides).

Two levels, the same interval:
- server: both builds behind the configuration's server, lone requests of the protocol in blocks
  (longctx.measure.ab): TTFT and decode rate, per configuration and length;
- kernel: both builds in one process, calls alternated in blocks (longctx.attention.kernel_ab): the decode
  attention call's time, per kernel and KV length, the cheap path for servers that take minutes to start.
A length where B lost what A had (pairs with both sides measured fewer than an interval needs, where A's blocks
alone had enough) is lost, with B's failures' reasons.
"""

from __future__ import annotations

from collections import Counter

from .compare import METRICS, Metric
from .kernel_ab import STATISTIC, block_values
from .paired import SIDES, pair_differences
from .sides import Cell, table

SERVER, KERNEL = "server", "kernel"
# the kernel level's one figure: the seconds of one decode attention call at the length
CALL = {"call": Metric("seconds", True, "decode attention call")}


def _values(block: dict, column: str) -> list[float]:
    return [t[column] for t in block["trials"] if t.get("status") == "ok" and isinstance(t.get(column), (int, float))]


def _why(blocks: list[dict], column: str) -> str | None:
    """Why B's trials have no value of `column`: their failures' reasons (or what left the figure out of an ok trial),
    the most frequent first, with counts."""
    reasons = Counter(str(t.get("fault") or t.get("reason") or t.get("decode_unmeasured") or "no reason recorded")
                      for b in blocks if b["side"] == "B" for t in b["trials"]
                      if t.get("status") != "ok" or not isinstance(t.get(column), (int, float)))
    return "; ".join(r if n == 1 else f"{r} ({n} trials)" for r, n in reasons.most_common()) or None


def _cell(name: str, length: int, blocks: list[tuple[str, dict[str, list[float]]]], metrics: dict,
          why: dict[str, str]) -> Cell:
    """One cell from blocks in order, each (side, {figure: values}): per figure the pairs, and the pairs whose A
    block has a value (what B could have matched: a lost figure is told by it)."""
    pairs = {f: list(pair_differences([(side, v[f]) for side, v in blocks])[0]) for f in metrics}
    possible = {f: sum(1 for i in range(0, len(blocks) - 1, 2) for side, v in blocks[i:i + 2] if side == "A" and v[f])
                for f in metrics}
    first = next(iter(metrics))
    return Cell(name, length, possible[first], len(pairs[first]), pairs=pairs, possible=possible, why_lost=why,
                before={f: [x for side, v in blocks if side == "A" for x in v[f]] for f in metrics},
                now={f: [x for side, v in blocks if side == "B" for x in v[f]] for f in metrics})


def server_cells(measured: list[dict]) -> list[Cell]:
    """The server level's cells: per configuration (measure.ab.run_ab's result each) and length."""
    out = []
    for conf in measured:
        for rec in conf["lengths"]:
            blocks = [(b["side"], {f: _values(b, m.column) for f, m in METRICS.items()}) for b in rec["blocks"]]
            why = {f: w for f, m in METRICS.items() if (w := _why(rec["blocks"], m.column))}
            out.append(_cell(conf["configuration"], int(rec["length"]), blocks, METRICS, why))
    return out


def kernel_cells(measured: list[dict], statistic: str = STATISTIC) -> list[Cell]:
    """The kernel level's cells: per kernel (attention.kernel_ab.alternate's result each, with its "kernel": {"kernel",
    "lengths": [{length, blocks: [{side, seconds}]}]}) and KV length; a block enters its pair by its median call
    (kernel_ab.block_values: a stalled call does not move it)."""
    out = []
    for k in measured:
        for rec in k["lengths"]:
            blocks = [(b["side"], {"call": block_values([s for s in b["seconds"] if s > 0], statistic)})
                      for b in rec["blocks"]]
            why = (rec.get("failed") or {}).get("B")
            out.append(_cell(k["kernel"], int(rec["length"]), blocks, CALL, {"call": why} if why else {}))
    return out


def family(cells: list[Cell], level: str, confidence: float, margin: float) -> dict:
    """sides.table of the cells at the given level (SERVER: TTFT and decode; KERNEL: the call's time)."""
    return {**table(cells, confidence, margin, CALL if level == KERNEL else METRICS), "level_measured": level,
            "metrics": list(CALL if level == KERNEL else METRICS)}


def starts(measured: list[dict]) -> int:
    """The server starts the server level took, over every configuration and both sides."""
    return sum(conf["starts"].get(side, 0) for conf in measured for side in SIDES)
