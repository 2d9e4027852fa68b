"""The GPU turn: children that share a GPU take it shared for ordinary steps and exclusively for the
steps they time, so a step time is measured while no other graphdoctor child runs on that GPU.

Two flock(2) locks per GPU: the turn lock itself, and a turnstile that a child waiting for exclusive
use holds, so that a stream of shared steps from other children cannot starve it. The lock files live
in the system temporary directory, so two graphdoctor commands on one machine coordinate too.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from typing import IO


class GpuTurn:
    """Shared or exclusive use of one GPU, across processes."""

    def __init__(self, path: str) -> None:
        self._lock: IO[bytes] = open(path, "a+b")  # noqa: SIM115 - held for the whole child
        self._turnstile: IO[bytes] = open(path + ".turnstile", "a+b")  # noqa: SIM115

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Use the GPU alongside other shared users (waits while a child times its steps)."""
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        fcntl.flock(self._lock, fcntl.LOCK_SH)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Use the GPU alone (waits for the shared users' current steps to end)."""
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)


__all__ = ["GpuTurn"]
