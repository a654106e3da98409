"""What if: each configuration's serving model, checked against its measured load points, then asked about
settings nobody measured -> data/whatif.json.

- The serving model (longctx.analysis.simulate.Costs) comes from fits.json: the prefill fit's a, b, c and the
  decode fit's t0 and beta; its bootstrap draws (paired by index) give the intervals. The decode batch's cost per
  request beyond the first, r, is the one figure fitted on load points: it is chosen (a grid of R_GRID values) to fit
  the measured closed-loop points with more than one request in flight (their median TPOT, in log), and refitted in
  every bootstrap draw on the draw's own fits, at the median's low end, the median or its high end in turn (r_end:
  the interval load_summary gives the median of the loop's few requests), so that the intervals carry its
  uncertainty, the loops' own as well as the fits'. Without such a point, r = 0 and the model says so.
- The scheduler's rules are the adapter's (EngineAdapter.scheduler_rules): a configuration whose engine has none
  that longctx knows (a server someone else runs) is not simulated, with the reason.
- Checked, out of sample only: every measured closed-loop and open-loop point is simulated with the same workload
  (the closed loop's concurrency, requests, prompt and output; the open loop's own scheduled arrivals) and every
  interference probe with its background streams; a point r is fitted to is predicted with r fitted to the other
  points only (leave one point out: left_out), so that no figure checked was fitted on. Per point the measured and
  predicted p50 and p90 of TTFT and TPOT (p90 only where the point has the samples for it:
  longctx.analysis.load_summary.MIN_SAMPLES) and the interference's worst stall, with the error predicted /
  measured - 1. The headline: the median absolute error at p50. The model is calibrated on the sweep, minutes before
  the load points; where the load stage sent the sweep's lone request just before and just after a point
  (load.sweep_twins), the model's lone request at that length is first set to what those measured (`anchor`: its
  prefill costs and its decode costs each scaled), so that its calibration is interleaved with its check points
  and a move of the machine between the stages cancels; the row is then read against the drift between its two
  blocks; a closed loop of one so bracketed is the lone request the model was set to, so it is not checked (the
  load section compares the two). Any other row is read against the drift the run's metronome measured around the sweep and the load stage
  (longctx.analysis.drift: within the readings of through_load). Each row's `verdict` and the headline's are pass,
  fail or inconclusive against TOLERANCE widened by that drift (`quoted`). A closed loop that did not hold its level
  (longctx.analysis.load_summary's `held`: the client kept off its CPUs) ran another workload than the one
  simulated: its rows say so and stay out of the headline and of r's fit.
- What if: the `whatif` grid (max-running-requests, chunked-prefill size, mem-fraction-static through the memory
  planner's pool, concurrency or arrival rate, length) answered per setting with the predicted closed loop at each
  concurrency and length, and the open loop at each rate (a seeded schedule, as the load workloads draw it): its p90 TTFT and TPOT, goodput against the `slo` section (longctx.analysis.slo.goodput), and the
  predicted frontier, the longest length that meets the SLOs at each concurrency (bisected between the grid's
  lengths to 2%). Marked as predicted.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import write_atomic
from ..core.numbers import finite, json_plain
from ..measure.load import arrival_schedule, background_tokens
from ..specs.pool import observed_pool
from .load import page_size, victim_figures
from .load_summary import min_samples
from .memory import adapter_of, memory_model, pool_tokens
from .drift import AROUND_LOAD, through_load, twin_drift, verdict, within
from .simulate import TOKEN_BUDGET, TURNAROUND, Costs, Rules, simulate
from .slo import goodput

log = logging.getLogger("longctx.analysis.whatif")

FORMAT = "longctx.whatif/1"
DRAWS = 24  # bootstrap draws simulated per measured point (the intervals)
R_GRID = 41  # values of r tried in each of two grids, the second around the first's best
QUANTITIES = ("ttft", "tpot")
FRONTIER_TOLERANCE = 0.02  # the predicted frontier is bisected to within 2% of its length
TOLERANCE = 0.15  # the target: a figure further off than this, outside the model's interval, is a miss
DEFAULT_GRID = {"configurations": None, "max_running_requests": [], "chunked_prefill_size": [],
                "mem_fraction_static": [], "concurrency": [], "rates": [], "arrival": "poisson", "burstiness": 1.0,
                "seed": 0, "lengths": [], "output_tokens": 64, "requests": 32}


def costs_of(fit: dict) -> tuple[Costs | None, list[Costs], str | None]:
    """The serving model of one configuration's fits.json entry, its bootstrap draws' models, and why there is
    none (a fit missing)."""
    p, d = fit.get("prefill") or {}, fit.get("decode") or {}
    if not p or not d:
        return None, [], f"no {'prefill' if not p else 'decode'} fit (fits.json)"
    best = model(p["a_s"], p["b_s_per_token"], p["c_s_per_token2"], d["t0_s"], d["beta_s_per_token"])
    pd_, dd = p.get("draws") or [], d.get("draws") or []
    draws = [model(*x[:3], *y[:2]) for x, y in zip(pd_, dd)]
    return best, draws, None


def model(a: float, b: float, c: float, t0: float, beta: float) -> Costs:
    """The serving model of one set of fits: a forward pass's fixed cost s is the decode step's, t0 (a pass whose
    token work is one token a request), at most the prefill's a (a prompt pays at least one pass)."""
    return Costs(a=a, b=b, c=c, t0=t0, beta=beta, s=min(t0, a))


