"""The load workloads' analysis (longctx.analysis.load, longctx.analysis.slo), on small synthetic raw
load.json files written per the data contract, against figures worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from longctx import cli
from longctx.analysis.load import aggregate_load, resident_bounds, resident_span_bounds, victim_figures
from longctx.analysis.load_summary import analyze_load, interference
from longctx.analysis.slo import slo_at, wilson

SETTINGS = {"bootstrap": 200, "confidence": 0.95, "seed": 0}


def stream(index, sent, ttft, tokens=4, gap=0.015625, prompt=1024, status="ok", reason=None, **extra):
    """One request's fields as the load runner records them: events one token each, `gap` apart."""
    if status != "ok":
        return {"index": index, "sent_s": sent, "status": status, "reason": reason, "prompt_tokens": None,
                "event_times": [], "event_tokens": [], **extra}
    times = [sent + ttft + i * gap for i in range(tokens)]
    return {"index": index, "sent_s": sent, "status": "ok", "reason": None, "ttft_s": ttft, "tpot_s": gap,
            "e2e_s": ttft + (tokens - 1) * gap, "itl_s": [gap] * (tokens - 1), "prompt_tokens": prompt,
            "completion_tokens": tokens, "queue_s": None, "event_times": times, "event_tokens": [1] * tokens, **extra}


def closed(c, length, requests, duration=10.0, samples=()):
    return {"kind": "closed", "length": length, "output_tokens": 4, "concurrency": c, "status": "ok", "reason": None,
            "t0": 100.0, "duration_s": duration, "requests": requests,
            "metrics": {"path": "/metrics", "interval_s": 0.25, "samples": list(samples), "names": {}, "error": None}}


def raw_file(tmp_path, name, workloads, args=None):
    d = tmp_path / "raw" / name
    d.mkdir(parents=True, exist_ok=True)
    doc = {"format": "longctx.load/1", "configuration": name, "engine": "sglang", "run_id": "r", "spec_hash": "h",
           "provenance": {"args": args or {}}, "status": "ok", "reason": None, "workloads": workloads}
    (d / "load.json").write_text(json.dumps(doc))
    return d / "load.json"


def tables(tmp_path, paths):
    return aggregate_load(paths, tmp_path / "req.csv", tmp_path / "int.csv", tmp_path / "met.csv")


def test_ten_requests_percentiles_throughput_and_goodput_by_hand(tmp_path):
    # 8 successes with TTFTs 0.1 .. 0.8 s, 2 timeouts; 4 tokens each; the point spans 10 s
    reqs = [stream(i, 0.0, 0.1 * (i + 1)) for i in range(8)] + [stream(8 + i, 0.0, None, status="failed", reason="timeout")
                                                                for i in range(2)]
    path = raw_file(tmp_path, "a", [closed(2, 1024, reqs)])
    req, _, _ = tables(tmp_path, [path])
    assert len(req) == 10 and (req["status"] == "failed").sum() == 2
    doc = analyze_load(req, *tables(tmp_path, [path])[1:], None, None, None,
                       {**SETTINGS, "slo": {"ttft_s": 0.55, "attainment": 0.9}})
    p = doc["configurations"]["a"]["closed"][0]
    assert (p["n"], p["ok"], p["failed"], p["reasons"]) == (10, 8, 2, ["timeout (2)"])
    # linear quantiles of 0.1 .. 0.8: p50 between 0.4 and 0.5; p90 needs 10 requests: 8 give their maximum
    assert p["ttft"]["p50"]["value"] == pytest.approx(0.45)
    assert p["ttft"]["p90"]["value"] is None and p["ttft"]["p90"]["max"] == pytest.approx(0.8)
    # the median's order-statistic interval of 8: the 1st and 8th values, covering 1 - 2 x 0.5^8 = 99.2%
    assert (p["ttft"]["p50"]["low"], p["ttft"]["p50"]["high"]) == (pytest.approx(0.1), pytest.approx(0.8))
    assert p["ttft"]["p50"]["coverage"] == pytest.approx(1 - 2 * 0.5**8)
    assert p["itl"]["p50"]["value"] == pytest.approx(0.015625) and p["itl"]["n"] == 24 and p["itl"]["requests"] == 8
    assert p["queue"]["n"] == 0 and p["queue"]["p50"]["value"] is None  # the server reported none
    assert p["output_tok_s"] == pytest.approx(32 / 10) and p["request_s"] == pytest.approx(0.8)
    # TTFT <= 0.55 s: 0.1 .. 0.5, five of ten (the timeouts count and do not meet)
    g = p["goodput"]
    assert (g["met"], g["n"], g["share"], g["by"]) == (5, 10, 0.5, ["ttft_s"])
    assert g["rate_s"] == pytest.approx(0.5)
    # Wilson at 95% for 5 of 10: 0.2366 .. 0.7634
    assert g["low"] == pytest.approx(0.2366, abs=1e-4) and g["high"] == pytest.approx(0.7634, abs=1e-4)


