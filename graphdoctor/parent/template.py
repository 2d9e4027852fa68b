"""The parent's side of the template process (graphdoctor.child.template): one per ChildSession, started with
the session's first child, that imports torch and Megatron once and forks each one-process child from there.

A forked child is still a process of its own: its own session and process group (the runner's timeouts, stack
requests and kills reach it as they reach a started one), its own environment, log and working directory, and
its own CUDA context, created after the fork (the template never initialises CUDA and says so when an import
did). `ForkedProcess` is the part of subprocess.Popen that graphdoctor.parent.runner uses, so run_isolated
treats both alike. Where the template cannot serve a child (not started, failed, a child whose environment
differs from the template's in a variable the imports could have read: same_imports; a command other than a diff
child) the runner starts the child as its own interpreter, as without a template.

A command may start the template early (start_early), before it knows its children: the template's imports (10 to
15 s on our GPU machines) then run beside the parent's own work before its first child (a launch line resolved
with Megatron-LM's parser, the checks), and the command's first session adopts it (adopt_early) where its
environment is the session's.

`GRAPHDOCTOR_FORK_TEMPLATE=0` in graphdoctor's environment turns the template off.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from graphdoctor.parent.processes import TOKEN_ENV
from graphdoctor.protocol.processes import CHILD_MODULE, PARENT_PID_ENV, SPAWNED_AT_ENV, STACKS_ENV, python_command

TEMPLATE_MODULE = "graphdoctor.child.template"

SWITCH_ENV = "GRAPHDOCTOR_FORK_TEMPLATE"
"""`0` turns the template off: every child starts as its own interpreter."""

PER_CHILD_ENV = frozenset({TOKEN_ENV, PARENT_PID_ENV, SPAWNED_AT_ENV, STACKS_ENV, "CUDA_VISIBLE_DEVICES",
                           "PYTEST_CURRENT_TEST"})
"""Variables that differ from child to child (or, under pytest, from test to test) and that no import reads."""

CLOSE_WAIT_S = 10.0
"""How long a closed template has to exit once its children have ended, before it is killed."""

SPAWN_WAIT_S = 30.0
"""How long the template has to report a forked child's pid; past it the template counts as failed and is ended,
and the child starts as its own interpreter."""


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether sessions fork their children from a template (GRAPHDOCTOR_FORK_TEMPLATE is not `0`)."""
    return (environ if environ is not None else os.environ).get(SWITCH_ENV, "1").strip() != "0"


def _shared(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_CHILD_ENV}


def same_imports(env: Mapping[str, str], launched: Mapping[str, str], imported: Mapping[str, str]) -> bool:
    """Whether a child with environment `env` imports what the template did: every variable but the per-child ones
    has the value the template started with (`launched`) or the value its imports left (`imported`: the parent's
    own imports of torch and Megatron set the same variables later, TORCHINDUCTOR_CACHE_DIR for one). The forked
    child then takes `env` exactly, for everything read after its imports."""
    env, launched, imported = _shared(env), _shared(launched), _shared(imported)
    return all(env.get(k) in (launched.get(k), imported.get(k)) for k in set(env) | set(launched) | set(imported))