def rules_of(entry: dict, load: dict | None) -> tuple[Rules | None, dict]:
    """A configuration's scheduler rules (its adapter's scheduler_rules, the pool the server allocated, the page it
    ran with: longctx.analysis.load.page_size), and the adapter's words on them."""
    pool = observed_pool(entry)[0] or (load or {}).get("pool_tokens")
    said = adapter_of(entry).run_rules(entry, pool)
    if said is None or said.get("not_simulated"):  # rules the simulation does not have, said why
        return None, said or {}
    fields = {f.name for f in dataclasses.fields(Rules)}
    return Rules(**{k: v for k, v in said.items() if k in fields}, page=page_size(entry)), said


def _quantile(values: list[float], q: float) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.quantile(v, q)) if len(v) >= min_samples(q) else None


def _summary(results: list[dict]) -> dict:
    """p50 and p90 of TTFT and TPOT over the successful requests (p90 only with its samples)."""
    ok = [r for r in results if not r["failed"]]
    return {q: {"p50": _quantile([r[q] for r in ok], 0.5), "p90": _quantile([r[q] for r in ok], 0.9)} for q in QUANTITIES}


def _closed(costs: Costs, rules: Rules, c: int, n: int, prompt: int, output: int,
            starts: list[float] | None = None) -> list[dict]:
    return simulate(costs, rules, closed=(int(c), int(n), int(prompt), int(output)), starts=starts)[0]


def first_step(starts: list[float] | None, clients: int, k: int) -> list[float]:
    """A closed loop's first sends with k of them in the server's first step: the first k at once (at 0), the others
    when they were sent, after that step began (at least TURNAROUND after). Which of a loop's first requests reach the
    engine before its first step starts is a race the client's send times do not settle: vLLM's CPU server took 3 of
    4 in one round of the brute force and 1 of 4 in the next two, on the same flags, and each round's TPOT p50 stayed
    in the split its first step made (55 ms against 33). The model's draws of a closed loop each take one split in
    turn (race_split), so that its interval spans what the race can give."""
    sent = list(starts or []) + [0.0] * (clients - len(starts or []))
    return [0.0 if i < k else max(float(t), TURNAROUND) for i, t in enumerate(sent[:clients])]


# Where in its closed loops' median TPOT interval a bootstrap draw fits r, in turn (r_end): a loop of 8 requests has
# its median anywhere between its lowest and its highest TPOT at the interval's 99% (load_summary's order statistics),
# and where they fall in two modes, as a closed loop's often do, the median is the midpoint between them: one such
# loop of 2 on vLLM's CPU server gave r anywhere from 0 to 5.6 ms (the loop of 4 it predicted 30% apart) as its
# median fell. The draws carry that into every interval the model gives.
R_ENDS = ("value", "low", "high")


def r_end(draw: int) -> str:
    """Which figure of its closed loops' median TPOT (R_ENDS) the draw-th bootstrap draw fits r to."""
    return R_ENDS[draw % len(R_ENDS)]


