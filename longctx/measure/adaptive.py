"""The adaptive sweep (config key lengths: {adaptive: ...}): lengths and trial counts chosen while the server is
up, to predict TTFT and the decode rate at `max` within `target_relative_interval` for the least server time.

After each length the scaling models (longctx.core.fitting.Fit: TTFT = a + bL + cL^2, TPOT = t0 + beta L) are
refitted to every successful trial and predict `max` with their bootstrap intervals. The next (length, trials)
is the candidate on the grid (min to max by `ratio`, max among them) that shrinks the two
intervals at max most per second of predicted server time: the gain is the fall in each model's relative
variance at max when n more trials at L join its design (the spread of the fit's standardised residuals squared
times phi(max)^T (sum_i phi_i phi_i^T / sd_i^2)^-1 phi(max) / y(max)^2, sd_i the fit's noise model at each trial,
relative noise over the absolute floor the replicates show: the weighted least-squares variance the fit's own
weighting gives, without its non-negativity), over the target squared; the cost is the fit's own
prediction of the time: warm-up and trials, each TTFT(L) + output tokens x TPOT(L). The confirmation at max is
part of every design weighed: its trials join the fits, so a choice is worth only what it adds to them. The sweep
stops when both intervals at max, with the confirmation's trials, are projected within the target (each
bootstrap interval scaled by the fall in its variance) or the next choice and the confirmation would overrun
`budget_s`, and always ends with a confirming measurement at max: inside both predictions, done, unless its trials left an
interval at max wider than the target, when more trials at max follow (each a confirmation too) while the
budget lasts (the fits' time scaled by how far the measurements so far ran over it); outside either, the lengths
on the grid next below max are measured too (the miss is a finding: the models change before max).
Every choice is logged with its reason (Planner.path), and the predicted and spent time.

run_adaptive drives the planner on the sweep's server: each choice measured (measure.protocol), its trials
joining its length's raw file, sweep.json the path at the end; on resume it replays the choices over the
trials kept.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import provenance
from ..config import grid
from ..core.fitting import Fit
from ..engines import ConfigurationSpec
from .progress import Progress
from .protocol import length_line, measure_at, samples as ok_samples
from .rawfiles import resumable_any, write_json, write_kept
from .session import Session, progress

__all__ = ["Planner", "at_max", "grid", "run_adaptive"]

Sample = tuple[int, float, float | None]  # (length, TTFT, TPOT) of a successful trial
KINDS = {"prefill": 3, "decode": 2}  # the lengths each model needs (its coefficients)


def _fits(samples: list[Sample], n_boot: int, seed: int) -> dict[str, Fit]:
    out = {}
    L = np.array([s[0] for s in samples], float)
    if len(set(L)) >= KINDS["prefill"]:
        out["prefill"] = Fit("prefill", L, [s[1] for s in samples], n_boot, seed=seed)
    dec = [(s[0], s[2]) for s in samples if s[2]]
    if len({d[0] for d in dec}) >= KINDS["decode"]:
        out["decode"] = Fit("decode", [d[0] for d in dec], [d[1] for d in dec], n_boot, seed=seed)
    return out


def at_max(fits: dict[str, Fit], length: int) -> dict[str, dict]:
    """Each model's prediction at `length` with its bootstrap interval and the interval's width over the prediction."""
    out = {}
    for kind, f in fits.items():
        pred = float(f.predict([length])[0])
        draws = f.predict_draws([length])
        ci = f.interval(draws[:, 0]) if draws is not None else None
        rel = (ci[1] - ci[0]) / pred if ci and None not in ci and pred > 0 else math.inf
        out[kind] = {"predicted": pred, "lo": ci[0] if ci else None, "hi": ci[1] if ci else None, "relative_interval": rel,
                     "relative_noise": _relative_noise(f, length)}
    return out


def _relative_noise(f: Fit, length: int) -> float:
    """The fit's noise at `length` relative to its prediction there: the spread of its standardised residuals
    (BasisFit.noise_scale) times the noise model's sd there (with purely relative noise, the same at every length)."""
    p = float(f.predict([length])[0])
    return f.noise_scale() * float(f.sd([p])[0]) / p if p > 0 else math.inf


def _relative_variance(f: Fit, extra: list[tuple[int, int]], length: int) -> float:
    """The fit's relative variance at `length` with n more observations at each (L, n) of extra (see the module)."""
    s2 = f.noise_scale() ** 2 or 1e-12
    W = f.weighted_design()
    A = W.T @ W
    for L, n in extra:
        phi = f.design([L])[0]
        w = phi / float(f.sd([float(phi @ f.coef)])[0] or 1e-12)
        A = A + n * np.outer(w, w)
    phi = f.design([length])[0]
    p = float(phi @ f.coef) or 1e-12
    try:
        return s2 * float((phi / p) @ np.linalg.pinv(A) @ (phi / p))
    except np.linalg.LinAlgError:
        return math.inf


