"""The suite's own lock on the machine (tests/conftest.py, machine): under `make test`'s two workers a test marked alone
holds the machine alone, and a test that waits for it is not passed by the other worker's stream of shared tests. Each
holder here is a thread with its own open files, as each worker has: flock's locks belong to the open file, so two
threads conflict as two processes do. The order of events is asserted, not their timing: a holder says when it is
waiting, and the test checks what has not happened yet before it lets the next thing happen."""

from __future__ import annotations

import json
import threading
import time

import pytest

from .conftest import machine, share_the_machine


@pytest.fixture(autouse=True)
def _not_in_the_suites_timeline(monkeypatch):
    """The holders here play workers inside one test: their waits and holds are not the suite's (LONGCTX_SUITE_TIMELINE,
    which bench/suite_timeline.py reads; a clean clone's timeline had 40 lines of theirs, charged to gw1)."""
    monkeypatch.delenv("LONGCTX_SUITE_TIMELINE", raising=False)


class Holder(threading.Thread):
    def __init__(self, run, alone: bool, log: list, name: str):
        super().__init__(daemon=True)
        self.run_dir, self.alone, self.log, self.label = run, alone, log, name
        self.waiting, self.held, self.release = threading.Event(), threading.Event(), threading.Event()

    def run(self):
        self.waiting.set()
        with machine(self.run_dir, self.alone):
            self.log.append(self.label)
            self.held.set()
            self.release.wait(30)


def start(run, alone, log, name) -> Holder:
    h = Holder(run, alone, log, name)
    h.start()
    assert h.waiting.wait(10)
    return h


def gate_taken(run, seconds: float = 10) -> bool:
    """Whether another open file holds the gate (machine's) within `seconds`: a holder waiting to be alone."""
    import fcntl

    end = time.monotonic() + seconds
    with open(run / "machine.gate", "a") as gate:
        while time.monotonic() < end:
            try:
                fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(gate, fcntl.LOCK_UN)
            time.sleep(0.01)
    return False


def not_yet(h: Holder) -> bool:
    return not h.held.wait(0.3)  # it asked and has not got it (it could only be late, never early)


def test_a_test_alone_keeps_a_shared_one_out_until_it_ends(tmp_path):
    log: list = []
    first = start(tmp_path, True, log, "alone")
    assert first.held.wait(10)
    shared = start(tmp_path, False, log, "shared")
    assert not_yet(shared)
    first.release.set()
    assert shared.held.wait(10) and log == ["alone", "shared"]
    shared.release.set()


def test_two_shared_tests_run_together(tmp_path):
    log: list = []
    a, b = start(tmp_path, False, log, "a"), start(tmp_path, False, log, "b")
    assert a.held.wait(10) and b.held.wait(10)
    a.release.set(), b.release.set()


def test_a_test_waiting_to_be_alone_is_not_passed_by_a_later_shared_one(tmp_path):
    """The gate: a shared test that asks after an alone one began to wait gets the machine after it, not before."""
    log: list = []
    running = start(tmp_path, False, log, "running")
    assert running.held.wait(10)
    alone = start(tmp_path, True, log, "alone")
    assert not_yet(alone)
    later = start(tmp_path, False, log, "later")
    assert not_yet(later)  # it would join the running shared test but for the gate
    running.release.set()
    assert alone.held.wait(10) and not_yet(later)
    alone.release.set()
    assert later.held.wait(10) and log == ["running", "alone", "later"]
    later.release.set()


def test_a_test_alone_that_is_done_measuring_lets_a_shared_one_in(tmp_path):
    """share_the_machine, in the thread that holds the machine alone (conftest.HELD is that holder's): a shared test
    waiting for it gets the machine while the alone test goes on."""
    from . import conftest

    log: list = []
    held: list = []  # whether the holder still held the machine alone after share_the_machine
    # said: the holder noted whether it still held the machine alone; the waiter can get the machine before that (the
    # downgrade inside share_the_machine lets it in), and a clean clone's run once read `held` in between
    holding, downgraded, said = threading.Event(), threading.Event(), threading.Event()

    def holder():
        with machine(tmp_path, True):
            log.append("alone")
            holding.set()
            downgraded.wait(30)
            log.append("sharing")
            share_the_machine()
            held.append(conftest.HELD["alone"])
            said.set()
            done.wait(30)

    done = threading.Event()
    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert holding.wait(10)
    waiter = start(tmp_path, False, log, "waiter")
    assert not_yet(waiter)
    downgraded.set()
    assert waiter.held.wait(10) and said.wait(10) and log == ["alone", "sharing", "waiter"] and held == [False]
    done.set(), waiter.release.set()
    t.join(10)