class ForkedProcess:
    """A child forked by the template: pid, returncode, poll, wait and communicate as subprocess.Popen has them
    (no pipes: the child's output goes to its log)."""

    def __init__(self, template: ForkTemplate, ident: int, pid: int, args: list[str]) -> None:
        self._template = template
        self.ident = ident
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit status once the template reported it (or, the template gone, once the process is)."""
        if self.returncode is None:
            self.returncode = self._template.exit_status(self)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until it ended.

        Raises:
            subprocess.TimeoutExpired: `timeout` ran out first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._template.wait_for_news(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic())))
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, None]:
        """wait(timeout); there is no output to read."""
        self.wait(timeout)
        return None, None


class ForkTemplate:
    """One template process and the children it forked.

    Args:
        env: the template's environment: the session's child environment (run file `env:` and the
            deterministic settings included), so that what the imports read is what a started child reads.
        log_path: where the template's own output goes.
    """

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.env = dict(env)
        self.log_path = log_path
        """Where the template's own output goes."""
        self._cond = threading.Condition()
        self.ready_s: float | None = None
        """The template's import seconds, once it is ready."""
        self.started_at = time.time()
        """time.time() when the template process was asked for."""
        self.ready_at: float | None = None
        """time.time() when this process heard it was ready (None until then)."""
        self.imported_env: dict[str, str] = {}
        """The template's environment as its imports left it, once it is ready."""
        self.failed: str | None = None
        """Why it cannot serve (it exited, or said so); None while it can."""
        self._pids: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._next = 0
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - open for the template's life
        self._closed = threading.Event()
        self._proc = self._start_owned()
        self._reader = threading.Thread(target=self._read, name="graphdoctor-template", daemon=True)
        self._reader.start()

    def _start_owned(self) -> subprocess.Popen[bytes]:
        """Start the template from a thread of its own that lives until close(): the kernel's parent-death
        signal (graphdoctor.child.stacks.die_with_parent) follows the thread that started a process, and the
        thread that asks for the first child (a worker, or a caller's short-lived thread) may end sooner."""
        spawn_env = {**self.env, PARENT_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        spawn_env.pop(STACKS_ENV, None)
        started = threading.Event()
        box: dict[str, Any] = {}

        def own() -> None:
            try:
                box["proc"] = subprocess.Popen(python_command(TEMPLATE_MODULE), stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=self._log, env=spawn_env,
                                               start_new_session=True)
            except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
                box["error"] = exc
            started.set()
            self._closed.wait()

        threading.Thread(target=own, name="graphdoctor-template-owner", daemon=True).start()
        started.wait()
        if "error" in box:
            self._log.close()
            raise box["error"]
        proc: subprocess.Popen[bytes] = box["proc"]
        return proc

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            try:
                message: dict[str, Any] = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                if "ready" in message:
                    self.imported_env = {str(k): str(v) for k, v in dict(message.get("env") or {}).items()}
                    self.ready_s = float(message["ready"])
                    self.ready_at = time.time()
                elif "error" in message:
                    self.failed = str(message["error"])
                elif "pid" in message:
                    self._pids[int(message["id"])] = int(message["pid"])
                elif "exit" in message:
                    self._exits[int(message["id"])] = int(message["exit"])
                self._cond.notify_all()
        self._proc.stdout.close()
        self._proc.wait()
        with self._cond:
            self.failed = self.failed or f"the template process exited ({self._proc.returncode})"
            self._cond.notify_all()

    def wait_for_news(self, timeout: float) -> None:
        """Until the template says something, or `timeout`."""
        with self._cond:
            self._cond.wait(timeout)

    def wait_ready(self, timeout_s: float, cancel: threading.Event | None = None) -> bool:
        """Wait until the template has imported (True), failed, `timeout_s` ran out or `cancel` was set (False;
        a template not ready in time is ended, so later children start as their own interpreters at once)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.ready_s is None and self.failed is None:
                left = deadline - time.monotonic()
                if left <= 0 or (cancel is not None and cancel.is_set()):
                    break
                self._cond.wait(min(0.1, left))
            ready = self.ready_s is not None and self.failed is None
        if not ready and self.failed is None and (cancel is None or not cancel.is_set()):
            self.failed = f"the template process was not ready within {timeout_s:.0f} s"
            self._kill()
        return ready

    def serves(self, argv: list[str], env: Mapping[str, str]) -> bool:
        """Whether this child (`python -P -m graphdoctor.child SPEC` with `env`) can be forked from here."""
        return (self.failed is None and self.ready_s is not None and argv[:-1] == python_command(CHILD_MODULE)
                and same_imports(env, self.env, self.imported_env))

    def spawn(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> ForkedProcess | None:
        """Fork the child `argv` (serves() said so) with `env`, its output appended to `log_path`; None where
        the template failed before the child was running, or did not report it within SPAWN_WAIT_S."""
        deadline = time.monotonic() + SPAWN_WAIT_S
        with self._cond:
            self._next += 1
            ident = self._next
            request = {"id": ident, "argv": argv[-1:], "env": dict(env), "cwd": os.getcwd(), "log": str(log_path)}
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except (OSError, ValueError):
                return None
            while ident not in self._pids and self.failed is None and time.monotonic() < deadline:
                self._cond.wait(0.1)
            pid = self._pids.get(ident)
            if pid is None and self.failed is None:
                self.failed = f"the template process did not fork a child within {SPAWN_WAIT_S:.0f} s"
        if pid is None:
            self._kill()
            return None
        return ForkedProcess(self, ident, pid, argv)

    def exit_status(self, child: ForkedProcess) -> int | None:
        """`child`'s exit status as the template reported it; with the template gone, -SIGKILL once the process
        is gone too (its status went with the template), else None."""
        with self._cond:
            if child.ident in self._exits:
                return self._exits[child.ident]
            if self.failed is None:
                return None
        try:
            os.kill(child.pid, 0)
        except ProcessLookupError:
            return -int(signal.SIGKILL)
        except PermissionError:
            return None
        return None

    def close(self) -> None:
        """No more children: the template exits once those running have ended (killed after CLOSE_WAIT_S
        more)."""
        with contextlib.suppress(OSError, ValueError), self._cond:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        with self._cond:
            running = [i for i in self._pids if i not in self._exits]
        if running:
            self._kill()
        try:
            self._proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self._kill()
        self._reader.join(timeout=CLOSE_WAIT_S)
        self._closed.set()
        self._log.close()

    def abandon(self) -> None:
        """End a template that forked nothing at once (close() would wait for imports still under way)."""
        self._kill()
        self.close()

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=CLOSE_WAIT_S)


_early_lock = threading.Lock()
_early: ForkTemplate | None = None
"""The template start_early started and no session has adopted yet."""


def start_early(env: Mapping[str, str]) -> bool:
    """Start a template now with `env` (a child's environment as far as the command knows it yet), for the first
    session of this process to adopt; its log is a temporary file until then. True where one started (templates
    on, none started before, the process could start); a template no session adopts is closed at exit."""
    global _early
    if not enabled():
        return False
    with _early_lock:
        if _early is not None:
            return False
        fd, name = tempfile.mkstemp(prefix="graphdoctor-template-", suffix=".txt")
        os.close(fd)
        try:
            _early = ForkTemplate(env, Path(name))
        except OSError:
            Path(name).unlink(missing_ok=True)
            return False
    atexit.register(close_early)
    return True


def adopt_early(run_env: Mapping[str, str], log_path: Path) -> ForkTemplate | None:
    """The early template, for a session that adds `run_env` (a run file's `env:`, a launch script's exports) to
    its children's environment: where it is alive and was started with those values, its log is linked to
    `log_path` and it is the session's (serves() still checks each child's whole environment once the template is
    ready); otherwise it is closed and None returned, and the session starts its own."""
    early = _take_early()
    if early is None:
        return None
    if early.failed is None and all(early.env.get(k) == v for k, v in run_env.items()):
        _link_log(early.log_path, log_path)
        early.log_path = log_path
        return early
    _discard(early)
    return None


def _take_early() -> ForkTemplate | None:
    """The early template, no longer anyone else's to adopt or close (None where none is waiting)."""
    global _early
    with _early_lock:
        early, _early = _early, None
    return early


def _discard(early: ForkTemplate) -> None:
    """End an early template no session adopted, and remove its temporary log."""
    early.abandon()
    early.log_path.unlink(missing_ok=True)


def _link_log(early: Path, wanted: Path) -> None:
    """The session's template log is the early template's log file (a hard link; a pointer line where the two
    paths are on different file systems). The temporary name is removed."""
    try:
        os.link(early, wanted)
    except OSError:
        with contextlib.suppress(OSError):
            wanted.write_text(f"the template's output: {early}\n", encoding="utf-8")
        return
    early.unlink(missing_ok=True)


def close_early() -> None:
    """Close the early template if no session adopted it (at exit, or when the command ends before any child)."""
    early = _take_early()
    if early is not None:
        _discard(early)


__all__ = ["SWITCH_ENV", "TEMPLATE_MODULE", "ForkTemplate", "ForkedProcess", "adopt_early", "close_early", "enabled",
           "same_imports", "start_early"]
