"""The prime: each server's first request, before any measured one (protocol.prime)."""

from __future__ import annotations

import logging

from .health import ServerError

progress = logging.getLogger("longctx.progress")


def prime(session) -> None:
    """Each server, before its first measured request: one request at the longest length the sweep measures
    (protocol.prime), its cache flushed after. A server's first long prompt grows its memory (the allocator's
    arenas, a GPU caching allocator's blocks), and until then every request pays for what it touches fresh: the
    reference engine's 1,024-token TTFT was 35-41 ms before its first 16k prompt and 28-30 ms after
    (bench/server_age.py). Primed, the sweep's first lengths and the load stage after them measure the same
    server. Never longer than a length the sweep measures (not the ITL-depth request nor the reused-context
    conversation, which may be longer): a prompt that kills the server in a way refuses() cannot foresee (an
    out-of-memory in the activations, a crash on long input) must not cost the lengths that would have measured
    without it. Recorded in provenance (`primed`), never as a trial. A prime that fails (an error, a timeout, the
    server's death) is said once and not sent again at a restart; a server it killed is started again before the
    sweep goes on (a start, as any restart)."""
    if not session.spec.protocol.get("prime", True):
        return
    out, asked = 2, session.spec.protocol["output_tokens"]
    entry: dict = {"start": session.starts}
    failed = next((p for p in session.prov.get("primed", ()) if p["status"] not in ("ok", "skipped")), None)
    # the longest length the sweep measures that the server does not refuse with the run's output tokens
    length = next((x for x in sorted(session.spec.lengths, reverse=True) if x and not session.refuses(x, asked)), None)
    if failed is not None:
        entry.update(length=failed["length"], status="skipped",
                     reason=f"the prime failed at start {failed['start']} ({failed['reason']}): not sent again")
        session.prov["primed"].append(entry)
        return
    entry["length"] = length
    if length is None:
        entry.update(status="skipped", reason=session.refuses(max(session.spec.lengths, default=0), asked)
                     or "no length to measure")
    else:
        timeout = session.spec.protocol["request_timeout_s"]
        body = session.prompter.body(length, f"prime/{session.spec.name}/{session.starts}", out)
        summary = session.prompter.generate(session.client, session.base + session.api.generate_path, body, timeout, length)
        entry.update(status=summary["status"], reason=summary.get("reason"), ttft_s=summary.get("ttft_s"))
        if entry["status"] == "ok" or session.healthy():
            entry["flush_error"] = session.flush(timeout)
    session.prov.setdefault("primed", []).append(entry)
    if entry["status"] in ("ok", "skipped"):
        progress.info("%s: primed with one %s-token prompt: %s", session.spec.name, length,
                      f"TTFT {entry['ttft_s']:.3g} s" if entry.get("ttft_s") else f"{entry['status']} ({entry['reason']})")
        return
    progress.warning("%s: the prime (one %s-token prompt, the longest length the sweep measures) failed: %s; it is "
                     "not sent again, and the sweep goes on", session.spec.name, length, entry["reason"])
    if not session.healthy():  # it took the server with it: started again (a restart) before any length is sent
        raise ServerError(session.server.died_message("the server stopped answering after the prime")
                          if session.server is not None else "the server stopped answering after the prime")
