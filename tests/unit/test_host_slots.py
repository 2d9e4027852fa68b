"""Machine-wide child slots (graphdoctor/parent/slots.py) with real lock files and real processes: a slot is held
while its holder lives and free once it dies (crashed or killed), a file left behind is no lock, a limit of one
makes the second child wait, and memory the GPU does not have keeps a second child out but never the first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from graphdoctor.parent.slots import Busy, HostSlots, HostTurn, Slot, runtime_dir, slots_per_gpu

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _holder_process(root: Path, ready: Path) -> subprocess.Popen[bytes]:
    """Another graphdoctor process that takes a slot of GPU 0 and keeps it until it is killed."""
    code = textwrap.dedent(f"""
        import pathlib, time
        from graphdoctor.parent.slots import HostSlots
        slot = HostSlots("0", root=pathlib.Path({str(root)!r}), limit=1).try_take(3 << 30, "eager reference")
        assert not isinstance(slot, type(None)) and slot.held
        pathlib.Path({str(ready)!r}).write_text("held")
        time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the holder did not take its slot"
        time.sleep(0.05)


def test_a_slot_held_by_another_process_is_busy_until_that_process_is_killed(tmp_path: Path) -> None:
    proc = _holder_process(tmp_path, tmp_path / "ready")
    try:
        _wait_for(tmp_path / "ready", proc)
        slots = HostSlots("0", root=tmp_path, limit=1)
        busy = slots.try_take(GIB, "local graphed")
        assert isinstance(busy, Busy) and not busy.memory
        (holder,) = busy.holders
        assert (holder.pid, holder.bytes, holder.what) == (proc.pid, 3 << 30, "eager reference")
        assert busy.describe("0") == ("waiting for a GPU slot: 1 other graphdoctor run on GPU 0 (1 child; waiting "
                                      "for a free slot)")
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: no release, no clean-up
        proc.wait(timeout=30)
    slot = slots.try_take(GIB, "local graphed")  # the kernel dropped the dead holder's lock
    assert isinstance(slot, Slot) and slot.held
    slot.release()


def test_a_file_left_behind_holds_nothing(tmp_path: Path) -> None:
    slots = HostSlots("0", root=tmp_path, limit=1)
    stale = slots.folder / "slot-0.lock"
    stale.write_text('{"pid": 999999, "bytes": 68719476736, "what": "a run that died"}')
    assert slots.holders() == []
    slot = slots.try_take(GIB, "eager reference")
    assert isinstance(slot, Slot)
    slot.release()
    assert stale.read_text() == ""  # released: its record cleared


def test_a_limit_of_one_makes_the_second_child_wait_for_the_first(tmp_path: Path) -> None:
    slots = HostSlots("0", root=tmp_path, limit=1)
    first = slots.try_take(GIB, "eager reference")
    assert isinstance(first, Slot)
    said: list[str] = []
    taken: list[Slot | None] = []
    waiter = threading.Thread(target=lambda: taken.append(slots.take(GIB, "local graphed", waiting=said.append,
                                                                     poll_s=0.02)))
    waiter.start()
    time.sleep(0.3)
    assert taken == [] and said == ["waiting for a GPU slot: this run's other children on GPU 0 (1 child; waiting "
                                    "for a free slot)"]
    first.release()
    waiter.join(timeout=10)
    (second,) = taken
    assert isinstance(second, Slot) and second.index == 0
    second.release()


def test_a_waiting_child_that_is_cancelled_takes_nothing(tmp_path: Path) -> None:
    slots = HostSlots("0", root=tmp_path, limit=1)
    first = slots.try_take(GIB, "eager reference")
    assert isinstance(first, Slot)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert slots.take(GIB, "local graphed", cancelled=stop.is_set, poll_s=0.02) is None
    first.release()