def test_wilson_and_the_slo_map():
    lo, hi = wilson(0, 10, 0.95)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    m = {"1000": 1.0, "10000": 5.0}
    assert (slo_at(m, 500), slo_at(m, 1000), slo_at(m, 9999), slo_at(m, 20000)) == (1.0, 1.0, 1.0, 5.0)
    assert slo_at(2.5, 123) == 2.5 and slo_at(None, 1) is None


def test_a_victim_stream_with_a_known_gap_sequence():
    # steady gaps of 0.1 s; the injected request is sent at 0.45 and has its first token at 1.0:
    # the window is [0.45, 1.1]; the gaps over it are 0.4->0.5 (0.1) and 0.5->1.2 (0.7)
    victim = {"event_times": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 1.2, 1.3, 1.4]}
    f = victim_figures(victim, 0.45, 1.0)
    assert f["status"] == "ok"
    assert f["steady_itl_s"] == pytest.approx(0.1)
    assert f["worst_gap_s"] == pytest.approx(0.7)
    assert f["extra_s"] == pytest.approx(0.6)
    assert victim_figures({"event_times": [0.5, 0.6]}, 0.45, 1.0)["status"] == "failed"  # no steady gap before


def _victims(length, extra, chunk, steady=0.0625):
    return {"configuration": "a", "length": length, "background": 2, "background_length": 64, "chunked_prefill_size": chunk,
            "trial": 0, "victim": 0, "status": "ok", "reason": None, "steady_itl_s": steady, "worst_gap_s": extra + steady,
            "extra_s": extra, "window_s": extra, "injected_ttft_s": extra}


def test_the_stall_fit_per_chunk_and_per_token():
    # extra = 0.05 + 0.2 x ceil(L / 512): chunks 1, 2, 4
    rows = [_victims(L, 0.05 + 0.2 * c, 512) for L, c in ((256, 1), (1024, 2), (2048, 4)) for _ in range(2)]
    out = interference(pd.DataFrame(rows), SETTINGS, "a")
    fit = out["fit"]
    assert fit["basis"] == "chunks" and fit["chunk"] == 512
    assert fit["per_chunk_s"] == pytest.approx(0.2) and fit["a_s"] == pytest.approx(0.05) and fit["r2"] == pytest.approx(1.0)
    assert [p["length"] for p in out["points"]] == [256, 1024, 2048]
    assert out["points"][1]["extra"]["value"] == pytest.approx(0.45)
    # L = 1024 in chunks of 512: 2 chunks; worst gap 0.45 + 0.0625 over an injected TTFT of 0.45 (the streams
    # waited through all of it and a step more); each chunk 0.225 s on average
    p = out["points"][1]
    assert p["chunks"] == 2 and p["stalled_share"] == pytest.approx(0.5125 / 0.45) and p["mean_chunk_s"] == pytest.approx(0.225)
    assert p["background"] == 2
    assert fit["share"] == pytest.approx(1.0)  # the fixture's streams lose exactly the injected prefill's time
    # streams that lose half of each injected prefill (one of two chunks, as with mixed chunks)
    half = [{**_victims(L, 0.05 + 0.2 * c, 512), "injected_ttft_s": 2 * (0.05 + 0.2 * c)} for L, c in ((256, 1), (1024, 2))]
    fit = interference(pd.DataFrame(half), SETTINGS, "a")["fit"]
    assert fit["share"] == pytest.approx(0.5) and fit["share_low"] == pytest.approx(0.5) and fit["basis"] is None
    # no chunked prefill: extra = 0.01 + 1e-4 L
    rows = [_victims(L, 0.01 + 1e-4 * L, None) for L in (1000, 2000, 4000)]
    fit = interference(pd.DataFrame(rows), SETTINGS, "a")["fit"]
    assert fit["basis"] == "linear" and fit["per_token_s"] == pytest.approx(1e-4) and fit["per_chunk_s"] is None


