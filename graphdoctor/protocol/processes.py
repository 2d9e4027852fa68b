"""How the parent starts a child's processes and what it tells them through the environment: both sides read
these names (graphdoctor.parent.runner sets them, graphdoctor.child.stacks acts on them)."""

from __future__ import annotations

import sys

STACKS_ENV = "GRAPHDOCTOR_STACKS"
"""Environment variable holding the stacks-file prefix (`<workdir>/stacks-<name>`)."""

PARENT_PID_ENV = "GRAPHDOCTOR_PARENT_PID"
"""Environment variable holding the pid of the graphdoctor process that started this child
(graphdoctor.parent.runner sets it); the child dies with that process (graphdoctor.child.stacks.die_with_parent)."""


CHILD_MODULE = "graphdoctor.child"
"""What the parent runs for each child: `python -P -m graphdoctor.child SPEC.json` (or forks from its template)."""

SPAWNED_AT_ENV = "GRAPHDOCTOR_SPAWNED_AT"
"""Environment variable holding time.time() when the parent started the child's process: the child's start-up
seconds count from it (graphdoctor.protocol.seconds)."""


def spawned_at() -> float | None:
    """time.time() when the parent started this process (None: not started by graphdoctor's runner)."""
    import os

    try:
        return float(os.environ[SPAWNED_AT_ENV])
    except (KeyError, ValueError):
        return None


def python_command(module: str, *args: str) -> list[str]:
    """`python -P -m module args...` with this interpreter."""
    return [sys.executable, "-P", "-m", module, *args]


def launcher_command(*torchrun_args: str) -> list[str]:
    """`python -P -m graphdoctor.child.stacks torch.distributed.run ARGS...` with this interpreter: torchrun's
    launcher with its stack dump registered (graphdoctor.child.stacks)."""
    return python_command("graphdoctor.child.stacks", "torch.distributed.run", *torchrun_args)


__all__ = ["CHILD_MODULE", "PARENT_PID_ENV", "SPAWNED_AT_ENV", "STACKS_ENV", "launcher_command", "python_command", "spawned_at"]
