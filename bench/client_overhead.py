#!/usr/bin/env python3
"""How much of what the client measures is the client: TTFT and per-token timing against the
reference engine's own timestamps, at 1k and 200k-token prompts, for our client and, where they
are installed, vLLM's benchmark client and GuideLLM against the same server.

The engine's times are taken at its socket (longctx/refengine/wire.py): a request is received
when its first bytes are read, an event is sent when its bytes are handed to the socket; both on
CLOCK_MONOTONIC (time.perf_counter), the clock of a client on the same machine. So, per request:
    TTFT error    = client TTFT - (first event sent - request received)
    per-token lag = an event's arrival at the client - its send time at the server
    ITL error     = |a gap between events at the client - the same gap at the server|
Our client (longctx.measure.transport.timed_client) times at its socket too: the request's first byte
written, each event's arrival by the kernel's receive timestamp (so the client being scheduled
late does not count; where it falls behind by more than an event, the kernel may merge the
waiting bytes and keep the newest time, and those events count late). The "httpx-level" row is the
same requests timed around the httpx calls, as the client did before (that row's TTFT error
includes httpx's request set-up and parsing and the client being scheduled late).

A small model (one layer, one head) keeps the 200k prefill to about a minute; the client's work
does not depend on the model. Prompts: ours are token ids, vLLM's and GuideLLM's are text made
with a one-character-per-token tokenizer (bench/char_tokenizer.py), so each is exactly L tokens
for the engine's byte-level tokenizer (the "prompt" column is the server's count).

    python bench/client_overhead.py [--lengths 1024 200000] [--trials 3] [--tokens 256]
        [--vllm-python PYTHON] [--guidellm GUIDELLM]

--vllm-python: a Python with vLLM (default $LONGCTX_VLLM_PYTHON); --guidellm: the guidellm
command (default: `guidellm` on PATH). Either missing: that client is skipped, saying so.

Goals (issue 5): TTFT error under 1 ms, per-token lag under 50 us.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from longctx.measure import clientcheck as cc  # noqa: E402
from longctx.measure.bodies import sglang_body  # noqa: E402
from longctx.measure.stream import stream_generate
from longctx.measure.transport import timed_client
from longctx.measure.process import ManagedServer, free_port  # noqa: E402
from longctx.measure.workload import prompt_ids  # noqa: E402

ARCH = {"num_hidden_layers": 1, "num_attention_heads": 1, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "hidden_size": 64, "intermediate_size": 128}


def _us(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e6:.1f}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3f}"


def print_table(rows: list[tuple[str, int, dict]]) -> None:
    print(f"{'client':<22} {'L':>7} {'n':>2} {'prompt':>7} {'TTFT s':>8} {'TTFT err ms':>11} {'(max)':>7} {'send ms':>7} "
          f"{'lag us mean':>11} {'median':>7} {'max':>8} {'|ITL err| us':>12}")
    for client, length, s in rows:
        prompt = ",".join(str(p) for p in s["prompt_tokens"])
        print(f"{client:<22} {length:>7} {s['requests']:>2} {prompt:>7} {s['ttft_s_median']:>8.3f} "
              f"{_ms(s['ttft_error_s_median']):>11} {_ms(s['ttft_error_s_max']):>7} {_ms(s['send_lag_s_median']):>7} "
              f"{_us(s['lag_s_mean']):>11} "
              f"{_us(s['lag_s_median']):>7} {_us(s['lag_s_max']):>8} {_us(s['itl_abs_error_s_mean']):>12}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 200_000])
    ap.add_argument("--trials", type=int, default=3, help="requests per client and length")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--vllm-python", default=os.environ.get("LONGCTX_VLLM_PYTHON"))
    ap.add_argument("--guidellm", default=shutil.which("guidellm"))
    ap.add_argument("--json", type=Path, help="also write every figure here")
    a = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ctx = max(a.lengths) + a.tokens + 16
    cmd = [sys.executable, "-m", "longctx.refengine", "--port", str(port), "--json-model-override-args", json.dumps(ARCH),
           "--context-length", str(ctx), "--max-total-tokens", str(ctx), "--chunked-prefill-size", "16384"]
    work = Path(tempfile.mkdtemp(prefix="longctx-client-overhead-"))
    log = work / "server.log"
    tools_log = work / "clients.log"
    rows: list[tuple[str, int, dict]] = []
    skipped: list[str] = []
    timeout_s = 3600.0
    with ManagedServer(cmd, log) as server, timed_client() as client:
        server.wait_healthy(base + "/health", 120)
        stream_generate(client, base + "/generate", sglang_body([1] * 64, 8), 60)  # the first request's one-off costs
        for length in a.lengths:
            own: list[cc.Check] = []
            for trial in range(a.trials):
                body = sglang_body(prompt_ids(length, 0, f"overhead/{length}/{trial}"), a.tokens)
                rec = stream_generate(client, base + "/generate", body, timeout_s)
                if not rec.ok:
                    sys.exit(f"request failed: {rec.error} (server log {log})")
                own += cc.own_checks(rec, length)
                c = own[-2]
                print(f"L={length} trial {trial}: arrival clock {rec.arrival_clock}, TTFT {c.ttft_s:.3f} s, error "
                      f"{_ms(c.ttft_error_s)} ms (send {_ms(c.send_lag_s)} ms, first event {_ms(c.lags_s[0])} ms)", flush=True)
            for name in ("longctx", "longctx, httpx-level"):
                rows.append((name, length, cc.summarize([c for c in own if c.client == name])))
        tokenizer = None
        for name, exe, runner in (("vllm bench serve", a.vllm_python, cc.run_vllm_bench), ("GuideLLM", a.guidellm, cc.run_guidellm)):
            if not exe:
                skipped.append(f"{name}: not installed here (--vllm-python / --guidellm)")
                continue
            try:
                if tokenizer is None:
                    tok_python = a.vllm_python or str(Path(a.guidellm).with_name("python"))
                    tokenizer = cc.make_char_tokenizer(tok_python, work / "chartok", tools_log)
                for length in a.lengths:
                    offset = cc.wall_minus_mono()
                    result = runner(exe, base, tokenizer, length, a.tokens, a.trials, work, tools_log, timeout_s * a.trials)
                    records = cc.server_requests(base)
                    taken: set[str] = set()
                    checks = (cc.vllm_checks(result, records, length, taken) if runner is cc.run_vllm_bench
                              else cc.guidellm_checks(result, records, length, offset, taken))
                    rows.append((name, length, cc.summarize(checks)))
                    print(f"{name} L={length}: {len(checks)} requests checked", flush=True)
            except (RuntimeError, ValueError, OSError) as exc:
                skipped.append(f"{name}: {exc}")
    print()
    print_table(rows)
    own_rows = [s for client, _, s in rows if client == "longctx"]
    print(f"\nlongctx client: worst TTFT error {_ms(max(s['ttft_error_s_max'] for s in own_rows))} ms [goal < 1 ms]; "
          f"worst mean per-token lag {_us(max(s['lag_s_mean'] for s in own_rows))} us [goal < 50 us]")
    print("TTFT err: median of the requests (and the largest); send: the part of it before the server read the request "
          "(median); lag: over every event of the requests")
    print("lag for GuideLLM: first and last token only (its report keeps no per-token times); "
          "|ITL err| for GuideLLM: of the mean gap")
    for line in skipped:
        print(f"skipped {line}")
    print(f"logs: {work}")
    if a.json:
        a.json.write_text(json.dumps([{"client": c, "length": n, **s} for c, n, s in rows], indent=1))


if __name__ == "__main__":
    main()