def test_client_resident_bounds_by_hand():
    # A: prompt 100, sent 0, tokens at 1.0, 1.5, 2.0; B: prompt 50, sent 0.5, first token at 3.0; pages of 16
    a = {"sent_s": 0.0, "prompt_tokens": 100, "event_times": [1.0, 1.5, 2.0], "event_tokens": [1, 1, 1], "e2e_s": 2.0}
    b = {"sent_s": 0.5, "prompt_tokens": 50, "event_times": [3.0, 3.5], "event_tokens": [1, 1], "e2e_s": 3.0}
    # at 1.6: A holds at least 100 + 2 - 1 (7 pages: 112), at most 100 + 2 + 1 (112); B is sent without a
    # first token: at most 50 + 1 (64) more
    assert resident_bounds([a, b], 1.6, 16) == (112, 176)
    assert resident_bounds([a, b], 1.6, 1) == (101, 103 + 51)
    assert resident_bounds([a, b], 0.2, 1) == (0, 101)  # only A sent, no token yet
    assert resident_bounds([a, b], 4.0, 1) == (0, 0)  # both done
    assert resident_bounds([{**a, "ended_by_client": True}], 9.0, 1) == (0, 103)  # the server may hold it still


def test_a_slow_metrics_answer_is_held_to_the_bounds_of_its_whole_get():
    # the requests of the test above; a GET from 0.2 to 1.6 s: the server answered at some moment of it, when A had
    # anything from nothing (0.2, no token yet) to 112 resident, B up to 51 on top (from 0.5 s)
    a = {"sent_s": 0.0, "prompt_tokens": 100, "event_times": [1.0, 1.5, 2.0], "event_tokens": [1, 1, 1], "e2e_s": 2.0}
    b = {"sent_s": 0.5, "prompt_tokens": 50, "event_times": [3.0, 3.5], "event_tokens": [1, 1], "e2e_s": 3.0}
    assert resident_span_bounds([a, b], (0.2, 1.6), 1) == (0, 103 + 51)
    assert resident_span_bounds([a, b], (0.2, 0.4), 1) == (0, 101)  # before B was sent
    assert resident_span_bounds([a, b], (1.6, 1.6), 1) == resident_bounds([a, b], 1.6, 1)
    # just before A's third token (2.0) it holds 101 at least: the bound is read on both sides of each change
    assert resident_span_bounds([a, b], (1.55, 1.99), 1) == (101, 103 + 51)


def test_reconciliation_flags_the_disagreeing_gauge(tmp_path):
    a = stream(0, 0.0, 1.0, tokens=3, gap=0.5, prompt=100)
    b = stream(1, 0.5, 2.5, tokens=2, gap=0.5, prompt=50)
    # at 1.6 the client knows 112 .. 176 tokens (test above); margin 0.1: 100.8 .. 193.6
    samples = [[1.6, {"used_tokens": 150, "running": 1}], [1.6001, {"used_tokens": 300}],
               [1.6002, {"token_usage": 0.09, "pool_tokens": 1000}]]
    path = raw_file(tmp_path, "a", [closed(2, 100, [a, b], samples=samples)], args={"page-size": 16})
    req, inter, met = tables(tmp_path, [path])
    low = met[(met["name"] == "client_resident_low")]["value"].tolist()
    assert low == [112, 112, 112]
    doc = analyze_load(req, inter, met, None, None, None, {**SETTINGS, "load": {"metrics": {"kv_margin": 0.1}}})
    rec = doc["configurations"]["a"]["reconciliation"]
    assert rec["checked"] == 3 and rec["margin"] == 0.1 and rec["gauge"] == "mixed"
    flagged = {round(f["t_s"], 4): (f["server_tokens"], f["client_low"], f["client_high"]) for f in rec["flagged"]}
    assert flagged == {1.6001: (300, 112, 176), 1.6002: (pytest.approx(90), 112, 176)}
    assert rec["low_above_zero"] == 3