def race_split(draw: int, clients: int) -> int:
    """The first step's split the draw-th bootstrap draw of a closed loop of `clients` takes: 1 to clients in turn,
    each against every end of r in turn (r_end: the split turns once per len(R_ENDS) draws)."""
    return 1 + (draw // len(R_ENDS)) % max(1, int(clients))


def _run_closed(costs: Costs, rules: Rules, p: dict, split: int | None = None) -> list[dict]:
    """A measured closed-loop point simulated: its clients, requests, prompt and output, its first requests sent when
    the client sent them (`starts`, from load_requests.csv: closed_starts); with `split`, that many of them in the
    server's first step (first_step)."""
    starts = p.get("starts") if split is None else first_step(p.get("starts"), int(p["level"]), split)
    return _closed(costs, rules, p["level"], p["n"], p["length"], _output(p), starts)


ANCHOR_ROUNDS = 3  # scalings toward the twins' lone request (each corrects what s, min(t0, a), and the chunks moved)


def scaled(costs: Costs, ttft: float = 1.0, tpot: float = 1.0) -> Costs:
    """The serving model with its prefill costs (a, b, c) times `ttft` and its decode costs (t0, beta, r) times `tpot`;
    a pass's fixed cost s is min(t0, a) of the new ones, as `model` sets it."""
    a, t0 = costs.a * ttft, costs.t0 * tpot
    return dataclasses.replace(costs, a=a, b=costs.b * ttft, c=costs.c * ttft, t0=t0, beta=costs.beta * tpot,
                               r=costs.r * tpot, s=min(t0, a))


def anchor(costs: Costs, rules: Rules, p: dict) -> dict | None:
    """The factors (`scaled`'s ttft and tpot) that make the model's lone request at a load point's length cost what the
    sweep's lone request measured just before and just after that point (its sweep_twins, longctx.measure.loadrun:
    their median TTFT and TPOT, at the tokens they decoded): the model's calibration taken beside each of its check
    points instead of from the sweep minutes before, so that the machine's move between the two cancels and what is
    checked is what the model adds (batching, scheduling, r). Found by scaling ANCHOR_ROUNDS times; r does not enter
    (a lone request decodes alone). None where the point has no twins."""
    t = p.get("sweep_twins") or {}
    want = {q: finite(t.get(q)) for q in QUANTITIES}
    if not t.get("n") or not all(want.values()):
        return None
    out = max(2, int(t.get("output_tokens") or _output(p)))
    k = {"ttft": 1.0, "tpot": 1.0}
    for _ in range(ANCHOR_ROUNDS):
        (alone,) = _closed(scaled(costs, **k), rules, 1, 1, int(p["length"]), out)
        if not alone.get("ttft") or not alone.get("tpot"):
            return None
        k = {q: k[q] * want[q] / alone[q] for q in QUANTITIES}
    return k


def _anchored(costs: Costs, k: dict | None) -> Costs:
    return scaled(costs, **k) if k else costs


def _requests_of(requests: pd.DataFrame, kind: str, p: dict) -> pd.DataFrame:
    """load_requests.csv's rows of one measured point."""
    return requests[(requests["kind"] == kind) & (requests["level"] == p["level"]) & (requests["length"] == p["length"])]


def closed_starts(requests: pd.DataFrame, p: dict) -> list[float] | None:
    """When the closed loop's client sent each of its first `level` requests, from the first (load_requests.csv's
    sent_s): a client sends them a few milliseconds apart, not at once."""
    if requests is None or not len(requests) or "sent_s" not in requests:
        return None
    sel = _requests_of(requests, "closed", p)
    sent = sorted(float(x) for x in sel.sort_values("index")["sent_s"].head(int(p["level"])).dropna())
    return [x - sent[0] for x in sent] if len(sent) == int(p["level"]) else None


def client_stagger(points: list[dict]) -> float:
    """The median gap between a closed loop's first sends over the measured points (0 where none): what the grid's
    closed loops start with, client i at i times it."""
    gaps = [b - a for p in points for a, b in zip(p.get("starts") or [], (p.get("starts") or [])[1:])]
    return float(np.median(gaps)) if gaps else 0.0


def _open(costs: Costs, rules: Rules, arrivals: list[float], prompt: int, output: int) -> list[dict]:
    return simulate(costs, rules, [(t, int(prompt), int(output)) for t in arrivals])[0]


def _interference(costs: Costs, rules: Rules, background: int, bg_length: int, length: int, steady: int,
                  tail: int) -> dict:
    """The probe as the client runs it: `background` streams decode at bg_length, each long enough to decode through
    three times the injected prefill (longctx.measure.load.background_tokens, on this model's own figures); once
    each has decoded `steady` tokens one prompt of `length` is sent; each victim's steady gap, worst gap and extra
    time (longctx.analysis.load.victim_figures) over the simulated token times."""
    alone = lambda L: (costs.a + costs.b * L + costs.c * L * L, costs.t0 + costs.beta * L)  # noqa: E731
    out = background_tokens({"steady_tokens": steady, "tail_tokens": tail, "background_length": bg_length},
                            alone, length, None)
    none = {"worst_gap": None, "extra": None}
    first, _ = simulate(costs, rules, [(0.0, bg_length, out)] * background)
    if any(len(r["times"]) < steady for r in first):
        return none  # a stream that never reached its steady tokens (the pool): no probe
    sent = max(r["times"][steady - 1] for r in first)  # each stream has decoded `steady` tokens
    results, _ = simulate(costs, rules, [(0.0, bg_length, out)] * background + [(sent, length, 2)])
    inj = results[-1]
    if not inj["times"]:
        return none
    figs = [victim_figures({"event_times": r["times"]}, sent, inj["times"][0]) for r in results[:-1]]
    worst = [f["worst_gap_s"] for f in figs if f.get("status") == "ok"]
    extra = [f["extra_s"] for f in figs if f.get("status") == "ok"]
    return {"worst_gap": float(np.median(worst)) if worst else None, "extra": float(np.median(extra)) if extra else None}


def r_points(closed: list[dict]) -> list[dict]:
    """The closed-loop points r is fitted to: more than one request in flight, the level held, a measured median TPOT."""
    return [p for p in closed if (p.get("level") or 0) > 1 and not _held_below(p)
            and finite(((p.get("tpot") or {}).get("p50") or {}).get("value"))]


def _r_target(p: dict, at: str) -> float:
    """A closed-loop point's median TPOT, or one end of its interval (`at`: R_ENDS; the median where it has none)."""
    m = p["tpot"]["p50"]
    return finite(m.get(at)) or m["value"]


def calibrate_r(costs: Costs, rules: Rules, closed: list[dict], other: str = "", at: str = "value") -> tuple[float, str]:
    """r, the decode batch's cost per request beyond the first, fitted to the closed-loop points with more than one
    request in flight (r_points: their measured median TPOT, in log; `at` "low" or "high": the low or high end of
    its interval, r_end), and how it was set (`other`: "other " where the points are the others of one left out)."""
    pts = r_points(closed)
    if not pts:
        return 0.0, f"0: no {other}closed-loop point held more than one request in flight"
    ks = {id(p): anchor(costs, rules, p) for p in pts}  # each point's model at its own time (its twins), r aside
    target = {id(p): _r_target(p, at) for p in pts}

    def err(r: float) -> float:
        c = dataclasses.replace(costs, r=r)
        e = 0.0
        for p in pts:
            pred = _summary(_run_closed(_anchored(c, ks[id(p)]), rules, p))["tpot"]["p50"]
            e += (np.log(pred) - np.log(target[id(p)])) ** 2 if pred else 1e9
        return e

    # a grid, then a finer one around its best: 0 to 4 times the larger of t0 and the measured TPOT (t0 may be 0)
    lo, hi = 0.0, 4 * max(costs.t0, max(target.values()))
    best = 0.0
    for _ in range(2):
        grid_r = np.linspace(lo, hi, R_GRID)
        errs = [err(float(r)) for r in grid_r]
        i = int(np.argmin(errs))
        best = float(grid_r[i])
        step = (hi - lo) / (R_GRID - 1)
        lo, hi = max(0.0, best - step), best + step
    return best, (f"fitted to the median TPOT of {'the ' + other if other else ''}{len(pts)} closed-loop "
                  f"point{'s' if len(pts) != 1 else ''} with more than one request in flight")


def with_r(costs: Costs, draws: list[Costs], rules: Rules, closed: list[dict],
           other: str = "") -> tuple[Costs, list[Costs], str]:
    """The serving model and its bootstrap draws with r fitted to `closed` (calibrate_r), each draw's r refitted on
    the draw's own fits at one end of the closed loops' median TPOT interval or its middle in turn (r_end), so that
    the intervals carry r's uncertainty: the fits' and the few requests' of the loops it stands on; and how r was set."""
    r, source = calibrate_r(costs, rules, closed, other)
    return (dataclasses.replace(costs, r=r),
            [dataclasses.replace(d, r=calibrate_r(d, rules, closed, at=r_end(j))[0]) for j, d in enumerate(draws)], source)


def left_out(costs: Costs, draws: list[Costs], rules: Rules, closed: list[dict]) -> dict[int, tuple[Costs, list[Costs], str]]:
    """Per point r is fitted to (by id), the model with r fitted to the other points only (with_r): the check
    predicts each point out of sample, by a model that never saw it."""
    pts = r_points(closed)
    return {id(p): with_r(costs, draws, rules, [q for q in pts if q is not p], "other ") for p in pts}


def _output(point: dict) -> int:
    return max(2, int(round(finite(point.get("output_tokens")) or 16)))


def _measured(p: dict, q: str, which: str) -> float | None:
    return finite(((p.get(q) or {}).get(which) or {}).get("value"))


def _held_below(p: dict) -> str | None:
    """Why a closed-loop point is not the workload simulated: it did not hold its concurrency (load_summary's held)."""
    held = p.get("held") or {}
    if not held.get("below"):
        return None
    stall = f", the client kept off its CPUs up to {held['client_stall_max_s']:.2g} s" if held.get("client_stall_max_s") else ""
    return f"the loop held its {held.get('level')} requests {held['share']:.0%} of the time{stall}"


def _row(kind: str, p: dict, predicted: dict, draws: list[dict], r_source: str | None,
         k: dict | None = None) -> list[dict]:
    rows = []
    excluded = _held_below(p) if kind == "closed" else None
    what = {"closed": f"closed loop of {p['level']:g}", "open": f"open loop at {p['level']:g}/s"}[kind]
    anchored = ({**k, "drift": twin_drift(p["sweep_twins"], f"{what} at {int(p['length']):,} tokens")}
                if k is not None else None)
    for q in QUANTITIES:
        for which in ("p50", "p90"):
            m, v = _measured(p, q, which), predicted[q][which]
            d = [x[q][which] for x in draws if x[q][which] is not None]
            rows.append({"kind": kind, "level": p["level"], "length": p["length"], "n": p.get("n"), "quantity": q,
                         "which": which, "measured": m, "predicted": v,
                         "low": float(np.quantile(d, 0.025)) if len(d) >= 10 else None,
                         "high": float(np.quantile(d, 0.975)) if len(d) >= 10 else None,
                         "error": v / m - 1 if m and v is not None else None,
                         "r_left_out": r_source, "excluded": excluded, "anchor": anchored})
    return rows


def check(costs: Costs, draws: list[Costs], rules: Rules, load: dict, requests: pd.DataFrame, inter: pd.DataFrame,
          interference_cfg: dict, loo: dict | None = None) -> list[dict]:
    """Every measured load point predicted (module docstring): one row per point, quantity and percentile, and one
    per interference length (the victims' worst gap). Every figure is out of sample: a point r was fitted to is
    predicted by the model of `loo` (left_out: r fitted to the other points), its r's source in `r_left_out`."""
    rows = []
    loo = loo or {}
    for kind in ("closed", "open"):
        for p in load.get(kind) or []:
            if not p.get("ok"):
                continue
            own, own_draws, r_source = loo.get(id(p), (costs, draws, None))
            if kind == "closed":  # each draw with its own first-step split (race_split): the point as sent
                run = lambda c, j=None: _run_closed(c, rules, p, None if j is None else race_split(j, p["level"]))  # noqa: E731
            else:
                arrivals = sorted(float(x) for x in _requests_of(requests, "open", p)["scheduled_s"].dropna())
                if not arrivals:
                    continue
                run = lambda c, j=None, a=arrivals: _open(c, rules, a, p["length"], _output(p))  # noqa: E731
            k = anchor(own, rules, p)
            if k is not None and kind == "closed" and p["level"] == 1:
                # the loop of one is the lone request the model is set to beside it: no check out of sample (the
                # load section compares the two: longctx.analysis.drift.lone_request)
                continue
            # each draw by its index among the model's draws (its r's end, r_end, and its split, race_split, pair by it)
            indexed = list(enumerate(own_draws[:DRAWS]))
            if k is not None:  # each draw set to the same twins by its own factors
                indexed = [(j, _anchored(d, kd)) for j, d in indexed if (kd := anchor(d, rules, p)) is not None]
            rows += _row(kind, p, _summary(run(_anchored(own, k))), [_summary(run(c, j)) for j, c in indexed], r_source, k)
    for p in (load.get("interference") or {}).get("points") or []:
        m = finite((p.get("worst_gap") or {}).get("value"))
        sel = inter[inter["length"] == p["length"]]
        bg_len = int(sel["background_length"].dropna().iloc[0]) if len(sel) and sel["background_length"].notna().any() else None
        if m is None or bg_len is None:
            continue
        args = (int(p["background"]), bg_len, int(p["length"]), interference_cfg["steady_tokens"], interference_cfg["tail_tokens"])
        v = _interference(costs, rules, *args)["worst_gap"]
        d = [x for x in (_interference(c, rules, *args)["worst_gap"] for c in draws[:DRAWS]) if x is not None]
        rows.append({"kind": "interference", "level": p["background"], "length": p["length"], "n": p.get("n"),
                     "quantity": "worst_gap", "which": "p50", "measured": m, "predicted": v,
                     "low": float(np.quantile(d, 0.025)) if len(d) >= 10 else None,
                     "high": float(np.quantile(d, 0.975)) if len(d) >= 10 else None,
                     "error": v / m - 1 if m and v is not None else None, "r_left_out": None, "excluded": None,
                     "anchor": None})
    return rows


def errors(rows: list[dict]) -> dict:
    """The median absolute error at p50 and at p90 over every point and quantity, each out of sample (check), a point
    that did not run the workload simulated (a closed loop below its level) left out."""
    rows = [r for r in rows if not r.get("excluded")]

    def med(which):
        e = [abs(r["error"]) for r in rows if r["which"] == which and r["error"] is not None]
        return {"median_abs": float(np.median(e)) if e else None, "n": len(e)}
    return {"p50": med("p50"), "p90": med("p90")}


def quoted(rows: list[dict], readings: list[dict] | None) -> dict:
    """The check read against the drift it was measured under (module docstring): a row whose model was set to the
    sweep's lone request beside its point (its `anchor`) against the drift between the two blocks around that point
    (longctx.analysis.drift.twin_drift), seconds apart; any other row (no twins, or an interference probe) against
    the drift of the metronome's readings around the sweep and the load stage (within of through_load; None without
    a metronome). Each row's `verdict` (pass, fail or inconclusive: longctx.analysis.drift.verdict against TOLERANCE),
    and the headline's: the verdict of the median figure at p50 (by the size of its error, the lower of two middle
    ones; its error signed: a machine that moved by D could have made a figure D times slower or faster), against the
    largest drift any of the figures at p50 was read against. {"drift": that figure (with words), "metronome": the
    metronome's, "anchored": how many rows were set to their twins, "verdict"}."""
    metronome = within(through_load(readings), where=AROUND_LOAD)

    def drift_of(r: dict) -> dict | None:
        return (r.get("anchor") or {}).get("drift") or metronome

    for r in rows:
        moved = drift_of(r)
        r["verdict"] = (verdict(r["error"], moved["drift"] if moved else None, TOLERANCE)["verdict"]
                        if r["error"] is not None else None)
    at_p50 = [r for r in rows if r["which"] == "p50" and r["error"] is not None and not r.get("excluded")]
    anchored = sum(bool(r.get("anchor")) for r in rows)
    figures = [m for r in at_p50 if (m := drift_of(r)) is not None]
    figure = max(figures, key=lambda f: f["drift"]) if figures else metronome
    if anchored and figure is not None and figure is not metronome:
        figure = {**figure, "words": figure["words"] + ", the largest move over any point checked"}
    p50 = sorted((r["error"] for r in at_p50), key=abs)
    median = p50[(len(p50) - 1) // 2] if p50 else None
    return {"drift": figure, "metronome": metronome, "anchored": anchored,
            "verdict": verdict(median, figure["drift"] if figure else None, TOLERANCE, "the median error at p50")
            if median is not None else None}


def grid_point(costs: Costs, rules: Rules, kind: str, level: float, L: int, g: dict, slo: dict,
                conf: float, stagger: float = 0.0, split: int | None = None) -> tuple[dict, int]:
    """One predicted point of the grid, a closed loop of `level` clients (client i sending its first request at i
    times `stagger`; with `split`, that many of them in the server's first step: first_step) or an open loop of `level`
    arrivals a second (the seeded schedule the load workloads use, longctx.measure.load.arrival_schedule): its p50 and
    p90, goodput against the SLOs, failures and retractions."""
    n, out = int(g["requests"]), int(g["output_tokens"])
    if kind == "concurrency":
        starts = [i * stagger for i in range(int(level))]
        res, events = simulate(costs, rules, closed=(int(level), max(n, int(level)), int(L), out),
                               starts=starts if split is None else first_step(starts, int(level), split))
    else:
        arrivals = arrival_schedule(float(level), n, g["arrival"], g["burstiness"], g["seed"])
        res, events = simulate(costs, rules, [(t, int(L), out) for t in arrivals])
    span = max((x["times"][-1] for x in res if x["times"]), default=None)
    df = pd.DataFrame({"status": ["ok" if not x["failed"] else "failed" for x in res],
                       "ttft_s": [x["ttft"] for x in res], "tpot_s": [x["tpot"] for x in res],
                       "itl_max_s": [x["max_gap"] for x in res]})
    gp = goodput(df, slo, L, span, conf)
    s = _summary(res)
    stalls = [x["max_gap"] for x in res if x["max_gap"] is not None and not x["failed"]]
    return {kind: level, "length": L, "ttft_p50": s["ttft"]["p50"], "ttft_p90": s["ttft"]["p90"],
            "tpot_p50": s["tpot"]["p50"], "tpot_p90": s["tpot"]["p90"], "stall_max": max(stalls, default=None),
            "goodput_share": gp["share"],
            "goodput_rate_s": gp["rate_s"], "failed": sum(1 for x in res if x["failed"]),
            "retractions": sum(x["retractions"] for x in res), "n": len(res)}, events


def _passes(p: dict, slo: dict) -> bool:
    return (p["goodput_share"] or 0) >= slo.get("attainment", 0.9)


def _frontier(costs: Costs, rules: Rules, kind: str, level: float, points: list[dict], g: dict, slo: dict,
              conf: float, stagger: float = 0.0) -> tuple[dict, int]:
    """The longest length meeting the SLOs at a concurrency or an arrival rate (kind): the grid's longest pass before
    its first fail, then bisected (geometric means) between them to within FRONTIER_TOLERANCE; open_above where
    nothing in the grid failed."""
    pts = sorted((p for p in points if p.get(kind) == level), key=lambda p: p["length"])
    passed = [p for p in pts if _passes(p, slo)]
    fail = next((p for p in pts if not _passes(p, slo)), None)
    lo = max((p["length"] for p in passed if fail is None or p["length"] < fail["length"]), default=None)
    events = 0
    best = next((p for p in pts if p["length"] == lo), None)
    if lo is not None and fail is not None:
        hi = fail["length"]
        while hi / lo > 1 + FRONTIER_TOLERANCE:
            mid = int(round((lo * hi) ** 0.5))
            if mid in (lo, hi):
                break
            p, ev = grid_point(costs, rules, kind, level, mid, g, slo, conf, stagger)
            events += ev
            if _passes(p, slo):
                lo, best = mid, p
            else:
                hi = mid
    return {kind: level, "max_length": lo, "open_above": fail is None and lo is not None,
            "goodput_rate_s": best["goodput_rate_s"] if best else None}, events


def grid(costs: Costs, rules: Rules, mm: dict | None, g: dict, slo: dict, level: float,
         stagger: float = 0.0) -> tuple[list[dict], int]:
    """The what-if grid of one configuration: per setting, per concurrency (arrival rate) and length, the predicted
    closed (open) loop and its goodput; per setting and concurrency (rate) the predicted frontier (_frontier). Also
    the events simulated."""
    settings = list(itertools.product(g["max_running_requests"] or [rules.max_running],
                                      g["chunked_prefill_size"] or [rules.chunk],
                                      g["mem_fraction_static"] or [None]))
    out, events = [], 0
    for mr, chunk, frac in settings:
        pool, pool_source = rules.pool_tokens, "as measured"
        if frac is not None:
            pool = pool_tokens(mm, float(frac)) if mm else None
            pool_source = f"the memory planner at mem-fraction-static {frac:g}"
            if not pool:
                out.append({"max_running_requests": mr, "chunked_prefill_size": chunk, "mem_fraction_static": frac,
                            "reason": "the memory planner cannot size this configuration's pool at this "
                                      "mem-fraction-static" if pool is None else "no page fits the pool at this fraction"})
                continue
        if rules.policy == TOKEN_BUDGET and mr and chunk:
            mr = min(mr, chunk)  # vLLM caps max-num-seqs at the step's budget
        r = dataclasses.replace(rules, max_running=mr, chunk=chunk, pool_tokens=pool)
        points, frontier = [], []
        for kind, levels in (("concurrency", g["concurrency"]), ("rate", g["rates"])):
            for x, L in itertools.product(levels, g["lengths"]):
                p, ev = grid_point(costs, r, kind, x, L, g, slo, level, stagger)
                points.append(p)
                events += ev
            for x in levels:
                f, ev = _frontier(costs, r, kind, x, points, g, slo, level, stagger)
                frontier.append(f)
                events += ev
        out.append({"max_running_requests": mr, "chunked_prefill_size": chunk, "mem_fraction_static": frac,
                    "pool_tokens": pool, "pool_source": pool_source, "points": points, "frontier": frontier})
    return out, events


def chunk_effect(settings: list[dict], rules: Rules, costs: Costs) -> str | None:
    """What the grid's chunk axis shows, in words, where it is not the plain trade (a smaller chunk costs TTFT, s a
    pass, and buys shorter stalls): settings that differ only in their chunk and predict the same figures at every
    point (no prompt of the grid is chunked at any of them), or rules under which a prefill runs all its chunks
    before the next decode step (PREFILL_FIRST without mixed chunks), where a smaller chunk only costs."""
    words = []
    groups: dict = {}
    for x in settings:
        if x.get("points") is not None:
            groups.setdefault((x["max_running_requests"], x["mem_fraction_static"]), []).append(x)
    figures = lambda x: [(p["ttft_p50"], p["ttft_p90"], p["tpot_p50"], p["tpot_p90"], p["stall_max"])  # noqa: E731
                         for p in x["points"]]
    same = [g for g in groups.values() if len(g) > 1 and all(figures(x) == figures(g[0]) for x in g[1:])]
    if same:
        chunks = sorted({x["chunked_prefill_size"] for g in same for x in g if x["chunked_prefill_size"]})
        words.append(f"the chunk sizes {', '.join(f'{c:,}' for c in chunks)} predict the same figures at every point of "
                     "the grid: none of its prompts is chunked at any of them, so the chunk does not matter here")
    if rules.policy != TOKEN_BUDGET and not rules.mixed_chunk and len({x["chunked_prefill_size"] for x in settings}) > 1:
        words.append("under these rules a prefill runs all its chunks before the next decode step (no mixed chunks), "
                     f"so a smaller chunk does not shorten a running stream's stall: it only adds passes "
                     f"({costs.s * 1e3:.3g} ms each) to the prompt's TTFT")
    return "; ".join(words) or None


def serving_model(name: str, entry: dict, fit: dict, ld: dict | None, requests: pd.DataFrame) -> dict:
    """One configuration's serving model as the what-if (and the advice, longctx.analysis.advise) asks it: its costs
    and their bootstrap draws with the wake probe's figures and r fitted to its closed loops, its scheduler's rules,
    its measured closed loops with their first sends, the client's stagger, the leave-one-out models (left_out), its
    memory model (None where the planner cannot size its pool); or {"reason"} where it cannot be simulated."""
    costs, draws, why = costs_of(fit)
    rules, said = rules_of(entry, ld)
    if adapter_of(entry).verify_width(entry.get("args") or {}) > 1:
        why = why or "speculative decoding (a step verifies several tokens) is not in the serving model"
    if rules is None:
        why = why or said.get("not_simulated") or (
            f"the scheduler of {adapter_of(entry).title} is not known to longctx (a server someone else runs: "
            f"configurations.{name}.scheduler can say which it runs)")
    if why:
        return {"reason": why}
    # the wake probe's idle gaps and what each cost (longctx.analysis.load_summary.wake), the shortest's 0
    woke = tuple((x["idle_s"], x["extra_s"]) for x in ((ld or {}).get("wake") or {}).get("points") or [])
    costs = dataclasses.replace(costs, wake=woke)
    draws = [dataclasses.replace(c, wake=woke) for c in draws[:DRAWS]]
    own = requests[requests["configuration"] == name]
    # each closed loop's first requests as its client sent them (a few ms apart), and their median gap for the grid
    closed = [{**p, "starts": closed_starts(own, p)} for p in (ld or {}).get("closed") or []]
    loo = left_out(costs, draws, rules, closed)
    costs, draws, r_source = with_r(costs, draws, rules, closed)
    try:
        mm = memory_model(entry)
    except Exception as e:  # noqa: BLE001 - a pool the planner cannot size leaves mem_fraction_static unanswered
        log.info("%s: no memory model (%s)", name, e)
        mm = None
    return {"costs": costs, "draws": draws, "rules": rules, "said": said, "fit": fit, "closed": closed,
            "stagger": client_stagger(closed), "left_out": loo, "r_source": r_source, "memory": mm, "requests": own}


def whatif(fits: dict, load: dict, provenance: dict, requests: pd.DataFrame, inter: pd.DataFrame, config: dict) -> dict:
    g = {**DEFAULT_GRID, **(config.get("whatif") or {})}
    slo = config.get("slo") or {}
    level = float((fits.get("settings") or {}).get("confidence", 0.95))
    icfg = (config.get("load") or {}).get("interference") or {}
    icfg = {"steady_tokens": int(icfg.get("steady_tokens", 8)), "tail_tokens": int(icfg.get("tail_tokens", 8))}
    out: dict = {"format": FORMAT, "configurations": {}, "grid": g}
    wanted = g.get("configurations")
    for name, entry in (provenance.get("configurations") or {}).items():
        ld = (load.get("configurations") or {}).get(name)
        if wanted is not None and name not in wanted:
            continue
        if wanted is None and not ld:
            continue
        t = time.perf_counter()
        m = serving_model(name, entry, (fits.get("configurations") or {}).get(name) or {}, ld, requests)
        if "reason" in m:
            out["configurations"][name] = {"reason": m["reason"]}
            continue
        costs, draws, rules, said, fit, mm = m["costs"], m["draws"], m["rules"], m["said"], m["fit"], m["memory"]
        stagger, r_source = m["stagger"], m["r_source"]
        rows = check(costs, draws, rules, {**(ld or {}), "closed": m["closed"]}, m["requests"],
                     inter[inter["configuration"] == name], icfg, m["left_out"]) if ld else []
        settings, events = (grid(costs, rules, mm, g, slo, level, stagger) if (g["concurrency"] or g["rates"]) and g["lengths"]
                            else ([], 0))
        out["configurations"][name] = {
            "costs": dataclasses.asdict(costs), "r_source": r_source, "draws": len(draws), "client_stagger_s": stagger,
            "rules": dataclasses.asdict(rules), "rules_source": said.get("source"),
            "rules_notes": (said.get("notes") or []) + [f"the {k} fit failed its quality gate: the model stands on it"
                                                         for k in ("prefill", "decode")
                                                         if not ((fit.get("quality") or {}).get(k) or {}).get("usable", True)],
            "check": rows, "errors": errors(rows), "drift": quoted(rows, (entry.get("metronome") or {}).get("readings")),
            "whatif": settings, "chunk_effect": chunk_effect(settings, rules, costs),
            "events": events,
            "seconds": round(time.perf_counter() - t, 3)}
    return out


def _read_csv(path: str | Path | None, columns: list[str]) -> pd.DataFrame:
    if path and Path(path).exists() and Path(path).stat().st_size:
        return pd.read_csv(path)
    return pd.DataFrame(columns=columns)


def whatif_file(fits_json, load_json, provenance_json, requests_csv, interference_csv, config: dict, out_json) -> dict:
    from .load import INTERFERENCE_COLUMNS, REQUEST_COLUMNS

    read = lambda p: json.loads(Path(p).read_text()) if p and Path(p).exists() else {}  # noqa: E731
    out = whatif(read(fits_json), read(load_json), read(provenance_json), _read_csv(requests_csv, REQUEST_COLUMNS),
                 _read_csv(interference_csv, INTERFERENCE_COLUMNS), config)
    write_atomic(out_json, json.dumps(json_plain(out), indent=1, sort_keys=True))
    return out
