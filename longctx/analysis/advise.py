"""The setting to restart with: the memory planner and the what-if serving model asked the user's question, "which
flags?", for a goal the config states (config key `advise`) -> `longctx advise`.

The goal: the context one request must fit (`context`, tokens), optionally a workload (a closed loop of `concurrency`
clients, or Poisson arrivals at `rate` a second; each request `prompt` tokens in and `output` out), an SLO on it
(`slo`: ttft_s and tpot_s at a `percentile`, 50 or 90) and what to maximise (`maximise`: goodput, the requests a
second that met the SLO; concurrency, the workload's requests the pool holds at once; or context, the longest request
the pool and the context length hold).

Searched, per configuration measured, in its engine's own flag names (the adapter's knob_flags): the requests running
at once (SGLang's max-running-requests, vLLM's max-num-seqs), the tokens of a prefill chunk or a step (SGLang's
chunked-prefill-size, vLLM's max-num-batched-tokens), and where the memory planner models the pool, the share of
memory it is sized from (SGLang's mem-fraction-static). `advise.search` names the values (by those flags); by default
the values around the setting measured: a quarter, half, once and twice its max-running-requests and half, once and
twice its chunk, and mem-fraction-static from 0.05 below the measured one to MAX_FRACTION in steps of 0.01.

Each setting is answered by:
- the memory planner (longctx.analysis.memory): the pool at that fraction, by SGLang's rule, with the req-to-token
  table moved: SGLang sets aside max-running-requests x (context-length + 4) entries before it sizes the pool, so the
  table the measured setting had is in the memory the planner backed out, and a setting with fewer requests frees
  the difference (more where the context length must grow to the goal's). The reserve per GPU: the memory outside the
  static pool, (1 - fraction) x the GPU's memory.
- the serving model (longctx.analysis.whatif.serving_model, longctx.analysis.simulate): the workload simulated under
  the setting's rules and pool, its p50 and p90 TTFT and TPOT and its goodput (longctx.analysis.slo.goodput).

Feasible: the goal's context fits the pool and the context length, and the predicted figures meet the SLO. The pick
maximises the goal among the feasible settings; equal goals go to the larger reserve, then to the setting nearest the
one measured. The runner-up is the next. The pick's and the runner-up's figures get the model's interval (its
bootstrap draws simulated alike). `binding` is the constraint with the least slack at the pick (the KV pool against
the context, the TTFT or TPOT against the SLO, the activation reserve against MAX_FRACTION); where nothing is
feasible it is the constraint that no searched setting met, and `nearest` is the setting that came closest. A value
beyond what was measured (a fraction other than the measured one, a concurrency above the loads measured) is said
with how far it extrapolates.

Proven by one run (`verified`): a configuration that names this one in `verifies` (longctx advise --verify writes
it: the same server restarted with the recommended flags) measures the goal's workload and one request at the goal's
context. Each predicted figure is read against what it measured: the KV pool the server allocated (held within
POOL_TOLERANCE, the planner's accuracy on the study), the request at the goal's context (it fits or it does not), and
the workload's TTFT and TPOT at the goal's percentile and its goodput against the goal's SLO, each measured with its
interval (the load stage's bootstrap; Wilson's for the share that met the SLO): a figure holds where the measured
interval meets the predicted one or the two are within TOLERANCE (the what-if's); one that does neither is read
against the drift between the two runs (their metronomes: longctx.analysis.drift): missed where its error is beyond
what the machine's move could explain, inconclusive where it is not. The SLO held where the measured figures meet it.
The advice is proven where every figure holds and the request fits, unproven (with what missed) where one missed,
and inconclusive (with the figures the drift leaves open) otherwise.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pandas as pd

from ..config import workload_requests
from ..core.words import listed
from . import drift
from .memory import adapter_of, memory_model, pool_tokens
from .simulate import TOKEN_BUDGET
from .slo import goodput, wilson
from .whatif import DRAWS, TOLERANCE, grid_point, race_split, serving_model

FORMAT = "longctx.advice/1"
MAX_FRACTION = 0.95  # the default search's highest mem-fraction-static: a reserve of 5% of the GPU's memory
FRACTION_STEP = 0.01
MAXIMISE = ("goodput", "concurrency", "context")
SGLANG_TABLE_ENTRY_BYTES = 4  # SGLang's req_to_token table: int32 entries, context-length + 4 a request
POOL_TOLERANCE = 0.05  # the planner's pool against the one a server allocated: within 5% on the study's restarts


class AdviceError(ValueError):
    """A goal that cannot be searched as stated (a flag the engine does not have): the message names it."""


def _default_values(measured: int | None, factors: tuple[float, ...]) -> list[int]:
    return sorted({max(1, int(measured * f)) for f in factors}) if measured else []


def _fractions(measured: float | None) -> list[float]:
    if measured is None:
        return []
    lo = max(FRACTION_STEP, round(float(measured) - 0.05, 2))
    steps = np.arange(lo, MAX_FRACTION + FRACTION_STEP / 2, FRACTION_STEP)
    return [round(float(x), 2) for x in steps] or [round(float(measured), 2)]


def search_axes(flags: dict, search: dict, measured: dict, modelled_pool: bool) -> dict[str, list]:
    """The values searched per axis (max_running, chunk, pool_fraction), from advise.search by the engine's flag names
    or around the measured setting; an axis the engine has no flag for keeps its measured value."""
    by_flag = {flag: axis for axis, flag in flags.items() if flag}
    unknown = sorted(set(search) - set(by_flag))
    if unknown:
        raise AdviceError(f"advise.search: {listed(unknown)} {'is' if len(unknown) == 1 else 'are'} not a flag the "
                          f"model covers for this engine; allowed: {listed(sorted(by_flag)) or 'none'}")
    given = {by_flag[f]: [v for v in values] for f, values in search.items()}
    axes = {"max_running": given.get("max_running") or _default_values(measured["max_running"], (0.25, 0.5, 1, 2)),
            "chunk": given.get("chunk") or _default_values(measured["chunk"], (0.5, 1, 2)),
            "pool_fraction": (given.get("pool_fraction") or _fractions(measured["pool_fraction"])) if modelled_pool else []}
    return {k: v or [measured[k]] for k, v in axes.items()}


def table_bytes(mm: dict, max_running: int | None, context_length: int | None) -> int | None:
    """The req-to-token table SGLang sets aside for max-running-requests requests of context-length tokens; None where
    the planner knows no table for this server (no SGLang rule, or neither figure)."""
    if not (mm.get("req_to_token_bytes") is not None and max_running and context_length):
        return None
    measured_mr, measured_ctx = mm.get("max_running_requests"), mm.get("context_length")
    if measured_mr and measured_ctx:  # the measured table's bytes per entry (4, or the server's own int64's 8)
        per_entry = mm["req_to_token_bytes"] / (int(measured_mr) * (int(measured_ctx) + 4))
    else:
        per_entry = SGLANG_TABLE_ENTRY_BYTES
    return int(round(int(max_running) * (int(context_length) + 4) * per_entry))


def pool_at(mm: dict, fraction: float, max_running: int | None, context_length: int | None) -> int | None:
    """The pool at `fraction` with the req-to-token table of this setting in place of the measured one's."""
    measured = table_bytes(mm, mm.get("max_running_requests"), mm.get("context_length"))
    moved = table_bytes(mm, max_running, context_length)
    if measured is None or moved is None or mm.get("weights_bytes") is None:
        return pool_tokens(mm, fraction)
    return pool_tokens({**mm, "weights_bytes": int(mm["weights_bytes"]) - measured + moved}, fraction)


