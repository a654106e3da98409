"""Drift: how far the machine moved during a run and between two runs, from the metronome's readings
(longctx.measure.metronome), and a comparison across time read against it.

A reading (one point of a run) gives up to four figures, its SERIES: the request TTFT and the request TPOT (the median
of the point's short requests through the configuration's own server), the machine probe (the median seconds of a matmul
and a memory copy in a process of its own, no code of the server's or the kernel's in it) and, where the configuration's
kernel is native, the kernel call (the median seconds of a call of it at a fixed shape and length, alone).

- within(readings): the run's drift: per series the ratio of its slowest point to its fastest; the run's figure is the
  largest of those ratios less one (0.32: some series' slowest point took 32% longer than its fastest point).
- between(before, now, same_code): the drift between two runs: each series' readings of both runs pooled, the same
  ratio. The request and kernel series count only where the two runs ran the same code (an edit of the engine or of
  the kernel under study can change the short request, and the kernel call, themselves); the machine probe always
  counts.
- verdict(error, drift, tolerance): a comparison's error (predicted over measured less one, or one measurement over
  another less one) read against the drift it was measured under. A machine that moved by a factor D while the two
  sides were measured could have moved either side by up to D, so the error of the thing compared (the model's, the
  stages') lies between (1 + error) / D - 1 and (1 + error) x D - 1: it passes where that whole range is within
  the tolerance, fails where none of it is, and is inconclusive otherwise (an error within the drift always is).
- lone_request(...): the sweep's lone request against the load stage's closed loop of one at the same length: where
  the load stage sent the sweep's lone request just before and after the loop (interleaved), against the drift
  between those two blocks; else the sweep's own trials against the drift of the readings around the two stages
  (through_load).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.numbers import finite

# the figures of a reading: (what it is, in words; whether it is the configuration's own request)
SERIES = {"probe": ("machine probe", False), "ttft": ("request TTFT", True), "tpot": ("request TPOT", True),
          "kernel": ("kernel call", True)}
ORDER = ("start", "after_sweep", "after_load", "end")  # longctx.measure.metronome.POINTS
QUANTITIES = {"ttft": "TTFT", "tpot": "TPOT"}


def value(reading: dict, series: str) -> float | None:
    """A reading's figure of one series (seconds), None where it has none (its requests or its probe failed)."""
    if series in ("probe", "kernel"):
        x = (reading.get(series) or {}).get("median_s")
    else:
        x = reading.get(f"{series}_s")
    x = finite(x)
    return x if x is not None and x > 0 else None


def _label(reading: dict) -> str:
    return str(reading.get("point") or "?").replace("_", " ")


def _spread(values: list[tuple[str, float]]) -> dict | None:
    """The ratio of the slowest to the fastest of (label, seconds), with both, or None with fewer than two."""
    if len(values) < 2:
        return None
    low, high = min(values, key=lambda v: v[1]), max(values, key=lambda v: v[1])
    return {"ratio": high[1] / low[1], "low": low[1], "high": high[1], "fastest": low[0], "slowest": high[0],
            "n": len(values)}


def _figure(spreads: dict[str, dict], where: str, left_out: str | None = None, source: str = "metronome") -> dict | None:
    if not spreads:
        return None
    worst = max(spreads, key=lambda k: spreads[k]["ratio"])
    drift = spreads[worst]["ratio"] - 1
    parts = [f"{SERIES[k][0]} 1.00 to {s['ratio']:.2f} ({s['fastest']} to {s['slowest']})" for k, s in
             sorted(spreads.items(), key=lambda kv: -kv[1]["ratio"])]
    words = (f"the machine moved by up to {drift:.0%} {where} ({source}: {'; '.join(parts)}"
             + (f"; {left_out}" if left_out else "") + ")")
    return {"drift": drift, "worst": worst, "series": spreads, "words": words}


