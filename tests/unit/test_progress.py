"""Progress of running children: following real events files written by EventWriter (torn lines,
offsets), the plain log, the live board on a StringIO terminal and on a real pseudo-terminal, quiet,
and the background refresh thread."""

from __future__ import annotations

import io
import os
import re
import select
import sys
import threading
import time
from pathlib import Path

import pytest

from graphdoctor.parent.children import ChildRequest
from graphdoctor.parent.progress import (
    EventFollower,
    ProgressBoard,
    ProgressError,
    ProgressMode,
    printable,
    progress_mode,
)
from graphdoctor.protocol import Capture, End, EventWriter, RunEnv, Started, Step, encode
from graphdoctor.protocol.spec import Role
from graphdoctor.protocol.steps import StepRecord

ESC = "\x1b"


def step(index: int, phase: str) -> Step:
    return Step(record=StepRecord(step=index, phase=phase, loss=6.5, step_time_ms=3.0))


STARTED = Started(env=RunEnv(torch="2.11.0", pid=7, gpu="NVIDIA H200", capability=(9, 0)))
END = End(train_s=1.5, compare_s=0.2, setup_s=3.0)


class Clock:
    """A clock the test moves by hand, so elapsed seconds in expected lines are exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TerminalStringIO(io.StringIO):
    """A StringIO that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def screen(output: str) -> list[str]:
    """The lines a terminal shows after `output` (only the escapes the board uses: CR, LF, cursor up,
    erase line, erase below)."""
    rows: list[str] = [""]
    row = 0
    for token in re.findall(r"\x1b\[\d*[AJK]|\x1b\[2K|[\r\n]|[^\x1b\r\n]+", output):
        if token == "\n":
            row += 1
            if row == len(rows):
                rows.append("")
        elif token == "\r":
            pass  # every write after a CR overwrites the whole line here: the board erases it first
        elif token.endswith("A"):
            row -= int(token[2:-1] or 1)
            assert row >= 0, "cursor moved above the first line"
        elif token == f"{ESC}[2K":
            rows[row] = ""
        elif token == f"{ESC}[J":
            del rows[row + 1:]
            rows[row] = ""
        else:
            rows[row] += token
    return rows[:-1] if rows[-1] == "" else rows


# ---- EventFollower -------------------------------------------------------------------------------

def test_follower_returns_only_new_events_and_keeps_a_torn_line_for_later(tmp_path: Path) -> None:
    path = tmp_path / "events-local-graphed-d0.jsonl"
    follower = EventFollower(path)
    assert follower.read_new() == []  # the child has not opened its file yet

    writer = EventWriter(path)
    writer.emit(STARTED)
    writer.emit(step(0, "capture"))
    assert follower.read_new() == [STARTED, step(0, "capture")]
    assert follower.read_new() == []
    assert follower.offset == path.stat().st_size

    writer.emit(Capture(step=0, seconds=0.25))
    line = encode(step(1, "replay")) + "\n"
    with open(path, "a", encoding="utf-8") as fh:  # a child caught mid-write: half a line
        fh.write(line[:17])
    assert follower.read_new() == [Capture(step=0, seconds=0.25)]
    assert follower.read_new() == []
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line[17:])
    assert follower.read_new() == [step(1, "replay")]
    assert follower.offset == path.stat().st_size
    assert follower.num_skipped == 0
    writer.close()


def test_follower_skips_lines_that_do_not_decode(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"event": "nonsense"}\n\nnot json\n' + encode(END) + "\n")
    follower = EventFollower(path)
    assert follower.read_new() == [END]
    assert follower.num_skipped == 2


def test_follower_reads_a_rewritten_file_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path)
    for i in range(3):
        writer.emit(step(i, "replay"))
    writer.close()
    follower = EventFollower(path)
    assert len(follower.read_new()) == 3
    path.write_text(encode(STARTED) + "\n", encoding="utf-8")
    assert follower.read_new() == [STARTED]


# ---- modes -----------------------------------------------------------------------------------------

