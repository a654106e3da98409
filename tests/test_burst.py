"""A stream whose tokens did not arrive apart (issue 47, item 4): a buffer between the server and the client
(a proxy under nginx's default proxy_buffering) hands the whole response on at once, and its arrival times say
when the buffer let go, not when the server decoded. The detection (longctx.measure.burst) on records built
by hand: paced and speculative streams are measured, a burst is said with why; then a real sweep of an
OpenAI-compatible server behind such a buffer (tests/openai_servers.py, `buffered`) beside one measured at a single
length (no prefill fit, no decode fit, no bounds), through the report chain to a PDF and its Markdown twin that say
why decode was not measured, tabulate no decode rate for it, and render whatever fit or bound is missing."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace

import pytest

from longctx import config as lcfg
from longctx.measure import burst, stream

from .openai_servers import DECODE_S, openai_server
from .report_data import LLAMA_GQA, run_report_chain
from .test_report_failed import text_of, unescape_md

# alone under -n (tests/conftest.py): the rates it measures are held to the server's decode time
pytestmark = pytest.mark.alone

MS = 1e-3


def record(times: list[float], tokens: list[int] | None = None, t_sent: float = 0.0) -> stream.StreamRecord:
    """A finished stream whose token events arrived at `times` (the socket's clock), each carrying `tokens`."""
    tokens = tokens or [1] * len(times)
    return stream.StreamRecord(t_sent=t_sent, t_call=t_sent, arrival_clock="kernel", event_times=list(times),
                               event_seen=list(times), event_tokens=list(tokens), event_sent=[None] * len(times),
                               t_done=times[-1], meta={"completion_tokens": sum(tokens)})


def test_a_paced_stream_is_measured_even_where_some_events_came_together():
    # 2 ms a token (tests/openai_servers.py's pace), three pairs of events the kernel handed over in one read
    times = [0.1 + 2 * MS * i for i in range(32)]
    for i in (5, 17, 29):
        times[i] = times[i - 1]
    s = record(times).summary()
    assert s["status"] == "ok" and s["burst"] is False and s["decode_unmeasured"] is None
    assert s["tpot_s"] == pytest.approx(2 * MS, rel=0.01) and len(s["itl_s"]) == 31 and s["itl_max_s"] > 0


def test_a_short_stream_that_came_whole_with_its_length_is_not_taken_as_a_decode_rate():
    """Four tokens are too few to judge by their gaps (a tiny model decodes that fast), but a stream that came with a
    Content-Length was whole before its first byte was sent: a buffer (a gateway, a proxy) held it, however short.
    Without the header the same times are taken as measured."""
    times = [0.05, 0.05, 0.05, 0.05]
    unsized = record(times).summary()
    assert unsized["burst"] is False and unsized["tpot_s"] == 0  # what it reads as: the buffer's pace, not the server's
    held = record(times)
    held.sized = True
    s = held.summary()
    assert s["status"] == "ok" and s["burst"] is True and s["tpot_s"] is None and s["decode_tok_s"] is None
    assert s["decode_unmeasured"].startswith("decode not measurable from this stream: it came whole, with its length "
                                             "(Content-Length), so its 4 tokens were all decoded before its first byte")
    assert s["ttft_s"] == pytest.approx(0.05)


def test_speculative_streams_are_measured():
    # one event per verify step (5 ms), carrying the tokens the step accepted, as SGLang and vLLM send them
    accepted = [1, 3, 2, 4, 1, 3, 3, 2, 4, 1, 2, 3]
    s = record([0.2 + 5 * MS * i for i in range(len(accepted))], accepted).summary()
    assert s["burst"] is False and s["decode_tok_s"] == pytest.approx(sum(accepted[1:]) / (11 * 5 * MS))
    # a server that writes a step's tokens as events of one token each, back to back (20 us apart): two of every
    # three gaps are short, under BURST_SHARE
    times = [0.2 + 5 * MS * step + 20e-6 * k for step in range(12) for k in range(3)]
    s = record(times).summary()
    assert s["burst"] is False and s["decode_tok_s"] == pytest.approx(35 / (times[-1] - times[0]))
    # a stream too short to judge (fewer than BURST_MIN_GAPS gaps): taken as measured, whatever its gaps
    assert record([0.2] * burst.BURST_MIN_GAPS).summary()["burst"] is False


def test_a_stream_that_arrived_in_one_burst_keeps_its_ttft_and_says_why_decode_was_not_measured():
    for times in ([0.5] * 32,  # one read, one kernel stamp
                  [0.5 + 30e-6 * i for i in range(32)]):  # the client's own time to parse each event (a TLS socket)
        s = record(times, t_sent=0.1).summary()
        assert s["status"] == "ok" and s["burst"] is True
        assert s["ttft_s"] == pytest.approx(0.4) and s["e2e_s"] == pytest.approx(times[-1] - 0.1)
        assert all(s[k] is None for k in ("tpot_s", "decode_tok_s", "decode_s", "itl_median_s", "itl_max_s", "itl_s"))
        why = s["decode_unmeasured"]
        assert why.startswith("decode not measurable from this stream: its 32 tokens arrived together (within ")
        assert why.endswith(burst.BURST_CAUSE) and "proxy_buffering off" in why and "X-Accel-Buffering: no" in why
    # a long stream held by a buffer that flushes every 16 events (a 4 kB proxy buffer): four bursts, 30 ms apart
    times = [0.5 + 30 * MS * (i // 16) for i in range(64)]
    s = record(times).summary()
    assert s["burst"] is True and s["decode_tok_s"] is None
    assert "its 64 tokens arrived in 4 bursts (60 of its 63 gaps between events under 0.1 ms)" in s["decode_unmeasured"]


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """Two OpenAI-compatible servers of one model (a GQA Llama, model.architecture): `proxied` behind a buffer (its
    whole response written at once), measured at three lengths; `one_length` measured directly at 64 tokens only.
    Their sweeps, then the report rules' commands."""
    from longctx.measure.sweep import run_configuration

    tmp = tmp_path_factory.mktemp("burst")
    data = tmp / "data"
    config = lcfg.validate({
        "lengths": [64, 128, 256],
        "protocol": {"warmup": 0, "trials": 2, "output_tokens": 12, "token_id_range": [3, 300]},
        "model": {"name": "tiny-llama", "architecture": LLAMA_GQA}, "telemetry": {"enabled": False},
        "configurations": {"proxied": {"engine": "external", "url": "http://127.0.0.1:1", "api": "openai"},
                           "one_length": {"engine": "external", "url": "http://127.0.0.1:1", "api": "openai"}}})
    terminal, logger = Lines(), logging.getLogger("longctx.progress")  # the lines `longctx bench` shows
    level = logger.level
    logger.addHandler(terminal)
    logger.setLevel(logging.INFO)
    try:
        with openai_server("no-health", tmp / "tok", buffered=True) as (held, _), \
                openai_server("no-health", tmp / "tok") as (direct, _):
            for name, url, lengths in (("proxied", held, [64, 128, 256]), ("one_length", direct, [64])):
                spec = lcfg.configuration_spec(config, name)
                spec = replace(spec, lengths=lengths, url=url)
                assert run_configuration(spec, data / "raw" / name, tmp / f"{name}.log") == 0
    finally:
        logger.removeHandler(terminal)
        logger.setLevel(level)
    paths = run_report_chain(data, tmp / "report", {**config, "report": {"baseline": None, "plans": []}})
    return {"data": data, "terminal": terminal.lines, "pdf": text_of(paths["pdf"]),
            "md": unescape_md(paths["md"].read_text())}


def test_a_buffered_stream_is_recorded_with_its_ttft_and_without_decode_figures(proxied):
    data = proxied["data"]
    for L in (64, 128, 256):
        raw = json.loads((data / "raw" / "proxied" / f"{L}.json").read_text())
        assert raw["status"] == "ok" and len(raw["trials"]) == 2
        for t in raw["trials"]:
            assert t["status"] == "ok" and t["burst"] is True and t["tpot_s"] is None and t["decode_tok_s"] is None
            assert t["decode_unmeasured"].startswith("decode not measurable from this stream: its 12 tokens arrived together")
            assert t["ttft_s"] > 12 * DECODE_S  # the buffer held the first byte too, until the server's last token
    direct = json.loads((data / "raw" / "one_length" / "64.json").read_text())["trials"]
    assert all(t["burst"] is False and 0.5 / DECODE_S < t["decode_tok_s"] < 1.1 / DECODE_S for t in direct)
    # the terminal said it once in full, as the trial came in, and at the end of each length
    said = [line for line in proxied["terminal"] if "decode not measurable from this stream" in line]
    assert len(said) == 1 and "proxy_buffering off" in said[0]
    assert sum("decode not measured in 2 of them: their tokens did not arrive apart" in line
               for line in proxied["terminal"]) == 3
    fits = json.loads((data / "fits.json").read_text())["configurations"]
    assert "prefill" in fits["proxied"] and "decode" not in fits["proxied"] and fits["proxied"]["trials_burst"] == 6
    assert fits["proxied"]["bounds"]["decode"] is None and "roofline" not in fits["proxied"]
    one = fits["one_length"]
    assert "prefill" not in one and "decode" not in one and one["bounds"] == {"prefill": None, "decode": None}
    assert one["roofline"]["points"]  # a point, and no bound to name beside it


def test_the_report_says_why_decode_was_not_measured_and_tabulates_no_rate(proxied):
    pdf, md = re.sub(r"(\w)- (\w)", r"\1-\2", proxied["pdf"]), proxied["md"]  # a line broken at a hyphen, joined
    summary = pdf[:pdf.index("2 Diagnosis")]
    said = ("proxied: no decode rate was measured: 6 of 6 trials' tokens did not arrive apart (at 64 tokens: decode not "
            "measurable from this stream: its 12 tokens arrived together (within ")
    for text in (summary, md):
        assert said in text and "likely buffering between the server and the client (a proxy: nginx's proxy_buffering off;" in text
        assert "X-Accel-Buffering: no); measure the server directly or turn the buffering off" in text
    flag = ("6 of 6 trials' tokens did not arrive apart, so their decode was not measured (at 64 tokens, trial 0: decode "
            "not measurable from this stream")
    assert flag in pdf and flag in md
    assert "its TTFT is kept: when the first byte arrived, which a buffer may also have delayed" in pdf
    # no decode rate in any table: the headline's rows, the results appendix (TPOT and decode)
    for L in (64, 128, 256):
        assert re.search(rf"proxied {L:,} [\d.,]+ -- ", pdf), L
        assert re.search(rf"\| proxied \| {L:,} \| [\d.,]+ \| -- \|", md), L
    assert "proxied not measured: its tokens did not arrive apart (see the diagnosis): no fit" in pdf
    assert "| proxied | not measured: its tokens did not arrive apart (see the diagnosis): no fit |" in md


def test_a_configuration_without_fits_or_bounds_renders_and_says_why(proxied):
    pdf, md = proxied["pdf"], proxied["md"]
    assert "one_length fewer than three measured lengths: no fit" in pdf  # the prefill table
    assert "one_length fewer than two measured lengths: no fit" in pdf  # the decode table
    for text in (pdf, md):
        assert "No prefill model is fitted: it needs 3 measured lengths, and prefill was measured at 64 tokens only" in text
        assert "No decode model is fitted: it needs 2 measured lengths, and decode was measured at 64 tokens only" in text
        # the roofline has its point, and no bound to name
        assert re.search(r"one_length: (intensity [\d.]+ FLOP/B \(verify width 1\); )?ridge .*?what bounds decode is not "
                         r"decided: fewer than two measured lengths: no fit\.", text)
    assert "??" not in pdf
