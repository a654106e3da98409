"""A discrete-event simulation of a server's scheduler, iteration by iteration, from a serving model
calibrated on the server's own measurements (longctx.analysis.whatif builds it): what each request of a
workload would see (its TTFT, its token times, TPOT, end to end) under a setting that was not measured.

The serving model (Costs), in seconds:

- a prefill chunk of k tokens after p already in the cache: b k + c ((p + k)^2 - p^2), the prefill fit's
  linear and attention terms (the prefix cost model's form); a step that holds the first chunk of any request
  also carries the fit's fixed cost a, once however many prompts start in it (vLLM's CPU server here: two
  256-token prompts sent together had their first tokens after 8.2 ms, one alone after 7.2, a = 6.5 ms), and
  every other forward pass that holds a chunk the fixed cost of a pass, s (whatif sets it: the decode fit's t0, a
  pass whose token work is one token a request, at most a). A step that also decodes pays its pass's fixed cost in
  t0, so its chunks add a - s where one starts a prompt and nothing fixed otherwise. A single request prefilled
  whole reproduces the fit, a + b L + c L^2; in n chunks it costs (n - 1) s more: what a smaller chunk costs.
- a decode step of a batch of n requests with contexts l_i: t0 + r (n - 1) + beta sum(l_i): the decode fit's
  step (t0 + beta L for one request), plus r per request beyond the first (calibrated on the closed-loop
  points by whatif). A step that also carries prefill chunks (mixed) costs its decode part and its chunks.
- waking: the first step after the server idled g seconds starts w(g) later, w from the load stage's wake probe
  (single requests after measured idle gaps, less the shortest gap's, the sweep's own spacing): linear between the
  gaps probed, 0 below the shortest, the longest's beyond it; the server is idle long before a workload starts.

The scheduler's rules (Rules: the adapter's scheduler_rules, never the engine's name):

- PREFILL_FIRST (SGLang's, and the reference engine's): whenever a prefill batch can be formed it runs,
  and the running requests get no decode step in it: a request in chunked prefill continues; else waiting
  requests are admitted in order while the chunk budget, max_running and the pool allow (one per batch where
  `one_prefill`); a prompt longer than the budget left is chunked. With `mixed_chunk` the running requests
  decode one token in each prefill batch. Admission needs the pool to hold the prompt, and where `reserve` is
  set (SGLang's new_token_ratio: 0.7, decaying to a seventh of that over 600 decode steps, back to 0.7 on a
  retraction) the new request's own output and that share of the running requests' remaining output (each
  clipped at 4,096 tokens, SGLang's CLIP_MAX_NEW_TOKENS). A decode step the pool cannot hold retracts requests
  (fewest output tokens first, then the longer prompt: SGLang's retract_decode) back to the waiting queue's
  end; they are prefilled again over prompt and output.
- TOKEN_BUDGET (vLLM's V1 scheduler): every step has `chunk` tokens: the running requests first (a decode
  takes one, a prefill in progress its next chunk), then waiting requests in order up to max_running, each
  given what is left of the budget (long_prefill, where set, caps one prefill's share of a step), each only
  where the pool holds its whole prompt (vLLM's scheduler_reserve_full_isl), and none in a step that preempted.
  A running request whose tokens the pool cannot hold preempts the last-admitted running request (recompute: it
  goes to the front of the waiting queue and is prefilled again).

Workloads: a list of requests with arrival times (open loop; the interference probe), or a closed loop of c
clients each sending its next request when its last ends, their first ones at given starts (a real client sends
them a few milliseconds apart, and a server may prefill the first alone: vLLM's CPU server took the first of four
256-token prompts alone, 148 ms, then the three others together, 516 ms). Pure Python over plain numbers: the what-if grid of
a study config is simulated in seconds (bench/whatif_speed.py).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

PREFILL_FIRST, TOKEN_BUDGET = "prefill_first", "token_budget"
POLICIES = (PREFILL_FIRST, TOKEN_BUDGET)
RESERVE_DECAY_STEPS = 600  # SGLang's new_token_ratio decay
CLIP_OUTPUT = 4096  # SGLang's CLIP_MAX_NEW_TOKENS: the most output tokens a reservation counts
TURNAROUND = 1e-6  # a closed-loop client's next request reaches the server this long after the last token it answers


@dataclass(frozen=True)
class Costs:
    a: float  # a request's fixed prefill cost
    b: float  # per prompt token
    c: float  # per (p + k)^2 - p^2: the attention of k tokens after p
    t0: float  # a decode step's fixed cost
    beta: float  # per context token a decode step reads
    r: float = 0.0  # per request in a decode batch beyond the first
    s: float = 0.0  # a forward pass's fixed cost: what a chunk after a prompt's first pays (at most a)
    wake: tuple[tuple[float, float], ...] = ()  # (idle s, extra s) by idle: what the first step after an idle pays

    def chunk(self, p: int, k: int) -> float:
        return self.b * k + self.c * ((p + k) ** 2 - p * p)

    def fixed(self, starting: bool, decoding: bool) -> float:
        """The fixed cost a step's prefill chunks add: a where one starts a prompt, else s (one pass); less s where
        the step also decodes (t0 holds its pass)."""
        cost = self.a if starting else self.s
        return max(0.0, cost - self.s) if decoding else cost

    def step(self, n: int, contexts: int) -> float:
        return self.t0 + self.r * (n - 1) + self.beta * contexts if n else 0.0

    def woken(self, idle: float) -> float:
        """The extra time of the first step after `idle` seconds with nothing to do."""
        w = self.wake
        if not w or idle <= w[0][0]:
            return 0.0
        for (g0, e0), (g1, e1) in zip(w, w[1:]):
            if idle <= g1:
                return e0 + (e1 - e0) * (idle - g0) / (g1 - g0)
        return w[-1][1]


@dataclass(frozen=True)
class Rules:
    policy: str
    chunk: int | None = None  # PREFILL_FIRST: the chunked-prefill size; TOKEN_BUDGET: the tokens of a step
    max_running: int | None = None
    pool_tokens: int | None = None
    page: int = 1  # the pool's granularity (tokens per page or block)
    one_prefill: bool = False  # PREFILL_FIRST: one request per prefill batch
    mixed_chunk: bool = False  # PREFILL_FIRST: running requests decode in each prefill batch
    reserve: float = 0.0  # PREFILL_FIRST: the share of the running requests' remaining output admission keeps free
    reserve_min: float = 0.0  # ... to which it decays over RESERVE_DECAY_STEPS decode steps
    long_prefill: int | None = None  # TOKEN_BUDGET: the most tokens one prefill takes in a step

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"scheduler policy {self.policy!r}: one of {', '.join(POLICIES)}")


@dataclass(eq=False)  # each request is itself: two alike are two requests
class Request:
    arrival: float
    prompt: int
    output: int
    client: int | None = None  # the closed-loop client that sent it
    done: int = 0  # tokens in the KV cache (prompt, then prompt and output after a retraction)
    need: int = 0  # tokens to prefill before the next token comes
    generated: int = 0
    started: bool = False  # its first chunk ran (the fixed cost is paid once)
    times: list = field(default_factory=list)  # when each output token came
    retractions: int = 0
    failed: str | None = None

    def context(self) -> int:
        return self.prompt + self.generated

    def result(self) -> dict:
        t = self.times
        gaps = [y - x for x, y in zip(t, t[1:])]
        return {"arrival": self.arrival, "prompt": self.prompt, "output": self.generated, "failed": self.failed,
                "ttft": t[0] - self.arrival if t else None, "e2e": t[-1] - self.arrival if t else None,
                "tpot": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None, "gaps": gaps,
                "max_gap": max(gaps) if gaps else None, "times": t, "retractions": self.retractions}


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page) * page


class Simulation:
    """One workload on one serving model and rule set; run() returns every request's result (Request.result)."""

    def __init__(self, costs: Costs, rules: Rules, requests: list[Request] | None = None,
                 closed: tuple[int, int, int, int] | None = None, limit_s: float = 1e7, starts: list[float] | None = None):
        self.costs, self.rules, self.limit = costs, rules, limit_s
        self.now, self.events = 0.0, 0
        self.arrivals: list = []  # heap of (time, order, request)
        self.order = 0
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admitted, in admission order
        self.finished: list[Request] = []
        self.used = 0  # pool tokens held (page-rounded per request)
        self.closed = closed  # (clients, requests, prompt, output)
        self.sent = 0
        self.ratio = rules.reserve
        self.idle_since = -math.inf  # when the server last had nothing to do (None: busy)
        for r in requests or []:
            self._arrive(r)
        if closed:  # each client's first request at its start (starts: as a client sent them; else all at 0)
            clients, n, prompt, output = closed
            for i in range(min(clients, n)):
                self._send(starts[i] if starts and i < len(starts) else 0.0, prompt, output, i)

    def _arrive(self, r: Request) -> None:
        heapq.heappush(self.arrivals, (r.arrival, self.order, r))
        self.order += 1

    def _send(self, at: float, prompt: int, output: int, client: int) -> None:
        self.sent += 1
        self._arrive(Request(at, prompt, output, client))

    def _held(self, r: Request) -> int:
        return _pages(r.done, self.rules.page) if r.done else 0

    def _fits(self, extra: int) -> bool:
        return self.rules.pool_tokens is None or self.used + extra <= self.rules.pool_tokens

    def _release(self, r: Request) -> None:
        self.used -= self._held(r)

    def _grow(self, r: Request, tokens: int) -> None:
        before = self._held(r)
        r.done += tokens
        self.used += self._held(r) - before

    def _emit(self, r: Request, t: float) -> None:
        r.times.append(t)
        r.generated += 1
        self.events += 1
        if r.generated >= r.output:
            self._release(r)
            self.running.remove(r)
            self._finish(r, t)

    def _finish(self, r: Request, t: float) -> None:
        """A request done (or failed): its closed-loop client sends its next one, which reaches the server after the
        step that follows has started (TURNAROUND): a server starts its next step as soon as the last ends, and a
        request sent on a token of that step cannot be in it (vLLM's CPU server: a request sent as the one before
        ended waited out the other stream's step, 48 ms, before its prefill)."""
        self.finished.append(r)
        if self.closed and r.client is not None and self.sent < self.closed[1]:
            self._send(t + TURNAROUND, self.closed[2], self.closed[3], r.client)

    def _admit_arrivals(self) -> None:
        while self.arrivals and self.arrivals[0][0] <= self.now:
            r = heapq.heappop(self.arrivals)[2]
            r.need = r.prompt
            if self.rules.pool_tokens is not None and _pages(r.prompt + r.output, self.rules.page) > self.rules.pool_tokens:
                # neither engine completes it: the pool cannot hold it even alone
                r.failed = (f"the prompt and its output ({r.prompt + r.output:,} tokens) are more than the pool holds "
                            f"({self.rules.pool_tokens:,})")
                self._finish(r, self.now)
                continue
            self.waiting.append(r)

    def run(self) -> list[dict]:
        step = self._step_prefill_first if self.rules.policy == PREFILL_FIRST else self._step_token_budget
        while True:
            self._admit_arrivals()
            if not self.running and not self.waiting:
                if not self.arrivals:
                    break
                if self.idle_since is None:
                    self.idle_since = self.now
                self.now = self.arrivals[0][0]
                continue
            if self.idle_since is not None:  # the server wakes to its first step after idling
                self.now += self.costs.woken(self.now - self.idle_since)
                self.idle_since = None
            took = step()
            if took is None:  # nothing could run: wait for the next arrival, else the waiting never fit
                if self.arrivals:
                    self.now = self.arrivals[0][0]
                    continue
                for r in self.waiting:
                    r.failed = "never admitted: the pool cannot hold it beside the running requests"
                    self.finished.append(r)
                self.waiting.clear()
                break
            if self.now > self.limit:
                for r in self.waiting + self.running + [a[2] for a in self.arrivals]:
                    r.failed = f"not finished by {self.limit:g} s"
                    self.finished.append(r)
                break
        return [r.result() for r in sorted(self.finished, key=lambda r: (r.arrival, r.client or 0))]

    # PREFILL_FIRST ------------------------------------------------------------------------------------
    def _chunk_left(self) -> float:
        return self.rules.chunk if self.rules.chunk else math.inf

    def _step_prefill_first(self) -> float | None:
        rules, costs = self.rules, self.costs
        batch: list[tuple[Request, int]] = []
        budget = self._chunk_left()
        in_prefill = next((r for r in self.running if r.need), None)  # a request in chunked prefill goes on
        if in_prefill is not None:
            k = int(min(in_prefill.need, budget))
            batch.append((in_prefill, k))
            budget -= k
        decoding = [r for r in self.running if not r.need]
        pending = 0  # pages granted in this batch, not yet held
        while in_prefill is None and self.waiting and budget > 0:
            if rules.max_running and len(self.running) >= rules.max_running:
                break
            r = self.waiting[0]
            reserve = 0
            if rules.reserve:
                reserve = int(min(r.output - r.generated, CLIP_OUTPUT) + self.ratio * sum(
                    min(x.output - x.generated, CLIP_OUTPUT) for x in self.running))
            if not self._fits(pending + _pages(r.need, rules.page) + reserve):
                break
            self.waiting.pop(0)
            self.running.append(r)
            pending += _pages(r.need, rules.page)
            k = int(min(r.need, budget))
            batch.append((r, k))
            budget -= k
            if k < r.need or rules.one_prefill:
                break
        if not batch:
            return self._decode(decoding) if decoding else None
        mixed = decoding if rules.mixed_chunk else []
        took = costs.fixed(any(not r.started for r, _ in batch), bool(mixed))
        for r, k in batch:
            took += costs.chunk(r.done, k)
            r.started = True
            self._grow(r, k)
            r.need -= k
        if mixed:
            took += costs.step(len(mixed), sum(x.context() for x in mixed))
        self.now += took
        for r in mixed:
            self._grow(r, 1)
            self._emit(r, self.now)
        for r, _ in batch:
            if not r.need:
                self._emit(r, self.now)
        return took

    def _decode(self, decoding: list[Request]) -> float:
        """One decode step of the running requests, after retracting what the pool cannot hold."""
        rules = self.rules
        if rules.pool_tokens is not None:
            grow = sum(self._held_after(r) - self._held(r) for r in decoding)
            # SGLang's retraction order: sorted by output length, then by shorter prompt; the last go first
            order = sorted(decoding, key=lambda r: (r.generated, -r.prompt), reverse=True)
            retracted = False
            while grow and not self._fits(grow) and len(order) > 1:
                victim = order.pop()
                grow -= self._held_after(victim) - self._held(victim)
                self._retract(victim)
                self.waiting.append(victim)
                retracted = True
            decoding = [r for r in decoding if r in self.running]
            if retracted:
                self.ratio = rules.reserve
            elif rules.reserve:
                self.ratio = max(rules.reserve_min, self.ratio - (rules.reserve - rules.reserve_min) / RESERVE_DECAY_STEPS)
        took = self.costs.step(len(decoding), sum(r.context() for r in decoding))
        self.now += took
        for r in list(decoding):
            self._grow(r, 1)
            self._emit(r, self.now)
        return took

    def _held_after(self, r: Request) -> int:
        return _pages(r.done + 1, self.rules.page)

    def _retract(self, r: Request) -> None:
        self._release(r)
        self.running.remove(r)
        r.done, r.need = 0, r.prompt + r.generated
        r.retractions += 1

    # TOKEN_BUDGET -------------------------------------------------------------------------------------
    def _step_token_budget(self) -> float | None:
        rules, costs = self.rules, self.costs
        budget = self._chunk_left()
        cap = rules.long_prefill or math.inf
        chunks: list[tuple[Request, int]] = []
        decodes: list[Request] = []
        preempted = False
        pending = 0  # pages granted in this step, not yet held
        growth: dict[int, int] = {}  # each one's share of it
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            k = 1 if not r.need else int(min(r.need, budget, cap))
            while not self._fits(pending + _pages(r.done + k, rules.page) - self._held(r)):
                victim = self.running[-1]  # the last admitted is preempted (recompute)
                self._retract(victim)
                self.waiting.insert(0, victim)
                preempted = True
                pending -= growth.pop(id(victim), 0)
                chunks = [(x, n) for x, n in chunks if x is not victim]
                decodes = [x for x in decodes if x is not victim]
                if victim is r:
                    break
            if r not in self.running:
                break
            (decodes.append(r) if not r.need else chunks.append((r, k)))
            growth[id(r)] = _pages(r.done + k, rules.page) - self._held(r)
            pending += growth[id(r)]
            budget -= k
            i += 1
        while not preempted and self.waiting and budget > 0 and (not rules.max_running or len(self.running) < rules.max_running):
            r = self.waiting[0]
            k = int(min(r.need, budget, cap))
            if not self._fits(pending + _pages(r.need, rules.page)):
                break
            self.waiting.pop(0)
            self.running.append(r)
            pending += _pages(k, rules.page)
            chunks.append((r, k))
            budget -= k
        if not chunks and not decodes:
            return None
        took = costs.step(len(decodes), sum(r.context() for r in decodes))
        took += costs.fixed(any(not r.started for r, _ in chunks), bool(decodes)) if chunks else 0.0
        for r, k in chunks:
            took += costs.chunk(r.done, k)
            r.started = True
        self.now += took
        for r, k in chunks:
            self._grow(r, k)
            r.need -= k
        for r in decodes:
            self._grow(r, 1)
            self._emit(r, self.now)
        for r, _ in chunks:
            if not r.need and r in self.running:
                self._emit(r, self.now)
        return took


def simulate(costs: Costs, rules: Rules, requests: list[tuple[float, int, int]] | None = None,
             closed: tuple[int, int, int, int] | None = None, starts: list[float] | None = None) -> tuple[list[dict], int]:
    """Every request's result (Request.result) and the events simulated (tokens emitted), for requests given as
    (arrival, prompt, output) or a closed loop (clients, requests, prompt, output), its clients' first requests at
    `starts` (seconds; default all at 0)."""
    sim = Simulation(costs, rules, [Request(t, p, o) for t, p, o in requests or []], closed, starts=starts)
    return sim.run(), sim.events
