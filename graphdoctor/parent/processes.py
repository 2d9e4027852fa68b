"""The processes of one running child: its process group, and every process that inherited its token.

torch.distributed.run starts each rank in a session of its own, so the child's process group alone
does not reach the ranks; every process started under the child inherits GRAPHDOCTOR_CHILD_TOKEN in
its environment, which /proc shows even after its parent died and it was re-parented (Linux).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_ENV = "GRAPHDOCTOR_CHILD_TOKEN"
"""Environment variable that marks every process of one child run."""


def new_token() -> str:
    """A token for one child run."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Member:
    """One process of a child run."""

    pid: int
    state: str
    """Its /proc state letter (R, S, D, Z, ...)."""
    command: str

    @property
    def running(self) -> bool:
        """Not a zombie waiting for its reaper."""
        return self.state != "Z"

    def describe(self) -> str:
        """`pid state command`."""
        return f"{self.pid} {self.state} {self.command}"


def members(pgid: int, token: str | None) -> list[Member]:
    """Every process in group `pgid` or whose environment carries `token` (Linux /proc; elsewhere
    none are listed)."""
    marker = f"{TOKEN_ENV}={token}".encode() if token else None
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            fields = text[text.rindex(")") + 2:].split()
            ours = int(fields[2]) == pgid
            if not ours and marker is not None:
                ours = marker in (stat.parent / "environ").read_bytes().split(b"\0")
            if not ours:
                continue
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile, or not ours to read
        found.append(Member(pid=int(stat.parent.name), state=fields[0], command=command.strip()[:200]))
    return found


def signal_all(pgid: int, token: str | None, sig: signal.Signals) -> int:
    """Send `sig` to the group and to every running member outside it; returns how many got it."""
    sent = 0
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
        sent += 1
    for member in members(pgid, token):
        if member.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member.pid, sig)
                sent += 1
    return sent


def kill_all(proc: subprocess.Popen[bytes] | Any, token: str | None, grace_s: float) -> None:
    """SIGTERM to every process of the child, SIGKILL to those left after `grace_s`; returns once
    the child itself has exited."""
    pgid = proc.pid
    signal_all(pgid, token, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not any(m.running for m in members(pgid, token)):
            return
        time.sleep(0.1)
    signal_all(pgid, token, signal.SIGKILL)
    proc.wait()


def left_running(pgid: int, token: str | None, wait_s: float) -> tuple[str, ...]:
    """The child's processes still running (`pid state command`), after SIGKILLs for up to `wait_s`;
    () once os.killpg(pgid, 0) finds no process and no process carries the token."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
            group_exists = True
        except ProcessLookupError:
            group_exists = False
        alive = [m for m in members(pgid, token) if m.running]
        if (not group_exists and not alive) or not alive or time.monotonic() > deadline:
            return tuple(m.describe() for m in alive)
        signal_all(pgid, token, signal.SIGKILL)
        time.sleep(0.1)


__all__ = ["TOKEN_ENV", "Member", "kill_all", "left_running", "members", "new_token", "signal_all"]