def test_a_gauge_stuck_at_0_under_load_is_caught_where_the_client_knows_tokens_are_resident(tmp_path):
    """Issue 32: a gauge reading 0 while a request decodes is flagged at every sample whose lower bound is above 0;
    a sample whose GET spans a moment with nothing known resident (0.2 to 1.6 s: A not yet at its first token) cannot
    catch it, and is not counted as one that could."""
    a = stream(0, 0.0, 1.0, tokens=3, gap=0.5, prompt=100)
    b = stream(1, 0.5, 2.5, tokens=2, gap=0.5, prompt=50)
    samples = [[1.6, {"used_tokens": 0}], [1.7, {"used_tokens": 0}], [1.0, {"used_tokens": 0}, 0.2, 1.6]]
    path = raw_file(tmp_path, "a", [closed(2, 100, [a, b], samples=samples)], args={"page-size": 16})
    doc = analyze_load(*tables(tmp_path, [path]), None, None, None, {**SETTINGS, "load": {"metrics": {"kv_margin": 0.1}}})
    rec = doc["configurations"]["a"]["reconciliation"]
    assert rec["checked"] == 3 and rec["low_above_zero"] == 2
    assert sorted(round(f["t_s"], 1) for f in rec["flagged"]) == [1.6, 1.7]


def _point_rows(c, length, ttfts, tpot=0.015625):
    return [{"configuration": "a", "kind": "closed", "level": c, "length": length, "index": i, "status": "ok",
             "ttft_s": t, "tpot_s": tpot, "itl_max_s": tpot, "e2e_s": t, "completion_tokens": 32, "output_tokens": 32,
             "duration_s": 10.0} for i, t in enumerate(ttfts)]


def _frontier(rows, fits, slo, pool=100_000):
    req = pd.DataFrame(rows)
    empty_i = pd.DataFrame(columns=["configuration", "length", "chunked_prefill_size", "status"])
    empty_m = pd.DataFrame(columns=["configuration", "kind", "level", "length", "trial", "t_s", "name", "value"])
    prov = {"configurations": {"a": {"kv_pool": {"tokens": pool}}}}
    doc = analyze_load(req, empty_i, empty_m, fits, prov, None, {**SETTINGS, "slo": slo})
    return {f["concurrency"]: f for f in doc["configurations"]["a"]["frontier"]}


PREFILL = {"a_s": 0.125, "b_s_per_token": 1 / 8192, "c_s_per_token2": 0.0}  # TTFT_1(L) = 0.125 + L / 8192
DECODE = {"t0_s": 1 / 64, "beta_s_per_token": 2.0**-20}


