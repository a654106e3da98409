#!/usr/bin/env python3
"""Is the load client ever the bottleneck? (issue 18, item 6)

Drives longctx's own load workloads (longctx.measure.load: the closed and open loops the pipeline runs,
on its asyncio client) against

- the stub server (bench/stub_sse_server.py: answers at once, streams on a fixed schedule), so that
  only the client is measured, and
- the reference engine (a tiny model, --max-running-requests as high as the concurrency),

at rising concurrency and arrival rate (the stub streaming 50 tokens/s per stream, a long-context
decode's pace; then 64 streams at 50, 100 and 200 tokens/s each, to find the event rate the client
keeps up with), and prints, against the servers' own socket-side stamps
(the request's kernel receive time, each event's send time; longctx.measure.clientcheck.stream_errors):
the TTFT error (client TTFT - server TTFT), the per-token error (an event's arrival at the client minus
its send at the server, each request's median), and the open loop's schedule lag (first byte written
minus scheduled time), and the share of its time a closed loop held its level in flight. Goals: at 64
concurrent streams, median TTFT error <= 1 ms, median per-token error <= 200 us and 64 in flight >= 97% of the time; at 50 arrivals/s, p99 schedule lag <= 2 ms. Then the highest arrival rate
(of those tried) at which the client keeps all three.

    python bench/load_client.py [--quick] [--no-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.engines import get_adapter  # noqa: E402
from longctx.measure import load as ld  # noqa: E402
from longctx.measure.clientcheck import stream_errors  # noqa: E402
from longctx.measure.process import ManagedServer, free_port  # noqa: E402
from longctx.measure.prompts import Prompter, PromptPlan  # noqa: E402

GOALS = {"ttft_error_ms": 1.0, "token_error_us": 200.0, "lag_p99_ms": 2.0, "held_share": 0.97}
TINY = {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 2, "kv_lora_rank": 32, "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "intermediate_size": 128}


def _stub():
    spec = importlib.util.spec_from_file_location("stub_sse_server", ROOT / "bench" / "stub_sse_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(concurrency: int, requests: int, rate: float, output_tokens: int) -> dict:
    return {"output_tokens": output_tokens, "metrics": {"enabled": False, "interval_s": 1.0, "kv_margin": 0.1},
            "closed": {"concurrency": [concurrency], "requests": requests, "duration_s": None},
            "open": {"rates": [rate], "requests": requests, "arrival": "poisson", "burstiness": 1.0, "seed": 0}}


async def _point(base: str, kind: str, length: int, level: float, requests: int, output_tokens: int) -> dict:
    prompter = Prompter("sglang", "bench", {"seed": 0, "token_id_range": [0, 256]}, PromptPlan())
    async with ld.new_client() as client:
        ctx = ld.LoadContext(client, base, "/generate", prompter, get_adapter("external"), f"bench/{kind}/{level}",
                             _load(int(level), requests, float(level), output_tokens), lambda p, n: 120.0,
                             warm_path="/health")
        if kind == "closed":
            return await ld.closed_loop(ctx, length, int(level))
        return await ld.open_loop(ctx, length, float(level))


# The machine's own share of a schedule lag: a process that only sleeps 1 ms at a time, beside the open loop,
# wakes late by the same stalls (a busy or virtualised machine: the hypervisor's steal time, /proc/stat)
JITTER_PROBE = ("import sys, time\nover = []\nend = time.perf_counter() + float(sys.argv[1])\n"
                "while time.perf_counter() < end:\n    t = time.perf_counter(); time.sleep(0.001)\n"
                "    over.append(time.perf_counter() - t - 0.001)\n"
                "over.sort(); print(over[len(over) // 2], over[int(0.99 * len(over))], over[-1])")


def _steal_s() -> float | None:
    """CPU seconds the hypervisor took from this machine's CPUs since boot (None: not a Linux /proc)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def machine_jitter(seconds: float):
    """Yields a dict filled on exit with the sleeping probe's lateness (p50, p99, max, ms) and the share of
    the CPUs' time stolen by the hypervisor meanwhile."""
    out: dict = {}
    probe = subprocess.Popen([sys.executable, "-c", JITTER_PROBE, f"{seconds:.3f}"], stdout=subprocess.PIPE, text=True)
    steal0, t0 = _steal_s(), time.perf_counter()
    try:
        yield out
    finally:
        text = probe.communicate(timeout=seconds + 30)[0].split()
        elapsed, steal1 = time.perf_counter() - t0, _steal_s()
        if len(text) == 3:
            out.update(zip(("jitter_p50_ms", "jitter_p99_ms", "jitter_max_ms"), (float(x) * 1e3 for x in text)))
        if steal0 is not None and steal1 is not None:
            out["steal_share"] = (steal1 - steal0) / (elapsed * (os.cpu_count() or 1))