def test_memory_keeps_a_second_child_out_but_never_the_first(tmp_path: Path) -> None:
    """An 80 GiB GPU, 40 GiB of it used by another user's process: a 40 GiB child starts alone, a second one
    waits (40 + 40 > 0.85 x 80); with the memory nvidia-smi sees below graphdoctor's reservations, the
    reservations count."""
    total = 80 * GIB
    used = {"bytes": 40 * GIB}
    slots = HostSlots("0", memory=lambda: (total, used["bytes"]), root=tmp_path, limit=8)
    first = slots.try_take(40 * GIB, "eager reference")
    assert isinstance(first, Slot)
    busy = slots.try_take(40 * GIB, "local graphed")
    assert isinstance(busy, Busy) and busy.memory
    assert "waiting for memory for one more child" in busy.describe("0")
    small = HostSlots("0", memory=lambda: (total, 10 * GIB), root=tmp_path, limit=8)
    assert isinstance(small.try_take(30 * GIB, "full_iteration graphed"), Busy)  # 40 reserved + 30 > 68
    fits = small.try_take(20 * GIB, "full_iteration graphed")
    assert isinstance(fits, Slot)
    fits.release()
    first.release()


def test_takers_at_the_same_instant_never_both_fit_where_one_does(tmp_path: Path) -> None:
    """Eight takers of 40 GiB on a 100 GiB GPU, released by one barrier, fifty times over: the first holds the GPU
    alone, a second fits beside it, and none of the others may read those two's slots as empty and fit a third."""
    for round_ in range(50):
        slots = [HostSlots("0", memory=lambda: (100 * GIB, 0), root=tmp_path / str(round_), limit=8)
                 for _ in range(8)]
        start = threading.Barrier(len(slots))
        taken: list[Slot | Busy] = []

        def take(host: HostSlots, start: threading.Barrier, taken: list[Slot | Busy]) -> None:
            start.wait()
            taken.append(host.try_take(40 * GIB, "graphed first run", headroom=1.0))

        threads = [threading.Thread(target=take, args=(host, start, taken)) for host in slots]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        held = [t for t in taken if isinstance(t, Slot)]
        assert len(held) == 2, (round_, [t.memory for t in taken if isinstance(t, Busy)])
        for slot in held:
            slot.release()


def test_a_child_on_two_gpus_takes_both_or_neither(tmp_path: Path) -> None:
    gpus = [HostSlots("1", root=tmp_path, limit=1), HostSlots("0", root=tmp_path, limit=1)]
    both = HostTurn(gpus, GIB, "eager reference")
    assert both.take() and all(isinstance(g.try_take(GIB, "x"), Busy) for g in gpus)
    both.release()
    assert all(g.holders() == [] for g in gpus)
    blocker = gpus[0].try_take(GIB, "another run")  # GPU 1 taken by another child
    assert isinstance(blocker, Slot)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert not HostTurn(gpus, GIB, "local graphed").take(stop.is_set)
    assert gpus[1].holders() == []  # GPU 0's slot, taken first, was given back
    blocker.release()


def test_the_runtime_directory_and_limit_come_from_the_environment(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDOCTOR_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setenv("GRAPHDOCTOR_SLOTS_PER_GPU", "3")
    assert runtime_dir() == tmp_path / "rt" and (tmp_path / "rt").is_dir()
    assert slots_per_gpu() == 3 and HostSlots("GPU-ab/c").folder == tmp_path / "rt" / "gpu-GPU-ab_c"
    monkeypatch.setenv("GRAPHDOCTOR_SLOTS_PER_GPU", "zero")
    assert slots_per_gpu() == 8


def test_two_diffs_children_queue_for_one_gpu_through_their_grants(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sessions' memory grants (two diffs on one GPU, each with a free slot of its own) and a machine-wide
    limit of one: the second diff's child is granted only when the first's ends, and says why it waits; a child
    that ends while it waits never takes the slot."""
    import queue

    from graphdoctor.parent.children import MemoryGrant

    monkeypatch.setenv("GRAPHDOCTOR_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setenv("GRAPHDOCTOR_SLOTS_PER_GPU", "1")
    said: list[str] = []

    def grant(name: str) -> MemoryGrant:
        own: queue.Queue[str | None] = queue.Queue()
        own.put("0")
        return MemoryGrant(own, tmp_path / name, HostTurn.on(["0"], GIB, f"{name} graphed", said.append))

    first = grant("a")
    assert first.granted.wait(5.0)
    second = grant("b")
    assert not second.granted.wait(0.5) and not (tmp_path / "b.go").exists()
    assert said and said[0].startswith("waiting for a GPU slot: this run's other children on GPU 0")
    third = grant("c")
    third.release()  # ended before its turn
    first.release()
    assert second.granted.wait(5.0) and (tmp_path / "b.go").exists()
    second.release()
    time.sleep(0.3)
    assert not third.granted.is_set() and HostSlots("0").holders() == []