def test_the_frontier_measured_model_and_pool_bound():
    def at(c, L, ratio=2.0, n=4):
        return _point_rows(c, L, [ratio * (0.125 + L / 8192)] * n)

    rows = at(2, 1024) + at(2, 4096) + at(4, 1024) + at(4, 32768) + at(8, 1024) + at(8, 4096)
    fits = {"configurations": {"a": {"prefill": PREFILL, "decode": DECODE}}}
    f = _frontier(rows, fits, {"ttft_s": 4.25, "attainment": 0.9})
    # c = 2: both lengths pass; the model 2 x (0.125 + L / 8192) <= 4.25 holds to L = 16384
    assert (f[2]["basis"], f[2]["max_length"], f[2]["limited_by"]) == ("model", 16384, "ttft")
    assert f[2]["passes"] == [1024, 4096] and f[2]["fails"] == [] and f[2]["pool_bound"] == 100_000 // 2 - 32
    # c = 4: 1024 passes, 32768 fails (TTFT 8.25 s): measured
    assert (f[4]["basis"], f[4]["max_length"], f[4]["limited_by"], f[4]["fails"]) == ("measured", 1024, "ttft", [32768])
    # c = 8: the model's 16384 does not fit the pool: 8 x (L + 32) <= 100000
    assert (f[8]["max_length"], f[8]["limited_by"]) == (100_000 // 8 - 32, "pool")
    assert f[2]["ratios"] == {"ttft": pytest.approx(2.0)} and f[2]["clipped"] is False
    # only a fail measured (TTFT 20 x the fit at 1024: 5 s): the model 20 x (0.125 + L / 8192) <= 4.25 holds
    # to L = 716.8, below the fail
    f = _frontier(at(2, 1024, ratio=20.0), fits, {"ttft_s": 4.25, "attainment": 0.9})
    assert (f[2]["basis"], f[2]["max_length"], f[2]["limited_by"], f[2]["clipped"]) == ("model", 716, "ttft", False)
    # the decode model: TPOTs measured at 1.5 x (t0 + beta c L); 1.5 x (1/64 + 4 L / 2^20) <= 3/64 holds to
    # 4 L / 2^20 = 1/64, L = 4096 at c = 4
    def tpot(L):
        return _point_rows(4, L, [0.25] * 4, tpot=1.5 * (1 / 64 + 4 * L / 2**20))

    f = _frontier(tpot(512) + tpot(1024), fits, {"tpot_s": 3 / 64, "attainment": 0.9})
    assert (f[4]["basis"], f[4]["max_length"], f[4]["limited_by"]) == ("model", 4096, "tpot")
    assert f[4]["ratios"] == {"tpot": pytest.approx(1.5)}


def test_the_frontier_without_fits_is_the_measurement_and_the_pool():
    rows = _point_rows(2, 1024, [0.5] * 4) + _point_rows(2, 4096, [1.0] * 4)
    f = _frontier(rows, None, {"ttft_s": 4.25})[2]
    assert (f["basis"], f["max_length"], f["open_above"], f["limited_by"]) == ("measured", 4096, True, None)
    f = _frontier(_point_rows(2, 1024, [9.0] * 4), None, {"ttft_s": 4.25})[2]
    assert f["max_length"] is None and f["fails"] == [1024] and f["pool_bound"] == 49968


def test_aggregate_load_with_a_failed_request_a_missing_file_and_interference(tmp_path):
    reqs = [stream(0, 0.0, 0.25), stream(1, 0.0, None, status="failed", reason="HTTP 503")]
    inj = stream(9, 0.45, 0.55, tokens=3, prompt=4096)
    victim = {**stream(0, 0.0, 0.0, tokens=9, gap=0.1, prompt=64),
              "event_times": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 1.2, 1.3, 1.4], "e2e_s": 1.4}
    inter = {"kind": "interference", "length": 4096, "background": 1, "background_length": 64, "chunked_prefill_size": 2048,
             "trial": 0, "status": "ok", "reason": None, "t0": 5.0, "injected": inj, "victims": [victim],
             "metrics": {"samples": [[1.0, {"used_tokens": 4200}]]}}
    path = raw_file(tmp_path, "a", [closed(1, 1024, reqs), inter])
    missing = tmp_path / "raw" / "b" / "load.json"
    out = [tmp_path / f for f in ("r.csv", "i.csv", "m.csv")]
    rc = cli.main(["aggregate-load", "--out-requests", str(out[0]), "--out-interference", str(out[1]),
                   "--out-metrics", str(out[2]), str(path), str(missing)])
    assert rc == 0
    req, inter_df, met = (pd.read_csv(p) for p in out)
    assert list(req["status"]) == ["ok", "failed", "failed"]
    assert req.loc[1, "reason"] == "HTTP 503" and req.loc[1, "index"] == 1
    assert req.loc[2, "configuration"] == "b" and "unreadable raw file" in req.loc[2, "reason"] and pd.isna(req.loc[2, "kind"])
    assert req.loc[0, "first_token_s"] == pytest.approx(0.25)
    v = inter_df.iloc[0]
    assert (v["status"], v["chunked_prefill_size"]) == ("ok", 2048)
    assert (v["worst_gap_s"], v["extra_s"], v["window_s"]) == (pytest.approx(0.7), pytest.approx(0.6), pytest.approx(0.55))
    # at 1.0: the victim has received 6 tokens, the injected one its first: at least 64 + 5 and 4096 + 0
    at = met[met["t_s"] == 1.0].set_index("name")["value"]
    assert at["client_resident_low"] == 64 + 5 + 4096 and at["used_tokens"] == 4200
    # and the analysis reads them: the missing file's configuration says why
    settings = json.dumps({"slo": {"ttft_s": 1.0}, "load": {"output_tokens": 4}})
    rc = cli.main(["analyze-load", "--requests", str(out[0]), "--interference", str(out[1]), "--metrics", str(out[2]),
                   "--settings", settings, "--out", str(tmp_path / "load.json")])
    assert rc == 0
    doc = json.loads((tmp_path / "load.json").read_text())
    assert "unreadable raw file" in doc["configurations"]["b"]["failed"][0]
    a = doc["configurations"]["a"]
    assert a["closed"][0]["goodput"]["share"] == 0.5 and a["interference"]["points"][0]["worst_gap"]["value"] == pytest.approx(0.7)
    assert a["reconciliation"]["checked"] == 1 and a["reconciliation"]["flagged"] == []