def test_a_test_that_shared_the_machine_holds_it_alone_again_once_the_shared_test_in_it_ends(tmp_path):
    """alone_again, after share_the_machine (a test that measures, reports, and measures again: tests/test_kernel_gate.py):
    it waits for the shared test that came in meanwhile to end, and a shared test that asks while it waits is kept out
    (the gate) until it is done."""
    from . import conftest
    from .conftest import alone_again

    log: list = []
    shared_now, again, done = threading.Event(), threading.Event(), threading.Event()
    results: list = []

    def holder():
        with machine(tmp_path, True):
            share_the_machine()
            shared_now.set()
            again.wait(30)
            alone_again()
            results.append(conftest.HELD["alone"])  # before the log says so: the test reads both once the log does
            log.append("alone again")
            done.wait(30)

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert shared_now.wait(10)
    inside = start(tmp_path, False, log, "shared meanwhile")
    assert inside.held.wait(10)  # it came in while the holder shared the machine
    again.set()
    assert gate_taken(tmp_path)  # the holder waits for the shared test, holding the gate
    assert log == ["shared meanwhile"]
    later = start(tmp_path, False, log, "later")
    assert not_yet(later) and log == ["shared meanwhile"]
    inside.release.set()
    t0 = threading.Event()
    for _ in range(100):
        if "alone again" in log:
            break
        t0.wait(0.1)
    assert log == ["shared meanwhile", "alone again"] and results == [True] and not_yet(later)
    done.set()
    t.join(10)
    assert later.held.wait(10) and log == ["shared meanwhile", "alone again", "later"]
    later.release.set()


def test_a_fixture_that_measures_holds_the_machine_alone_from_a_shared_test_then_shares_it(tmp_path):
    """measuring(), in a test that shares the machine (a module fixture that measures, set up by a test that only reads
    what it measured): it waits for the other worker's shared test to end, keeps a later shared test out while it
    measures, and lets it in once it is done, the test itself still running."""
    from . import conftest
    from .conftest import measuring

    log: list = []
    asked, inside, done = threading.Event(), threading.Event(), threading.Event()
    held: list = []

    def reader():
        with machine(tmp_path, False):
            asked.wait(30)
            with measuring():
                held.append(conftest.HELD["alone"])
                log.append("measured")
                inside.wait(30)
            held.append(conftest.HELD["alone"])
            log.append("reads")
            done.wait(30)

    other = start(tmp_path, False, log, "other shared")
    assert other.held.wait(10)
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    asked.set()
    assert gate_taken(tmp_path)  # the reader waits to measure, holding the gate, for the other shared test to end
    later = start(tmp_path, False, log, "later")
    assert not_yet(later) and log == ["other shared"]
    other.release.set()
    for _ in range(100):
        if "measured" in log:
            break
        time.sleep(0.1)
    assert log == ["other shared", "measured"] and held == [True] and not_yet(later)
    inside.set()  # done measuring: the later shared test comes in beside the rest of the reader
    assert later.held.wait(10) and held == [True, False] and set(log) == {"other shared", "measured", "reads", "later"}
    done.set(), later.release.set()
    t.join(10)


def test_the_timeline_charges_each_wait_to_the_test_the_other_worker_held(tmp_path, monkeypatch):
    """bench/suite_timeline.py on a timeline written by hand, through conftest.timeline's own file format: gw0 holds A
    alone from 0 to 10 s while gw1 waits from 2 s (8 s charged to A); gw1's shared test S runs 10 to 15 s beside gw0's
    shared B (10 to 20 s); gw1 waits to be alone from 15 to 20 s (5 s charged to B, held shared), then holds C alone
    20 to 25 s with nobody waiting. By hand: gw0 alone 10, shared 10, waiting 0, outside any test 5; gw1 alone 5,
    shared 5, waiting 13, outside 2."""
    from .conftest import bench_script

    timeline = bench_script("suite_timeline")
    events = [(0, "gw0", "wait", "A"), (0, "gw0", "alone", "A"), (2, "gw1", "wait", "S"), (10, "gw0", "done", "A"),
              (10, "gw1", "shared", "S"), (10, "gw0", "wait", "B"), (10, "gw0", "shared", "B"), (15, "gw1", "done", "S"),
              (15, "gw1", "wait", "C"), (20, "gw0", "done", "B"), (20, "gw1", "alone", "C"), (25, "gw1", "done", "C")]
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setenv("LONGCTX_SUITE_TIMELINE", str(path))
    from . import conftest

    for t, worker, event, test in events:  # conftest.timeline writes each line; its clock and worker set here
        monkeypatch.setattr(time, "time", lambda t=t: 1000.0 + t)
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        conftest.timeline(event, test)
    out = timeline.report([json.loads(x) for x in path.read_text().splitlines()])
    assert "span of the timeline: 25 s, 2 workers" in out
    assert "gw0: alone 10 s, shared 10 s, waiting 0 s, outside any test 5 s" in out, out
    assert "gw1: alone 5 s, shared 5 s, waiting 13 s, outside any test 2 s" in out, out
    alone, shared = out.split("held the machine alone")[1], out.split("held the machine shared")[1]
    assert "waited 8 s in all while a test" in out and "    8.0    10.0  A" in alone.split("\n\n")[0], out
    assert "waited 5 s in all while a test" in out and "    5.0    10.0  B" in shared, out
    assert "  S" not in shared and "  C" not in alone.split("held the machine shared")[0], out
