"""A sweep's progress where the user is: a line per request done, with the sweep's elapsed time and
the time left for its configuration, predicted from the lengths measured so far.

The prediction is the one the request timeouts use (`fitted`): TTFT(L) = a + b L + c L^2 and the
decode step t0 + beta L (core.fitting), fitted to every successful trial so far (those of lengths
reused from an earlier run included), once they cover FIT_LENGTHS lengths. A request left costs
TTFT(L) + output_tokens x step(L); a batch of c requests sent together costs c prefills and one
decode (prefills queue, decode steps are shared). Before FIT_LENGTHS lengths the line gives a lower
bound instead, and says so: each request costs what the longest measured length not above its own
cost. Server start-ups are not predicted (a restart cannot be), nor are the load and reused-context workloads
after the lengths (their points may be reused from an interrupted run, and an open loop lasts as long as its
arrivals): where the configuration measures them the line says they are not counted, and a line says when the
lengths are done and the workloads begin.

The console gets a warm-up or trial line at most every `every_s` seconds (a failed one always), and
every length's final line; the lines held back go to the log file (logger longctx.measure.progress),
so the log has every request.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np

from ..core.fitting import decode_curve, fit_decode, fit_prefill, prefill_curve

console = logging.getLogger("longctx.progress")  # what `longctx bench --log` shows on the console
held = logging.getLogger(__name__)  # the log file's alone
FIT_LENGTHS = 3  # distinct lengths before the prefill fit (three coefficients) predicts
EVERY_S = 10.0  # at most one request line this often on the console; a length's final line always

Sample = tuple[int, float, float | None]  # (length, TTFT, TPOT) of a successful trial
Request = tuple[int, int, int]  # (prompt tokens, output tokens, prefills: 1, or c for a batch of c)


def fitted(history: list[Sample], lengths) -> tuple[np.ndarray, np.ndarray] | None:
    """(TTFT, TPOT) predicted at each of lengths by the non-negative fits of the trials in history,
    TTFT = a + b L + c L^2 and TPOT = t0 + beta L (TPOT 0 where fewer than two lengths have one);
    None until history covers FIT_LENGTHS lengths."""
    lengths = np.asarray(lengths, float)
    if len({h[0] for h in history}) < FIT_LENGTHS:
        return None
    ttft = prefill_curve(fit_prefill([h[0] for h in history], [h[1] for h in history]), lengths)
    decode = [(h[0], h[2]) for h in history if h[2]]
    if len({d[0] for d in decode}) < 2:
        return ttft, np.zeros(len(lengths))
    return ttft, decode_curve(fit_decode([d[0] for d in decode], [d[1] for d in decode], None), lengths)


def measured_below(history: list[Sample], lengths) -> tuple[list[float], list[float]] | None:
    """(TTFT, TPOT) at each of lengths as measured (medians) at the longest measured length not above
    it, 0 below them all: a lower bound where time grows with the length. None with nothing measured."""
    by: dict[int, list[Sample]] = {}
    for h in history:
        by.setdefault(h[0], []).append(h)
    if not by:
        return None
    med = {L: (statistics.median(s[1] for s in v), statistics.median(s[2] or 0.0 for s in v)) for L, v in by.items()}
    at = [med[max(k for k in med if k <= L)] if any(k <= L for k in med) else (0.0, 0.0) for L in lengths]
    return [a[0] for a in at], [a[1] for a in at]


def time_left(history: list[Sample], work: list[Request]) -> tuple[float, bool] | None:
    """Seconds the requests of work take, and whether that is the fits' prediction (True) or a lower
    bound (False: fewer than FIT_LENGTHS lengths measured); None with nothing measured."""
    if not work:
        return 0.0, True
    lengths = [w[0] for w in work]
    times = fitted(history, lengths)
    predicted = times is not None
    times = times if predicted else measured_below(history, lengths)
    if times is None:
        return None
    return float(sum(p * t + out * s for (_, out, p), t, s in zip(work, *times))), predicted


def length_work(proto: dict, length: int, needle: bool) -> list[Request]:
    """The requests of one length in the order the sweep sends them: warm-ups and trials, the
    concurrency batches, the needle probe (one request; a retry for its length is not counted)."""
    out = proto["output_tokens"]
    work = [(length, out, 1)] * (proto["warmup"] + proto["trials"])
    work += [(length, out, c) for c in proto["concurrency"] for _ in range(proto["trials"])]
    return work + ([(length, proto["needle"]["output_tokens"], 1)] if needle else [])


def duration(seconds: float) -> str:
    """0.25s, 1.5s, 42s, 3m05s, 2h07m."""
    s = max(0.0, seconds)
    if s < 1:
        return f"{s:.2f}s"
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


class Progress:
    """Where one configuration's sweep stands: which length (i of n), which request of it, the time
    since the sweep started, and the time left (the module's docstring says how it is predicted)."""

    def __init__(self, name: str, lengths: list[int], proto: dict, every_s: float = EVERY_S, clock=time.monotonic,
                 workloads: bool = False):
        self.name, self.lengths, self.proto, self.every_s, self.clock = name, list(lengths), proto, every_s, clock
        self.workloads = workloads  # load or reused-context workloads follow the lengths (not predicted)
        self.t0 = clock()
        self.last: float | None = None  # when a line last went to the console
        self.history: list[Sample] = []
        self.reused: set[int] = set()  # positions of lengths measured before: they cost nothing
        self.needle = bool(proto["needle"]["enabled"])  # False once the server says its weights are random
        self.index, self.done = 0, 0  # the length being measured (position) and its requests done
        self.burst_said = False  # whether a stream whose tokens did not arrive apart was said in full yet

    def known(self, index: int, samples: list[Sample]) -> None:
        """A length measured by an earlier run and reused: its trials join the fits, it costs nothing."""
        self.reused.add(index)
        self.history += samples

    def begin(self, index: int) -> None:
        self.index, self.done = index, 0

    def remaining(self) -> list[Request]:
        """The requests left to send: the current length's after those done, the later lengths' (those
        reused aside), the ITL-depth request."""
        work: list[Request] = []
        for i in range(self.index, len(self.lengths)):
            if i not in self.reused:
                work += length_work(self.proto, self.lengths[i], self.needle)[self.done if i == self.index else 0:]
        depth = self.proto["itl_depth"]
        return work + ([(depth["length"], depth["output_tokens"], 1)] if depth["length"] else [])

    def clock_text(self, server_up: bool = True) -> str:
        work = self.remaining()
        left = time_left(self.history, work)
        elapsed = f"elapsed {duration(self.clock() - self.t0)}"
        start = "" if server_up or not work else " plus the server's start-up"
        if left is None:
            return f"{elapsed}, time left: unknown until a length is measured"
        seconds, predicted = left
        start += ", workloads not counted" if self.workloads else ""
        if predicted:
            return f"{elapsed}, time left ~{duration(seconds)}{start}"
        measured = len({h[0] for h in self.history})
        return (f"{elapsed}, time left: at least {duration(seconds)}{start} (predicted once {FIT_LENGTHS} lengths are "
                f"measured; {measured} so far)")

    def where(self) -> str:
        return f"{self.name} L={self.lengths[self.index]} ({self.index + 1} of {len(self.lengths)} lengths)"

    def request(self, warmup: bool, k: int, n: int, summary: dict) -> None:
        """Request k of n (a warm-up, or a trial) of the current length is done."""
        self.done += 1
        ok = summary["status"] == "ok"
        if ok and not warmup:
            self.history.append((self.lengths[self.index], summary["ttft_s"], summary.get("tpot_s")))
        first_burst = False
        if ok:
            rate = f", decode {summary['decode_tok_s']:.1f} tok/s" if summary.get("decode_tok_s") else ""
            what = f"ok in {duration(summary.get('e2e_s') or 0.0)} (TTFT {summary['ttft_s']:.3f} s{rate})"
            if summary.get("burst"):  # its decode not measured (longctx.measure.burst): the first said in full
                first_burst, self.burst_said = not self.burst_said, True
                short = "decode not measured: its tokens did not arrive apart"
                what += f", {summary['decode_unmeasured'] if first_burst else short}"
        else:
            what = f"failed ({(summary.get('reason') or 'no reason given')[:160]})"
        self._say(f"{self.where()} {'warm-up' if warmup else 'trial'} {k} of {n}: {what}; {self.clock_text()}",
                  force=not ok or first_burst)

    def end(self, text: str, server_up: bool = True) -> None:
        """The current length is done (measured, failed or reused): its line always reaches the console.
        server_up False: the next length waits for a server start (not predicted), and the line says so."""
        where = self.where()
        self.index, self.done = self.index + 1, 0
        self._say(f"{where}: {text}; {self.clock_text(server_up)}", force=True)

    def lengths_done(self) -> None:
        """The lengths and the ITL-depth request are done: the workloads (not predicted) begin."""
        if self.workloads:
            self._say(f"{self.name}: lengths done, elapsed {duration(self.clock() - self.t0)}; the load and "
                      "reused-context workloads next", force=True)

    def finish(self) -> None:
        self._say(f"{self.name}: sweep done, elapsed {duration(self.clock() - self.t0)}", force=True)

    def _say(self, line: str, force: bool = False) -> None:
        now = self.clock()
        if force or self.last is None or now - self.last >= self.every_s:
            self.last = now
            console.info("%s", line)
        else:
            held.info("%s", line)