def measure(base: str, kind: str, level: float, requests: int, length: int = 64, output_tokens: int = 32) -> dict:
    if kind == "open":  # the schedule's span, and the last requests' decoding
        with machine_jitter(requests / level + 1.0) as machine:
            point = asyncio.run(_point(base, kind, length, level, requests, output_tokens))
    else:
        machine = {}
        point = asyncio.run(_point(base, kind, length, level, requests, output_tokens))
    reqs = point["requests"]
    err = stream_errors(reqs)
    lags = sorted(r["schedule_lag_s"] for r in reqs if r.get("schedule_lag_s") is not None)
    ok = sum(r["status"] == "ok" for r in reqs)
    row = {"kind": kind, "level": level, "requests": len(reqs), "ok": ok, "checked": err["checked"],
           "ttft_error_ms": err["ttft_error_s"]["p50"] * 1e3 if err["checked"] else None,
           "ttft_error_p99_ms": err["ttft_error_s"]["p99"] * 1e3 if err["checked"] else None,
           "token_error_us": err["token_lag_s"]["p50"] * 1e6 if err["checked"] else None,
           "token_error_p99_us": err["token_lag_s"]["p99"] * 1e6 if err["checked"] else None}
    if kind == "closed":  # the concurrency the loop held (longctx.analysis.load_summary.held_level, as the report)
        import pandas as pd

        from longctx.analysis.load_summary import held_level

        held = held_level(pd.DataFrame([{"sent_s": r.get("sent_s"), "e2e_s": r.get("e2e_s")} for r in reqs]), int(level))
        if held:
            row.update(held_share=held["share"], mean_in_flight=held["mean_in_flight"])
    if kind == "closed":  # the first c requests start together; the others one at a time, as one ends
        steady = stream_errors([r for r in reqs if r["index"] >= level])
        wave = stream_errors([r for r in reqs if r["index"] < level])
        if steady["checked"] and wave["checked"]:
            row.update(wave_ttft_error_ms=wave["ttft_error_s"]["p50"] * 1e3,
                       steady_ttft_error_ms=steady["ttft_error_s"]["p50"] * 1e3,
                       steady_ttft_error_p99_ms=steady["ttft_error_s"]["p99"] * 1e3)
    row.update(machine)
    if lags:
        row.update(lag_p50_ms=statistics.median(lags) * 1e3, lag_p99_ms=lags[min(len(lags) - 1, int(0.99 * len(lags)))] * 1e3,
                   lag_max_ms=lags[-1] * 1e3)
    return row


def line(row: dict) -> str:
    level = f"{row['level']:g} in flight" if row["kind"] == "closed" else f"{row['level']:g}/s"
    parts = [f"{row['kind']:6s} {level:>12s}: {row['ok']}/{row['requests']} ok"]
    if row.get("ttft_error_ms") is not None:
        parts.append(f"TTFT error p50 {row['ttft_error_ms']:.3f} ms (p99 {row['ttft_error_p99_ms']:.3f})")
        parts.append(f"per-token error p50 {row['token_error_us']:.0f} us (p99 {row['token_error_p99_us']:.0f})")
    if row.get("steady_ttft_error_ms") is not None:
        parts.append(f"TTFT error p50 of the first {row['level']:g}, sent at once, {row['wave_ttft_error_ms']:.3f} ms; "
                     f"of the rest {row['steady_ttft_error_ms']:.3f} ms (p99 {row['steady_ttft_error_p99_ms']:.3f})")
    if row.get("held_share") is not None:
        parts.append(f"{row['level']:g} in flight {100 * row['held_share']:.1f}% of the time (mean {row['mean_in_flight']:.2f})")
    if row.get("lag_p99_ms") is not None:
        parts.append(f"schedule lag p50 {row['lag_p50_ms']:.3f} ms, p99 {row['lag_p99_ms']:.3f}, max {row['lag_max_ms']:.3f}")
    if row.get("jitter_p99_ms") is not None:
        parts.append(f"a process that only sleeps wakes late by p99 {row['jitter_p99_ms']:.3f} ms meanwhile"
                     + (f" (hypervisor steal {100 * row['steal_share']:.1f}% of the CPUs)" if "steal_share" in row else ""))
    return "  " + ", ".join(parts)


def meets(row: dict) -> bool:
    return (row["ok"] == row["requests"] and row.get("ttft_error_ms") is not None
            and row["ttft_error_ms"] <= GOALS["ttft_error_ms"] and row["token_error_us"] <= GOALS["token_error_us"]
            and (row.get("lag_p99_ms") is None or row["lag_p99_ms"] <= GOALS["lag_p99_ms"]))


def run_suite(name: str, base: str, concurrencies, rates, seconds: float, length: int) -> list[dict]:
    print(f"{name} ({base}):")
    rows = []
    for c in concurrencies:
        rows.append(measure(base, "closed", c, max(2 * c, 16), length))
        print(line(rows[-1]), flush=True)
    for r in rates:
        rows.append(measure(base, "open", r, max(int(r * seconds), 20), length))
        print(line(rows[-1]), flush=True)
    return rows