def _goal_value(maximise: str, p: dict) -> float:
    """What the pick maximises; `reserve` (a context to fit and no workload): nothing beyond fitting it, so that the
    ties go to the smallest fraction, the largest reserve."""
    if maximise == "reserve":
        return 0.0
    if maximise == "goodput":
        return p["goodput_rps"] if p.get("goodput_rps") is not None else -math.inf
    if maximise == "concurrency":
        return p["concurrency_fits"] if p.get("concurrency_fits") is not None else -math.inf
    return p["largest_context"] if p.get("largest_context") is not None else -math.inf


def _meets(p: dict, slo: dict) -> dict[str, bool | None]:
    """Each SLO set against the predicted figure at its percentile: True, False, or None where nothing was predicted."""
    q = f"p{int(slo.get('percentile', 50))}"
    out = {}
    for key, figure in (("ttft_s", "ttft"), ("tpot_s", "tpot")):
        if slo.get(key) is not None:
            v = p.get(f"{figure}_{q}")
            out[key] = None if v is None else v <= float(slo[key])
    return out


def _workload_grid(w: dict) -> tuple[str, float, dict]:
    kind, level = ("concurrency", float(w["concurrency"])) if w.get("concurrency") else ("rate", float(w["rate"]))
    return kind, level, {"requests": workload_requests(w), "output_tokens": int(w["output"]), "arrival": "poisson",
                         "burstiness": 1.0, "seed": int(w.get("seed", 0))}