@dataclass
class Planner:
    """The adaptive sweep's decisions. next_step() says what to measure next (length, trials, reason) or None
    when done; record(length, trials, samples, seconds) tells it what that measurement gave."""

    settings: dict  # config key lengths.adaptive (defaults filled)
    protocol: dict  # config key protocol (warm-up, output tokens)
    n_boot: int = 200
    seed: int = 0
    samples: list[Sample] = field(default_factory=list)
    measured: dict[int, int] = field(default_factory=dict)  # length -> trials measured
    spent_s: float = 0.0
    path: list[dict] = field(default_factory=list)
    phase: str = "start"  # start | choose | confirm | around | done
    outcome: dict = field(default_factory=dict)

    @property
    def max(self) -> int:
        return int(self.settings["max"])

    def cost(self, length: int, trials: int, fits: dict[str, Fit] | None = None) -> float | None:
        """Predicted server seconds for `trials` trials at `length` (and the warm-up, before the first measurement)."""
        fits = fits if fits is not None else _fits(self.samples, 0, self.seed)
        if "prefill" not in fits:
            return None
        ttft = float(fits["prefill"].predict([length])[0])
        tpot = float(fits["decode"].predict([length])[0]) if "decode" in fits else 0.0
        return (trials + self.warmup()) * (ttft + self.protocol["output_tokens"] * tpot)

    def overrun(self) -> float:
        """How far the measurements so far ran over the fits' predictions of their time (spent over predicted, at
        least 1): the budget checks scale the predictions by it, so that a sweep stays within budget_s although
        the fits' time is an estimate."""
        pairs = [(p["spent_s"], p["predicted_s"]) for p in self.path if p.get("predicted_s") and p.get("spent_s")]
        return max(1.0, sum(a for a, _ in pairs) / sum(b for _, b in pairs)) if pairs else 1.0

    def warmup(self) -> int:
        """Warm-up requests before the next measurement: the protocol's, before the first only (they take the
        server's one-off costs; a sweep that buys certainty per second does not pay them at every length)."""
        return 0 if self.measured else int(self.protocol["warmup"])

    def _log(self, length: int, trials: int, reason: str, fits: dict[str, Fit]) -> tuple[int, int, str]:
        self.path.append({"step": len(self.path) + 1, "length": length, "trials": trials, "reason": reason,
                          "phase": self.phase, "predicted_s": self.cost(length, trials, fits), "spent_before_s": self.spent_s,
                          "at_max": at_max(fits, self.max) if fits else {}})
        return length, trials, reason

    def next_step(self) -> tuple[int, int, str] | None:
        st, g = self.settings, grid(self.settings)
        most = int(st["max_trials"])
        fits = _fits(self.samples, self.n_boot, self.seed)
        if self.phase == "start":
            todo = [L for L in g[:int(st["start_lengths"])] if L not in self.measured]
            if todo:
                return self._log(todo[0], most, f"one of the {st['start_lengths']} starting lengths", fits)
            self.phase = "choose"
        if self.phase == "choose":
            pred = at_max(fits, self.max)
            target = float(st["target_relative_interval"])
            confirm = int(st["confirm_trials"])
            confirm_s = self.cost(self.max, confirm, fits) or 0.0
            planned = [(self.max, confirm)]  # the confirmation joins the fits: every choice is weighed with it
            base = {k: _relative_variance(f, planned, self.max) for k, f in fits.items()}
            now = {k: _relative_variance(f, [], self.max) for k, f in fits.items()}
            projected = {k: p["relative_interval"] * math.sqrt(base[k] / now[k]) if now[k] > 0 else p["relative_interval"]
                         for k, p in pred.items()}
            within = len(pred) == len(KINDS) and all(w <= target for w in projected.values())
            if within:
                self.phase = "confirm"
                widths = ", ".join(f"{k} {w:.0%}" for k, w in projected.items())
                return self._log(self.max, confirm, f"with the confirmation, both intervals at max are projected within the "
                                                    f"target ({widths}): the confirming measurement", fits)
            best = None
            for L in g:  # max among them: where the prediction is wanted, a trial there tells most (at its price)
                for n in range(1, most + 1):
                    c = self.cost(L, n, fits)
                    if not c:
                        continue
                    gain = sum((base[k] - _relative_variance(f, planned + [(L, n)], self.max)) / target**2
                               for k, f in fits.items())
                    if best is None or gain / c >= best[0] * (1 + 1e-9):
                        best = (gain / c, L, n, c, gain)
            chosen = sum(1 for p in self.path if p["phase"] == "choose")
            if (best is None or self.spent_s + (best[3] + confirm_s) * self.overrun() > float(st["budget_s"])
                    or chosen >= int(st["max_steps"])):
                self.phase = "confirm"
                why = ("nothing left to choose" if best is None else
                       f"{chosen} choices made (max_steps)" if chosen >= int(st["max_steps"]) else
                       "the budget would be spent before the confirmation")
                return self._log(self.max, confirm, f"{why}: the confirming measurement", fits)
            _, L, n, c, gain = best
            widths = ", ".join(f"{k} {p['relative_interval']:.0%} ({projected[k]:.0%} with the confirmation)"
                               for k, p in pred.items())
            return self._log(L, n, f"intervals at max {widths}, target {target:.0%}: {n} trial(s) at {L:,} shrink them "
                                   f"most per second ({c:.3g} s predicted)", fits)
        if self.phase == "done":  # confirmed: if still wider than the target, more trials at max while the budget lasts
            return self._more_at_max(fits)
        return None

    def _more_at_max(self, fits: dict[str, Fit]) -> tuple[int, int, str] | None:
        """After a confirmation inside its prediction whose trials left an interval at max wider than the target:
        the next confirmation (confirm_trials more at max, where they tell most), within the budget and max_steps."""
        st = self.settings
        target, n = float(st["target_relative_interval"]), int(st["confirm_trials"])
        wide = {k: p["relative_interval"] for k, p in at_max(fits, self.max).items() if p["relative_interval"] > target}
        c = self.cost(self.max, n, fits)
        more = sum(1 for p in self.path if p["phase"] == "confirm") - 1
        if not wide or not c or self.spent_s + c * self.overrun() > float(st["budget_s"]) or more >= int(st["max_steps"]):
            return None
        self.phase = "confirm"
        widths = ", ".join(f"{k} {w:.0%}" for k, w in wide.items())
        return self._log(self.max, n, f"confirmed, but the intervals at max are wider than the target {target:.0%} ({widths}): "
                                      f"{n} more trial(s) at max, confirming again ({c:.3g} s predicted)", fits)

    def record(self, length: int, trials: int, samples: list[Sample], seconds: float) -> None:
        """A measurement done: its successful trials' samples and the server seconds it took."""
        self.measured[length] = self.measured.get(length, 0) + trials
        self.spent_s += seconds
        # the step this measurement was: the earliest one at this length not yet measured (around() logs its steps
        # before any of them is measured)
        step = next((p for p in self.path if p["length"] == length and "spent_s" not in p), None)
        if step is not None:
            step["spent_s"] = seconds
            step["ok"] = len(samples)
        if self.phase == "confirm" and length == self.max:
            before = self.path[-1]["at_max"] if self.path else {}
            self.samples += samples
            self.outcome = {**self._confirm(before, samples), "confirmations": sum(p["phase"] == "confirm" for p in self.path)}
            self.phase = "around" if not self.outcome["inside"] else "done"
            return
        self.samples += samples

    def _confirm(self, before: dict, samples: list[Sample]) -> dict:
        measured = {"prefill": statistics.median(s[1] for s in samples) if samples else None,
                    "decode": statistics.median(s[2] for s in samples if s[2]) if any(s[2] for s in samples) else None}
        checks = {}
        n = max(1, len(samples))
        for kind, p in before.items():
            m = measured.get(kind)
            # the prediction's interval for a median of n trials: the fit's interval at max widened by the trials' own
            # noise (the fit's relative residuals, 1.96 sigma / sqrt(n)); a single trial is not the curve's mean
            spread = 1.96 * p.get("relative_noise", 0.0) / math.sqrt(n)
            lo = p["lo"] * (1 - spread) if p["lo"] is not None else None
            hi = p["hi"] * (1 + spread) if p["hi"] is not None else None
            inside = m is not None and lo is not None and hi is not None and lo <= m <= hi
            checks[kind] = {**p, "measured": m, "prediction_lo": lo, "prediction_hi": hi, "inside": inside}
        return {"checks": checks, "inside": bool(checks) and all(c["inside"] for c in checks.values())}

    def around(self) -> list[tuple[int, int, str]]:
        """After a confirmation that missed: the two grid lengths next below max, measured (again) in full: whether
        the models change before max, and from where."""
        g = grid(self.settings)[:-1]
        fits = _fits(self.samples, self.n_boot, self.seed)
        missed = ", ".join(k for k, c in self.outcome.get("checks", {}).items() if not c["inside"])
        self.phase = "around"
        n, left, out = int(self.settings["max_trials"]), float(self.settings["budget_s"]) - self.spent_s, []
        for L in g[-2:][::-1]:
            c = self.cost(L, n, fits) or 0.0
            if c > left:
                self.outcome["around_skipped"] = f"{L:,}: {c:.3g} s predicted, {max(left, 0):.3g} s of the budget left"
                break
            left -= c
            out.append(self._log(L, n, f"the confirmation at max missed ({missed}): a length around the miss", fits))
        return out

    def summary(self) -> dict:
        return {"settings": self.settings, "grid": grid(self.settings), "path": self.path, "outcome": self.outcome,
                "spent_s": self.spent_s, "predicted_s": sum(p["predicted_s"] or 0.0 for p in self.path),
                "at_max": at_max(_fits(self.samples, self.n_boot, self.seed), self.max)}