STREAM_INTERVAL_S = 0.02  # the stub's pace: 50 tokens/s per stream, a long-context decode's (the study: 0.7 to 30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer levels and shorter open loops")
    ap.add_argument("--no-engine", action="store_true", help="the stub server only")
    ap.add_argument("--json", help="write every row here")
    a = ap.parse_args()
    concurrencies = [1, 16, 64] if a.quick else [1, 8, 16, 32, 64, 128]
    rates = [10, 50, 200] if a.quick else [10, 25, 50, 100, 200, 400]
    seconds = 2.0 if a.quick else 5.0
    print(f"{os.cpu_count()} CPUs; goals: at 64 in flight TTFT error p50 <= {GOALS['ttft_error_ms']} ms and per-token "
          f"error p50 <= {GOALS['token_error_us']:.0f} us; at 50/s schedule lag p99 <= {GOALS['lag_p99_ms']} ms")
    rows = {}
    pace = f"an event every {STREAM_INTERVAL_S * 1e3:g} ms per stream"
    with _stub().running(interval_s=STREAM_INTERVAL_S, tokens=32) as base:
        rows["stub"] = run_suite(f"stub server (answers at once, {pace})", base, concurrencies, rates, seconds, 64)
    # how many events a second the client reads before its times slip: 64 streams, faster and faster
    print("64 streams at a rising pace (events per second offered; the stub server needs a core of its own too):")
    rows["pace"] = []
    for interval in (0.02, 0.01, 0.005):
        with _stub().running(interval_s=interval, tokens=32) as base:
            row = {**measure(base, "closed", 64, 128), "interval_s": interval, "events_s": 64 / interval}
        rows["pace"].append(row)
        print(f"  every {interval * 1e3:g} ms ({row['events_s']:,.0f} events/s):" + line(row).split(":", 1)[1], flush=True)
    if not a.no_engine:
        port = free_port("127.0.0.1")
        log = Path("/tmp") / f"longctx-bench-load-client-{os.getpid()}.log"
        server = ManagedServer([sys.executable, "-m", "longctx.refengine", "--port", str(port),
                                "--json-model-override-args", json.dumps(TINY), "--context-length", "2048",
                                "--max-total-tokens", "65536", "--max-running-requests", "64"], log)
        server.start()
        try:
            server.wait_healthy(f"http://127.0.0.1:{port}/health", 120)
            rows["engine"] = run_suite("reference engine (tiny model)", f"http://127.0.0.1:{port}", concurrencies[:-1],
                                       [r for r in rates if r <= 100], seconds, 64)
        finally:
            server.stop()
    stub = rows["stub"]
    at64 = next((r for r in stub if r["kind"] == "closed" and r["level"] == 64), None)
    at50 = next((r for r in stub if r["kind"] == "open" and r["level"] == 50), None)
    print(f"goals (stub server, the client alone, {pace}):")
    if at64 and at64.get("held_share") is not None:
        print(f"  64 in flight: the closed loop held 64 requests at the server {100 * at64['held_share']:.1f}% of the time "
              f"[goal >= {100 * GOALS['held_share']:.0f}%]: {'met' if at64['held_share'] >= GOALS['held_share'] else 'NOT met'}")
    if at64:
        print(f"  64 in flight: TTFT error p50 {at64['ttft_error_ms']:.3f} ms [goal <= 1 ms], per-token error p50 "
              f"{at64['token_error_us']:.0f} us [goal <= 200 us]: {'met' if meets(at64) else 'NOT met'}")
    if at50:
        print(f"  50 arrivals/s: schedule lag p99 {at50['lag_p99_ms']:.3f} ms [goal <= 2 ms]: "
              f"{'met' if at50['lag_p99_ms'] <= GOALS['lag_p99_ms'] else 'NOT met'}")
        if at50.get("jitter_p99_ms") is not None:  # what the machine itself allowed meanwhile
            print(f"    the machine's own: a process that only sleeps 1 ms woke late by p99 {at50['jitter_p99_ms']:.3f} ms "
                  f"(max {at50['jitter_max_ms']:.3f})" + (f"; the hypervisor stole {100 * at50['steal_share']:.1f}% of "
                  "the CPUs' time" if "steal_share" in at50 else ""))
    sustained = [r["level"] for r in stub if r["kind"] == "open" and meets(r)]
    print(f"  highest arrival rate tried at which the client keeps all three: "
          f"{max(sustained):g}/s" if sustained else "  no rate tried kept all three")
    kept = [r["events_s"] for r in rows["pace"] if meets(r)]
    print(f"  64 streams: timing kept up to {max(kept):,.0f} events/s of those tried" if kept
          else "  64 streams: no pace tried kept the timing goals")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
