"""Progress while a sweep runs: a line per warm-up and trial (throttled on the console, all in the log),
the sweep's elapsed time and the time left, predicted from the fits of the lengths measured so far."""

import json
import logging
import re
import subprocess
import sys

import pytest

from longctx.measure.progress import Progress, duration, time_left

from .conftest import ENV, ROOT, tiny_spec

# alone under -n (tests/conftest.py): the time left it predicts is held against the time taken
pytestmark = pytest.mark.alone

# exact laws: TTFT = a + b L + c L^2, decode step = t0 + beta L
A, B, C, T0, BETA = 0.01, 1e-5, 1e-9, 1e-3, 1e-7
PROTO = {"warmup": 1, "trials": 2, "output_tokens": 32, "concurrency": [2], "needle": {"enabled": False, "output_tokens": 16},
         "itl_depth": {"length": 8000, "output_tokens": 100}}


def law(L: int) -> tuple[int, float, float]:
    return L, A + B * L + C * L * L, T0 + BETA * L


def test_time_left_is_the_fits_prediction_of_the_requests_left():
    p = Progress("cfg", [1000, 2000, 4000, 8000], PROTO, every_s=0)
    for i, L in enumerate((1000, 2000, 4000)):  # reused: they cost nothing, their trials make the fits
        p.known(i, [law(L), law(L)])
    p.begin(3)
    # by hand, at 8000: TTFT 0.01 + 0.08 + 0.064 = 0.154 s, step 0.001 + 0.0008 = 0.0018 s, 32 steps 0.0576 s;
    # 1 warm-up + 2 trials: 3 x 0.2116 = 0.6348; 2 batches of 2 (two prefills, one decode): 2 x 0.3656 = 0.7312;
    # the ITL-depth request, 8000 tokens and 100 steps: 0.154 + 0.18 = 0.334; in all 1.7 s
    assert p.remaining() == [(8000, 32, 1)] * 3 + [(8000, 32, 2)] * 2 + [(8000, 100, 1)]
    left, predicted = time_left(p.history, p.remaining())
    assert predicted and left == pytest.approx(1.7, rel=1e-6)
    assert p.clock_text().endswith("time left ~1.7s")
    p.request(True, 1, 1, {"status": "ok", "ttft_s": 0.154, "tpot_s": 0.0018, "e2e_s": 0.2116, "decode_tok_s": 555.6})
    assert time_left(p.history, p.remaining())[0] == pytest.approx(1.7 - 0.2116, rel=1e-6)  # the warm-up is done
    p.end("ok")
    assert p.remaining() == [(8000, 100, 1)]  # the ITL-depth request alone
    assert p.clock_text(server_up=False).endswith("time left ~0.33s plus the server's start-up")


def test_before_three_lengths_the_time_left_is_a_lower_bound_and_says_so():
    proto = {**PROTO, "concurrency": [], "itl_depth": {"length": None, "output_tokens": 100}}
    p = Progress("cfg", [1000, 2000, 4000], proto, every_s=0)
    assert "time left: unknown until a length is measured" in p.clock_text()
    p.known(0, [law(1000)])
    p.known(1, [law(2000)])
    p.begin(2)
    # each of the 3 requests at 4000 costs at least what one at 2000 did: 0.01 + 0.02 + 0.004 + 32 x 0.0012 = 0.0724 s
    left, predicted = time_left(p.history, p.remaining())
    assert not predicted and left == pytest.approx(3 * 0.0724)
    assert p.clock_text().endswith("time left: at least 0.22s (predicted once 3 lengths are measured; 2 so far)")


