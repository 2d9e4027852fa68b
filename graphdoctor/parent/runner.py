"""The one subprocess runner: every child graphdoctor starts (diff and count children, probe workers,
the Transformer Engine import check) runs through run_isolated.

A child runs in its own process session with a wall-clock limit; on timeout every process of it (its
group, and every process that inherited its token, graphdoctor.parent.processes) is asked for its
stacks (SIGUSR1: each dumps them to its stacks file, graphdoctor.child.stacks), then killed (SIGTERM,
then SIGKILL), and the runner checks that none of them is left running. Its output goes to a log
file whose tail comes back with the result. Children start with `python -P`, so the working directory
is not put first on their import path (a stray `torch.py` or `sitecustomize.py` there is not imported).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from graphdoctor.errors import Stopped
from graphdoctor.parent.processes import TOKEN_ENV, kill_all, left_running, new_token, signal_all
from graphdoctor.process_env import environ_copy
from graphdoctor.protocol.processes import PARENT_PID_ENV, SPAWNED_AT_ENV, STACKS_ENV, python_command

if TYPE_CHECKING:
    from graphdoctor.parent.template import ForkedProcess, ForkTemplate

DETERMINISTIC_ENV = {
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}
"""Placed in every child's environment unless the user set them (what upstream bitwise tests set)."""

STDERR_TAIL_BYTES = 4000
"""How much of a child's log comes back with its result."""

KILL_GRACE_S = 10.0
"""How long a child has to exit after SIGTERM before SIGKILL."""

STACKS_WAIT_S = 3.0
"""How long the processes of a timed-out child have to write their stacks after SIGUSR1."""

STOP_STACKS_WAIT_S = 2.0
"""How long every running child together has to write its stacks when the parent is stopped (CI runners
send SIGKILL a few seconds after SIGTERM)."""

GROUP_GONE_WAIT_S = 5.0
"""How long the runner waits for a killed child's processes to be gone (SIGKILL again meanwhile)."""

MAX_STACKS_BYTES = 65536
"""The last bytes of each stacks file that come back with the result."""

PORT_RETRIES = 2
"""Re-runs of a child whose rendezvous port was taken between picking and binding it."""

_running: dict[int, tuple[subprocess.Popen[bytes] | ForkedProcess, str, Path | None]] = {}
"""Every child started by run_isolated and not yet ended, by pid (with its token and stacks prefix)."""
_running_lock = threading.Lock()
_stopping = threading.Event()
"""Set by stop_running: the parent is stopping, no child may start."""
_stopped_by: list[str] = []
"""The name of the signal that stopped the parent (stop_running), for the records of the children it ended."""

@dataclass(frozen=True, slots=True)
class ProcessResult:
    """How one child process ended."""

    returncode: int | None
    """Exit status (negative: killed by that signal; None: it did not exit)."""
    timed_out: bool
    """True when the wall-clock limit ran out and the process group was killed."""
    wall_s: float
    """Start to exit."""
    log_tail: str
    """The last STDERR_TAIL_BYTES of its output (stdout and stderr together)."""
    stdout: str = ""
    """Its standard output, when captured (capture_stdout=True)."""
    stacks: tuple[tuple[str, str], ...] = ()
    """(label, text) of every non-empty stacks file (`rank0`, ..., `launcher`), when asked for."""
    group_gone: bool | None = None
    """After a timeout: True when none of its processes (its group, and every process that inherited
    its token: torchrun's ranks run in sessions of their own) was left running; None: not checked."""
    left_running: tuple[str, ...] = ()
    """After a timeout: `pid state command` of each of its processes still running."""
    stopped: str | None = None
    """The signal (`SIGTERM`, ...) that stopped the parent and with it this child before it ended."""
    started_at: float = 0.0
    """time.time() just before the process was started (0.0: unknown)."""
    ended_at: float = 0.0
    """time.time() once it had exited and its output was read."""

    def describe_exit(self) -> str:
        """`exited with code N`, `killed by SIGKILL`, ... for messages."""
        code = self.returncode
        if code is None:
            return "did not exit"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"


def child_env(run_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's environment: ours (never as a launch line's parse on another thread borrows it), the deterministic
    defaults, then the run file's `env:`."""
    env = environ_copy()
    for key, value in DETERMINISTIC_ENV.items():
        env.setdefault(key, value)
    env.update(run_env or {})
    env["PYTHONUNBUFFERED"] = "1"
    return env


CANCEL_POLL_S = 0.1
"""How often a cancellable child's runner looks at its cancel event."""

CANCELLED = "cancelled"
"""ProcessResult.stopped of a child ended by its cancel event (its result was no longer needed)."""


