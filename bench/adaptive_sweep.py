#!/usr/bin/env python3
"""The adaptive sweep against the fixed one, on the reference engine (issue 21, item 4): the default config's first
configuration measured twice, each time with its own server, by the fixed sweep of config/longctx.yaml's lengths
and by the adaptive sweep for the same max (lengths: {adaptive: {min: the shortest, max: the longest}}); then,
from each one's trials, the same fits' predictions of TTFT and the decode step at max with their bootstrap
intervals (longctx.measure.adaptive.at_max), and the server time each took (the seconds its lengths' requests
ran: warm-up, trials, needle).

    python bench/adaptive_sweep.py [--config config/longctx.yaml] [--configuration NAME] [--target 0.25] [--repeat N]

Goal: the adaptive prediction at max inside the fixed sweep's interval, its interval no wider than the target,
in at most half the fixed sweep's server time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx import config as lcfg  # noqa: E402
from longctx.measure.adaptive import _fits, at_max  # noqa: E402
from longctx.measure.sweep import run_configuration  # noqa: E402


def samples(outdir: Path, lengths: list[int]) -> tuple[list, float]:
    """(length, TTFT, TPOT) of every successful trial, and the server seconds the lengths took."""
    out, seconds = [], 0.0
    for L in lengths:
        raw = json.loads((outdir / f"{L}.json").read_text())
        if raw.get("status") == "not chosen":
            continue
        out += [(L, t["ttft_s"], t.get("tpot_s")) for t in raw["trials"] if t["status"] == "ok"]
        if "adaptive_seconds" in raw:
            seconds += raw["adaptive_seconds"]
        elif raw.get("started_at") and raw.get("finished_at"):
            seconds += (datetime.fromisoformat(raw["finished_at"]) - datetime.fromisoformat(raw["started_at"])).total_seconds()
    return out, seconds


def run(config: dict, name: str, work: Path) -> tuple[dict, float, list[int]]:
    spec = lcfg.configuration_spec(config, name)
    failed = run_configuration(spec, work / "raw", work / "server.log")
    if failed:
        print(f"  {failed} length(s) failed: see {work}", file=sys.stderr)
    got, seconds = samples(work / "raw", spec.lengths)
    measured = sorted({s[0] for s in got})
    return at_max(_fits(got, 1000, 0), max(spec.lengths)), seconds, measured


def show(what: str, pred: dict, seconds: float, measured: list[int]) -> None:
    print(f"{what}: {seconds:.1f} s of server time, lengths {measured}")
    for kind in ("prefill", "decode"):
        p = pred.get(kind)
        if p:
            print(f"  {'TTFT' if kind == 'prefill' else 'decode step'} at max: {p['predicted'] * 1e3:.2f} ms "
                  f"[{p['lo'] * 1e3:.2f}, {p['hi'] * 1e3:.2f}] ({p['relative_interval']:.1%} wide)")


def ensure_kernel(config: dict, name: str) -> None:
    """The configuration's kernel built where the workflow's build_kernel rule puts it, if it is not there yet."""
    from longctx.attention.build import CUDA_ARCHS, build

    kernel = config["configurations"][name].get("kernel")
    if kernel and not (ROOT / "build" / "kernels" / kernel / "manifest.json").exists():
        k = config["kernels"][kernel]
        print(f"building kernel {kernel} (the build_kernel rule's output is missing)")
        build(kernel, k["kind"], [str(ROOT / p) for p in k["sources"]], str(ROOT / "build" / "kernels" / kernel),
              tuple(k.get("cuda_archs") or CUDA_ARCHS))


def compare(f_pred: dict, f_s: float, a_pred: dict, a_s: float, target: float) -> bool:
    ok = []
    for kind in ("prefill", "decode"):
        fp, ap_ = f_pred.get(kind), a_pred.get(kind)
        if fp and ap_:
            inside = fp["lo"] <= ap_["predicted"] <= fp["hi"]
            narrow = ap_["relative_interval"] <= target
            ok += [inside, narrow]
            print(f"{kind}: adaptive prediction {'inside' if inside else 'OUTSIDE'} the fixed sweep's interval; its interval "
                  f"{ap_['relative_interval']:.1%} {'within' if narrow else 'WIDER than'} the target")
        else:
            ok.append(False)
    half = a_s <= f_s / 2
    print(f"server time: adaptive {a_s:.1f} s against fixed {f_s:.1f} s ({a_s / f_s:.0%}): "
          f"{'within' if half else 'MORE than'} half")
    return all(ok) and half


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "config" / "longctx.yaml"))
    ap.add_argument("--configuration")
    ap.add_argument("--target", type=float, default=0.25)
    ap.add_argument("--budget", type=float, help="the adaptive sweep's budget_s (default: half the fixed sweep's server time, "
                    "measured first: the goal's time, as the sweep's own limit)")
    ap.add_argument("--repeat", type=int, default=1, help="pairs of sweeps, fixed then adaptive, one after the other: this "
                    "machine's speed drifts over minutes, and from the second pair on each fixed sweep is also set against "
                    "the previous one's interval (how often the fixed sweep repeated lands inside its own interval)")
    a = ap.parse_args()
    raw = lcfg.read(a.config)
    name = a.configuration or next(iter(raw["configurations"]))
    raw["configurations"] = {name: {**raw["configurations"][name], "load": False, "prefix": False}}
    raw["protocol"] = {**raw.get("protocol", {}), "itl_depth": {"length": None}, "needle": {"enabled": False}}
    fixed = lcfg.validate(raw)
    ensure_kernel(fixed, name)
    lengths = fixed["lengths"]
    work = Path(tempfile.mkdtemp(prefix="longctx-adaptive-"))
    print(f"configuration {name}; fixed lengths {lengths}; target {a.target:.0%}")
    met, repeats, previous = 0, [], None
    dev = {"adaptive against fixed": [], "fixed against the previous fixed": []}  # |relative difference| of the predictions
    for i in range(a.repeat):
        print(f"--- pair {i + 1} of {a.repeat}")
        f_pred, f_s, f_len = run(fixed, name, work / f"fixed-{i}")
        show("fixed sweep", f_pred, f_s, f_len)
        if previous:
            dev["fixed against the previous fixed"].append({k: abs(f_pred[k]["predicted"] / previous[k]["predicted"] - 1)
                                                            for k in previous if k in f_pred})
            repeats.append(all(previous[k]["lo"] <= f_pred[k]["predicted"] <= previous[k]["hi"] for k in previous if k in f_pred))
            print(f"  the fixed sweep repeated: {'inside' if repeats[-1] else 'OUTSIDE'} the previous fixed sweep's intervals")
        previous = f_pred
        budget = a.budget or f_s / 2
        adaptive = lcfg.validate({**raw, "lengths": {"adaptive": {"min": lengths[0], "max": lengths[-1], "ratio": 2,
                                                                  "target_relative_interval": a.target, "budget_s": budget}}})
        print(f"adaptive grid {lcfg.length_grid(adaptive)}, budget {budget:.1f} s")
        a_pred, a_s, a_len = run(adaptive, name, work / f"adaptive-{i}")
        show("adaptive sweep", a_pred, a_s, a_len)
        sweep = json.loads((work / f"adaptive-{i}" / "raw" / "sweep.json").read_text())
        for step in sweep["path"]:
            print(f"  step {step['step']}: {step['trials']} at {step['length']:,}, predicted {step['predicted_s'] or 0:.2f} s, "
                  f"took {step.get('spent_s', 0):.2f} s: {step['reason']}")
        print(f"  confirmation at max: {'inside' if sweep['outcome'].get('inside') else 'outside'} the prediction")
        dev["adaptive against fixed"].append({k: abs(a_pred[k]["predicted"] / f_pred[k]["predicted"] - 1)
                                              for k in f_pred if k in a_pred})
        good = compare(f_pred, f_s, a_pred, a_s, a.target)
        met += good
        print(f"pair {i + 1}: goal {'met' if good else 'not met'}")
    for what, rows in dev.items():
        if rows:
            print(f"{what}: median difference at max " + ", ".join(
                f"{'TTFT' if k == 'prefill' else 'decode step'} {statistics.median(r[k] for r in rows if k in r):.1%}"
                for k in ("prefill", "decode") if any(k in r for r in rows)) + f" ({len(rows)} pair(s))")
    print(f"goal met in {met} of {a.repeat} pair(s)"
          + (f"; the fixed sweep repeated landed inside its predecessor's intervals in {sum(repeats)} of {len(repeats)}"
             if repeats else "") + f" (work in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