def test_with_workloads_after_the_lengths_the_lines_say_they_are_not_counted_and_when_they_begin(caplog):
    now = [0.0]
    p = Progress("cfg", [1000], {**PROTO, "itl_depth": {"length": None}}, clock=lambda: now[0], workloads=True)
    assert p.clock_text().endswith("time left: unknown until a length is measured")
    p.begin(0)
    p.request(False, 1, 2, {"status": "ok", "ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 0.4, "decode_tok_s": 100.0})
    assert p.clock_text().endswith(", workloads not counted (predicted once 3 lengths are measured; 1 so far)")
    caplog.set_level(logging.INFO)
    now[0] = 7.5
    p.lengths_done()
    assert [r.getMessage() for r in caplog.records if r.name == "longctx.progress"] == [
        "cfg: lengths done, elapsed 7.5s; the load and reused-context workloads next"]


def test_request_lines_are_throttled_on_the_console_and_all_in_the_log(caplog):
    now = [0.0]
    p = Progress("cfg", [1000, 2000], {**PROTO, "itl_depth": {"length": None}}, every_s=10, clock=lambda: now[0])
    ok = {"status": "ok", "ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 0.4, "decode_tok_s": 100.0}
    caplog.set_level(logging.INFO)
    p.begin(0)
    for t, k in ((1, 1), (5, 2), (12, 3)):  # a line at 1 s; the next at 5 s held back; at 12 s, 11 s later, shown
        now[0] = t
        p.request(k == 1, 1 if k == 1 else k - 1, 1 if k == 1 else 2, ok)
    now[0] = 13
    p.end("ok, 2 of 2 trials")  # a length's line always
    p.begin(1)
    now[0] = 14
    p.request(False, 1, 2, {"status": "failed", "reason": "timed out"})  # a failure always
    console = [r.getMessage() for r in caplog.records if r.name == "longctx.progress"]
    held = [r.getMessage() for r in caplog.records if r.name == "longctx.measure.progress"]
    assert [m.split(":")[0] for m in console] == ["cfg L=1000 (1 of 2 lengths) warm-up 1 of 1", "cfg L=1000 (1 of 2 lengths) trial 2 of 2",
                                                   "cfg L=1000 (1 of 2 lengths)", "cfg L=2000 (2 of 2 lengths) trial 1 of 2"]
    # left after trial 1 at 1000: 1 trial and 2 batches of 2 there, 3 requests and 2 batches at 2000, each costing at
    # least what 1000 did: a request 0.1 + 32 x 0.01 = 0.42 s, a batch 2 x 0.1 + 0.32 = 0.52 s; 4 x 0.42 + 4 x 0.52 = 3.76 s
    assert held == [("cfg L=1000 (1 of 2 lengths) trial 1 of 2: ok in 0.40s (TTFT 0.100 s, decode 100.0 tok/s); elapsed 5.0s, "
                     "time left: at least 3.8s (predicted once 3 lengths are measured; 1 so far)")]
    assert console[3].startswith("cfg L=2000 (2 of 2 lengths) trial 1 of 2: failed (timed out); elapsed 14s")
    assert [duration(s) for s in (0.25, 4.26, 42.4, 185, 7620)] == ["0.25s", "4.3s", "42s", "3m05s", "2h07m"]


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?", text)
    return int(m[1] or 0) * 3600 + int(m[2] or 0) * 60 + float(m[3] or 0)


def _bench(spec, tmp_path, run: str, *extra: str) -> tuple[list[str], str]:
    """longctx bench as the workflow runs it (--log): its console lines and its log file."""
    log = tmp_path / f"{run}.log"
    proc = subprocess.run([sys.executable, "-m", "longctx", "bench", "--spec", spec.to_json(), "--outdir", str(tmp_path / run),
                           "--server-log", str(tmp_path / f"{run}-server.log"), "--resume-dir", str(tmp_path / "partial"),
                           "--log", str(log), *extra], check=False, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(proc.stderr)
    return [line.removeprefix("longctx bench: ") for line in proc.stderr.splitlines()], log.read_text()


def _checked_against_truth(console: list[str]) -> int:
    """Every 'time left ~X' against the time the lengths then took (to the line that says they are done and the
    workloads, which the prediction does not count, begin; less the server's start-up where the line says it is not
    counted), within a factor 3, where that was at least a second; how many were checked. (Against the end of the
    whole sweep, the workloads' seconds made a prediction 3.0 times short once in four rounds of bench/flake_hunt.py.)"""
    (done,) = [m[1] for m in map(re.compile(r"page1: lengths done, elapsed (\S+); the load and reused-context "
                                            r"workloads next").fullmatch, console) if m]
    end = _seconds(done)
    checked = 0
    for i, line in enumerate(console):
        m = re.search(r"elapsed (\S+), time left ~(\S+)( plus the server's start-up)?, workloads not counted$", line)
        if not m:
            continue
        starts = [float(s[1]) for s in map(re.compile(r"server up in ([\d.]+) s").search, console[i:]) if s]
        actual, predicted = end - _seconds(m[1]) - (sum(starts) if m[3] else 0.0), _seconds(m[2])
        if actual >= 1.0:
            assert actual / 3 <= predicted <= 3 * actual, f"{line}: took {actual:.1f} s"
            checked += 1
    return checked


def test_a_real_sweep_shows_its_progress_and_predicts_its_time_left(tmp_path):
    """Against the reference engine: every warm-up and trial on the console (--progress-every 0) with its
    counts, the time left predicted from three lengths on and checked against the time the lengths then
    took (the workloads after them are not predicted, and the lines say so); resumed, the lengths reused from the first run predict at once, and on the default throttle
    the trials' lines reach the log alone (they take less than its 10 s)."""
    spec = tiny_spec("page1", lengths=[512, 1024, 2048, 4096])
    spec.args.update({"context-length": 8192, "max-total-tokens": 16384})
    # enough decoding that the lines from the third length on leave a second or more to check (the tiny model
    # decodes about 2,000 tokens/s here: with 32 output tokens and a 500-token ITL-depth request the whole sweep took
    # 2 s after start-up, and only 4 lines of the first run, none of the second, had a second left)
    spec.protocol.update(warmup=1, trials=2, output_tokens=128, concurrency=[2],
                         itl_depth={"length": 4096, "output_tokens": 2000})
    console, log = _bench(spec, tmp_path, "first", "--progress-every", "0")
    lengths = [line for line in console if re.match(r"page1 L=\d+ \(\d of 4 lengths\)", line)]
    for i, L in enumerate(spec.lengths, 1):
        where = f"page1 L={L} ({i} of 4 lengths)"
        assert [line.split(":")[0] for line in lengths if line.startswith(where)] == [
            f"{where} warm-up 1 of 1", f"{where} trial 1 of 2", f"{where} trial 2 of 2", where]
        assert f"{where}: ok, 2 of 2 trials, TTFT " in "\n".join(lengths)
    assert "time left: unknown until a length is measured" in lengths[0]
    assert all("time left: at least" in line for line in lengths[1:9])  # 1 and 2 lengths measured: a lower bound
    assert all("time left ~" in line for line in lengths[9:])  # the third length's first trial makes three
    assert _checked_against_truth(console) >= 5
    assert all(line in log for line in lengths)  # the log has them too

    (tmp_path / "partial" / "4096.json").unlink()  # the longest is measured again, the others reused
    console, log = _bench(spec, tmp_path, "second")
    reused = [line for line in console if "measured before" in line and " load " not in line
              and not re.search(r": (prefix|conversation) ", line)]  # the lengths' lines, not the workloads' points
    assert len(reused) == 3 and all(re.search(r"time left ~\S+ plus the server's start-up, workloads not counted$", line)
                                    for line in reused)
    assert not any(" trial " in line or "warm-up" in line for line in console)  # seconds apart: held back ...
    assert "page1 L=4096 (4 of 4 lengths) trial 2 of 2: ok" in log  # ... for the log
    assert re.search(r"page1 L=4096 \(4 of 4 lengths\): ok, 2 of 2 trials, .*time left ~", "\n".join(console))
    assert _checked_against_truth(console) >= 3  # the reused lines (the last line's rest, the ITL-depth request, may take under a second)
    assert json.loads((tmp_path / "second" / "512.json").read_text())["resumed"]