def test_mode_is_quiet_when_asked_live_on_a_terminal_plain_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    assert progress_mode(TerminalStringIO()) is ProgressMode.LIVE
    assert progress_mode(TerminalStringIO(), quiet=True) is ProgressMode.QUIET
    assert progress_mode(io.StringIO()) is ProgressMode.PLAIN
    assert progress_mode(io.StringIO(), quiet=True) is ProgressMode.QUIET
    monkeypatch.setenv("TERM", "dumb")
    assert progress_mode(TerminalStringIO()) is ProgressMode.PLAIN


def test_wrong_use_raises_progress_error(tmp_path: Path) -> None:
    with pytest.raises(ProgressError, match="got 'fancy'"):
        ProgressBoard(io.StringIO(), "fancy")
    board = ProgressBoard(io.StringIO(), "plain")
    board.child_started("a", "local", "graphed", tmp_path / "e.jsonl", 8)
    with pytest.raises(ProgressError, match="started twice"):
        board.child_started("a", "local", "graphed", tmp_path / "e.jsonl", 8)
    with pytest.raises(ProgressError, match="not running"):
        board.child_finished("b", "ok", 1.0)


# ---- plain -----------------------------------------------------------------------------------------

def test_plain_mode_logs_start_phase_changes_and_end(tmp_path: Path) -> None:
    path = tmp_path / "events-local.jsonl"
    out, clock = io.StringIO(), Clock()
    board = ProgressBoard(out, "plain", clock=clock)
    writer = EventWriter(path)
    board.child_started("local", "local", "graphed", path, 4)
    clock.now += 2.0
    writer.emit(STARTED)
    board.refresh()  # set-up is not a phase line
    clock.now += 1.5
    writer.emit(step(0, "capture"))
    writer.emit(Capture(step=0, seconds=0.4))
    board.refresh()
    clock.now += 0.5
    writer.emit(step(1, "replay"))
    board.refresh()
    clock.now += 0.5
    writer.emit(step(2, "replay"))
    board.refresh()  # same phase: no line
    writer.emit(step(3, "replay"))
    writer.emit(END)
    board.child_finished("local", "ok", 5.25)
    board.close()
    writer.close()
    assert out.getvalue().splitlines() == [
        "  local       graphed  started",
        "  local       graphed  capture  step 1/4    3.5 s",
        "  local       graphed  replay   step 2/4    4.0 s",
        "  local       graphed  ok       4/4 steps    5.2 s",
    ]
    assert ESC not in out.getvalue()


