"""Turns of a session's children (graphdoctor/parent/turns.py), with real threads: a retry runs alone, children asked
for while it waits or runs wait for it, retries run one at a time, and every wait ends at its bound or on cancel."""

from __future__ import annotations

import threading
import time

from graphdoctor.parent.turns import Turns


def _hold(turns: Turns, log: list[tuple[str, str]], name: str, seconds: float, *, alone: bool = False,
          started: threading.Event | None = None) -> threading.Thread:
    def run() -> None:
        with turns.turn(alone=alone):
            log.append(("start", name))
            if started is not None:
                started.set()
            time.sleep(seconds)
            log.append(("end", name))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _log() -> list[tuple[str, str]]:
    return []


def _spans(log: list[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    return {name: (log.index(("start", name)), log.index(("end", name))) for _, name in log}


def test_children_without_a_retry_run_together() -> None:
    turns, log = Turns(30.0), _log()
    threads = [_hold(turns, log, f"child{i}", 0.3) for i in range(3)]
    time.sleep(0.15)
    assert turns.running == 3
    for t in threads:
        t.join()
    assert [kind for kind, _ in log[:3]] == ["start"] * 3


def test_a_retry_waits_for_the_children_before_it_and_the_children_after_it_wait_for_it() -> None:
    turns, log = Turns(30.0), _log()
    first = threading.Event()
    before = _hold(turns, log, "before", 0.4, started=first)
    assert first.wait(5.0)
    retry = _hold(turns, log, "retry", 0.3, alone=True)
    time.sleep(0.1)  # the retry waits now
    after = _hold(turns, log, "after", 0.1)
    for t in (before, retry, after):
        t.join()
    spans = _spans(log)
    assert spans["before"][1] < spans["retry"][0]  # alone: started once the earlier child ended
    assert spans["retry"][1] < spans["after"][0]  # nothing started beside it


def test_retries_run_one_at_a_time() -> None:
    turns, log = Turns(30.0), _log()
    threads = [_hold(turns, log, f"retry{i}", 0.2, alone=True) for i in range(3)]
    for t in threads:
        t.join()
    assert [kind for kind, _ in log] == ["start", "end"] * 3


def test_a_wait_ends_at_its_bound_and_on_cancel() -> None:
    turns, log = Turns(0.3), _log()
    started = threading.Event()
    long = _hold(turns, log, "long", 1.5, started=started)
    assert started.wait(5.0)
    began = time.monotonic()
    with turns.turn(alone=True):  # the bound passed: it runs beside the long child rather than wait for ever
        assert turns.running == 2
    assert 0.25 <= time.monotonic() - began < 1.2
    turns = Turns(30.0)
    started.clear()
    long = _hold(turns, log, "long2", 3.0, started=started)
    assert started.wait(5.0)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    began = time.monotonic()
    with turns.turn(cancel, alone=True):
        pass
    assert time.monotonic() - began < 2.0  # the long child holds its turn for 3 s
    long.join()
    assert turns.running == 0
