"""Progress of running children, read from their events files: a live board on a terminal, plain log
lines otherwise, nothing when quiet. The parent's only code that draws on a terminal; docs/protocol.md
("Progress") describes what each mode prints.
"""

from __future__ import annotations

import enum
import os
import shutil
import threading
import time
import unicodedata
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from graphdoctor.errors import GraphDoctorError
from graphdoctor.protocol.events import End, Error, Event, Started, Step, decode
from graphdoctor.protocol.spec import ProtocolError

CURSOR_UP = "\x1b[{n}A"
"""Move the cursor `n` lines up (column unchanged; every board write starts with a carriage return)."""
ERASE_LINE = "\x1b[2K"
"""Erase the whole line the cursor is on."""
ERASE_BELOW = "\x1b[J"
"""Erase from the cursor to the end of the screen (lines a shrinking board leaves behind)."""


class ProgressError(GraphDoctorError, ValueError):
    """The progress board was used wrongly (an unknown mode, a child key twice or never started)."""


class ProgressMode(enum.StrEnum):
    """How a ProgressBoard shows progress."""

    LIVE = "live"
    """One line per running child, redrawn in place with ANSI escapes (a terminal)."""
    PLAIN = "plain"
    """One log line per start, phase change and end; never an escape sequence (a pipe or a file)."""
    QUIET = "quiet"
    """Nothing."""


def progress_mode(stream: IO[str], *, quiet: bool = False) -> ProgressMode:
    """The mode for `stream`: quiet when asked, live on a terminal whose TERM is not "dumb", else plain."""
    if quiet:
        return ProgressMode.QUIET
    try:
        is_tty = stream.isatty()
    except (AttributeError, OSError, ValueError):
        is_tty = False
    if is_tty and os.environ.get("TERM", "") != "dumb":
        return ProgressMode.LIVE
    return ProgressMode.PLAIN


