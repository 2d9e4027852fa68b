"""The user's torchrun around graphdoctor: whether this process is one of its ranks, and the variables it set.
Kept apart from graphdoctor.parent.launch so that the command reads them before it imports anything heavier (the
template it starts early waits on this)."""

from __future__ import annotations

import os
from collections.abc import Mapping

TORCHRUN_VARIABLES: tuple[str, ...] = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
"""What an outer torchrun put in our environment; removed before we start launchers of our own."""


def under_user_torchrun(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(rank, world size) when this process is one rank of a user's torchrun, else None."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env or "LOCAL_RANK" not in env:
        return None
    try:
        return int(env.get("RANK", env["LOCAL_RANK"])), int(env["WORLD_SIZE"])
    except ValueError:
        return None


def leave_user_torchrun() -> None:
    """Rank 0 of a user's torchrun runs the diff itself: forget the outer launcher's variables so
    the children get rendezvous of their own."""
    for key in TORCHRUN_VARIABLES:
        os.environ.pop(key, None)


__all__ = ["TORCHRUN_VARIABLES", "leave_user_torchrun", "under_user_torchrun"]