def _predict(costs, rules, setting: dict, w: dict, slo: dict, level: float, stagger: float,
             draw: int | None = None) -> dict:
    kind, x, g = _workload_grid(w)
    mr, chunk = setting["max_running"], setting["chunk"]
    if rules.policy == TOKEN_BUDGET and mr and chunk:
        mr = min(mr, chunk)  # vLLM caps max-num-seqs at the step's budget
    r = dataclasses.replace(rules, max_running=mr, chunk=chunk, pool_tokens=setting["pool_tokens"] or rules.pool_tokens)
    p, _ = grid_point(costs, r, kind, x, int(w["prompt"]), g, {k: slo[k] for k in ("ttft_s", "tpot_s") if slo.get(k)}
                       | {"attainment": 0.0}, level, stagger,
                       None if draw is None or kind != "concurrency" else race_split(draw, x))
    return {"ttft_p50": p["ttft_p50"], "ttft_p90": p["ttft_p90"], "tpot_p50": p["tpot_p50"], "tpot_p90": p["tpot_p90"],
            "goodput_rps": p["goodput_rate_s"], "failed": p["failed"], "retractions": p["retractions"]}


def _interval(values: list[float | None], level: float) -> list[float] | None:
    v = [x for x in values if x is not None]
    if len(v) < 4:
        return None
    return [float(np.quantile(v, (1 - level) / 2)), float(np.quantile(v, (1 + level) / 2))]


