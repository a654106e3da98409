"""Two builds of one configuration measured in one run, interleaved: the server-level A/B (`longctx ab`).

The two sides are the same configuration but for the kernel build their server runs: A, the baseline (the sources
of a kept version or of a git revision), B, the candidate (the working tree's). Per length, after one warm-up
request on each side, blocks alternate in ABBA order (longctx.analysis.paired.schedule: A B B A A B ...), each block
`trials` lone requests of the protocol (measure.protocol.one_request: a unique prefix, the cache flushed, streamed
and timed), so that what the machine does over a pair of neighbouring blocks (a clock that drifts, a neighbour that
competes for the cores) hits both sides. Each length's blocks are written as soon as they are measured
(<outdir>/<length>.json): nothing measured is lost, a failed request is a trial with its status and reason.

Servers: "together" keeps both up at once, each idle while the other is measured (two server starts; the device
must hold both); "alternate" keeps one up at a time and restarts the other for every block (2 x blocks starts per
length, for a server that cannot share its device). What it cost, server starts and wall time, is returned.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from ..core.interleave import SIDES, schedule
from ..core.secrets import mask
from ..engines import ConfigurationSpec, get_adapter
from . import provenance
from .health import ServerError
from .protocol import one_request, request_timeout, stall_timeout
from .rawfiles import writable, write_json
from .session import Session

progress = logging.getLogger("longctx.progress")
SERVERS = ("together", "alternate")


def ab_spec(spec: ConfigurationSpec, kernel_build: str | Path, lengths: list[int]) -> ConfigurationSpec:
    """The configuration as one side of the A/B runs it: its kernel build, the A/B's lengths, and none of the
    sweep's other workloads (load, reused context, the ITL-against-depth request), so that its server is primed with
    the A/B's longest prompt only."""
    protocol = {**spec.protocol, "itl_depth": {**spec.protocol.get("itl_depth", {}), "length": 0}}
    return dataclasses.replace(spec, kernel_build=str(kernel_build), lengths=list(lengths), load=None, prefix=None,
                               adaptive=None, protocol=protocol)


def _provenance(spec: ConfigurationSpec) -> dict:
    adapter = get_adapter(spec.engine)
    return {"protocol": spec.protocol, **provenance.model_provenance(adapter, spec), "args": mask(spec.args),
            "settings": spec.settings(), "hardware": provenance.hardware(), "kernel": provenance.kernel_manifest(spec),
            "run_started_at": provenance.now_iso()}


def _trial(summary: dict | None, side: str, block: int, index: int) -> dict:
    if summary is None:  # the flush found the server gone quiet: nothing was sent
        summary = {"status": "failed", "reason": "the server stopped answering before the request was sent"}
    summary.pop("itl_s", None)
    return {**summary, "side": side, "block": block, "trial": index}


def run_ab(specs: dict[str, ConfigurationSpec], outdir: str | Path, server_logs: dict[str, str | Path],
           blocks: int, trials: int, servers: str = "together", run_id: str = "ab") -> dict:
    """Measure both sides (specs: {"A": spec, "B": spec}, each with its kernel build: ab_spec) at every length of
    the specs, interleaved in blocks; returns {"lengths": [per length: {length, blocks: [{side, index, trials}],
    warmup}], "provenance": {side: ...}, "starts": {side: n}, "wall_s", "servers", "blocks_per_side",
    "trials_per_block"}, each length also written to outdir/<length>.json as it is done."""
    if servers not in SERVERS:
        raise ValueError(f"servers {servers!r}; allowed: {', '.join(SERVERS)}")
    outdir = Path(outdir)
    writable(outdir)
    started = time.monotonic()
    name = specs["B"].name
    sessions: dict[str, Session] = {}
    prov = {side: _provenance(specs[side]) for side in SIDES}
    lengths_out: list[dict] = []
    history: list[tuple[int, float, float | None]] = []  # (length, TTFT, TPOT) of A's ok trials: the timeouts' scale
    try:
        for side in SIDES:
            Path(server_logs[side]).parent.mkdir(parents=True, exist_ok=True)
            sessions[side] = Session(get_adapter(specs[side].engine), specs[side], Path(server_logs[side]), prov[side])

        def up(side: str) -> str | None:
            """The side's server, up (the other stopped first where they alternate); why not, where it cannot be."""
            if servers == "alternate":
                sessions["B" if side == "A" else "A"].pause()
            try:
                sessions[side].up()
                return None
            except ServerError as exc:
                return str(exc)

        for length in specs["B"].lengths:
            timeout = request_timeout(specs["A"].protocol, history, length)
            stall = stall_timeout(history, length, timeout)
            record: dict = {"configuration": name, "length": length, "run_id": run_id, "started_at": provenance.now_iso(),
                            "warmup": {}, "blocks": []}
            for side in SIDES:  # a warm-up on each side, not kept as a trial
                why = up(side)
                record["warmup"][side] = _trial(None if why else one_request(sessions[side], specs[side], length,
                                                                             f"{run_id}/{name}/{length}/warmup/{side}",
                                                                             timeout, stall), side, -1, 0)
                if why:
                    record["warmup"][side].update(reason=why)
            for index, side in enumerate(schedule(blocks)):
                why = up(side)
                block = {"side": side, "index": index, "trials": []}
                for t in range(trials):
                    if why:
                        block["trials"].append({**_trial(None, side, index, t), "reason": why})
                        continue
                    s = _trial(one_request(sessions[side], specs[side], length, f"{run_id}/{name}/{length}/{index}/{t}",
                                           timeout, stall), side, index, t)
                    block["trials"].append(s)
                    if s["status"] != "ok" and not sessions[side].healthy():
                        why = sessions[side].fault(f"while measuring length {length} (A/B side {side})", "the next block")
                        s["fault"] = why
                    elif side == "A" and s["status"] == "ok":
                        history.append((length, s["ttft_s"], s.get("tpot_s")))
                record["blocks"].append(block)
            ok = {side: sum(t["status"] == "ok" for b in record["blocks"] if b["side"] == side for t in b["trials"])
                  for side in SIDES}
            record["finished_at"] = provenance.now_iso()
            write_json(outdir / f"{length}.json", record)
            lengths_out.append(record)
            progress.info("%s L=%d: A/B %d blocks a side of %d trial(s): %d and %d trials ok (A, B)", name, length,
                          blocks, trials, ok["A"], ok["B"])
    finally:
        for s in sessions.values():
            s.close()
    return {"configuration": name, "lengths": lengths_out, "provenance": {side: prov[side] for side in SIDES},
            "starts": {side: sessions[side].starts if side in sessions else 0 for side in SIDES},
            "wall_s": time.monotonic() - started, "servers": servers, "blocks_per_side": blocks, "trials_per_block": trials}