def within(readings: list[dict] | None, points: tuple[str, ...] | None = None, where: str = "within the run",
           source: str = "metronome") -> dict | None:
    """The drift of one run (module docstring) over its readings (those at `points`, where given): {"drift": the
    fraction, "worst": the series that gave it, "series": {series: its ratio, fastest and slowest figures and
    points}, "points": readings used, "words", saying `where` (over the runs measured, where the readings are of
    several)}. None where no series has two readings."""
    rs = [r for r in readings or [] if points is None or r.get("point") in points]
    runs = {r.get("run_id") for r in rs}
    spreads = {}
    for key in SERIES:
        values = [(_label(r) + (f" of run {str(r.get('run_id'))[:8]}" if len(runs) > 1 else ""), v)
                  for r in rs if (v := value(r, key)) is not None]
        if (s := _spread(values)) is not None:
            spreads[key] = s
    figure = _figure(spreads, where if len(runs) <= 1 else f"{where}, over the {len(runs)} runs measured",
                     source=source)
    if figure is not None:
        figure["points"] = len(rs)
    return figure


def between(before: list[dict] | None, now: list[dict] | None, same_code: bool) -> dict | None:
    """The drift between two runs (module docstring): before's and now's readings (a version record's
    measurements["metronome"][configuration]) pooled per series; the request series only where same_code (the two
    ran the same engine and kernel code). {"drift": the fraction (0 or more), "worst", "series" (each also with
    "shift": now's median over before's), "same_code", "words"}; None where a side has no reading with a figure."""
    sides = {"before": before or [], "now": now or []}
    spreads = {}
    for key, (_, own) in SERIES.items():
        if own and not same_code:
            continue
        values = {side: [(f"{_label(r)} of the run {side}", v) for r in rs if (v := value(r, key)) is not None]
                  for side, rs in sides.items()}
        if not values["before"] or not values["now"]:
            continue
        s = _spread(values["before"] + values["now"])
        s["shift"] = float(np.median([v for _, v in values["now"]]) / np.median([v for _, v in values["before"]]))
        spreads[key] = s
    kernel = any(value(r, "kernel") is not None for rs in sides.values() for r in rs)
    left_out = None if same_code else (f"the requests{' and the kernel call' if kernel else ''} left out: the two runs "
                                       "ran different code")
    figure = _figure(spreads, "between the two runs", left_out)
    if figure is not None:
        figure["same_code"] = same_code
    return figure


AROUND_LOAD = "around the sweep and the load stage"  # where the readings of through_load are


def through_load(readings: list[dict] | None) -> list[dict]:
    """The readings around a run's sweep and its load stage: per run its start, the point between the two, and the
    first point after the load stage (after_load, else the end): what a comparison of the two stages was measured
    under."""
    out = []
    for run in dict.fromkeys(r.get("run_id") for r in readings or []):
        rs = [r for r in readings if r.get("run_id") == run]
        after = "after_load" if any(r.get("point") == "after_load" for r in rs) else "end"
        out += [r for r in rs if r.get("point") in ("start", "after_sweep", after)]
    return out


def verdict(error: float, drift: float | None, tolerance: float = 0.0, what: str = "the error",
            signed: bool = True) -> dict:
    """error (a fraction: predicted over measured less one, or one measurement over another less one; with signed
    False a magnitude, such as a median absolute error) read against the drift it was measured under (module
    docstring): {"verdict": "pass" | "fail" | "inconclusive", "low", "high": the range the error of the thing compared
    lies in once the machine's move is allowed for, "within": whether the error is within the drift, "words", naming
    the error `what`}. Without a drift (None: no metronome), the error alone against the tolerance, and no words."""
    if drift is None:
        return {"verdict": "pass" if abs(error) <= tolerance else "fail", "error": error, "drift": None, "low": error,
                "high": error, "within": False, "tolerance": tolerance, "words": None}
    f, d = 1 + error, 1 + drift
    low, high = f / d - 1, f * d - 1
    within_drift = low <= 0 <= high
    said = f"{what}, {error:+.0%}" if signed else f"{what}, {error:.0%}"
    moved = f"the {drift:.0%} the machine moved while it was measured"
    if -tolerance <= low and high <= tolerance:
        outcome, words = "pass", f"{said}, stays within {tolerance:.0%} even with {moved}"
    elif low > tolerance or high < -tolerance:
        outcome, words = "fail", f"{said}, is beyond {moved}" + (f" and the {tolerance:.0%} held to" if tolerance else "")
    elif within_drift:
        outcome, words = "inconclusive", f"inconclusive: {said}, is within {moved}"
    else:
        outcome, words = "inconclusive", (f"inconclusive: with {moved}, {said}, could be anywhere from {low:+.0%} to "
                                          f"{high:+.0%} without that move, across the {tolerance:.0%} held to")
    return {"verdict": outcome, "error": error, "drift": drift, "low": low, "high": high, "within": within_drift,
            "tolerance": tolerance, "words": words}


