"""Where the suite's wall time goes under `make test`'s two workers: which tests held the machine alone while the other
worker stood waiting for it, and for how long.

Run the suite with LONGCTX_SUITE_TIMELINE=<file> (tests/conftest.py writes a line each time a worker waits for, takes,
shares or lets go of the machine), then

    python bench/suite_timeline.py <file> [--top 30]

It prints the run's span, each worker's time by state (alone, shared, waiting, between tests), and the tests that cost
the run most: the seconds the other worker waited while each held the machine alone (a test that shares the machine
once it is done measuring costs only its alone part)."""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def intervals(lines: list[dict]) -> dict[str, list[tuple[float, float, str, str]]]:
    """Each worker's (start, end, state, test): state one of alone, shared, wait; the gaps between are its own."""
    out: dict[str, list] = collections.defaultdict(list)
    last: dict[str, tuple[float, str, str]] = {}
    for ln in sorted(lines, key=lambda d: d["t"]):
        w = ln["worker"] or "main"
        if w in last:
            t0, state, test = last.pop(w)
            out[w].append((t0, ln["t"], state, test))
        if ln["event"] != "done":
            last[w] = (ln["t"], ln["event"], ln["test"])
    return out


def report(lines: list[dict], top: int = 30) -> str:
    spans = intervals(lines)
    t0 = min(d["t"] for d in lines)
    t1 = max(d["t"] for d in lines)
    rows = [f"span of the timeline: {t1 - t0:.0f} s, {len(spans)} workers"]
    for w, iv in sorted(spans.items()):
        by = collections.Counter()
        for a, b, state, _ in iv:
            by[state] += b - a
        busy = sum(by.values())
        rows.append(f"{w}: alone {by['alone']:.0f} s, shared {by['shared']:.0f} s, waiting {by['wait']:.0f} s, "
                    f"outside any test {t1 - t0 - busy:.0f} s")
    for held in ("alone", "shared"):
        cost, total = collections.Counter(), collections.Counter()
        for w, iv in spans.items():
            others = [x for o, ivs in spans.items() if o != w for x in ivs if x[2] == "wait"]
            for a, b, state, test in iv:
                if state != held:
                    continue
                total[test] += b - a
                for c, d, _, _ in others:
                    cost[test] += max(0.0, min(b, d) - max(a, c))
        rows.append(f"\nthe other worker waited {sum(cost.values()):.0f} s in all while a test held the machine {held}"
                    + (" (it waited to hold it alone)" if held == "shared" else "")
                    + f"; the tests it waited on most (seconds waited, seconds held {held}):")
        rows += [f"{s:7.1f} {total[test]:7.1f}  {test}" for test, s in cost.most_common(top) if s >= 0.05]
    return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline", type=Path)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    print(report([json.loads(x) for x in args.timeline.read_text().splitlines() if x.strip()], args.top))


if __name__ == "__main__":
    main()
