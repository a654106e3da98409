"""How much of what a benchmark client measures is the client: its figures against the reference
engine's own timestamps (bench/client_overhead.py).

The engine's times are taken at its socket (refengine/wire.py): a request's "received" when its
first bytes were read, an event's "sent" when its bytes were handed to the socket. They are
time.perf_counter(), CLOCK_MONOTONIC on Linux, the clock that our client and vLLM's benchmark
client also use on the same machine, so their times compare directly. GuideLLM times with the wall
clock (time.time()); its times are moved onto the monotonic clock by the offset between the two
clocks, read together (NTP slews both alike, so the offset only moves if the wall clock is set).

Per request:
    TTFT error   = the client's TTFT - (first event sent - request received)
                 = send lag (request start to the server reading it) + the first event's lag
    per-token lag = an event's arrival at the client - its send time at the server
    ITL error     = a gap between two events at the client - the same gap at the server
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .stream import StreamRecord
from .wire import read_clocks


@dataclass
class Check:
    """One request seen by one client, next to the server's view of it."""
    client: str
    length: int
    prompt_tokens: int | None
    ttft_s: float
    server_ttft_s: float
    send_lag_s: float  # from the client's request start to the server's reading it: the part of the TTFT error before the server's clock
    lags_s: list[float] = field(default_factory=list)  # where the client gives each event's arrival
    itl_errors_s: list[float] = field(default_factory=list)

    @property
    def ttft_error_s(self) -> float:
        return self.ttft_s - self.server_ttft_s


def own_checks(rec: StreamRecord, length: int) -> list[Check]:
    """Our client's request, timed at the socket and, from the same request, around the httpx calls
    (what the client measured before it read the socket's times)."""
    s = rec.summary()
    server_ttft = s.get("server_ttft_s")
    if s["status"] != "ok" or server_ttft is None or None in rec.event_sent:
        raise ValueError(f"no server timestamps to check against: {s.get('reason') or 'the server gives none'}")
    sent = rec.event_sent
    out = []
    for name, t0, times in (("longctx", rec.t_sent, rec.event_times), ("longctx, httpx-level", rec.t_call, rec.event_seen)):
        out.append(Check(name, length, s["prompt_tokens"], times[0] - t0, server_ttft, s["server_timestamps"]["received"] - t0,
                         lags_s=[t - u for t, u in zip(times, sent)], itl_errors_s=_gap_errors(times, sent)))
    return out


def _gap_errors(client_times: list[float], server_times: list[float]) -> list[float]:
    n = min(len(client_times), len(server_times))
    return [(client_times[i] - client_times[i - 1]) - (server_times[i] - server_times[i - 1]) for i in range(1, n)]


def server_requests(base: str) -> list[dict]:
    """The engine's records of its last requests (GET /request_timestamps)."""
    r = httpx.get(base + "/request_timestamps", timeout=30)
    r.raise_for_status()
    return r.json()["requests"]


def match(records: list[dict], start: float, endpoint: str, taken: set[str]) -> dict:
    """The first streamed request to `endpoint` that the server received after `start` (a client's
    request start on the monotonic clock), not matched before."""
    for rec in sorted(records, key=lambda r: r["received"]):
        if rec["endpoint"] == endpoint and rec.get("sent") and rec["rid"] not in taken and rec["received"] >= start:
            taken.add(rec["rid"])
            return rec
    raise ValueError(f"the server has no streamed {endpoint} request received after {start:.6f}")


def _server_ttft(rec: dict) -> float:
    return rec["sent"][0] - rec["received"]


