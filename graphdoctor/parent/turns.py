"""Turns of one session's children (graphdoctor.parent.children.ChildSession): any number run at once, except a
retry of a child the machine failed (graphdoctor.parent.environment), which runs alone. It waits until the children
already started have ended; no other child of the session starts while it waits or runs, and retries take their
turns one at a time. A retry beside other children would share their GPU memory again, and could fail for the same
reason as the first attempt.

Every wait is bounded (each child is bounded by its own time limit; the bound here is a backstop) and ends when the
child's run is cancelled.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class Turns:
    """Admission of a session's children: `turn()` around each child's run, `turn(alone=True)` around a retry."""

    def __init__(self, wait_s: float) -> None:
        """`wait_s`: the longest any one child waits for its turn, after which it starts regardless."""
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._running = 0
        self._alone_running = 0
        self._alone_waiting = 0

    @property
    def running(self) -> int:
        """Children holding a turn now."""
        with self._cond:
            return self._running

    def _blocked(self, alone: bool) -> bool:
        if alone:
            return self._running > 0
        return self._alone_running > 0 or self._alone_waiting > 0

    @contextlib.contextmanager
    def turn(self, cancel: threading.Event | None = None, *, alone: bool = False) -> Iterator[None]:
        """Hold a turn for the enclosed run: alone, once no other child holds one (others wait meanwhile); else
        once no retry runs or waits to run alone."""
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            self._alone_waiting += alone
            try:
                while (self._blocked(alone) and time.monotonic() < deadline
                       and not (cancel is not None and cancel.is_set())):
                    self._cond.wait(timeout=min(0.25, max(0.0, deadline - time.monotonic())))
            finally:
                self._alone_waiting -= alone
            self._running += 1
            self._alone_running += alone
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._alone_running -= alone
                self._cond.notify_all()


__all__ = ["Turns"]
