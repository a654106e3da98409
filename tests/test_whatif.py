"""The what-if simulator (longctx.analysis.simulate) on cases derived by hand, the adapters' scheduler rules from
the engines' own parsers and defaults, and the what-if grid (longctx.analysis.whatif). Against measured load points:
the reference engine's in tests/test_workflow.py (the tiny workflow), vLLM's in tests/test_thirdparty.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from longctx.analysis.simulate import PREFILL_FIRST, TOKEN_BUDGET, Costs, Rules, simulate
from longctx.engines import get_adapter

K = Costs(a=0.01, b=2e-5, c=1e-9, t0=0.002, beta=1e-7, r=0.0005)


@pytest.mark.parametrize("policy", [PREFILL_FIRST, TOKEN_BUDGET])
@pytest.mark.parametrize("chunk", [None, 1000, 4096])
def test_a_single_request_reproduces_the_fits(policy, chunk):
    """Alone, a request's TTFT is the prefill fit a + b L + c L^2 whatever the chunking (the chunks' attention terms
    telescope: sum of (p + k)^2 - p^2 is L^2), and its steps are the decode fit's t0 + beta x context, the context
    one token longer each step: TPOT = t0 + beta (L + n / 2) over n + 1 output tokens."""
    if policy == TOKEN_BUDGET and chunk is None:
        chunk = 1 << 20
    L, n = 3000, 9
    (r,), events = simulate(K, Rules(policy, chunk=chunk), [(0.5, L, n + 1)])
    assert events == n + 1
    assert r["ttft"] == pytest.approx(0.01 + 2e-5 * L + 1e-9 * L * L, rel=1e-12)
    assert r["tpot"] == pytest.approx(0.002 + 1e-7 * (L + n / 2 + 0.5), rel=1e-12)
    assert r["e2e"] == pytest.approx(r["ttft"] + n * r["tpot"], rel=1e-12)


def test_a_prefill_stalls_a_running_stream_for_all_its_chunks_under_prefill_first():
    """SGLang runs a prefill's chunks one after another before any decode step: a stream decoding when a prompt of L
    tokens arrives waits the whole prefill, a + b L + c L^2, plus the next step, now of 2 requests. beta = 0 here, so
    the step is t0 + r (n - 1) whatever the contexts."""
    k = Costs(a=0.01, b=2e-5, c=1e-9, t0=0.002, beta=0.0, r=0.0005)
    L, chunk = 10000, 4096
    victim_ttft = k.a + k.chunk(0, 100)
    arrive = victim_ttft + 5.5 * k.t0  # halfway through the victim's sixth step
    res, _ = simulate(k, Rules(PREFILL_FIRST, chunk=chunk), [(0.0, 100, 40), (arrive, L, 3)])
    victim, injected = res
    prefill = k.a + k.chunk(0, 4096) + k.chunk(4096, 4096) + k.chunk(8192, L - 8192)
    assert prefill == pytest.approx(k.a + k.b * L + k.c * L * L)
    assert victim["max_gap"] == pytest.approx(prefill + k.t0 + k.r, rel=1e-9)
    # the injected request waited for the step in progress, then its whole prefill
    assert injected["ttft"] == pytest.approx(victim_ttft + 6 * k.t0 - arrive + prefill, rel=1e-9)


def test_a_prefill_stalls_a_running_stream_by_one_chunk_a_step_under_a_token_budget():
    """vLLM's step holds the running decode (1 token) and as much of the prompt as the budget leaves (chunk - 1):
    the stream gets a token every step, each step one chunk longer; its worst gap is the step with the costliest
    chunk, the last full one or the remainder (the attention term grows with p), plus the decode part."""
    k = Costs(a=0.01, b=2e-5, c=1e-9, t0=0.002, beta=0.0, r=0.0)
    L, budget = 10000, 2048
    res, _ = simulate(k, Rules(TOKEN_BUDGET, chunk=budget), [(0.0, 100, 60), (0.03, L, 3)])
    victim, injected = res
    chunks, p = [], 0
    while p < L:
        n = min(budget - 1, L - p)
        chunks.append(k.chunk(p, n) + (k.a if p == 0 else 0.0))
        p += n
    assert victim["max_gap"] == pytest.approx(k.t0 + max(chunks), rel=1e-9)
    # the prefill took that many steps, each a gap of the stream's, and it waited for none other
    assert sum(gap > 1.5 * k.t0 for gap in victim["gaps"]) == len(chunks) == 5
    long = [i for i, gap in enumerate(victim["gaps"]) if gap > 1.5 * k.t0]
    assert long == list(range(long[0], long[0] + 5))  # one after another
    assert injected["times"][0] == victim["times"][long[-1] + 1]  # its first token with the last chunk's step


def test_a_request_waits_for_a_running_slot_and_its_ttft_is_the_wait_plus_its_prefill():
    """max_running 1: the second request, arriving while the first decodes, is admitted when the first ends."""
    L, n = 500, 20
    res, _ = simulate(K, Rules(PREFILL_FIRST, chunk=8192, max_running=1), [(0.0, L, n), (0.02, L, n)])
    first, second = res
    end1 = first["times"][-1]
    assert second["ttft"] == pytest.approx(end1 - 0.02 + K.a + K.chunk(0, L), rel=1e-9)


def test_a_closed_loop_of_one_sends_each_request_as_the_last_ends():
    from longctx.analysis.simulate import TURNAROUND

    L, n = 800, 6
    res, _ = simulate(K, Rules(PREFILL_FIRST, chunk=8192), closed=(1, 4, L, n))
    assert len(res) == 4
    for before, after in zip(res, res[1:]):
        assert after["arrival"] == before["times"][-1] + TURNAROUND
        assert after["ttft"] == pytest.approx(res[0]["ttft"], rel=1e-12)


@pytest.mark.parametrize("policy", [PREFILL_FIRST, TOKEN_BUDGET])
def test_a_request_sent_on_a_token_misses_the_step_already_running_and_clients_start_when_they_sent(policy):
    """Two clients, the second's first request sent 11 ms after the first's (starts), 3 output tokens each, a = 10 ms,
    2 ms decode steps, nothing per token. By hand: the first is prefilled alone (TTFT 10 ms); the second arrives
    during the first's decode and is prefilled next (PREFILL_FIRST: alone; under a token budget beside the first's
    decode, a step of 10 ms). The first ends at 22 or 24 ms, and its client's next request reaches the server after
    the step that follows has begun (as vLLM's CPU server took it): it waits that step (the second's decode, 2 ms),
    then its own prefill: TTFT 12 ms where a request already there would have had 10."""
    k = Costs(a=0.01, b=0.0, c=0.0, t0=0.002, beta=0.0, s=0.002)
    res, _ = simulate(k, Rules(policy, chunk=4096, one_prefill=True), closed=(2, 3, 100, 3), starts=[0.0, 0.011])
    first, second, third = sorted(res, key=lambda r: r["arrival"])
    assert first["ttft"] == pytest.approx(0.01, rel=1e-9) and second["arrival"] == 0.011
    assert third["arrival"] == pytest.approx(first["times"][-1], abs=1e-5)
    assert third["ttft"] == pytest.approx(0.012, abs=1e-5)


@pytest.mark.parametrize("policy", [PREFILL_FIRST, TOKEN_BUDGET])
def test_a_pool_too_small_for_every_stream_retracts_and_every_request_still_finishes(policy):
    """4 requests of 1,000 prompt tokens and 600 output in a pool of 5,000: all are admitted (their prompts fit),
    their decodes do not; requests are retracted (preempted) and prefilled again, and each still gets all its
    tokens, one per step, in order."""
    res, _ = simulate(K, Rules(policy, chunk=8192, pool_tokens=5000, page=16), [(0.0, 1000, 600)] * 4)
    assert sum(r["retractions"] for r in res) >= 1
    assert all(r["output"] == 600 and not r["failed"] for r in res)
    assert all(np.all(np.diff(r["times"]) > 0) for r in res)


def test_a_prompt_larger_than_the_pool_fails_with_the_reason():
    (r,), _ = simulate(K, Rules(PREFILL_FIRST, pool_tokens=1000), [(0.0, 5000, 4)])
    assert r["failed"] and "more than the pool holds" in r["failed"]
    # nor one whose output would outgrow it: neither engine completes it, and it blocks nothing after it
    res, _ = simulate(K, Rules(PREFILL_FIRST, pool_tokens=6000, reserve=0.7, reserve_min=0.098), [(0.0, 5000, 2000), (0.1, 100, 10)])
    assert res[0]["failed"] and not res[1]["failed"] and res[1]["output"] == 10


@pytest.mark.parametrize("policy", [PREFILL_FIRST, TOKEN_BUDGET])
def test_two_prompts_the_pool_holds_only_one_of_are_not_admitted_together(policy):
    """Pages granted earlier in the same step count: two 6,000-token prompts in a pool of 10,000 run one after the
    other, the second admitted when the first ends (its TTFT: the first's end to arrival, then its prefill)."""
    res, _ = simulate(K, Rules(policy, chunk=16384, pool_tokens=10000), [(0.0, 6000, 4), (0.0, 6000, 4)])
    first, second = res
    assert second["ttft"] == pytest.approx(first["times"][-1] + K.a + K.chunk(0, 6000), rel=1e-9)


def test_sglang_retracts_the_request_with_the_fewest_output_tokens_first():
    """retract_decode sorts by (output length, -prompt length) in reverse and pops from the end: the request with
    the fewest output tokens (then the longest prompt) goes first. Here b (3,000-token prompt, admitted later, so
    fewer tokens out) is retracted and a decodes on."""
    res, _ = simulate(K, Rules(PREFILL_FIRST, chunk=8192, pool_tokens=4100), [(0.0, 1000, 200), (0.05, 3000, 200)])
    a, b = res
    assert (a["retractions"], b["retractions"]) == (0, 1)


def test_sglang_reserves_running_output_at_admission_and_the_reference_engine_does_not():
    """SGLang's PrefillAdder keeps new_token_ratio of the running requests' remaining output free (and the new one's
    own): with a pool of 6,000, a second 2,000-token prompt beside one that will decode 3,000 more waits; the
    reference engine admits it at once (its prompt's pages are free)."""
    reqs = [(0.0, 2000, 3000), (0.001, 2000, 10)]
    sg, _ = simulate(K, Rules(PREFILL_FIRST, chunk=8192, pool_tokens=6000, reserve=0.7, reserve_min=0.098), reqs)
    ref, _ = simulate(K, Rules(PREFILL_FIRST, chunk=8192, pool_tokens=6000, one_prefill=True), reqs)
    prefill = K.a + K.chunk(0, 2000)
    assert ref[1]["ttft"] == pytest.approx(prefill - 0.001 + prefill, rel=1e-9)  # admitted as the first's prefill ends
    # SGLang: 2,000 held + 2,000 + 10 + 0.7 x 3,000 = 6,110 > 6,000; each decode step holds one token more and
    # reserves about 2.7 fewer (one fewer to come, the ratio 0.001 lower), so some 40 steps pass first
    assert sg[1]["ttft"] > ref[1]["ttft"] + 30 * K.t0


def test_the_adapters_state_their_schedulers_rules():
    """From each engine's flags (as configured, else its info, else the engine's own default): SGLang's and the
    reference engine's prefill-first rules, vLLM's token budget with its CPU defaults (2048 tokens, 128 sequences:
    vllm/engine/arg_utils.py get_batch_defaults), none for a server someone else runs."""
    ref = get_adapter("reference").scheduler_rules({"page-size": 1}, {}, 40960)
    assert (ref["policy"], ref["chunk"], ref["max_running"], ref["one_prefill"], ref["reserve"]) == ("prefill_first", 8192, 8, True, 0.0)
    sg = get_adapter("sglang").scheduler_rules({"max-running-requests": 8, "chunked-prefill-size": 4096,
                                               "enable-mixed-chunk": True}, {}, 200000)
    assert (sg["chunk"], sg["max_running"], sg["mixed_chunk"], sg["one_prefill"], sg["reserve"]) == (4096, 8, True, False, 0.7)
    # SGLang's resolve_max_num_reqs where max-running-requests is neither set nor reported: min(clamp(pool /
    # context x 512, 2048, 4096), pool // 2)
    sg = get_adapter("sglang").scheduler_rules({"context-length": 200000}, {"chunked_prefill_size": 8192}, 230000)
    assert sg["max_running"] == min(max(min(int(230000 / 200000 * 512), 4096), 2048), 115000) == 2048
    vl = get_adapter("vllm").scheduler_rules({}, {}, 8192, device="cpu")  # its CPU build, as the run recorded it
    assert (vl["policy"], vl["chunk"], vl["max_running"]) == ("token_budget", 2048, 128)
    vl = get_adapter("vllm").scheduler_rules({"tensor-parallel-size": 2}, {}, 8192, device="gpu")
    assert (vl["chunk"], vl["max_running"]) == (8192, 1024)
    vl = get_adapter("vllm").scheduler_rules({"device": "cpu", "max-num-batched-tokens": 64, "max-num-seqs": 256}, {}, 8192)
    assert vl["max_running"] == 64  # vLLM caps max_num_seqs at the budget
    assert get_adapter("external").scheduler_rules({}, {}, None) is None


def test_the_reference_engines_defaults_are_its_parsers():
    from longctx.refengine.args import build_parser

    d = build_parser().parse_args([])
    ref = get_adapter("reference").scheduler_rules({}, {}, 1000)
    assert (ref["chunk"], ref["max_running"]) == (d.chunked_prefill_size, d.max_running_requests)


def test_the_whatif_grid_answers_each_setting_with_a_frontier():
    """A grid of max_running and chunk sizes on a serving model with a pool: each setting has its points and a
    frontier per concurrency, bisected between the grid's lengths; one running slot queues the 8 clients' requests
    one after another, eight run them together, so eight slots give the longer frontier at c = 8; a setting whose
    pool cannot be sized says so."""
    from longctx.analysis.whatif import grid

    rules = Rules(PREFILL_FIRST, chunk=8192, max_running=4, pool_tokens=100000, page=1, one_prefill=True)
    g = {"max_running_requests": [1, 8], "chunked_prefill_size": [], "mem_fraction_static": [], "concurrency": [1, 8],
         "rates": [0.5], "arrival": "poisson", "burstiness": 1.0, "seed": 0,
         "lengths": [1000, 4000, 16000], "output_tokens": 16, "requests": 16}
    slo = {"ttft_s": 0.5, "tpot_s": 0.05, "attainment": 0.9}
    out, events = grid(K, rules, None, g, slo, 0.95)
    assert events > 0 and len(out) == 2
    one, eight = out
    # alone, the TTFT is the fit: a + b L + c L^2 <= 0.5 s up to about 12.6k tokens
    L_star = (-K.b + math.sqrt(K.b**2 + 4 * K.c * (0.5 - K.a))) / (2 * K.c)
    f1 = {f["concurrency"]: f for f in one["frontier"] if "concurrency" in f}[1]
    assert L_star / 1.03 <= f1["max_length"] <= L_star
    # at c = 8 with one running slot, the 8th request queues behind 7 others: far shorter
    at8 = [{f.get("concurrency"): f["max_length"] for f in s["frontier"]}[8] for s in (one, eight)]
    assert at8[0] < at8[1]
    # an open loop at 0.5/s: requests mostly alone (each takes well under 2 s up to the frontier), so its frontier is
    # near the lone request's, and never above it
    (rate,) = [f for f in eight["frontier"] if "rate" in f]
    assert L_star / 2 <= rate["max_length"] <= L_star
    out, _ = grid(K, rules, None, {**g, "max_running_requests": [], "mem_fraction_static": [0.9]}, slo, 0.95)
    assert "cannot size" in out[0]["reason"]


@pytest.mark.parametrize("policy", [PREFILL_FIRST, TOKEN_BUDGET])
def test_a_request_that_finds_the_server_idle_pays_its_waking(policy):
    """The wake probe's figures: nothing after 20 ms idle (the reference), 3 ms after 100 ms, 40 ms after 1 s. By hand,
    with a = 10 ms, no per-token prefill cost and 1 ms decode steps: the first request finds the server idle since
    long before (the longest gap's 40 ms): TTFT 50 ms, its second token at 51 ms; the second arrives 60 ms after that,
    3 ms x (60 - 20) / (100 - 20) = 1.5 ms on waking: TTFT 11.5 ms; the third arrives while the second decodes and
    pays nothing for waking: it waits for the step in progress (PREFILL_FIRST then prefills it before any decode)."""
    k = Costs(a=0.01, b=0.0, c=0.0, t0=0.001, beta=0.0, wake=((0.02, 0.0), (0.1, 0.003), (1.0, 0.04)))
    assert [k.woken(g) for g in (0.0, 0.02, 0.06, 0.1, 0.55, 1.0, 30.0)] == pytest.approx(
        [0, 0, 0.0015, 0.003, 0.0215, 0.04, 0.04])
    second = 0.051 + 0.06
    res, _ = simulate(k, Rules(policy, chunk=4096), [(0.0, 100, 2), (second, 100, 20), (second + 0.0115 + 0.0005, 100, 2)])
    first, two, three = res
    assert first["ttft"] == pytest.approx(0.05, rel=1e-9) and first["e2e"] == pytest.approx(0.051, rel=1e-9)
    assert two["ttft"] == pytest.approx(0.0115, rel=1e-9)
    # the third arrived 0.5 ms into the second's first decode step (1 ms): it waits 0.5 ms, then its prefill (10 ms)
    # under PREFILL_FIRST; under the token budget it is prefilled in the next step beside the second's decode, a step
    # that costs both (11 ms)
    assert three["ttft"] == pytest.approx(0.0005 + 0.01 + (0.001 if policy == TOKEN_BUDGET else 0.0), rel=1e-9)
    # without the probe's figures, no waking: the fits alone
    plain, _ = simulate(Costs(a=0.01, b=0.0, c=0.0, t0=0.001, beta=0.0), Rules(policy, chunk=4096), [(0.0, 100, 2)])
    assert plain[0]["ttft"] == pytest.approx(0.01, rel=1e-9)


@pytest.mark.parametrize("policy", [PREFILL_FIRST, TOKEN_BUDGET])
def test_prompts_that_start_in_one_step_pay_the_fixed_cost_once(policy):
    """Two prompts of L tokens arriving together are prefilled in one step (a batch under PREFILL_FIRST, one budget
    under the token budget): a once, and each prompt's own b L + c L^2 (vLLM's CPU server: 8.2 ms for two 256-token
    prompts, 7.2 ms for one, a = 6.5 ms). With one_prefill (the reference engine) the second waits for the first."""
    L = 1000
    (x, y), _ = simulate(K, Rules(policy, chunk=4096), [(0.0, L, 2), (0.0, L, 2)])
    assert x["ttft"] == pytest.approx(K.a + 2 * (K.b * L + K.c * L * L), rel=1e-12) and y["ttft"] == x["ttft"]
    if policy == PREFILL_FIRST:
        (x, y), _ = simulate(K, Rules(policy, chunk=4096, one_prefill=True), [(0.0, L, 2), (0.0, L, 2)])
        alone = K.a + K.b * L + K.c * L * L
        assert x["ttft"] == pytest.approx(alone, rel=1e-12) and y["ttft"] == pytest.approx(2 * alone, rel=1e-12)


def test_a_closed_loop_below_its_level_is_predicted_but_left_out_of_the_error():
    """A closed loop that did not hold its concurrency ran another workload than the one simulated: its rows say why
    (the held share, the client's stall) and the median error leaves them out; one that held it counts."""
    from longctx.analysis.whatif import check, errors

    rules = Rules(PREFILL_FIRST, chunk=8192)
    (alone,), _ = simulate(K, rules, [(0.0, 1000, 17)])
    measured = {q: {"p50": {"value": alone[q] * 1.1}} for q in ("ttft", "tpot")}  # 10% above the model
    held = {"level": 2, "share": 0.4, "below": True, "client_stall_max_s": 0.31}
    load = {"closed": [{"ok": True, "level": 1, "n": 4, "length": 1000, "output_tokens": 17, **measured},
                       {"ok": True, "level": 2, "n": 4, "length": 1000, "output_tokens": 17, "held": held,
                        "ttft": {"p50": {"value": 9.0}}, "tpot": {"p50": {"value": 9.0}}}]}
    rows = check(K, [], rules, load, None, None, {})
    p50 = [r for r in rows if r["which"] == "p50"]
    assert [(r["level"], r["quantity"], bool(r["excluded"])) for r in p50] == [
        (1, "ttft", False), (1, "tpot", False), (2, "ttft", True), (2, "tpot", True)]
    assert p50[2]["excluded"] == "the loop held its 2 requests 40% of the time, the client kept off its CPUs up to 0.31 s"
    assert all(r["error"] == pytest.approx(1 / 1.1 - 1) for r in p50[:2]) and p50[2]["error"] < -0.9  # predicted, not counted
    assert errors(rows)["p50"] == {"median_abs": pytest.approx(1 - 1 / 1.1), "n": 2}


@pytest.mark.parametrize("policy", [PREFILL_FIRST, TOKEN_BUDGET])
def test_a_prompt_in_n_chunks_pays_n_minus_one_passes_more(policy):
    """A forward pass has its own fixed cost s (issue 45): a prompt of 10,000 tokens in chunks of 4,096 is three passes,
    the first paying a, the next two s each: a + 2 s + b L + c L^2 by hand; unchunked, the fit a + b L + c L^2."""
    k = Costs(a=0.01, b=2e-5, c=1e-9, t0=0.004, beta=1e-7, s=0.004)
    L = 10000
    (chunked,), _ = simulate(k, Rules(policy, chunk=4096), [(0.0, L, 2)])
    (whole,), _ = simulate(k, Rules(policy, chunk=1 << 20), [(0.0, L, 2)])
    assert chunked["ttft"] == pytest.approx(0.01 + 2 * 0.004 + 2e-5 * L + 1e-9 * L * L, rel=1e-12)
    assert whole["ttft"] == pytest.approx(0.01 + 2e-5 * L + 1e-9 * L * L, rel=1e-12)


def test_the_chunk_trades_ttft_for_stalls_under_a_token_budget_and_only_costs_under_prefill_first():
    """A stream decoding when a 16,000-token prompt arrives. Under a token budget, a smaller chunk costs the prompt
    TTFT (more passes, s each) and shortens the stream's worst stall (one chunk a step); under PREFILL_FIRST without
    mixed chunks the prompt runs all its chunks before the next decode step: a smaller chunk lengthens both."""
    k = Costs(a=0.01, b=2e-5, c=1e-9, t0=0.004, beta=1e-7, s=0.004)
    work = [(0.0, 100, 80), (0.05, 16000, 2)]
    figs = {}
    for policy in (TOKEN_BUDGET, PREFILL_FIRST):
        for chunk in (2048, 8192):
            victim, injected = simulate(k, Rules(policy, chunk=chunk), work)[0]
            figs[policy, chunk] = (injected["ttft"], victim["max_gap"])
    small, large = figs[TOKEN_BUDGET, 2048], figs[TOKEN_BUDGET, 8192]
    assert small[0] > large[0] and small[1] < large[1] / 2
    small, large = figs[PREFILL_FIRST, 2048], figs[PREFILL_FIRST, 8192]
    assert small[0] > large[0] and small[1] > large[1]
    # six passes more at 2,048 than at 8,192 (8 against 2), s each
    assert small[1] - large[1] == pytest.approx(6 * k.s, rel=1e-9)


def _closed_point(costs, rules, level, length, output=17, n=8, scale=1.0):
    """A closed-loop point as load.json has it, its medians those of the simulation (times scale): data whose answer
    is known by construction."""
    from longctx.analysis.whatif import _closed, _summary

    s = _summary(_closed(costs, rules, level, n, length, output))
    return {"ok": True, "level": level, "n": n, "length": length, "output_tokens": output,
            "ttft": {"p50": {"value": s["ttft"]["p50"]}}, "tpot": {"p50": {"value": s["tpot"]["p50"] * scale}}}


def test_each_point_r_is_fitted_to_is_predicted_out_of_sample():
    """r fitted to the closed loops of 2 and 4 (made by a model with r = 0.5 ms) is found again; each point is checked
    with r fitted to the other alone. With the loop of 4's TPOT 30% higher than the model made it, the check does not
    bend to it: its error is about 1/1.3 - 1 (the all-points fit would have met it halfway), and the headline counts
    every figure as out of sample."""
    from longctx.analysis.whatif import calibrate_r, check, errors, left_out, with_r

    rules = Rules(PREFILL_FIRST, chunk=8192)
    truth = dataclasses.replace(K, r=0.0005)
    two, four = _closed_point(truth, rules, 2, 1000), _closed_point(truth, rules, 4, 1000)
    r, source = calibrate_r(dataclasses.replace(truth, r=0.0), rules, [two, four])
    assert r == pytest.approx(0.0005, rel=0.05) and "2 closed-loop points" in source
    four = _closed_point(truth, rules, 4, 1000, scale=1.3)
    base = dataclasses.replace(truth, r=0.0)
    loo = left_out(base, [], rules, [two, four])
    assert loo[id(four)][0].r == pytest.approx(0.0005, rel=0.05)  # from the loop of 2 alone
    assert "the other 1 closed-loop point" in loo[id(four)][2]
    best, _, _ = with_r(base, [], rules, [two, four])
    rows = check(best, [], rules, {"closed": [two, four]}, None, None, {}, loo)
    (tp4,) = [x for x in rows if x["level"] == 4 and x["quantity"] == "tpot" and x["which"] == "p50"]
    assert tp4["error"] == pytest.approx(1 / 1.3 - 1, abs=0.02) and tp4["r_left_out"]
    # in sample (the all-points r), the same point would have looked better than it is
    (in_sample,) = [x for x in check(best, [], rules, {"closed": [four]}, None, None, {}) if x["quantity"] == "tpot" and x["which"] == "p50"]
    assert abs(in_sample["error"]) < abs(tp4["error"]) - 0.05
    assert set(errors(rows)) == {"p50", "p90"} and errors(rows)["p50"]["n"] == 4
    # one point alone: nothing else to fit r to, so r = 0 for its check, said
    loo = left_out(base, [], rules, [four])
    assert loo[id(four)][0].r == 0 and loo[id(four)][2].startswith("0: no other closed-loop point")


def test_each_bootstrap_draw_refits_r():
    """Draws whose decode step is 20% shorter or longer than the best fit's each get their own r, fitted to the same
    point: the draw with the cheaper step needs a larger r to meet the measured TPOT, so the intervals carry r's
    uncertainty instead of holding it fixed."""
    from longctx.analysis.whatif import with_r

    rules = Rules(PREFILL_FIRST, chunk=8192)
    four = _closed_point(dataclasses.replace(K, r=0.0005), rules, 4, 1000)
    low, high = dataclasses.replace(K, t0=K.t0 * 0.8, r=0.0), dataclasses.replace(K, t0=K.t0 * 1.2, r=0.0)
    best, (d_low, d_high), _ = with_r(dataclasses.replace(K, r=0.0), [low, high], rules, [four])
    assert d_low.r > best.r > d_high.r


def test_the_chunk_axis_says_where_it_cannot_matter():
    """A grid whose chunk sizes are all above its longest prompt predicts the same figures at each: said so, with why;
    under PREFILL_FIRST without mixed chunks the words say a smaller chunk only adds passes."""
    from longctx.analysis.whatif import chunk_effect, grid

    k = dataclasses.replace(K, s=0.002)
    g = {"max_running_requests": [], "chunked_prefill_size": [8192, 16384], "mem_fraction_static": [],
         "concurrency": [1, 2], "rates": [], "arrival": "poisson", "burstiness": 1.0, "seed": 0, "lengths": [1000, 4000],
         "output_tokens": 8, "requests": 4}
    rules = Rules(PREFILL_FIRST, chunk=8192, one_prefill=True)
    out, _ = grid(k, rules, None, g, {"ttft_s": 1.0}, 0.95)
    said = chunk_effect(out, rules, k)
    assert "8,192, 16,384 predict the same figures" in said and "only adds passes (2 ms each)" in said
    out, _ = grid(k, rules, None, {**g, "chunked_prefill_size": [1024, 8192]}, {"ttft_s": 1.0}, 0.95)
    said = chunk_effect(out, rules, k)
    assert "predict the same" not in said and "only adds passes" in said
    budget = Rules(TOKEN_BUDGET, chunk=2048)
    out, _ = grid(k, budget, None, {**g, "chunked_prefill_size": [1024, 8192]}, {"ttft_s": 1.0}, 0.95)
    assert chunk_effect(out, budget, k) is None


def test_an_external_server_is_simulated_by_the_scheduler_its_configuration_names():
    """A server someone else runs has no rules unless its configuration says which scheduler it runs; then that
    engine's rules from the flags it gives: vLLM's adapter's own, llama.cpp's server's (slots, continuous batching: a
    token budget of --batch-size), llama-cpp-python's (one completion at a time, its prompt in n_batch batches)."""
    ext = get_adapter("external")
    entry = {"server_info": {}, "device": "cpu"}
    assert ext.run_rules(entry, 5000) is None
    said = ext.run_rules({**entry, "scheduler": {"engine": "vllm", "args": {"max-num-batched-tokens": 512, "max-num-seqs": 4}}}, 5000)
    assert (said["policy"], said["chunk"], said["max_running"], said["pool_tokens"]) == (TOKEN_BUDGET, 512, 4, 5000)
    assert said["source"].startswith("vLLM's V1 scheduler's") and "its configuration's scheduler key" in said["source"]
    said = ext.run_rules({**entry, "scheduler": {"engine": "llama.cpp", "args": {"parallel": 2, "batch-size": 1024, "ctx-size": 8192}}}, None)
    assert (said["policy"], said["chunk"], said["max_running"], said["pool_tokens"]) == (TOKEN_BUDGET, 1024, 2, 8192)
    said = ext.run_rules({**entry, "scheduler": {"engine": "llama.cpp", "args": {"no-cont-batching": True}}}, None)
    assert "without continuous batching" in said["not_simulated"]
    said = ext.run_rules({**entry, "scheduler": {"engine": "llama-cpp-python", "args": {"n_ctx": 4096}}}, None)
    assert "interrupt_requests" in said["not_simulated"]  # its default: a new request ends the streaming one
    said = ext.run_rules({**entry, "scheduler": {"engine": "llama-cpp-python",
                                                 "args": {"n_ctx": 4096, "interrupt_requests": False}}}, None)
    assert (said["policy"], said["chunk"], said["max_running"], said["pool_tokens"]) == (PREFILL_FIRST, 512, 1, 4096)
    assert said["notes"] == ["n_batch not set: llama-cpp-python's default 512"]
    # one completion at a time: the second request, sent with the first, starts its prefill when the first has its
    # last token, and its 1,300-token prompt is three passes of 512 (a, then s twice)
    k = Costs(a=0.01, b=2e-5, c=1e-9, t0=0.004, beta=1e-7, s=0.004)
    rules = Rules(**{f: said[f] for f in ("policy", "chunk", "max_running", "one_prefill", "pool_tokens")})
    first, second = simulate(k, rules, [(0.0, 1300, 5), (0.0, 1300, 5)])[0]
    alone = 0.01 + 2 * 0.004 + 2e-5 * 1300 + 1e-9 * 1300**2
    assert first["ttft"] == pytest.approx(alone, rel=1e-12)
    assert second["ttft"] == pytest.approx(first["e2e"] + alone, rel=1e-12)


def test_only_an_external_configuration_names_its_scheduler():
    from longctx import config as lcfg
    from longctx.core.errors import ConfigError

    base = {"model": {"name": "m"}, "lengths": [64]}
    ok = lcfg.validate({**base, "configurations": {"x": {"engine": "external", "url": "http://127.0.0.1:1", "api": "openai",
                                                          "scheduler": {"engine": "llama-cpp-python", "args": {"n_batch": 256}}}}})
    assert lcfg.configuration_spec(ok, "x").scheduler == {"engine": "llama-cpp-python", "args": {"n_batch": 256}}
    with pytest.raises(ConfigError, match=r"configurations\.x\.scheduler' is for external servers"):
        lcfg.validate({**base, "configurations": {"x": {"engine": "reference", "scheduler": {"engine": "vllm"}}}})
    with pytest.raises(ConfigError, match="llama-cpp-python"):
        lcfg.validate({**base, "configurations": {"x": {"engine": "external", "url": "http://127.0.0.1:1", "api": "openai",
                                                         "scheduler": {"engine": "tgi"}}}})


def test_settings_that_differ_only_in_a_chunk_that_changes_nothing_are_one_row():
    """The report's grid table (longctx.report.whatif.view): two chunk sizes above every prompt of the grid predict the
    same, and print as one row naming both; a chunk that changes the figures keeps its own row."""
    from longctx.analysis.whatif import chunk_effect, grid
    from longctx.report.whatif import view

    k = dataclasses.replace(K, s=0.002)
    g = {"max_running_requests": [], "chunked_prefill_size": [1024, 8192, 16384], "mem_fraction_static": [],
         "concurrency": [1], "rates": [], "arrival": "poisson", "burstiness": 1.0, "seed": 0, "lengths": [4000],
         "output_tokens": 8, "requests": 2}
    rules = Rules(PREFILL_FIRST, chunk=8192, one_prefill=True)
    out, _ = grid(k, rules, None, g, {"ttft_s": 1.0}, 0.95)
    doc = {"configurations": {"x": {"costs": dataclasses.asdict(k), "rules": dataclasses.asdict(rules), "rules_source": "r",
                                    "r_source": "0", "check": [], "errors": {}, "whatif": out, "draws": 0,
                                    "chunk_effect": chunk_effect(out, rules, k)}}, "grid": g}
    (c,) = view(doc, ["x"], {})["configurations"]
    assert [s["chunk_words"] for s in c["settings"]] == ["1,024", "8,192, 16,384"]


def test_the_model_set_to_the_lone_request_beside_each_point_checks_what_it_adds_whatever_the_machine_did():
    """Issue 53, item 7: the machine ran the load stage 1.6 times slower in prefill and 1.3 times in decode than during
    the sweep the model was fitted on (the truth: every cost so scaled, r = 0.5 ms). Where the load stage sent the
    sweep's lone request beside each point (its sweep_twins: a lone request of the slower machine, TTFT by hand
    1.6 (a + b L + c L^2)), the model is set to them first (anchor: factors 1.6 and 1.3 found again), r is fitted on
    that model (0.5 ms in the sweep's units, found again), and the loop of 4 is predicted within 1%; without the twins
    the check measures the machine: TTFT about 1/1.6 - 1 off. Each anchored row is read against the drift between its
    two blocks (here 4%), not the metronome's."""
    from longctx.analysis.whatif import anchor, calibrate_r, check, quoted, scaled

    rules = Rules(PREFILL_FIRST, chunk=8192)
    L = 1000
    truth = scaled(K, ttft=1.6, tpot=1.3)  # K's r (0.5 ms) times 1.3 too
    (alone,), _ = simulate(truth, rules, [(0.0, L, 17)])
    assert alone["ttft"] == pytest.approx(1.6 * (K.a + K.b * L + K.c * L * L), rel=1e-12)
    twins = {"n": 4, "ttft": alone["ttft"], "tpot": alone["tpot"], "output_tokens": 17,
             "before": {"n": 2, "ttft": alone["ttft"] * 0.98, "tpot": alone["tpot"]},
             "after": {"n": 2, "ttft": alone["ttft"] * 1.02, "tpot": alone["tpot"]}}
    two, four = ({**_closed_point(truth, rules, c, L), "sweep_twins": twins} for c in (2, 4))
    k = anchor(K, rules, four)
    assert k["ttft"] == pytest.approx(1.6, rel=1e-3) and k["tpot"] == pytest.approx(1.3, rel=1e-3)
    sweep = dataclasses.replace(K, r=0.0)
    r, _ = calibrate_r(sweep, rules, [two, four])
    assert r == pytest.approx(K.r, rel=0.05)
    rows = check(dataclasses.replace(K, r=r), [], rules, {"closed": [four]}, None, None, {})
    p50 = {x["quantity"]: x for x in rows if x["which"] == "p50"}
    assert abs(p50["ttft"]["error"]) < 0.01 and abs(p50["tpot"]["error"]) < 0.01, p50
    assert p50["ttft"]["anchor"]["ttft"] == pytest.approx(1.6, rel=1e-3)
    # the drift between the blocks, 1.02 / 0.98: 4%, and a pass within it; the metronome's 30% is not used
    metronome = [{"point": "start", "probe": {"median_s": 0.040}}, {"point": "after_sweep", "probe": {"median_s": 0.052}}]
    q = quoted(rows, metronome)
    assert q["anchored"] == 4 and q["drift"]["drift"] == pytest.approx(1.02 / 0.98 - 1)
    assert q["metronome"]["drift"] == pytest.approx(0.3) and q["verdict"]["verdict"] == "pass"
    assert q["drift"]["words"].startswith("the machine moved by up to 4% over the closed loop of 4 at 1,000 tokens")
    # without the twins: the model of the sweep against the slower machine
    bare = {k_: v for k_, v in four.items() if k_ != "sweep_twins"}
    rows = check(dataclasses.replace(K, r=r), [], rules, {"closed": [bare]}, None, None, {})
    (ttft,) = [x for x in rows if x["which"] == "p50" and x["quantity"] == "ttft"]
    assert ttft["anchor"] is None and ttft["error"] < 1 / 1.6 - 1 + 0.1
    assert quoted(rows, metronome)["drift"]["drift"] == pytest.approx(0.3)