def vllm_checks(result: dict, records: list[dict], length: int, taken: set[str]) -> list[Check]:
    """`vllm bench serve --save-detailed` results: start times are perf_counter, so each chunk's
    arrival is start + TTFT + the ITLs before it."""
    out = []
    for start, ttft, itls, error in zip(result["start_times"], result["ttfts"], result["itls"], result["errors"]):
        if error:
            raise ValueError(f"vLLM's benchmark client failed a request: {error[:300]}")
        rec = match(records, start, "/v1/completions", taken)
        arrivals = [start + ttft + t for t in itertools.accumulate([0.0, *itls])]
        out.append(Check("vllm bench serve", length, rec["prompt_tokens"], ttft, _server_ttft(rec), rec["received"] - start,
                         lags_s=[a - s for a, s in zip(arrivals, rec["sent"])], itl_errors_s=_gap_errors(arrivals, rec["sent"])))
    return out


def guidellm_checks(report: dict, records: list[dict], length: int, wall_minus_mono: float, taken: set[str]) -> list[Check]:
    """GuideLLM's JSON report: per request its start, first and last token times (wall clock) and
    the mean inter-token latency; each event's own arrival is not kept, so the lag is the last
    token's and the ITL error that of the mean gap."""
    out = []
    for bench in report["benchmarks"]:
        requests = bench["requests"]
        if requests.get("errored"):
            raise ValueError(f"GuideLLM failed a request: {str(requests['errored'][0].get('info', {}).get('error'))[:300]}")
        for req in requests["successful"]:
            timings = req["info"]["timings"]
            start = timings["request_start"] - wall_minus_mono
            rec = match(records, start, "/v1/completions", taken)
            first = timings["first_token_iteration"] - wall_minus_mono
            last = timings["last_token_iteration"] - wall_minus_mono
            sent = rec["sent"]
            gaps = len(sent) - 1
            itl_error = [(last - first) / gaps - (sent[-1] - sent[0]) / gaps] if gaps else []
            out.append(Check("GuideLLM", length, rec["prompt_tokens"], first - start, _server_ttft(rec), rec["received"] - start,
                             lags_s=[first - sent[0], last - sent[-1]], itl_errors_s=itl_error))
    return out


def wall_minus_mono() -> float:
    mono, real_ns = read_clocks()
    return real_ns * 1e-9 - mono


def summarize(checks: list[Check]) -> dict:
    """Figures over a client's requests at one length."""
    ttft_err = [c.ttft_error_s for c in checks]
    lags = [x for c in checks for x in c.lags_s]
    itl = [abs(x) for c in checks for x in c.itl_errors_s]
    return {
        "requests": len(checks),
        "prompt_tokens": sorted({c.prompt_tokens for c in checks}, key=lambda x: (x is None, x)),
        "ttft_s_median": statistics.median(c.ttft_s for c in checks),
        "ttft_error_s_median": statistics.median(ttft_err),
        "ttft_error_s_max": max(ttft_err),
        "send_lag_s_median": statistics.median(c.send_lag_s for c in checks),
        "lag_s_mean": statistics.fmean(lags) if lags else None,
        "lag_s_median": statistics.median(lags) if lags else None,
        "lag_s_max": max(lags) if lags else None,
        "itl_abs_error_s_mean": statistics.fmean(itl) if itl else None,
    }


def _percentiles(xs: list[float]) -> dict | None:
    if not xs:
        return None
    xs = sorted(xs)

    def at(q: float) -> float:  # linear between the closest ranks (numpy's default)
        pos = q * (len(xs) - 1)
        lo = int(pos)
        return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": xs[-1], "n": len(xs)}


