"""A stream whose tokens did not arrive apart (issue 47, item 4): a buffer between the server and the client
(a proxy under nginx's default proxy_buffering) hands the whole response on at once, and its arrival times say
when the buffer let go, not when the server decoded. The detection (longctx.measure.stream.burst) on records built
by hand: paced and speculative streams are measured, a burst is said with why."""

from __future__ import annotations

import pytest

from longctx.measure import stream

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
    assert record([0.2] * stream.BURST_MIN_GAPS).summary()["burst"] is False


def test_a_stream_that_arrived_in_one_burst_keeps_its_ttft_and_says_why_decode_was_not_measured():
    for times in ([0.5] * 32,  # one read, one kernel stamp
                  [0.5 + 30e-6 * i for i in range(32)]):  # the client's own time to parse each event (a TLS socket)
        s = record(times, t_sent=0.1).summary()
        assert s["status"] == "ok" and s["burst"] is True
        assert s["ttft_s"] == pytest.approx(0.4) and s["e2e_s"] == pytest.approx(times[-1] - 0.1)
        assert all(s[k] is None for k in ("tpot_s", "decode_tok_s", "decode_s", "itl_median_s", "itl_max_s", "itl_s"))
        why = s["decode_unmeasured"]
        assert why.startswith("decode not measurable from this stream: its 32 tokens arrived together (within ")
        assert why.endswith(stream.BURST_CAUSE) and "proxy_buffering off" in why and "X-Accel-Buffering: no" in why
    # a long stream held by a buffer that flushes every 16 events (a 4 kB proxy buffer): four bursts, 30 ms apart
    times = [0.5 + 30 * MS * (i // 16) for i in range(64)]
    s = record(times).summary()
    assert s["burst"] is True and s["decode_tok_s"] is None
    assert "its 64 tokens arrived in 4 bursts (60 of its 63 gaps between events under 0.1 ms)" in s["decode_unmeasured"]