def run_isolated(argv: list[str], *, timeout_s: float, log_path: Path | None = None,
                 env: Mapping[str, str] | None = None, capture_stdout: bool = False,
                 stacks_prefix: Path | None = None, cancel: threading.Event | None = None,
                 clock: threading.Event | None = None, template: ForkTemplate | None = None) -> ProcessResult:
    """Run `argv` in its own process session; kill its process group when `timeout_s` runs out.

    Args:
        argv: the command.
        timeout_s: wall-clock limit.
        log_path: where its output goes (default: a temporary file, removed afterwards).
        env: its environment (default: ours).
        capture_stdout: keep standard output apart and return it (stderr still goes to the log).
        stacks_prefix: `<workdir>/stacks-<name>`: the child's processes register their stack dumps
            there (GRAPHDOCTOR_STACKS); on timeout they are asked for them before the kill.
        cancel: set by another thread when the child's result is no longer needed: its processes are killed
            (no stacks asked for) and the result says `stopped` CANCELLED.
        clock: the limit counts from when this is set (the child's memory grant, graphdoctor.parent.children);
            until then the same limit bounds the child's wait for it.
        template: fork the child from this template process where it serves it (graphdoctor.parent.template);
            the wait for the template's imports counts in the child's start-up and is bounded by `timeout_s`.

    Returns:
        How it ended; never raises for a failing child.
    """
    own_log = log_path is None
    path = Path(tempfile.mkstemp(prefix="graphdoctor-", suffix=".log")[1]) if own_log else Path(log_path)  # type: ignore[arg-type]
    start = time.perf_counter()
    timed_out = False
    stopped: str | None = None
    left: tuple[str, ...] | None = None
    token = new_token()
    started_at = time.time()
    # PARENT_PID_ENV: the child dies with this process (graphdoctor.child.stacks.die_with_parent).
    env = {**(env if env is not None else os.environ), TOKEN_ENV: token, PARENT_PID_ENV: str(os.getpid()),
           SPAWNED_AT_ENV: repr(started_at)}
    if stacks_prefix is not None:
        env[STACKS_ENV] = str(stacks_prefix)
        for old in stack_files(stacks_prefix):
            old.unlink(missing_ok=True)
    if template is not None and (capture_stdout or not template.wait_ready(timeout_s, cancel)):
        template = None  # a forked child writes only to its log
    if cancel is not None and cancel.is_set():  # while it waited for the template: no process to start
        return ProcessResult(returncode=None, timed_out=False, wall_s=time.perf_counter() - start, log_tail="",
                             stopped=CANCELLED, started_at=started_at, ended_at=time.time())
    try:
        with open(path, "wb") as log:
            proc = _start(argv, log, env, capture_stdout, token, stacks_prefix, template)
            try:
                out = _communicate(proc, timeout_s, cancel, clock)
                if out is None:  # cancelled
                    kill_all(proc, token, KILL_GRACE_S)
                    out, _ = proc.communicate()
                if _stopping.is_set():  # ended by stop_running (its stacks asked for first)
                    stopped = _stopped_by[-1] if _stopped_by else "stop"
                elif cancel is not None and cancel.is_set():
                    stopped = CANCELLED
            except subprocess.TimeoutExpired:
                timed_out = True
                if stacks_prefix is not None:
                    request_stacks(proc.pid, token, stacks_prefix)
                kill_all(proc, token, KILL_GRACE_S)
                out, _ = proc.communicate()
                left = left_running(proc.pid, token, GROUP_GONE_WAIT_S)
            except BaseException:  # a stop signal (parent.stopping), Ctrl-C: every process of the child goes too
                kill_all(proc, token, KILL_GRACE_S)
                raise
            finally:
                with _running_lock:
                    _running.pop(proc.pid, None)
        wall_s = time.perf_counter() - start
        tail = path.read_bytes()[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
    finally:
        if own_log:
            path.unlink(missing_ok=True)
    stdout = out.decode("utf-8", "replace") if capture_stdout and out else ""
    return ProcessResult(returncode=proc.returncode, timed_out=timed_out, wall_s=wall_s, started_at=started_at,
                         ended_at=time.time(), log_tail=tail,
                         stdout=stdout, stacks=read_stacks(stacks_prefix) if stacks_prefix else (),
                         group_gone=None if left is None else not left, left_running=left or (), stopped=stopped)


def _communicate(proc: subprocess.Popen[bytes] | ForkedProcess, timeout_s: float, cancel: threading.Event | None,
                 clock: threading.Event | None = None) -> bytes | None:
    """The child's stdout once it exits; None when `cancel` was set first.

    Raises:
        subprocess.TimeoutExpired: `timeout_s` ran out (counted from when `clock` was set, when one is given).
    """
    if cancel is None and clock is None:
        return proc.communicate(timeout=timeout_s)[0]
    deadline = time.monotonic() + timeout_s
    granted = False
    while True:
        if cancel is not None and cancel.is_set():
            return None
        if clock is not None and not granted and clock.is_set():
            granted, deadline = True, time.monotonic() + timeout_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            return proc.communicate(timeout=min(CANCEL_POLL_S, left))[0]
        except subprocess.TimeoutExpired:
            continue


def _start(argv: list[str], log: IO[bytes], env: Mapping[str, str], capture_stdout: bool,
           token: str, stacks_prefix: Path | None,
           template: ForkTemplate | None = None) -> subprocess.Popen[bytes] | ForkedProcess:
    """Start one child in a session of its own (forked from `template` where it serves it) and register it for
    stop_running."""
    with _running_lock:
        if _stopping.is_set():
            raise Stopped(signal.SIGTERM)
        proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        if template is not None and template.serves(argv, env):
            proc = template.spawn(argv, env, Path(log.name))
        if proc is None:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE if capture_stdout else log,
                                    stderr=log if capture_stdout else subprocess.STDOUT, env=dict(env),
                                    start_new_session=True)
        _running[proc.pid] = (proc, token, stacks_prefix)
    return proc