def printable(text: str) -> str:
    """`text` with control and format characters (ESC, CR, bidi overrides, line separators) written as
    Python escapes, so nothing read from a file can move the cursor or recolour the terminal."""
    out = []
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            out.append(ch.encode("unicode_escape", errors="backslashreplace").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


class EventFollower:
    """Reads the events a child appended to its events file since the last call.

    Keeps the byte offset it has read up to and the bytes of an unfinished last line, so each call
    reads only what is new. A missing file reads as no events; a line that does not decode is skipped
    and counted in `num_skipped`. A file that shrank (rewritten from the start) is read again from 0.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0
        """Bytes of the file read so far (complete lines plus the pending partial line)."""
        self.num_skipped = 0
        """Complete lines that did not decode as an event."""
        self._pending = b""

    def read_new(self) -> list[Event]:
        """Decoded events of the complete lines appended since the last call, in file order."""
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:
                    self.offset, self._pending = 0, b""
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        events: list[Event] = []
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                events.append(decode(line))
            except ProtocolError:
                self.num_skipped += 1
        return events


@dataclass(slots=True)
class ChildProgress:
    """What the board knows about one running child."""

    impl: str
    role: str
    total_steps: int
    started_at: float
    follower: EventFollower
    phase: str = "starting"
    """starting (no event yet), setup (started event), a step phase, done (end event), error."""
    num_steps_done: int = 0
    logged_phase: str = ""
    """The last step phase a plain log line announced."""

    def apply(self, event: Event) -> None:
        """Fold one event into the state."""
        if isinstance(event, Started) and self.phase == "starting":
            self.phase = "setup"
        elif isinstance(event, Step):
            self.phase = event.record.phase
            self.num_steps_done = max(self.num_steps_done, event.record.step + 1)
        elif isinstance(event, Error):
            self.phase = "error"
        elif isinstance(event, End):
            self.phase = "done"

    def head(self) -> str:
        """`  impl        role     ` (escaped, padded)."""
        return f"  {printable(self.impl):<11} {printable(self.role):<8}"

    def steps(self) -> str:
        """`k/N`, padded to the width of `N/N`."""
        total = self.total_steps
        return f"{self.num_steps_done}/{total}".ljust(len(f"{total}/{total}"))

    def running_line(self, now: float) -> str:
        """`  local       graphed  replay   step 5/8   12.3 s`."""
        return (f"{self.head()} {printable(self.phase):<8} step {self.steps()} "
                f"{now - self.started_at:6.1f} s")

    def finished_line(self, status: str, wall_s: float) -> str:
        """`  local       graphed  ok       8/8 steps   12.3 s`."""
        return f"{self.head()} {printable(status):<8} {self.steps()} steps {wall_s:6.1f} s"


def _terminal_size(stream: IO[str]) -> os.terminal_size:
    """The stream's terminal size; COLUMNS/LINES win when both are set (as shutil honours them)."""
    fallback = shutil.get_terminal_size()
    if os.environ.get("COLUMNS") and os.environ.get("LINES"):
        return fallback
    try:
        return os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return fallback


class ProgressBoard:
    """Shows the progress of the running children of one diff on one stream.

    Thread-safe: child_started/child_finished may be called from worker threads while start()'s
    thread refreshes; one lock guards all state and every write.

    Args:
        stream: where to write (stderr, usually).
        mode: live, plain or quiet (progress_mode() picks one).
        clock: seconds, monotonic; tests pass their own.
    """

    def __init__(self, stream: IO[str], mode: ProgressMode | str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        try:
            self.mode = ProgressMode(mode)
        except ValueError:
            raise ProgressError(f"progress mode: got {mode!r}, expected one of "
                                f"{', '.join(m.value for m in ProgressMode)}") from None
        self._stream = stream
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[Hashable, ChildProgress] = {}
        self._permanent: list[str] = []
        """Lines of finished children the live board has not printed yet."""
        self._num_board_lines = 0
        """Lines the live board drew last time (the cursor sits just below them)."""
        self._broken = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def child_started(self, key: Hashable, impl: str, role: str, events_path: str | Path,
                      total_steps: int) -> None:
        """A child process was started; its events go to `events_path`.

        Raises:
            ProgressError: `key` is already running.
        """
        with self._lock:
            if key in self._running:
                raise ProgressError(f"progress: child {key!r} started twice")
            child = ChildProgress(impl=impl, role=str(role), total_steps=total_steps,
                                  started_at=self._clock(), follower=EventFollower(events_path))
            self._running[key] = child
            if self.mode is ProgressMode.PLAIN:
                self._write(f"{child.head()} started\n")
            self._update()

    def child_finished(self, key: Hashable, status: str, wall_s: float) -> None:
        """A child process ended with `status` (ok, error, timeout, ...) after `wall_s` seconds.

        Raises:
            ProgressError: `key` is not running.
        """
        with self._lock:
            child = self._running.get(key)
            if child is None:
                raise ProgressError(f"progress: child {key!r} finished but is not running")
            self._follow(child)
            del self._running[key]
            line = child.finished_line(status, wall_s)
            if self.mode is ProgressMode.PLAIN:
                self._write(line + "\n")
            elif self.mode is ProgressMode.LIVE:
                self._permanent.append(line)
            self._update()

    def note(self, text: str) -> None:
        """One line of the parent's own (e.g. "children run in series: ..."): printed above the live
        board, or as a log line in plain mode; nothing when quiet. Control characters are escaped."""
        with self._lock:
            line = printable(text)
            if self.mode is ProgressMode.PLAIN:
                self._write(line + "\n")
            elif self.mode is ProgressMode.LIVE:
                self._permanent.append(line)
                self._update()

    def refresh(self) -> None:
        """Read every running child's new events and redraw (live) or log phase changes (plain)."""
        with self._lock:
            self._update()

    def close(self) -> None:
        """Stop the refresh thread, redraw one last time and leave the cursor below the board."""
        self.stop()
        with self._lock:
            self._update()
            self._num_board_lines = 0

    def start(self, interval_s: float = 0.5) -> None:
        """Refresh every `interval_s` seconds in a daemon thread until stop() or close()."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, args=(interval_s,),
                                            name="graphdoctor-progress", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the refresh thread (a no-op when none runs)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=5.0)

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.refresh()

    def _update(self) -> None:
        """Follow all running children, then print what the mode prints (the lock is held)."""
        if self.mode is ProgressMode.QUIET:
            return
        for child in self._running.values():
            self._follow(child)
        if self.mode is ProgressMode.LIVE:
            self._redraw()

    def _follow(self, child: ChildProgress) -> None:
        """Fold a child's new events; in plain mode log each change of step phase (lock held)."""
        if self.mode is ProgressMode.QUIET:
            return
        for event in child.follower.read_new():
            child.apply(event)
            if (self.mode is ProgressMode.PLAIN and isinstance(event, Step)
                    and child.phase != child.logged_phase):
                child.logged_phase = child.phase
                self._write(child.running_line(self._clock()) + "\n")

    def _board(self, width: int, height: int) -> list[str]:
        """The running children's lines, at most `height - 1` of them, each cut to `width - 1`."""
        now = self._clock()
        lines = [child.running_line(now) for child in self._running.values()]
        max_lines = max(1, height - 1)
        if len(lines) > max_lines:
            hidden = len(lines) - (max_lines - 1)
            lines = lines[:max_lines - 1] + [f"  ... {hidden} more running"]
        return [line[:max(1, width - 1)] for line in lines]

    def _redraw(self) -> None:
        """Erase the last board, print finished children once, draw the board again (lock held)."""
        size = _terminal_size(self._stream)
        board = self._board(size.columns, size.lines)
        if not board and not self._permanent and not self._num_board_lines:
            return
        parts = []
        if self._num_board_lines:
            parts.append(CURSOR_UP.format(n=self._num_board_lines))
        parts.append("\r")
        parts.extend(f"{ERASE_LINE}{line}\n" for line in self._permanent)
        parts.extend(f"{ERASE_LINE}{line}\n" for line in board)
        parts.append(ERASE_BELOW)
        self._permanent.clear()
        self._num_board_lines = len(board)
        self._write("".join(parts))

    def _write(self, text: str) -> None:
        """Write and flush; a stream that fails once (closed, broken pipe) is never written again."""
        if self._broken:
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            self._broken = True


__all__ = [
    "ChildProgress",
    "EventFollower",
    "ProgressBoard",
    "ProgressError",
    "ProgressMode",
    "printable",
    "progress_mode",
]
