#!/usr/bin/env python3
"""Fault scenarios, run as a new user would (issue 47: "each scenario's time and exit status before and after").

Each scenario runs the README's command,

    python -m snakemake --cores 1 report/longctx.pdf --configfile scenario.yaml

in a fresh temporary copy of a checkout's workflow (Snakefile, rules, config, kernels, templates, envs, profiles),
with PYTHONPATH=<checkout> and the project's virtual environment first on PATH, so that `python -m longctx` and the
`longctx` console script run the checkout's code (checked before anything runs). The configuration is
tests/configs/tiny.yaml's (the reference engine, a tiny random MLA model on CPU) cut down to one configuration,
lengths [64, 128, 256], one warm-up and two trials, no load or prefix workloads: a run takes well under a minute.

Scenarios (one function each):

  server-later   an external OpenAI-compatible server (engine: external, api: openai) on a port where nothing
                 listens (run 1; server.startup_timeout_s 15, though longctx caps an external
                 server's wait at 5 s); then the reference engine started there by this
                 script (python -m longctx.refengine, its own process group), and the same command again (run 2)
                 and a third time (run 3)
  truncated-raw  a normal run; then data/raw/<conf>/128.json and its copy data/partial/<conf>/128.json cut to
                 their first 200 bytes, and the same command again: is 128 "ok" again with a new run_id, and does
                 the output say it is measured again?
  sigstop        request_timeout_s 60, timeout_factor 1, output_tokens 64: a baseline run, then the same run with
                 the server's process group SIGSTOPped once the last length's first trial is under way (10 ms
                 after the server logs the cache flush that follows that length's warm-up line in
                 data/logs/bench/<conf>.log: in the trial's decode); the time from the SIGSTOP to the end of the run, and
                 the run's time over the baseline's
  burst          the reference engine started by this script behind a buffering reverse proxy (as nginx with
                 proxy_buffering on: each response read whole from upstream, then sent in one write with
                 Content-Length), configured as engine: external, api: sglang at the proxy; then the same command
                 for report/longctx.md (the PDF's target does not make it): its lines on decode not measured /
                 buffering, and the median decode_tok_s and tpot_s of data/results.csv

One line is printed per run: scenario, run number, wall time, exit status and a short outcome (the status of each
raw file data/raw/<conf>/<L>.json, whether Snakemake said "Nothing to be done", whether the PDF exists), then
indented detail lines.

    python bench/fault_scenarios.py --checkout DIR [--only NAME ...] [--keep] [--python PYTHON]

--keep leaves each scenario's temporary directory (its path is printed); every server and proxy this script starts
is stopped (by its process group) whatever happens. Run it against the checkout before a change and the one after,
and compare the lines.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

WORKFLOW_FILES = ("Snakefile", "rules", "config", "kernels", "templates", "envs", "profiles")
DEFAULT_PYTHON = "/work/main/.venv/bin/python"
LENGTHS = [64, 128, 256]
RUN_TIMEOUT_S = 900  # a hard cap on each run of the command
CONF = "page1"  # the managed configuration (tiny.yaml's)
EXT = "ext"  # the external one


@dataclass
class Env:
    checkout: Path
    python: str
    keep: bool

    def environ(self) -> dict:
        return {**os.environ, "PYTHONPATH": str(self.checkout),
                "PATH": f"{Path(self.python).parent}{os.pathsep}{os.environ['PATH']}"}


@dataclass
class Run:
    work: Path
    seconds: float
    returncode: int | None  # None: killed at RUN_TIMEOUT_S
    output: str

    @property
    def status(self) -> str:
        return "timeout" if self.returncode is None else str(self.returncode)


# ---------------------------------------------------------------------------------------------------------------
# helpers: the workflow, its runs, what they left


def tiny(checkout: Path) -> dict:
    return yaml.safe_load((checkout / "tests" / "configs" / "tiny.yaml").read_text())


def base_config(checkout: Path, **protocol) -> dict:
    """tiny.yaml cut down: its managed configuration page1 only, three lengths, two trials, no load/prefix."""
    t = tiny(checkout)
    page1 = {k: v for k, v in t["configurations"][CONF].items() if k != "env"}
    page1.update(load=False, prefix=False)
    return {"lengths": list(LENGTHS),
            "protocol": {"warmup": 1, "trials": 2, "output_tokens": 8, "request_timeout_s": 60, **protocol},
            "server": dict(t.get("server", {})), "calibration": t["calibration"], "analysis": t["analysis"],
            "model": t["model"], "kernels": {page1["kernel"]: t["kernels"][page1["kernel"]]},
            "configurations": {CONF: page1}}


def external_config(checkout: Path, url: str, api: str, **server) -> dict:
    config = base_config(checkout)
    config["server"].update(server)
    config["kernels"] = {}
    config["configurations"] = {EXT: {"engine": "external", "url": url, "api": api}}
    return config


def new_workflow(env: Env, name: str, config: dict) -> Path:
    """A fresh temporary copy of the checkout's workflow files, with scenario.yaml."""
    work = Path(tempfile.mkdtemp(prefix=f"fault-{name}-"))
    for item in WORKFLOW_FILES:
        src = env.checkout / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / item)
    (work / "scenario.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return work


def done_with(env: Env, work: Path) -> None:
    if env.keep:
        print(f"    kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def run_command(env: Env, work: Path, during=None, target: str = "report/longctx.pdf") -> Run:
    """The README's command in work (its own process group, killed at RUN_TIMEOUT_S); during(proc, start) runs in a
    thread meanwhile."""
    out_path = work / f"run-{time.time_ns()}.out"
    with open(out_path, "w") as out:
        start = time.monotonic()
        proc = subprocess.Popen([env.python, "-m", "snakemake", "--cores", "1", target,
                                 "--configfile", "scenario.yaml"], cwd=work, env=env.environ(),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        watcher = None
        if during:
            watcher = threading.Thread(target=during, args=(proc, start), daemon=True)
            watcher.start()
        try:
            code = proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.monotonic() - start
        if watcher:
            watcher.join(5)
    return Run(work, seconds, code, out_path.read_text(errors="replace"))


def raw_statuses(work: Path, conf: str) -> dict[int, dict | None]:
    """Each length's raw file: its JSON, {} where it cannot be read, None where there is none."""
    found = {}
    for n in LENGTHS:
        path = work / "data" / "raw" / conf / f"{n}.json"
        try:
            found[n] = json.loads(path.read_text())
        except FileNotFoundError:
            found[n] = None
        except (OSError, ValueError):
            found[n] = {}
    return found


def outcome(run: Run, conf: str) -> str:
    raws = raw_statuses(run.work, conf)
    words = " ".join(f"{n}={'missing' if r is None else r.get('status', 'unreadable')}" for n, r in raws.items())
    nothing = "Nothing to be done" in run.output
    pdf = (run.work / "report" / "longctx.pdf").exists()
    return f"raw[{words}] nothing-to-be-done={'yes' if nothing else 'no'} pdf={'yes' if pdf else 'no'}"


def short(text: str, width: int = 170) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def report(scenario: str, number: int | str, run: Run, conf: str, extra: str = "") -> None:
    print(f"{scenario:<14} run {number}  {run.seconds:7.1f} s  exit {run.status:<7} {outcome(run, conf)}{extra}",
          flush=True)


def reasons(run: Run, conf: str) -> None:
    """Why each raw file is not ok (lengths with the same reason on one line), and the command's last error lines
    where it failed."""
    why: dict[str, list[int]] = {}
    for n, raw in raw_statuses(run.work, conf).items():
        if raw == {}:
            why.setdefault("the raw file cannot be read", []).append(n)
        elif raw and raw.get("status") != "ok":
            why.setdefault(f"{raw.get('status')}: {raw.get('reason')}", []).append(n)
    for text, lengths in why.items():
        print(f"    L={','.join(map(str, lengths))} {short(text, 200)}")
    if run.returncode != 0:
        lines = [ln for ln in run.output.splitlines() if ln.startswith("longctx:") or "Error" in ln]
        for line in lines[-2:]:
            print(f"    | {short(line, 220)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def stop_group(pgid: int, timeout_s: float = 20) -> None:
    """SIGTERM a process group this script started, SIGKILL it if it is still there after timeout_s."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def refengine(env: Env, port: int, log: Path):
    """The reference engine (the tiny model of tiny.yaml) as an external server on port, in its own process group,
    health-waited; stopped by its process group on the way out."""
    t = tiny(env.checkout)
    args = t["configurations"][CONF]["args"]
    command = [env.python, "-m", "longctx.refengine", "--port", str(port),
               "--json-model-override-args", json.dumps(t["model"]["architecture"]),
               "--context-length", str(args["context-length"]), "--max-total-tokens", str(args["max-total-tokens"])]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=env.environ(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the reference engine did not come up on port {port}: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        stop_group(proc.pid)
        proc.wait()


class BufferingProxy(http.server.ThreadingHTTPServer):
    """A reverse proxy that buffers whole responses (nginx's proxy_buffering on): each request is forwarded to the
    upstream with http.client, its response read to the end, and only then written to the client in one write with
    a Content-Length."""

    daemon_threads = True

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade",
           "proxy-connection"}

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self.HOP | {"host"}}
        try:
            upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=900)
            upstream.request(self.command, self.path, body=body, headers=headers)
            resp = upstream.getresponse()
            data = resp.read()  # the whole response, streamed or not
            status, reason = resp.status, resp.reason
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in self.HOP]
            upstream.close()
        except OSError as exc:
            data = f"upstream error: {exc}".encode()
            status, reason, kept = 502, "Bad Gateway", [("Content-Type", "text/plain")]
        head = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in kept] + [f"Content-Length: {len(data)}", "", ""]
        self.wfile.write("\r\n".join(head).encode("latin-1") + data)  # one write
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def buffering_proxy(upstream_port: int):
    proxy = BufferingProxy(upstream_port)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy.server_address[1]
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(10)


# ---------------------------------------------------------------------------------------------------------------
# the scenarios


def server_later(env: Env) -> None:
    """External server not up at run 1; up (the reference engine, started here) at runs 2 and 3."""
    port = free_port()
    work = new_workflow(env, "server-later",
                        external_config(env.checkout, f"http://127.0.0.1:{port}", "openai", startup_timeout_s=15))
    try:
        run = run_command(env, work)
        report("server-later", 1, run, EXT, "  (nothing listens)")
        reasons(run, EXT)
        with refengine(env, port, work / "refengine.log"):
            for number in (2, 3):
                before = {n: (r or {}).get("run_id") for n, r in raw_statuses(work, EXT).items()}
                run = run_command(env, work)
                after = {n: (r or {}).get("run_id") for n, r in raw_statuses(work, EXT).items()}
                fresh = sum(1 for n in LENGTHS if after[n] and after[n] != before[n])
                report("server-later", number, run, EXT, f"  (server up; {fresh} raw file(s) new)")
                reasons(run, EXT)
                for line in [ln for ln in run.output.splitlines() if "again" in ln][:3]:
                    print(f"    > {short(line)}")
    finally:
        done_with(env, work)


def truncated_raw(env: Env) -> None:
    """A length's raw file and its partial copy cut short between two runs of the same command."""
    n = LENGTHS[1]
    work = new_workflow(env, "truncated-raw", base_config(env.checkout))
    try:
        run = run_command(env, work)
        report("truncated-raw", 1, run, CONF)
        reasons(run, CONF)
        old = (raw_statuses(work, CONF)[n] or {}).get("run_id")
        for path in (work / "data" / "raw" / CONF / f"{n}.json", work / "data" / "partial" / CONF / f"{n}.json"):
            if path.exists():
                path.write_bytes(path.read_bytes()[:200])
            else:
                print(f"    (no {path.relative_to(work)} to truncate)")
        run = run_command(env, work)
        raw = raw_statuses(work, CONF)[n] or {}
        new = raw.get("run_id")
        said = [ln for ln in run.output.splitlines() if f"L={n}" in ln and re.search(r"again|remeasur|re-measur", ln)]
        report("truncated-raw", 2, run, CONF,
               f"  (L={n} {raw.get('status', 'unreadable')}, run_id {'new' if new and new != old else 'same/none'}, "
               f"said again: {'yes' if said else 'no'})")
        reasons(run, CONF)
        for line in said[:2]:
            print(f"    > {short(line)}")
    finally:
        done_with(env, work)


def sigstop(env: Env) -> None:
    """The managed server's process group SIGSTOPped during the last length's first trial, against a baseline."""
    config = base_config(env.checkout, request_timeout_s=60, timeout_factor=1, trials=2, output_tokens=64)
    last = LENGTHS[-1]

    work = new_workflow(env, "sigstop-base", config)
    try:
        base = run_command(env, work)
        report("sigstop", "base", base, CONF, "  (no SIGSTOP)")
        reasons(base, CONF)
    finally:
        done_with(env, work)

    work = new_workflow(env, "sigstop", config)
    bench_log = work / "data" / "logs" / "bench" / f"{CONF}.log"
    pid_path = work / "data" / "logs" / "server" / f"{CONF}.log.pid"
    stopped: dict = {}

    server_log = work / "data" / "logs" / "server" / f"{CONF}.log"
    stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")

    def when(line: str) -> float:
        return datetime.strptime(stamp.match(line).group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()

    def first_flush_after(t: float) -> float | None:
        try:
            lines = server_log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return None
        return next((when(ln) for ln in lines if "Cache flushed successfully" in ln and stamp.match(ln)
                     and when(ln) >= t), None)

    def stop_when_last_length_starts(proc, start) -> None:
        # a length's first progress line is its warm-up's end (warmup: 1); its first trial follows: the server's
        # cache flush (a line in its log, at or after the warm-up line's time), then the request, which decodes for
        # ~50 ms: the stop is sent 10 ms after that flush, in the first trial's decode
        marker = f" L={last} ("
        while proc.poll() is None and time.monotonic() - start < RUN_TIMEOUT_S:
            try:
                text = bench_log.read_text(errors="replace")
            except FileNotFoundError:
                text = ""
            if marker in text:
                at = when(next(ln for ln in text.splitlines() if marker in ln))
                deadline = time.monotonic() + 1
                while (flushed := first_flush_after(at)) is None and time.monotonic() < deadline:
                    time.sleep(0.001)
                if flushed is not None:
                    time.sleep(max(0.0, flushed + 0.01 - time.time()))
                try:
                    rec = json.loads(pid_path.read_text())
                    pid, created = int(rec["pid"]), float(rec["create_time"])
                except (OSError, ValueError, KeyError):
                    m = re.search(r"server up in [\d.]+ s \(pid (\d+)", text)
                    pid, created = (int(m.group(1)), None) if m else (None, None)
                try:
                    if pid is None or os.getpgid(pid) != pid:
                        raise ProcessLookupError
                    os.killpg(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    stopped["error"] = f"no server process group to stop (pid {pid})"
                    return
                stopped.update(at=time.monotonic(), pgid=pid, created=created, into=time.monotonic() - start)
                return
            time.sleep(0.002)

    try:
        run = run_command(env, work, during=stop_when_last_length_starts)
        if "at" in stopped:
            extra = (f"  (SIGSTOP at {stopped['into']:.1f} s; SIGSTOP to end {run.seconds - stopped['into']:.1f} s; "
                     f"baseline {base.seconds:.1f} s; over baseline {run.seconds - base.seconds:+.1f} s)")
        else:
            extra = f"  (no SIGSTOP sent: {stopped.get('error', 'the last length never started')})"
        report("sigstop", "stop", run, CONF, extra)
        reasons(run, CONF)
        first = ((raw_statuses(work, CONF)[last] or {}).get("remeasured") or {}).get("first_attempt")
        if first:
            print(f"    L={last} first attempt {first.get('status')}: {short(first.get('reason'), 200)}")
        if bench_log.exists():  # what the bench said after the stop: failures, stalls, health checks, restarts
            lines = bench_log.read_text(errors="replace").splitlines()
            first = next((i for i, ln in enumerate(lines) if f" L={last} (" in ln), len(lines))
            said = [ln for ln in lines[first + 1:]
                    if re.search(r"failed|stall|health|again|attempt|restart|timed out|not sent|gave up", ln, re.I)]
            for line in said[:8]:
                print(f"    log> {short(line.split('] ', 1)[-1], 200)}")
    finally:
        release_stopped(stopped)
        done_with(env, work)


def release_stopped(stopped: dict) -> None:
    """SIGCONT and SIGKILL whatever is left of the group this script stopped (only its own members: the recorded
    leader, or processes of that group started after it)."""
    pgid = stopped.get("pgid")
    if not pgid:
        return
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "create_time"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and (stopped["created"] is None or proc.info["create_time"] >= stopped["created"] - 1):
                members.append(proc.pid)
    for pid in members:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    if members:
        print(f"    (stopped server's group {pgid} was still there: killed {members})")


def burst(env: Env) -> None:
    """The reference engine behind a buffering reverse proxy: every stream arrives in one piece."""
    upstream = free_port()
    work = new_workflow(env, "burst", base_config(env.checkout))  # rewritten below, once the proxy has its port
    try:
        with refengine(env, upstream, work / "refengine.log"), buffering_proxy(upstream) as port:
            (work / "scenario.yaml").write_text(yaml.safe_dump(
                external_config(env.checkout, f"http://127.0.0.1:{port}", "sglang"), sort_keys=False))
            run = run_command(env, work)
            report("burst", 1, run, EXT, "  (sglang API through a buffering proxy)")
            reasons(run, EXT)
            md_run = run_command(env, work, target="report/longctx.md")  # the PDF's target does not make its twin
            report("burst", "md", md_run, EXT, "  (the same command for report/longctx.md)")
        md = work / "report" / "longctx.md"
        if md.exists():
            lines = [ln for ln in md.read_text().splitlines()
                     if re.search(r"buffer|\bburst\b|one (piece|chunk|write)|decode.{0,60}not measured|not measured.{0,60}decode",
                                  ln, re.I)]
            print(f"    report/longctx.md: {len(lines)} line(s) on decode not measured / buffering")
            for line in lines[:6]:
                print(f"    md> {short(line)}")
        else:
            print("    report/longctx.md: none")
        results = work / "data" / "results.csv"
        if results.exists():
            with open(results, newline="") as f:
                rows = [r for r in csv.DictReader(f) if r.get("configuration") == EXT]
            for col in ("decode_tok_s", "tpot_s"):
                values = [float(r[col]) for r in rows if r.get(col) not in (None, "", "nan")]
                shown = f"{statistics.median(values):.6g} over {len(values)} row(s)" if values else "no values"
                print(f"    results.csv {col}: {shown if rows and col in rows[0] else 'no such column/rows'}")
        else:
            print("    data/results.csv: none")
    finally:
        done_with(env, work)


SCENARIOS = {"server-later": server_later, "truncated-raw": truncated_raw, "sigstop": sigstop, "burst": burst}


def check_longctx(env: Env) -> None:
    """`longctx` (the console script) and `python -m longctx` must import the checkout's package."""
    script = shutil.which("longctx", path=env.environ()["PATH"])
    if not script:
        sys.exit(f"no longctx console script on PATH under {Path(env.python).parent}")
    interpreter = Path(script).read_text().splitlines()[0].lstrip("#!").strip().split()[0]
    for python in {interpreter, env.python}:
        where = subprocess.run([python, "-c", "import longctx.cli; print(longctx.cli.__file__)"], env=env.environ(),
                               capture_output=True, text=True).stdout.strip()
        if not Path(where).resolve().is_relative_to(env.checkout.resolve()):
            sys.exit(f"{python} imports longctx from {where!r}, not from {env.checkout}")
    print(f"checkout {env.checkout} (longctx from {Path(where).parent}; console script {script})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", required=True, type=Path, help="the project checkout whose code and workflow run")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="these scenarios only (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep each scenario's temporary directory")
    parser.add_argument("--python", default=DEFAULT_PYTHON, help=f"the virtual environment's python ({DEFAULT_PYTHON})")
    opts = parser.parse_args()
    env = Env(opts.checkout.resolve(), opts.python, opts.keep)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that every finally: stops what was started
    check_longctx(env)
    for name in opts.only or SCENARIOS:
        SCENARIOS[name](env)


if __name__ == "__main__":
    main()
