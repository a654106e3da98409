"""A stream whose tokens did not arrive apart: decode not measurable from it, and why (``burst``).

StreamRecord.summary (measure.stream) asks ``burst`` of every stream's token events; a stream it names keeps its
TTFT and gets no decode figures, and the report says why (TTFT_OF_BURST, the cause in BURST_CAUSE).
"""

from __future__ import annotations


# A stream whose tokens arrive together (in one read, or within the client's own time to parse one event and read
# the next: tens of microseconds) was held by something between the server's decoding and the client, as nginx
# holds a proxied response under its default proxy_buffering: its arrival times say when the buffer let go, not when
# the server decoded. Two token events that arrived less than BURST_GAP_S apart did not arrive apart: no server
# decodes 10,000 steps a second for one stream (a step takes a millisecond or more; a speculative server's several
# tokens of one step come in one event). A stream is a burst where at least BURST_SHARE of the gaps between its token
# events are that short: a buffered stream's are nearly all (every one, or all but one per flush of the buffer, whose
# 4 or 8 kB hold tens of events), while a real stream's short gaps are only the events its server happened to write
# together (or the client's socket merged while it was busy), under BURST_SHARE unless its steps averaged ten events
# or more each. The reference engine writes several steps' events within 50 microseconds of each other (its event
# loop runs after its scheduler thread's steps): every one of a short stream's, and at most 75% of the gaps of any
# stream of nine events or more, over 740 streams of the test suite's servers. So a stream is judged from
# BURST_MIN_GAPS gaps on (nine token events); a shorter one is taken as measured.
BURST_GAP_S = 1e-4
BURST_SHARE = 0.9
BURST_MIN_GAPS = 8
# why, in words, once a burst is found: the likely cause and how to turn it off
BURST_CAUSE = ("likely buffering between the server and the client (a proxy: nginx's proxy_buffering off; for its "
               "location, or the response header X-Accel-Buffering: no); measure the server directly or turn the "
               "buffering off")
TTFT_OF_BURST = "its TTFT is kept: when the first byte arrived, which a buffer may also have delayed"


def burst(times: list[float], tokens: list[int], sized: bool = False) -> str | None:
    """Why a stream's decode cannot be measured from the arrival times of its token events (`times`, `tokens` each
    event's tokens) where they did not arrive apart (BURST_GAP_S, BURST_SHARE, BURST_MIN_GAPS), else None. `sized`:
    the response came with a Content-Length, so it was whole before its first byte was sent (a server that streams
    cannot know its length; a proxy or gateway that held all of it can): not apart, however short the stream."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    n = sum(tokens)
    if sized and gaps:
        return (f"decode not measurable from this stream: it came whole, with its length (Content-Length), so its {n} "
                f"tokens were all decoded before its first byte was sent; {BURST_CAUSE}")
    together = sum(1 for g in gaps if g < BURST_GAP_S)
    if len(gaps) < BURST_MIN_GAPS or together < BURST_SHARE * len(gaps):
        return None
    if together == len(gaps):
        how = f"its {n} tokens arrived together (within {(times[-1] - times[0]) * 1e3:.3f} ms)"
    else:
        how = (f"its {n} tokens arrived in {len(gaps) - together + 1} bursts ({together} of its {len(gaps)} gaps between "
               f"events under {BURST_GAP_S * 1e3:g} ms)")
    return f"decode not measurable from this stream: {how}; {BURST_CAUSE}"
