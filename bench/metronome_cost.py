"""What the metronome costs a run (longctx.measure.metronome): after a run, per configuration, each reading's seconds
(its requests and its machine probe), their sum, and that sum against the bench job's wall time (the run's first
start to its metronome's last reading); and the run's drift figure.

    .venv/bin/python bench/metronome_cost.py                # data/raw/*/metronome.json of the workflow here
    .venv/bin/python bench/metronome_cost.py path/to/data/raw

Measured figures are in docs/pipeline.md (The metronome).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.analysis.drift import within  # noqa: E402


def _time(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="?", default="data/raw", help="the raw directory (default: data/raw)")
    args = ap.parse_args()
    files = sorted(Path(args.raw).glob("*/metronome.json"))
    if not files:
        sys.exit(f"no */metronome.json under {args.raw}: run the bench first")
    total = run_total = 0.0
    for path in files:
        doc = json.loads(path.read_text())
        readings = [r for r in doc.get("readings") or [] if r.get("run_id") == doc.get("run_id")]
        if not readings:
            print(f"{path.parent.name}: no reading ({doc.get('status')}: {doc.get('reason')})")
            continue
        took = sum(r.get("took_s") or 0 for r in readings)
        starts = [_time(json.loads(p.read_text()).get("started_at")) for p in path.parent.glob("*.json")
                  if p.stem.isdigit()]
        first = min([t for t in starts if t] or [_time(readings[0]["started_at"])])
        wall = (_time(readings[-1]["finished_at"]) - first).total_seconds()
        total, run_total = total + took, run_total + wall
        points = ", ".join(f"{r['point']} {r['took_s']:.2f} s (probe {r['probe'].get('median_s', 0) * 1e3:.0f} ms, "
                           f"TTFT {(r.get('ttft_s') or 0) * 1e3:.1f} ms)" for r in readings)
        figure = within(doc.get("readings"))
        print(f"{path.parent.name}: {took:.2f} s in {len(readings)} readings of a {wall:.0f} s run "
              f"({took / wall:.1%}): {points}")
        print(f"  {figure['words'] if figure else 'no drift figure'}")
    print(f"all: {total:.2f} s of metronome in {run_total:.0f} s of bench runs ({total / run_total:.1%})")


if __name__ == "__main__":
    main()
