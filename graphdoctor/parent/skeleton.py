"""The model's skeleton, built without a GPU for the plans: graphdoctor.child.skeleton in an isolated process
(CUDA hidden, a timeout), and what its build says: the parameters, a set-up error Megatron raised (refused at
plan time, exit 2), or why it was not built here."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from graphdoctor.config import DiffConfig
from graphdoctor.errors import UsageError
from graphdoctor.inputs import read_json
from graphdoctor.parent.runner import child_env, python_command, run_isolated

SKELETON_TIMEOUT_S = 300.0
"""Limit for building the skeleton (importing Megatron and building a 7B-class model on the meta device take
seconds; an import that hangs must not hang the plan)."""


@dataclass(frozen=True, slots=True)
class Skeleton:
    """What building the model on the meta device said."""

    num_parameters: int | None = None
    """Parameters of the built model (one process: every tensor-parallel shard whole)."""
    error: str | None = None
    """The error Megatron raised while building it (a set-up failure of every child)."""
    where: str | None = None
    """Megatron's file:line of that error."""
    not_built: str | None = None
    """Why it was not built here (a GPU or the user's own code needed)."""

    @property
    def line(self) -> str:
        """One line for the plan."""
        if self.num_parameters is not None:
            return f"model built on the meta device: {self.num_parameters / 1e9:.3g} B parameters"
        if self.error is not None:
            return f"set-up fails: {self.error}" + (f" ({self.where})" if self.where else "")
        return f"model not built here: {self.not_built}"


def build_skeleton(config: DiffConfig, *, timeout_s: float = SKELETON_TIMEOUT_S) -> Skeleton:
    """Build the eager reference's model as a child would, on the meta device, in an isolated process."""
    with tempfile.TemporaryDirectory(prefix="graphdoctor-skeleton-") as folder:
        spec, out = Path(folder) / "config.json", Path(folder) / "result.json"
        spec.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        env = {**child_env(config.env), "CUDA_VISIBLE_DEVICES": ""}
        ended = run_isolated(python_command("graphdoctor.child.skeleton", str(spec), str(out)),
                             timeout_s=timeout_s, env=env)
        if ended.timed_out:
            return Skeleton(not_built=f"building it took over {timeout_s:.0f} s")
        if not out.is_file():
            tail = (ended.log_tail.strip().splitlines() or [ended.describe_exit()])[-1]
            return Skeleton(not_built=f"the build process ended without a result ({tail[:200]})")
        result = read_json(out, "skeleton result")
    if result.get("built"):
        return Skeleton(num_parameters=int(result["num_parameters"]))
    if result.get("error"):
        return Skeleton(error=str(result["error"]), where=result.get("where"))
    return Skeleton(not_built=str(result.get("why") or "unknown"))


def refuse_what_fails_to_build(skeleton: Skeleton) -> None:
    """A set-up failure is a plan-time refusal.

    Raises:
        UsageError: the model fails to build (Megatron's message and file:line).
    """
    if skeleton.error is not None:
        raise UsageError(f"every child's set-up would fail building the model: {skeleton.error}"
                         + (f" ({skeleton.where})" if skeleton.where else ""))


__all__ = ["SKELETON_TIMEOUT_S", "Skeleton", "build_skeleton", "refuse_what_fails_to_build"]
