"""A diff (or any command that starts children) stopped by SIGTERM, SIGHUP or SIGINT (Ctrl-C): every running
child's processes are killed as at a timeout, no new child starts, and the command exits 128 + the signal.

The children side of the same promise is graphdoctor.child.stacks.die_with_parent: a child whose
parent dies without clean-up (SIGKILL) gets SIGTERM from the kernel.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from graphdoctor.errors import Stopped
from graphdoctor.parent.runner import allow_starts, stop_running

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""What stops the parent the way a timeout stops a child. SIGINT (Ctrl-C) too: children run in sessions of
their own, so the terminal's SIGINT never reaches them, and a KeyboardInterrupt left the parent waiting for
its worker threads' children until their timeout (measured: 56 s for a 60 s limit)."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stopped = Stopped(signum)
    stop_running(stopped.signal_name)
    raise stopped


@contextlib.contextmanager
def stop_children_on_signals() -> Iterator[None]:
    """Within: SIGTERM, SIGHUP and SIGINT kill every running child (parent.runner.stop_running) and raise
    Stopped in the main thread. Outside the main thread (signal handlers cannot be set there) nothing
    is installed, nor for a signal that is ignored (nohup)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal the caller ignores stays ignored (`nohup graphdoctor diff ...` must survive its SIGHUP).
    previous = {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        allow_starts()  # a command stopped in-process (CliRunner, a test) leaves later commands free to run


@contextlib.contextmanager
def partial_report_on_stop(partial: Callable[[str], object]) -> Iterator[None]:
    """Within: a Stopped (a stop signal, its children ended already) leaves with `partial(signal_name)` as its
    report, the command's report of how far it got, which the CLI still writes (diff, advise, count)."""
    try:
        yield
    except Stopped as stop:
        stop.report = partial(stop.signal_name)
        raise


__all__ = ["STOP_SIGNALS", "Stopped", "partial_report_on_stop", "stop_children_on_signals"]