def advise_configuration(name: str, entry: dict, fit: dict, ld: dict | None, requests: pd.DataFrame, goal: dict,
                         level: float = 0.95) -> dict:
    """The advice for one measured configuration (the module's docstring)."""
    adapter = adapter_of(entry)
    flags = adapter.knob_flags(entry)
    # the context length is not searched: it is set to the goal's where that is longer
    searched_flags = {k: v for k, v in flags.items() if k != "context"}
    try:
        mm = memory_model(entry)
    except Exception:  # noqa: BLE001 - a pool the planner cannot size: the fraction is not searched
        mm = None
    workload, slo = goal.get("workload") or None, goal.get("slo") or {}
    model = serving_model(name, entry, fit, ld, requests) if workload else {}
    if workload and "reason" in model:
        return {"configuration": name, "feasible": False, "binding": None, "reason": f"no serving model: {model['reason']}"}
    rules = model.get("rules")
    args, info = entry.get("args") or {}, entry.get("server_info") or {}
    measured = {"max_running": (rules.max_running if rules else None) or (mm or {}).get("max_running_requests"),
                "chunk": (rules.chunk if rules else None) or adapter.chunked_prefill_size(args, info),
                "pool_fraction": (mm or {}).get("mem_fraction_static")}
    if measured["max_running"] is not None:
        measured["max_running"] = int(measured["max_running"])
    modelled_pool = bool(mm and flags.get("pool_fraction") and pool_tokens(mm, 0.5) is not None)
    axes = search_axes(searched_flags, goal.get("search") or {}, measured, modelled_pool)
    context = int(goal["context"]) if goal.get("context") else None
    ctx_len = (mm or {}).get("context_length") or adapter.context_length(args, info)
    new_ctx = max(int(ctx_len), context) if ctx_len and context else (context or ctx_len)
    observed = (mm or {}).get("observed_tokens") or (rules.pool_tokens if rules else None)
    memory = (mm or {}).get("memory_bytes")
    need = (int(workload["prompt"]) + int(workload["output"])) if workload else None
    rows = []
    for mr, chunk, frac in itertools.product(axes["max_running"], axes["chunk"], axes["pool_fraction"]):
        pool = pool_at(mm, float(frac), mr, new_ctx) if frac is not None and modelled_pool else observed
        s = {"max_running": mr, "chunk": chunk, "pool_fraction": frac, "pool_tokens": pool,
             "reserve_bytes_per_gpu": int(round(memory * (1 - float(frac)))) if memory and frac is not None else None,
             "largest_context": min(pool, new_ctx) if pool and new_ctx else pool,
             "concurrency_fits": pool // need if pool and need else None}
        s["context_fits"] = None if context is None or pool is None else pool >= context
        if workload:
            s.update(_predict(model["costs"], rules, s, workload, slo, level, model["stagger"]))
            s["slo"] = _meets(s, slo)
        s["feasible"] = s["context_fits"] is not False and all(v is not False for v in (s.get("slo") or {}).values()) \
            and not s.get("failed")
        rows.append(s)
    maximise = goal.get("maximise") or "goodput"
    if not workload and maximise in ("goodput", "concurrency"):  # nothing to serve: fit the context, keep the reserve
        maximise = "reserve" if context else "context"
    near = lambda s: sum(s[k] != measured[k] for k in axes)  # noqa: E731 - flags changed
    ranked = sorted(rows, key=lambda s: (-_goal_value(maximise, s), s["pool_fraction"] or 0, near(s)))
    feasible = [s for s in ranked if s["feasible"]]
    device = "cpu" if entry.get("device") == "cpu" else adapter.compute_device(args)
    out = {"configuration": name, "engine": adapter.title, "device": device, "maximise": maximise, "goal": goal,
           "flags": {k: v for k, v in searched_flags.items() if v},
           "searched": {flags[k]: v for k, v in axes.items() if flags.get(k)},
           "measured": {**{flags[k]: v for k, v in measured.items() if flags.get(k)}, "pool_tokens": observed,
                        "context_length": ctx_len,
                        "reserve_bytes_per_gpu": int(round(memory * (1 - float(measured["pool_fraction"]))))
                        if memory and measured["pool_fraction"] is not None else None},
           "settings": len(rows), "feasible": bool(feasible),
           # every setting searched, best first: its flags and its predicted figures (the pick's and the runner-up's
           # with their intervals are below)
           "ranked": [_ranked(s, flags, workload) for s in ranked]}
    if feasible:
        pick = feasible[0]
        # the runner-up: the best other scheduling setting (a pool one step larger is no alternative worth naming)
        runner = next((s for s in feasible[1:] if (s["max_running"], s["chunk"]) != (pick["max_running"], pick["chunk"])),
                      feasible[1] if len(feasible) > 1 else None)
        out["recommended"] = _answer(pick, flags, new_ctx, ctx_len, model, workload, slo, level, mm)
        out["runner_up"] = _answer(runner, flags, new_ctx, ctx_len, model, workload, slo, level, mm) if runner else None
        out["binding"] = _binding(pick, context, slo, workload, modelled_pool,
                                  max((f for f in axes["pool_fraction"] if f is not None), default=math.inf))
    else:
        nearest = min(rows, key=lambda s: _shortfall(s, context, slo))
        out["binding"] = _unmet(rows, context, slo, mm, modelled_pool, new_ctx)
        out["nearest"] = _answer(nearest, flags, new_ctx, ctx_len, model, workload, slo, level, mm)
        out["recommended"] = None
        out["runner_up"] = None
    out["extrapolates"] = _extrapolation(out.get("recommended") or out.get("nearest"), measured, ld, workload)
    return out


def _answer(s: dict, flags: dict, new_ctx, ctx_len, model: dict, workload, slo, level, mm) -> dict:
    changed = {flags[k]: s[k] for k in ("max_running", "chunk", "pool_fraction") if flags.get(k) and s[k] is not None}
    if new_ctx and ctx_len and new_ctx != ctx_len and flags.get("context"):  # the goal is longer than the server took
        changed[flags["context"]] = new_ctx
    out = {"flags": changed, "pool_tokens": s["pool_tokens"], "reserve_bytes_per_gpu": s["reserve_bytes_per_gpu"],
           "largest_context": s["largest_context"], "concurrency_fits": s["concurrency_fits"],
           "context_fits": s["context_fits"], "req_to_token_bytes": table_bytes(mm or {}, s["max_running"], new_ctx)}
    if workload:  # each figure with the interval of the model's bootstrap draws, each simulated alike, a closed loop's
        # each with its own split of the first requests at the server's first step (whatif.race_split)
        draws = [_predict(c, model["rules"], s, workload, slo, level, model["stagger"], j)
                 for j, c in enumerate(model["draws"][:DRAWS])]
        named = {"ttft_s_p50": "ttft_p50", "tpot_s_p50": "tpot_p50", "ttft_s_p90": "ttft_p90", "tpot_s_p90": "tpot_p90",
                 "goodput_rps": "goodput_rps"}
        out["predicted"] = {k: {"value": s[v], "interval": _interval([d[v] for d in draws], level)} for k, v in named.items()}
        out["slo"] = s.get("slo")
    return out


def _ranked(s: dict, flags: dict, workload) -> dict:
    out = {"flags": {flags[k]: s[k] for k in ("max_running", "chunk", "pool_fraction") if flags.get(k) and s[k] is not None},
           "feasible": s["feasible"], "pool_tokens": s["pool_tokens"]}
    if workload:
        out["predicted"] = {"ttft_s_p50": s["ttft_p50"], "tpot_s_p50": s["tpot_p50"], "goodput_rps": s["goodput_rps"]}
    return out


def _binding(s: dict, context, slo, workload, modelled_pool, top_fraction: float) -> str:
    """The constraint with the least slack at the pick (relative)."""
    slack = {}
    if context and s["pool_tokens"]:
        slack["the KV pool"] = s["pool_tokens"] / context - 1
    q = f"p{int(slo.get('percentile', 50))}"
    for key, figure, words in (("ttft_s", "ttft", "the TTFT objective"), ("tpot_s", "tpot", "the TPOT objective")):
        if workload and slo.get(key) and s.get(f"{figure}_{q}"):
            slack[words] = float(slo[key]) / s[f"{figure}_{q}"] - 1
    if modelled_pool and s["pool_fraction"] is not None and float(s["pool_fraction"]) >= top_fraction:
        slack["the activation reserve"] = 0.0  # the highest fraction searched: no more memory to give the pool
    return min(slack, key=slack.get) if slack else "none searched"


def _shortfall(s: dict, context, slo) -> float:
    short = max(0.0, context / s["pool_tokens"] - 1) if context and s["pool_tokens"] else (1.0 if context else 0.0)
    q = f"p{int(slo.get('percentile', 50))}"
    for key, figure in (("ttft_s", "ttft"), ("tpot_s", "tpot")):
        v = s.get(f"{figure}_{q}")
        if slo.get(key) and v is not None:
            short += max(0.0, v / float(slo[key]) - 1)
    return short + (1.0 if s.get("failed") else 0.0)


def _unmet(rows: list[dict], context, slo, mm, modelled_pool, new_ctx) -> str:
    if context and not any(s["context_fits"] for s in rows):
        if modelled_pool and mm.get("memory_bytes") and mm.get("cell_bytes") and mm.get("weights_bytes") is not None:
            need = (context * mm["cell_bytes"] + mm["weights_bytes"]) / mm["memory_bytes"]
            return (f"the KV pool: {context:,} tokens need mem-fraction-static {need:.3f} or more, above the highest "
                    f"searched ({max(s['pool_fraction'] for s in rows):g}): the activation reserve binds")
        return f"the KV pool: no searched setting holds {context:,} tokens"
    return "the SLO: " + ", ".join(k for k in ("ttft_s", "tpot_s") if slo.get(k) and not any(
        (s.get("slo") or {}).get(k) for s in rows if s["context_fits"] is not False)) + " met by no setting that fits"


def _extrapolation(ans: dict | None, measured: dict, ld: dict | None, workload) -> list[str]:
    words = []
    if not ans:
        return words
    frac = ans["flags"].get("mem-fraction-static")
    if frac is not None and measured["pool_fraction"] is not None and float(frac) != float(measured["pool_fraction"]):
        words.append(f"mem-fraction-static {frac:g} is {float(frac) - float(measured['pool_fraction']):+.2f} from the "
                     f"{float(measured['pool_fraction']):g} measured: the pool by SGLang's rule, calibrated there")
    levels = [int(p["level"]) for p in (ld or {}).get("closed") or []]
    if workload and workload.get("concurrency") and levels and int(workload["concurrency"]) > max(levels):
        words.append(f"a closed loop of {int(workload['concurrency'])} is beyond the {max(levels)} measured under load")
    return words


def _point(ld: dict | None, workload: dict) -> dict | None:
    """The load point that measured the goal's workload: the closed loop at its concurrency, or the open loop at its
    rate, at its prompt length."""
    kind, level = ("closed", float(workload["concurrency"])) if workload.get("concurrency") else ("open", float(workload["rate"]))
    return next((p for p in (ld or {}).get(kind) or [] if float(p["level"]) == level and int(p["length"]) == int(workload["prompt"])),
                None)


def _measured_goodput(rows: pd.DataFrame, point: dict, slo: dict, level: float) -> dict | None:
    """The point's requests a second that met the goal's SLO, with the Wilson interval of that share over its
    requests (longctx.analysis.slo.goodput, over the point's duration)."""
    keys = {k: slo.get(k) for k in ("ttft_s", "tpot_s") if slo.get(k)}
    duration = point.get("duration_s")
    if rows.empty or not duration:
        return None
    g = goodput(rows.reset_index(drop=True), keys, float(point["length"]), duration, level)
    lo, hi = wilson(g["met"], g["n"], level)
    scale = g["n"] / duration
    return {"value": g["rate_s"], "low": None if lo is None else lo * scale, "high": None if hi is None else hi * scale}


def _held(predicted: dict, measured: dict) -> tuple[float | None, bool | None]:
    """(predicted over measured less one, whether the figure holds: the two intervals meet, or the error is within
    TOLERANCE)."""
    p, m = predicted.get("value"), measured.get("value")
    if p is None or m is None or m <= 0:
        return None, None
    error = p / m - 1
    iv, lo, hi = predicted.get("interval"), measured.get("low"), measured.get("high")
    meet = bool(iv and lo is not None and hi is not None and iv[0] <= hi and lo <= iv[1])
    return error, abs(error) <= TOLERANCE or meet


def against_drift(figure: dict, moved: dict | None) -> dict:
    """A verified figure that missed (_held) read against the drift between the run the advice came from and the run
    that verified it (longctx.analysis.drift.between of their metronomes): where the machine's move could explain the
    miss (drift.verdict: inconclusive), it is neither held nor missed (held None) and says so (`inconclusive`);
    where the error is beyond that move too it stays missed."""
    if figure["held"] is not False or not moved or figure["error"] is None:
        return figure
    judged = drift.verdict(figure["error"], moved["drift"], TOLERANCE, what="the error")
    if judged["verdict"] == "inconclusive":
        return {**figure, "held": None, "inconclusive": judged["words"]}
    return figure


def _readings(entry: dict | None) -> list[dict]:
    return ((entry or {}).get("metronome") or {}).get("readings") or []


def verification(advice: dict, name: str, entry: dict, ld: dict | None, requests: pd.DataFrame,
                 results: pd.DataFrame, level: float = 0.95, advised_entry: dict | None = None) -> dict:
    """The recommended setting of `advice` against what configuration `name` (which verifies it) measured (the
    module's docstring)."""
    goal, rec = advice["goal"], advice["recommended"]
    workload, slo = goal.get("workload"), goal.get("slo") or {}
    flags = {k: entry.get("args", {}).get(k) for k in rec["flags"]}
    out: dict = {"configuration": name, "flags_as_run": flags, "flags_match": flags == rec["flags"], "figures": []}
    # the machine between the run the advice came from and this one: the same engine's code on both (the flags differ)
    moved = drift.between(_readings(advised_entry), _readings(entry), same_code=True)
    out["drift"] = None if moved is None else {"drift": moved["drift"], "words": moved["words"]}
    try:
        observed = memory_model(entry).get("observed_tokens")
    except Exception:  # noqa: BLE001 - a server whose pool the planner cannot read: not compared
        observed = None
    if rec.get("pool_tokens") and observed:
        error = rec["pool_tokens"] / observed - 1
        out["pool"] = {"predicted": rec["pool_tokens"], "measured": int(observed), "error": error,
                       "held": abs(error) <= POOL_TOLERANCE}
    if goal.get("context"):
        rows = results[results["configuration"] == name] if not results.empty else results
        longest = rows[rows["length"] == rows["length"].max()] if not rows.empty else rows
        ok = not longest.empty and bool(longest["status"].eq("ok").all())
        reasons = sorted({str(r) for r in longest.get("reason", pd.Series(dtype=str)).dropna() if str(r)})
        out["context"] = {"length": int(longest["length"].iloc[0]) if not longest.empty else None, "fits": ok,
                          "reason": None if ok else ("; ".join(reasons) or "not measured")}
    if workload:
        point = _point(ld, workload)
        q = f"p{int(slo.get('percentile', 50))}"
        if point is None:
            out["workload"] = {"reason": "the goal's workload was not measured"}
        else:
            kind = "closed" if workload.get("concurrency") else "open"
            rows = requests[(requests["configuration"] == name) & (requests["kind"] == kind)
                            & (pd.to_numeric(requests["level"]) == float(point["level"]))
                            & (requests["length"] == int(point["length"]))] if not requests.empty else requests
            if "twin" in rows:
                rows = rows[rows["twin"].isna() | (rows["twin"].astype(str) == "")]
            for figure, key in (("ttft", f"ttft_s_{q}"), ("tpot", f"tpot_s_{q}")):
                m = (point.get(figure) or {}).get(q) or {}
                measured = {"value": m.get("value"), "low": m.get("low"), "high": m.get("high")}
                error, held = _held(rec["predicted"].get(key) or {}, measured)
                out["figures"].append(against_drift({"key": key, "predicted": rec["predicted"].get(key),
                                                     "measured": measured, "error": error, "held": held}, moved))
            measured = _measured_goodput(rows, point, slo, level) or {"value": None, "low": None, "high": None}
            error, held = _held(rec["predicted"].get("goodput_rps") or {}, measured)
            out["figures"].append(against_drift({"key": "goodput_rps", "predicted": rec["predicted"].get("goodput_rps"),
                                                 "measured": measured, "error": error, "held": held}, moved))
            values = {f["key"]: f["measured"]["value"] for f in out["figures"]}
            out["slo_held"] = all(values.get(f"{k}_{q}") is not None and values[f"{k}_{q}"] <= float(slo[k])
                                  for k in ("ttft_s", "tpot_s") if slo.get(k))
    missed = [f["key"] for f in out["figures"] if f["held"] is False]
    if out.get("pool") and not out["pool"]["held"]:
        missed.insert(0, "pool_tokens")
    if out.get("context") and not out["context"]["fits"]:
        missed.insert(0, "context")
    if (out.get("workload") or {}).get("reason"):
        missed.append("workload")
    if not out["flags_match"]:
        missed.insert(0, "flags")
    out["missed"] = missed
    # figures the machine's move leaves open: the advice is not proven, and not disproven by them
    out["inconclusive"] = [f["key"] for f in out["figures"] if f.get("inconclusive")]
    out["proven"] = not missed and not out["inconclusive"]
    return out


def advise(fits: dict, load: dict, provenance: dict, requests: pd.DataFrame, config: dict,
           configuration: str | None = None, results: pd.DataFrame | None = None) -> dict:
    """The advice for every measured configuration (or the one named) toward config key `advise`; each one that a
    configuration of the run verifies (its `verifies`) with what that run measured (`verified`)."""
    goal = config.get("advise")
    out: dict = {"format": FORMAT, "goal": goal, "configurations": {}}
    entries = provenance.get("configurations") or {}
    if configuration is not None and configuration not in entries:
        raise AdviceError(f"--configuration {configuration!r}: not measured in this run; "
                          f"measured: {listed(sorted(entries)) or 'none'}")
    level = float((fits.get("settings") or {}).get("confidence", 0.95))
    verifiers = {e["verifies"]: n for n, e in sorted(entries.items()) if e.get("verifies")}
    for name, entry in sorted(entries.items()):
        if (configuration is not None and name != configuration) or entry.get("verifies"):
            continue  # a run that verifies an advice is not advised in turn
        fit = (fits.get("configurations") or {}).get(name) or {}
        ld = (load.get("configurations") or {}).get(name)
        a = advise_configuration(name, entry, fit, ld, requests, goal, level)
        v = verifiers.get(name)
        if v and a.get("recommended"):
            a["verified"] = verification(a, v, entries[v], (load.get("configurations") or {}).get(v), requests,
                                         results if results is not None else pd.DataFrame(), level, entry)
        out["configurations"][name] = a
    return out


def flag_words(flags: dict) -> str:
    return " ".join(f"--{k} {v:g}" if isinstance(v, float) else f"--{k} {v}" for k, v in flags.items())


def _figure(p: dict, key: str, unit: str, scale: float = 1.0) -> str:
    f = p.get(key) or {}
    if f.get("value") is None:
        return f"{key}: not predicted"
    iv = f.get("interval")
    return f"{f['value'] * scale:.3g}{unit}" + (f" [{iv[0] * scale:.3g}, {iv[1] * scale:.3g}]" if iv else "")


def lines(doc: dict) -> list[str]:
    """The advice in words, a line per configuration."""
    out = []
    for name, a in doc["configurations"].items():
        if a.get("reason"):
            out.append(f"{name}: no advice: {a['reason']}")
            continue
        ans = a.get("recommended") or a.get("nearest") or {}
        said = [f"pool {ans['pool_tokens']:,} tokens" if ans.get("pool_tokens") else None,
                f"reserve {ans['reserve_bytes_per_gpu'] / 1e9:.3g} GB{' per GPU' if a.get('device') == 'gpu' else ''}"
                if ans.get("reserve_bytes_per_gpu") else None]
        p = ans.get("predicted") or {}
        if p:
            said += [f"TTFT p50 {_figure(p, 'ttft_s_p50', ' s')}", f"TPOT p50 {_figure(p, 'tpot_s_p50', ' ms', 1e3)}",
                     f"goodput {_figure(p, 'goodput_rps', ' req/s')}"]
        figures = ", ".join(x for x in said if x)
        if a["feasible"]:
            line = f"{name} ({a['engine']}): restart with {flag_words(ans['flags'])}: {figures}; binding: {a['binding']}"
            if a.get("runner_up"):
                line += f"; runner-up: {flag_words(a['runner_up']['flags'])}"
        else:
            line = (f"{name} ({a['engine']}): no searched setting meets the goal: {a['binding']}; nearest: "
                    f"{flag_words(ans['flags'])} ({figures})")
        if a.get("extrapolates"):
            line += "; extrapolates: " + "; ".join(a["extrapolates"])
        out.append(line)
        v = a.get("verified")
        if v:
            figures = ", ".join(f"{f['key']} {f['error']:+.0%}" for f in v["figures"] if f["error"] is not None)
            verdict = ("proven" if v["proven"] else f"unproven ({', '.join(v['missed'])} missed)" if v["missed"] else
                       f"inconclusive ({', '.join(v['inconclusive'])} within the machine's drift between the two runs, "
                       f"{v['drift']['drift']:.0%})")
            out.append(f"{name}: verified by {v['configuration']}: {verdict}"
                       + (f"; predicted against measured: {figures}" if figures else "")
                       + ("" if "slo_held" not in v else "; the SLO held" if v["slo_held"] else "; the SLO was missed"))
    return out