def stop_running(signal_name: str = "stop") -> None:
    """Ask every running child for its stacks (all at once, at most STOP_STACKS_WAIT_S), then kill their
    processes (SIGTERM to all of them at once, SIGKILL after KILL_GRACE_S) and let no new child start: the
    parent is stopping (graphdoctor.parent.stopping). Their results say `stopped` by `signal_name`."""
    # No lock here: this runs in the signal handler, maybe while the main thread holds _running_lock in
    # _start; list() of the values is one step under the GIL. A child started but not yet registered
    # when the signal came is not reached here; it gets SIGTERM from the kernel as this process exits
    # (graphdoctor.child.stacks.die_with_parent).
    _stopped_by.append(signal_name)
    _stopping.set()
    running = list(_running.values())
    _await_stacks([(proc.pid, token, prefix) for proc, token, prefix in running if prefix is not None],
                  STOP_STACKS_WAIT_S)
    for proc, token, _ in running:
        signal_all(proc.pid, token, signal.SIGTERM)
    for proc, token, _ in running:
        kill_all(proc, token, KILL_GRACE_S)


def allow_starts() -> None:
    """Children may start again (after a stop handled in-process: graphdoctor.parent.stopping)."""
    _stopping.clear()
    _stopped_by.clear()


def stack_files(prefix: Path) -> list[Path]:
    """The stacks files under `prefix` (`<prefix>.rank<R>.txt`, `<prefix>.launcher.txt`), by name; not
    those of a run whose name extends this one's (`stacks-eager-reference-d0` and `-d0.1`)."""
    label = re.compile(re.escape(prefix.name) + r"\.(rank\d+|launcher)\.txt")
    return sorted(p for p in prefix.parent.glob(f"{prefix.name}.*.txt") if label.fullmatch(p.name))


def request_stacks(pgid: int, token: str | None, prefix: Path) -> None:
    """SIGUSR1 to every process of the child; wait (at most STACKS_WAIT_S) until every stacks file registered
    before the signal has grown and stopped growing."""
    _await_stacks([(pgid, token, prefix)], STACKS_WAIT_S)


def _await_stacks(children: list[tuple[int, str | None, Path]], wait_s: float) -> None:
    """SIGUSR1 to every process of each child at once; wait (at most `wait_s` for all of them) until every
    stacks file registered before the signals has grown and stopped growing."""
    before: dict[Path, int] = {}
    for pgid, token, prefix in children:
        files = {p: p.stat().st_size for p in stack_files(prefix)}
        if signal_all(pgid, token, signal.SIGUSR1):
            before.update(files)
    deadline = time.monotonic() + wait_s
    last: dict[Path, int] = {}
    while before and time.monotonic() < deadline:
        time.sleep(0.1)
        sizes = {p: p.stat().st_size if p.exists() else 0 for p in before}
        if all(sizes[p] > size for p, size in before.items()) and sizes == last:
            return
        last = sizes


def read_stacks(prefix: Path) -> tuple[tuple[str, str], ...]:
    """(label, last MAX_STACKS_BYTES of the text) of every non-empty stacks file."""
    found = []
    for file in stack_files(prefix):
        data = file.read_bytes()[-MAX_STACKS_BYTES:]
        if data.strip():
            found.append((file.name[len(prefix.name) + 1:-len(".txt")], data.decode("utf-8", "replace")))
    return tuple(found)


def with_port_retries[T](run: Callable[[int], T], port_taken: Callable[[T], bool],
                         retries: int = PORT_RETRIES) -> tuple[T, list[T]]:
    """Run `run(attempt)` again while its rendezvous port was taken (up to `retries` more times).

    Returns:
        (the last result, the earlier results that failed on a taken port).
    """
    failed: list[T] = []
    result = run(0)
    for attempt in range(1, retries + 1):
        if not port_taken(result):
            break
        failed.append(result)
        result = run(attempt)
    return result, failed


__all__ = ["CANCELLED", "DETERMINISTIC_ENV", "PORT_RETRIES", "ProcessResult", "allow_starts", "child_env", "python_command", "read_stacks", "request_stacks", "run_isolated",
           "stack_files", "stop_running", "with_port_retries"]
