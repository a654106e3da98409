"""The loop the sweep's workloads after the lengths share (longctx.measure.load, longctx.measure.prefix):
each point measured on the sweep's server in turn, one measured by an interrupted run under the same key
reused, every point kept as soon as it is done, a point the server died or hung in failed with the
server's fault (the server restarted for the next), and no point ever dropped: the ones a server that
cannot come up leaves are failed rows with the reason."""

from __future__ import annotations

import logging
from typing import Callable, Hashable

from .health import ServerError
from .rawfiles import STARTS_AGAIN, Retries

log = logging.getLogger("longctx.measure.points")
progress = logging.getLogger("longctx.progress")


def measure_points(session, name: str, todo: list[Hashable], key: Callable[[dict], Hashable],
                   measure: Callable[[Hashable], dict], failed: Callable[[Hashable, str], dict],
                   describe: Callable[[dict], str], keep: Callable[[list[dict]], None],
                   kept: list[dict] | None = None, retries: Retries | None = None) -> list[dict]:
    """Measure every point of `todo` (hashable descriptions; key(point) gives a measured point's) on
    session (longctx.measure.session.Session) with measure(item); failed(item, reason) is the record of one
    that was not measured or whose measurement raised; keep(points) is called after each point. A point lost again
    is counted as a length is (rawfiles.Retries: at server.give_up_after_runs runs the command gives up on it)."""
    retries = retries or Retries()
    done: list[dict] = []
    before = {key(p): p for p in kept or []}
    reuse = {k: p for k, p in before.items() if retries.reuses(p)}
    for item in todo:
        if item in reuse:  # measured by an interrupted run of the same spec, kernel and engine (or given up on)
            done.append({**reuse[item], "resumed": True})
            progress.info("%s: %s: measured before, reused", name, describe(reuse[item]))
            keep(done)
            continue
        try:
            session.up()
        except ServerError as exc:  # no server for the rest: each point left is a failed one, with the reason
            measured = {key(p) for p in done}
            fault = {"fault": str(exc)} if getattr(exc, "may_pass", True) else {}
            done += [retries.count(before.get(k), {**failed(k, f"not measured: {exc}"), **fault})
                     for k in todo if k not in measured]
            keep(done)
            raise
        try:
            point = measure(item)
        except Exception as exc:  # a bug or a surprise must not cost the points already measured
            log.exception("%s: %s failed", name, item)
            point = failed(item, f"{type(exc).__name__}: {exc}")
        if point["status"] != "ok" and not session.healthy():
            fault = session.fault(f"during {describe(point).split(':')[0]}", "the next point")
            point.update(status="failed", fault=fault, reason="; ".join(filter(None, [fault, point.get("reason")])))
        point = retries.count(before.get(item), point)
        if point.get("gave_up"):
            progress.warning("%s: %s: the same command no longer measures it %s", name, describe(point), STARTS_AGAIN)
        progress.info("%s: %s", name, describe(point))
        done.append(point)
        keep(done)
    return done