def test_plain_mode_escapes_control_characters_read_from_files(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    out = io.StringIO()
    board = ProgressBoard(out, "plain", clock=Clock())
    board.child_started(1, "evil\x1b[2J", "graphed", path, 2)
    writer = EventWriter(path)
    writer.emit(step(0, "re\x1b]0;pwned\x07play\u202e"))
    writer.close()
    board.refresh()
    board.child_finished(1, "error\r", 0.5)
    text = out.getvalue()
    assert ESC not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text
    assert text.splitlines()[1] == "  evil\\x1b[2J graphed  re\\x1b]0;pwned\\x07play\\u202e step 1/2    0.0 s"
    assert printable("ok") == "ok"



# ---- live ------------------------------------------------------------------------------------------

def live_board(monkeypatch: pytest.MonkeyPatch, columns: int, lines: int) -> tuple[ProgressBoard, io.StringIO, Clock]:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", str(lines))
    monkeypatch.setenv("TERM", "xterm-256color")
    out, clock = TerminalStringIO(), Clock()
    board = ProgressBoard(out, progress_mode(out), clock=clock)
    assert board.mode is ProgressMode.LIVE
    return board, out, clock


def new_output(out: io.StringIO, seen: list[int]) -> str:
    text = out.getvalue()[seen[0]:]
    seen[0] = len(out.getvalue())
    return text


def test_live_board_redraws_one_line_per_running_child_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board, out, clock = live_board(monkeypatch, 80, 24)
    seen = [0]
    ref_path, local_path = tmp_path / "events-eager.jsonl", tmp_path / "events-local.jsonl"
    board.child_started("ref", "eager", "reference", ref_path, 8)
    assert new_output(out, seen) == f"\r{ESC}[2K  eager       reference starting step 0/8    0.0 s\n{ESC}[J"
    clock.now += 1.0
    board.child_started("local", "local", "graphed", local_path, 8)
    assert new_output(out, seen) == (
        f"{ESC}[1A\r"
        f"{ESC}[2K  eager       reference starting step 0/8    1.0 s\n"
        f"{ESC}[2K  local       graphed  starting step 0/8    0.0 s\n{ESC}[J")

    ref, local = EventWriter(ref_path), EventWriter(local_path)
    ref.emit(STARTED)
    for i in range(3):
        ref.emit(step(i, "eager"))
    local.emit(STARTED)
    for i, phase in enumerate(["capture", "replay", "replay", "replay", "replay"]):
        local.emit(step(i, phase))
    clock.now += 11.3
    board.refresh()
    assert new_output(out, seen) == (
        f"{ESC}[2A\r"
        f"{ESC}[2K  eager       reference eager    step 3/8   12.3 s\n"
        f"{ESC}[2K  local       graphed  replay   step 5/8   11.3 s\n{ESC}[J")

    for i in range(3, 8):
        ref.emit(step(i, "eager"))
    ref.emit(END)
    board.child_finished("ref", "ok", 13.0)
    assert new_output(out, seen) == (
        f"{ESC}[2A\r"
        f"{ESC}[2K  eager       reference ok       8/8 steps   13.0 s\n"
        f"{ESC}[2K  local       graphed  replay   step 5/8   11.3 s\n{ESC}[J")
    board.refresh()  # the finished child is printed once: only the board is redrawn
    assert new_output(out, seen) == f"{ESC}[1A\r{ESC}[2K  local       graphed  replay   step 5/8   11.3 s\n{ESC}[J"

    board.child_finished("local", "error", 12.0)
    board.close()
    ref.close()
    local.close()
    assert screen(out.getvalue()) == [
        "  eager       reference ok       8/8 steps   13.0 s",
        "  local       graphed  error    5/8 steps   12.0 s",
    ]
    assert out.getvalue().endswith("\n" + f"{ESC}[J")  # the cursor is left below the board


def test_live_board_fits_the_terminal_height_and_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board, out, _ = live_board(monkeypatch, 30, 4)
    for i in range(5):
        board.child_started(i, f"impl{i}", "graphed", tmp_path / f"e{i}.jsonl", 8)
    assert screen(out.getvalue()) == [
        "  impl0       graphed  starti",
        "  impl1       graphed  starti",
        "  ... 3 more running",
    ]
    board.child_finished(0, "ok", 1.0)
    assert screen(out.getvalue()) == [
        "  impl0       graphed  ok       0/8 steps    1.0 s",  # permanent lines are never cut
        "  impl1       graphed  starti",
        "  impl2       graphed  starti",
        "  ... 2 more running",
    ]
    board.close()


def read_pty(master: int, until: str, timeout_s: float = 5.0) -> str:
    """What the board wrote to the terminal, once `until` has arrived (bounded wait)."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while until.encode() not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            data += os.read(master, 65536)
    return data.decode("utf-8")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminal test written for Linux")
def test_live_board_on_a_real_pseudo_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl
    import pty
    import struct
    import termios

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 10, 40, 0, 0))
    stream = open(slave, "w", encoding="utf-8")  # noqa: SIM115 - closed below, with the master
    try:
        board = ProgressBoard(stream, progress_mode(stream), clock=Clock())
        assert board.mode is ProgressMode.LIVE
        board.child_started("te", "transformer_engine", "graphed", tmp_path / "te.jsonl", 8)
        board.child_started("fi", "full_iteration", "graphed", tmp_path / "fi.jsonl", 8)
        writer = EventWriter(tmp_path / "fi.jsonl")
        writer.emit(step(0, "warmup"))
        writer.emit(END)
        writer.close()
        board.child_finished("fi", "ok", 2.5)
        board.close()
        text = read_pty(master, "2.5 s")
    finally:
        stream.close()
        os.close(master)
    assert f"{ESC}[1A\r{ESC}[2K" in text and f"{ESC}[2A\r{ESC}[2K" in text
    assert screen(text) == [
        "  full_iteration graphed  ok       1/8 steps    2.5 s",
        "  transformer_engine graphed  starting ",  # cut to 39 columns of the 40-column terminal
    ]


# ---- quiet and the refresh thread -----------------------------------------------------------------

def test_quiet_prints_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    out = TerminalStringIO()
    board = ProgressBoard(out, progress_mode(out, quiet=True))
    board.start(interval_s=0.01)
    board.child_started("a", "local", "graphed", tmp_path / "e.jsonl", 2)
    writer = EventWriter(tmp_path / "e.jsonl")
    writer.emit(step(0, "capture"))
    writer.emit(step(1, "replay"))
    writer.close()
    board.refresh()
    board.child_finished("a", "ok", 1.0)
    board.close()
    assert out.getvalue() == ""


def wait_for(predicate: object, timeout_s: float = 5.0) -> bool:
    """Poll `predicate` until it is true or `timeout_s` has passed."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_refresh_thread_shows_events_as_they_are_appended(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    out = io.StringIO()
    board = ProgressBoard(out, "plain", clock=Clock())
    board.child_started("fi", "full_iteration", "graphed", path, 3)
    board.start(interval_s=0.01)
    writer = EventWriter(path)
    try:
        writer.emit(step(0, "warmup"))
        assert wait_for(lambda: "warmup   step 1/3" in out.getvalue())
        writer.emit(step(1, "capture"))
        assert wait_for(lambda: "capture  step 2/3" in out.getvalue())
        writer.emit(step(2, "replay"))
        assert wait_for(lambda: "replay   step 3/3" in out.getvalue())
    finally:
        writer.close()
        board.child_finished("fi", "ok", 4.0)
        board.close()
    assert out.getvalue().splitlines() == [
        "  full_iteration graphed  started",
        "  full_iteration graphed  warmup   step 1/3    0.0 s",
        "  full_iteration graphed  capture  step 2/3    0.0 s",
        "  full_iteration graphed  replay   step 3/3    0.0 s",
        "  full_iteration graphed  ok       3/3 steps    4.0 s",
    ]


@pytest.mark.parametrize("mode", ["plain", "live"])
def test_children_start_and_finish_from_worker_threads_while_the_board_refreshes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "5")
    out = TerminalStringIO()
    board = ProgressBoard(out, mode, clock=Clock())
    board.start(interval_s=0.001)
    num_children = 8

    def child(index: int) -> None:
        path = tmp_path / f"events-{index}.jsonl"
        board.child_started(index, f"impl{index}", "graphed", path, 20)
        writer = EventWriter(path)
        for i in range(20):
            writer.emit(step(i, "capture" if i == 0 else "replay"))
        writer.close()
        board.child_finished(index, "ok", float(index))

    workers = [threading.Thread(target=child, args=(i,)) for i in range(num_children)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=10.0)
    assert not any(worker.is_alive() for worker in workers)
    board.close()
    ends = sorted(f"  impl{i}       graphed  ok       20/20 steps {float(i):6.1f} s" for i in range(num_children))
    if mode == "plain":
        lines = out.getvalue().splitlines()
        assert sorted(line for line in lines if "steps" in line) == ends
        assert sum(line.endswith("started") for line in lines) == num_children
        assert ESC not in out.getvalue()
    else:
        assert sorted(screen(out.getvalue())) == ends