def test_open_loop_lag_a_point_never_measured_and_a_configuration_without_load(tmp_path):
    # open loop: 4 requests scheduled 0.25 s apart, sent 1, 2, 3 and 10 ms late
    reqs = [stream(i, 0.25 * i + lag, 0.125, scheduled_s=0.25 * i, schedule_lag_s=lag)
            for i, lag in enumerate((0.001, 0.002, 0.003, 0.010))]
    open_point = {**closed(None, 256, reqs, duration=2.0), "kind": "open", "rate": 4.0, "arrival": "poisson"}
    open_point.pop("concurrency")
    # the runner's point after the server was lost: kind, length, level, status, reason, no requests
    lost = {"kind": "closed", "length": 512, "level": 2, "status": "failed", "reason": "not measured: the server died",
            "requests": []}
    path = raw_file(tmp_path, "a", [open_point, closed(2, 256, [stream(0, 0.0, 0.125)]), lost])
    d = tmp_path / "raw" / "b"
    d.mkdir(parents=True)
    (d / "load.json").write_text(json.dumps({"format": "longctx.load/1", "configuration": "b", "status": "not configured",
                                             "reason": None, "workloads": []}))
    req, inter, met = tables(tmp_path, [path, d / "load.json"])
    assert set(req["configuration"]) == {"a"}  # nothing configured is nothing failed
    doc = analyze_load(req, inter, met, None, None, None, {**SETTINGS, "slo": {"ttft_s": 1.0}})
    a = doc["configurations"]["a"]
    o = a["open"][0]
    assert (o["level"], o["n"]) == (4, 4)
    assert o["schedule_lag"]["p50"]["value"] == pytest.approx(0.0025)  # between 2 and 3 ms
    # the user waits from the scheduled arrival: TTFT is 125 ms from the send plus each send's lag (issue 32), the
    # server's share kept beside it
    opened = req[req["kind"].eq("open")].sort_values("index")
    assert opened["ttft_s"].tolist() == pytest.approx([0.126, 0.127, 0.128, 0.135])
    assert opened["service_ttft_s"].tolist() == pytest.approx([0.125] * 4)
    assert o["ttft"]["p50"]["value"] == pytest.approx(0.1275)
    # p99 of 4 lags is not one: their maximum, said so
    assert o["schedule_lag"]["p99"]["value"] is None and o["schedule_lag"]["p99"]["max"] == pytest.approx(0.010)
    lost_point = next(p for p in a["closed"] if p["length"] == 512)
    assert (lost_point["n"], lost_point["reasons"], lost_point["goodput"]["share"]) == (0, ["not measured: the server died"], None)
    f = a["frontier"][0]
    assert (f["concurrency"], f["passes"], f["fails"], f["max_length"], f["basis"]) == (2, [256], [512], 256, "measured")
    assert f["limited_by"] == "failures"


def test_a_quantile_needs_enough_requests_and_its_interval_covers_what_it_states():
    """Issue 32. p99 of 4 requests is their maximum: the record says so (value None, max and n) instead of a p99 with
    an interval that cannot exceed it. Each interval is the exact order-statistic one: over 4,000 seeded samples per
    case, from a skewed (lognormal) and a flat (uniform) law, the true quantile is covered as often as the coverage
    recorded with the interval (within 4 binomial standard errors), never less than 95%."""
    from scipy import stats as st

    from longctx.analysis.load_summary import min_samples, order_statistic_interval, quantiles

    four = quantiles([0.1, 0.2, 0.3, 0.9], 0.95)
    assert four["p99"]["value"] is None and four["p99"]["max"] == 0.9 and four["p99"]["n"] == 4
    assert four["p90"]["value"] is None and four["p50"]["value"] == pytest.approx(0.25)
    assert four["p50"]["low"] is None  # 4 values: no order-statistic pair covers the median with 95%
    assert (min_samples(0.5), min_samples(0.9), min_samples(0.99)) == (1, 10, 100)
    rng = np.random.default_rng(32)
    laws = {"lognormal": (lambda size: rng.lognormal(0, 0.5, size), lambda q: float(np.exp(0.5 * st.norm.ppf(q)))),
            "uniform": (lambda size: rng.uniform(1, 2, size), lambda q: 1 + q)}
    for name, (draw, truth) in laws.items():
        for n, q in ((6, 0.5), (10, 0.5), (30, 0.5), (60, 0.9), (200, 0.9)):
            samples = draw((4000, n))
            stated = order_statistic_interval(samples[0], q, 0.95)[2]
            hits = 0
            for row in samples:
                lo, hi, coverage = order_statistic_interval(row, q, 0.95)
                assert coverage == stated  # the coverage depends on n and q alone
                hits += lo <= truth(q) <= hi
            se = (stated * (1 - stated) / 4000) ** 0.5
            assert stated >= 0.95 and abs(hits / 4000 - stated) <= 4 * se, (name, n, q, hits / 4000, stated)