def twin_drift(twins: dict, what: str = "loop of one") -> dict | None:
    """The drift over one load point, from the sweep's lone request sent just before it and just after it
    (analysis.load_summary.sweep_twins: each side's medians): the ratio of the slower side to the faster, per request
    figure, as within() reads the metronome's points. None without both sides."""
    sides = [{"point": f"{side} the {what}", "ttft_s": (twins.get(side) or {}).get("ttft"),
              "tpot_s": (twins.get(side) or {}).get("tpot")} for side in ("before", "after")]
    return within(sides, where=f"over the {what}", source="the sweep's lone request before and after it")


def lone_request(results: pd.DataFrame, load: dict | None, readings: list[dict] | None) -> dict:
    """One configuration's lone request measured twice: by the sweep and by the load stage (its closed loop of one at
    that length, load.json's p50). Where the load stage sent the sweep's lone request just before and just after the
    loop (load.json's point's sweep_twins: the sweep's code, interleaved with the loop), that is the sweep's side, and the
    drift it is read against is the one between those two blocks (twin_drift), seconds apart; else the sweep's own
    trials at the length (results.csv), minutes before, against the drift of the metronome's readings around the two
    stages (within of through_load). Per such length {"length", "interleaved", "sweep": {q: median, "n"}, "load": {q:
    p50, "n"}, "ratio": {q: load over sweep}, "drift": the figure read against, "verdicts": {q: verdict(ratio - 1,
    drift)}}, and the metronome's figure; the stages measure the same request, so there is no tolerance: a
    difference beyond the drift is the stages'."""
    figure = within(through_load(readings), where=AROUND_LOAD)
    ok = results[results["status"].eq("ok") & pd.to_numeric(results["concurrency"], errors="coerce").eq(1)]
    rows = []
    for p in (load or {}).get("closed") or []:
        if finite(p.get("level")) != 1:
            continue
        length = int(p["length"])
        twin = p.get("sweep_twins") if (p.get("sweep_twins") or {}).get("n") else None
        trials = ok[pd.to_numeric(ok["length"], errors="coerce").eq(length)]
        if twin is None and trials.empty:
            continue
        moved = twin_drift(twin) if twin is not None else figure
        row = {"length": length, "interleaved": twin is not None,
               "sweep": {"n": twin["n"] if twin is not None else int(len(trials))}, "load": {"n": p.get("n")},
               "ratio": {}, "drift": moved, "verdicts": {}}
        for q in QUANTITIES:
            if twin is not None:
                row["sweep"][q] = twin.get(q)
            else:
                swept = pd.to_numeric(trials[f"{q}_s"], errors="coerce").dropna()
                row["sweep"][q] = float(swept.median()) if len(swept) else None
            loaded = finite(((p.get(q) or {}).get("p50") or {}).get("value"))
            row["load"][q] = loaded
            if row["sweep"][q] and loaded:
                row["ratio"][q] = loaded / row["sweep"][q]
                row["verdicts"][q] = (verdict(row["ratio"][q] - 1, moved["drift"], 0.0, "the difference")
                                      if moved is not None else None)
        if row["ratio"]:
            rows.append(row)
    return {"rows": rows, "drift": figure}