def test_a_note_goes_above_the_live_board_and_into_the_plain_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board, out, _ = live_board(monkeypatch, 80, 24)
    board.child_started("a", "local", "graphed", tmp_path / "e.jsonl", 8)
    board.note("children run in series:\nnot enough GPU memory")
    assert screen(out.getvalue()) == [
        "children run in series:\\nnot enough GPU memory",
        "  local       graphed  starting step 0/8    0.0 s",
    ]
    board.close()
    plain = io.StringIO()
    ProgressBoard(plain, "plain").note("children run in series")
    quiet = io.StringIO()
    ProgressBoard(quiet, "quiet").note("children run in series")
    assert (plain.getvalue(), quiet.getvalue()) == ("children run in series\n", "")


def test_each_childs_progress_label_says_its_role_once() -> None:
    """A tapped pair's children read `tapped` (the role, once); a reference that taps reads `tapped reference`."""
    def label(role: Role, **kw: bool) -> str:
        return ChildRequest(impl="local", dropout=0.0, role=role, ref_dir=Path("."), **kw).describe()

    assert label(Role.TAPPED, taps=True) == "tapped"
    assert label(Role.REFERENCE, taps=True) == "tapped reference"
    assert label(Role.GRAPHED) == "graphed"
    assert label(Role.GRAPHED, hunt=True) == "culprit hunt"