def stream_errors(results: list) -> dict:
    """How far a client's times are from a same-machine server's own socket stamps (the reference
    engine, bench/stub_sse_server.py), over many finished requests: StreamRecords, or their summaries
    (``StreamRecord.summary()``, ``Prompter.generate``). Percentiles (p50, p90, p99, max, n) of

    - ``ttft_error_s``: the client's TTFT - the server's (first event sent - request received)
      = ``send_lag_s`` (the client's first byte written to the server's read) + the first event's lag;
    - ``token_lag_s``: an event's arrival at the client - its send time at the server (``sent_ts``),
      over every event (records) or each request's median (summaries: ``recv_lag_median_s``);
    - ``token_lag_max_s``: each request's worst event lag;
    - ``itl_error_s``: |a gap between two events at the client - the same gap at the server| (records only);
    - ``read_delay_s``: how long an event's bytes waited before the client's code had them (the
      client's own backlog; each request's mean).

    Requests without server stamps (failed ones, servers that give none) are counted, not used."""
    ttft, send, lags, worst, itl, delay = [], [], [], [], [], []
    checked = 0
    for r in results:
        s = r.summary() if isinstance(r, StreamRecord) else r
        if s.get("status") != "ok" or s.get("server_ttft_s") is None or s.get("send_lag_s") is None:
            continue
        checked += 1
        ttft.append(s["ttft_s"] - s["server_ttft_s"])
        send.append(s["send_lag_s"])
        worst.append(s["recv_lag_max_s"])
        if s.get("read_delay_mean_s") is not None:
            delay.append(s["read_delay_mean_s"])
        if isinstance(r, StreamRecord):
            pairs = [(t, u) for t, u in zip(r.event_times, r.event_sent) if u is not None]
            lags += [t - u for t, u in pairs]
            itl += [abs(x) for x in _gap_errors([t for t, _ in pairs], [u for _, u in pairs])]
        else:
            lags.append(s["recv_lag_median_s"])
    return {"requests": len(results), "checked": checked, "ttft_error_s": _percentiles(ttft), "send_lag_s": _percentiles(send),
            "token_lag_s": _percentiles(lags), "token_lag_max_s": _percentiles(worst), "itl_error_s": _percentiles(itl),
            "read_delay_s": _percentiles(delay)}


# --- third-party clients ----------------------------------------------------------------------

_VLLM_BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); "
               "main(p.parse_args(sys.argv[1:]))")
_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _run(cmd: list[str], log: Path, what: str, timeout_s: float) -> None:
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **_OFFLINE},
                              timeout=timeout_s, start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited with code {proc.returncode}; its log: {log}")


def make_char_tokenizer(python: str, out: Path, log: Path) -> Path:
    """A Hugging Face tokenizer of single ASCII characters (bench/char_tokenizer.py), made with `python`."""
    script = Path(__file__).resolve().parents[2] / "bench" / "char_tokenizer.py"
    _run([python, str(script), str(out)], log, "the tokenizer script", 300)
    return out


def run_vllm_bench(python: str, base: str, tokenizer: Path, length: int, tokens: int, requests: int,
                   out_dir: Path, log: Path, timeout_s: float) -> dict:
    """vLLM's benchmark client (vllm.benchmarks.serve, as `vllm bench serve`), one request at a time."""
    name = f"vllm-{length}.json"
    _run([python, "-c", _VLLM_BENCH, "--backend", "openai", "--base-url", base, "--endpoint", "/v1/completions",
          "--model", "refmla", "--tokenizer", str(tokenizer), "--dataset-name", "random",
          "--random-input-len", str(length), "--random-output-len", str(tokens), "--num-prompts", str(requests),
          "--max-concurrency", "1", "--ignore-eos", "--temperature", "0", "--ready-check-timeout-sec", "0",
          "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(out_dir), "--result-filename", name],
         log, "vllm bench serve", timeout_s)
    return json.loads((out_dir / name).read_text())


def run_guidellm(exe: str, base: str, tokenizer: Path, length: int, tokens: int, requests: int,
                 out_dir: Path, log: Path, timeout_s: float) -> dict:
    """GuideLLM, synchronous (one request at a time), synthetic text of `length` tokens."""
    out = out_dir / f"guidellm-{length}.json"
    _run([exe, "run", "--backend", f"kind=openai_http,target={base},model=refmla,request_format=/v1/completions",
          "--profile", "kind=synchronous", "--constraint", f"kind=max_requests,count={requests}",
          "--tokenizer", f"kind=hf_auto,model={tokenizer}",
          "--data", f"kind=synthetic_text,prompt_tokens={length},output_tokens={tokens}",
          "--output", f"kind=json,path={out}", "--disable-console"], log, "guidellm run", timeout_s)
    return json.loads(out.read_text())