def run_adaptive(session: Session, spec: ConfigurationSpec, run_id: str, common: dict, prov: dict, key: str,
                 outdir: Path, resume_dir: Path | None, history: list, statuses: dict, tracker: Progress) -> None:
    """The adaptive sweep (longctx.measure.adaptive.Planner): each choice measured (warm-up before the first only,
    no batches), its trials joining its length's raw file (a length chosen again gets more trials), each file kept
    in resume_dir as it grows; then sweep.json, the path with every choice and its reason. On resume the planner
    replays its choices over the trials kept (same trials, same fits, same choices) and measures from where the
    interrupted run stopped."""
    planner = Planner(spec.adaptive, spec.protocol, seed=int(spec.protocol.get("seed") or 0))
    before = {L: r for L in spec.lengths if (r := resumable_any(resume_dir, L, key))}
    kept = {L: list(r["trials"]) for L, r in before.items()}
    kept_time = {L: float(r.get("adaptive_seconds") or 0.0) for L, r in before.items()}
    records: dict[int, dict] = {}

    def step(length: int, n: int) -> None:
        ok_before = len(records.get(length, {}).get("trials") or [])
        reused = kept.get(length, [])[ok_before:ok_before + n]
        started = provenance.now_iso()
        t0 = time.monotonic()
        if len(reused) == n:  # measured before this interruption: the same trials
            result = {"status": "ok" if all(t["status"] == "ok" for t in reused) else "partial", "reason": None,
                      "warmup": [], "trials": [dict(t) for t in reused], "resumed": True}
            history.extend(ok_samples(length, result))
            seconds = kept_time.get(length, 0.0) * n / max(1, len(kept.get(length, [])))
        else:
            tracker.begin(spec.lengths.index(length))
            sub = replace(spec, protocol={**spec.protocol, "trials": n, "warmup": planner.warmup(), "concurrency": []})
            result = measure_at(session, sub, length, run_id, history, tracker, needle=length not in records)
            seconds = time.monotonic() - t0
        rec = records.get(length)
        trials = (rec["trials"] if rec else []) + result.get("trials", [])
        for j, t in enumerate(trials):
            t["trial"] = j
        ok = [t for t in trials if t["status"] == "ok"]
        reasons = sorted({t["reason"] for t in trials if t["status"] != "ok" and t.get("reason")} |
                         ({result["reason"]} if result.get("reason") and not result.get("trials") else set()))
        rec = {**common, "provenance": copy.deepcopy(prov), "length": length, **(rec or {}),
               "status": "ok" if trials and len(ok) == len(trials) else ("partial" if ok else "failed"),
               "reason": "; ".join(reasons) or None, "warmup": (rec or {}).get("warmup", []) + result.get("warmup", []),
               "trials": trials, "batches": [], "needle": (rec or {}).get("needle") or result.get("needle"),
               "resume_key": key, "started_at": (rec or {}).get("started_at") or started, "finished_at": provenance.now_iso(),
               "adaptive_seconds": (rec or {}).get("adaptive_seconds", 0.0) + seconds}
        if result.get("fault"):
            rec["fault"] = result["fault"]
        records[length] = rec
        write_kept(str(length), rec, outdir, None if result.get("resumed") else resume_dir)
        statuses[length] = rec["status"]
        planner.record(length, n, ok_samples(length, result), seconds)
        progress.info("%s L=%d: %d trial(s) (%s), %.1f s; %s", spec.name, length, n, planner.path[-1]["reason"][:120],
                      seconds, length_line(result))

    while (choice := planner.next_step()) is not None:
        step(choice[0], choice[1])
    if planner.phase == "around":
        for length, n, _ in planner.around():
            step(length, n)
    write_json(outdir / "sweep.json", {**common, "kind": "adaptive", **planner.summary(), "finished_at": provenance.now_iso()})