def test_the_itl_slo_holds_a_request_to_its_longest_wait_between_events(tmp_path):
    """Issue 32: a 300 ms wait that brings 3 tokens is one 300 ms wait for its user, not three of 100 ms: itl_max_s
    (what slo.itl_s is held against) is the largest gap between events; the per-token gaps stay for the percentiles."""
    r = stream(0, 0.0, 0.1, tokens=2, gap=0.02)
    r["event_times"] = [0.1, 0.12, 0.42]
    r["event_tokens"] = [1, 1, 3]
    r["itl_s"] = [0.02, 0.1, 0.1, 0.1]  # as the client divides a chunk's gap among its tokens
    path = raw_file(tmp_path, "a", [closed(1, 1024, [r])])
    req, _, _ = tables(tmp_path, [path])
    assert req["itl_max_s"].iloc[0] == pytest.approx(0.30)
    doc = analyze_load(req, *tables(tmp_path, [path])[1:], None, None, None, {**SETTINGS, "slo": {"itl_s": 0.2}})
    assert doc["configurations"]["a"]["closed"][0]["goodput"]["met"] == 0


def test_a_closed_loop_that_does_not_keep_its_level_is_flagged_and_kept_off_the_frontier(tmp_path):
    """Issue 32: concurrency 2, but the requests ran one after another (as vLLM's CPU server's did on 2 cores when the
    client's event loop was blocked): 0% of the time at 2 in flight, 1 on average; flagged, and not on the frontier.
    The same requests overlapping hold 2 in flight the whole time between the first send and the last."""
    serial = [stream(i, 0.5 * i, 0.1, tokens=4, gap=0.1) for i in range(6)]  # each ends (0.4 s) before the next send
    paired = [stream(i, 0.5 * (i // 2) + 0.001 * (i % 2), 0.2, tokens=4, gap=0.1) for i in range(6)]  # 0.5 s each
    for reqs, share, below in ((serial, 0.0, True), (paired, 1.0, False)):
        path = raw_file(tmp_path, "a", [closed(2, 1024, reqs)])
        doc = analyze_load(*tables(tmp_path, [path]), None, None, None, {**SETTINGS, "slo": {"ttft_s": 1.0}})
        a = doc["configurations"]["a"]
        held = a["closed"][0]["held"]
        assert held["share"] == pytest.approx(share, abs=0.01) and held["below"] is below, held
        assert [f["concurrency"] for f in a["frontier"]] == ([] if below else [2])
        assert [b["level"] for b in a["below_level"]] == ([2] if below else [])
    assert held_level_mean(serial) == pytest.approx(0.8)  # 0.4 s in flight of every 0.5 s


def held_level_mean(reqs):
    from longctx.analysis.load_summary import held_level

    rows = pd.DataFrame([{"sent_s": r["sent_s"], "e2e_s": r["e2e_s"]} for r in reqs])
    return held_level(rows, 2)["mean_in_flight"]


def test_the_victims_of_one_probe_are_one_observation_and_get_no_interval():
    """Issue 46, item 5: two victims of one injected prefill stall together; their median is reported, with no
    interval (the bootstrap over them treated them as independent). Six probes of two victims each give the
    order-statistic interval of the probes' medians at 95%."""
    from longctx.analysis.load_summary import probe_median

    one = pd.DataFrame({"trial": [0, 0], "worst_gap_s": [0.9, 1.0]})
    assert probe_median(one, "worst_gap_s", 0.95) == {"value": pytest.approx(0.95), "low": None, "high": None, "probes": 1}
    six = pd.DataFrame({"trial": [t for t in range(6) for _ in range(2)],
                        "worst_gap_s": [0.9 + 0.01 * t + 0.001 * v for t in range(6) for v in range(2)]})
    m = probe_median(six, "worst_gap_s", 0.95)
    per = sorted(0.9 + 0.01 * t + 0.0005 for t in range(6))
    assert m["probes"] == 6 and (m["low"], m["high"]) == (pytest.approx(per[0]), pytest.approx(per[-1]))
