"""Stacks on demand and a bounded exit, inside a child's processes (every rank and torchrun's launcher).

Each process registers faulthandler for SIGUSR1 with its own file `<prefix>.<label>.txt` (the prefix
comes from the GRAPHDOCTOR_STACKS environment variable the parent sets); faulthandler writes from the
C signal handler, so a process stuck in C code (an NCCL or gloo wait, a CUDA synchronize) still
answers. `python -P -m graphdoctor.child.stacks MODULE ARGS...` runs MODULE (torch.distributed.run)
as `__main__` with its dump registered under the label `launcher`.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from graphdoctor.protocol.processes import PARENT_PID_ENV, STACKS_ENV

LAUNCHER_LABEL = "launcher"
"""Label of torchrun's own launcher process."""

TEARDOWN_BOUND_S = 20.0
"""Longest a child's teardown (process-group destruction) may take after its end event."""

BACKSTOP_S = 5.0
"""After the bound, faulthandler's own watchdog (a C thread: it needs no GIL, which a call hung in C++
may hold) dumps the stacks again and ends the process with exit status 1, should the Python watchdog
not have run."""

BACKSTOP_MARK = "Timeout ("
"""How faulthandler's own watchdog starts its dump."""

PR_SET_PDEATHSIG = 1
"""prctl option: the signal this process gets when the thread that started it ends."""

_files: dict[str, IO[str]] = {}


def stacks_path(prefix: str | os.PathLike[str], label: str) -> Path:
    """The stacks file of one process: `<prefix>.<label>.txt`."""
    return Path(f"{os.fspath(prefix)}.{label}.txt")


def rank_label(default_rank: int = 0) -> str:
    """`rank<R>`: R from torchrun's RANK variable, else `default_rank`."""
    return f"rank{int(os.environ.get('RANK', default_rank))}"


def register(label: str | None = None, *, default_rank: int = 0) -> Path | None:
    """Dump every thread's stack to this process's stacks file on SIGUSR1.

    Args:
        label: `launcher`, or None for `rank<R>` (rank_label).
        default_rank: the rank when RANK is not set.

    Returns:
        The stacks file, or None when GRAPHDOCTOR_STACKS is not set (nothing registered).
    """
    prefix = os.environ.get(STACKS_ENV)
    if not prefix:
        return None
    name = label or rank_label(default_rank)
    path = stacks_path(prefix, name)
    fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - faulthandler writes to it until exit
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True, chain=False)
    _files[name] = fh
    return path


def dump_now(header: str) -> None:
    """Write `header` and every thread's stack to this process's stacks file (when registered)."""
    for fh in _files.values():
        fh.write(f"# {header}\n")
        fh.flush()
        faulthandler.dump_traceback(file=fh, all_threads=True)


def exit_within(bound_s: float, teardown: Callable[[], None], on_done: Callable[[float, bool], None],
                *, backstop_s: float = BACKSTOP_S) -> None:
    """Run `teardown` under a watchdog; if it takes longer than `bound_s`, dump the stacks, report
    and end the process with os._exit(0) (its results are already written).

    Args:
        bound_s: the watchdog's bound.
        teardown: e.g. graphdoctor.child.distributed.teardown_distributed.
        on_done: called once with (seconds, hung): from this thread when teardown returns, from the
            watchdog when it hung (then the process exits right after).
        backstop_s: faulthandler's own watchdog fires this long after the bound.
    """
    backstop = next(iter(_files.values()), sys.stderr)
    faulthandler.dump_traceback_later(bound_s + backstop_s, exit=True, file=backstop)
    lock = threading.Lock()
    finished = threading.Event()
    fired: list[bool] = []
    start = time.perf_counter()

    def watch() -> None:
        if finished.wait(bound_s):
            return
        with lock:
            if finished.is_set():
                return
            fired.append(True)
            dump_now(f"teardown watchdog: still running after {bound_s:g} s")
            on_done(time.perf_counter() - start, True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    threading.Thread(target=watch, name="graphdoctor-teardown-watchdog", daemon=True).start()
    teardown()
    faulthandler.cancel_dump_traceback_later()
    with lock:
        finished.set()
        if not fired:
            on_done(time.perf_counter() - start, False)


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> bool:
    """Get `sig` from the kernel when the graphdoctor parent dies (Linux prctl PR_SET_PDEATHSIG), however
    it dies (SIGKILL included, which leaves it no clean-up of its own). Exits at once (status 1) when the
    parent is already gone: it may have died before the prctl took effect.

    The kernel signals when the thread that started the process ends; graphdoctor's runner threads
    wait for their child, so no thread ends before its child.

    Returns:
        True when set; False when PARENT_PID_ENV is not set (not started by graphdoctor) or not on Linux.
    """
    expected = os.environ.get(PARENT_PID_ENV, "")
    if not expected.isdigit() or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(expected):
        os._exit(1)
    return True


def main() -> None:
    """`python -m graphdoctor.child.stacks MODULE ARGS...`: run MODULE with the launcher's dump; the
    launcher gets SIGTERM when the graphdoctor parent dies (torch.distributed.run then stops its ranks,
    which die with it: graphdoctor.child.distributed.die_with_launcher)."""
    if len(sys.argv) < 2:
        print("usage: python -m graphdoctor.child.stacks MODULE [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    die_with_parent()
    os.environ.pop(PARENT_PID_ENV, None)  # the ranks' parent is the launcher, not graphdoctor
    module = sys.argv[1]
    register(LAUNCHER_LABEL)
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()


__all__ = ["BACKSTOP_MARK", "BACKSTOP_S", "LAUNCHER_LABEL", "TEARDOWN_BOUND_S", "die_with_parent", "dump_now",
           "exit_within", "rank_label", "register", "stacks_path"]
