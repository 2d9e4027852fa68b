"""ChildSpec: what one child run must do, passed to the child process as a JSON file.

Distributed placement comes from torchrun's environment when present (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); every child of one rank gets its own rendezvous port so runs never collide.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a child runs inside a (possibly multi-process) job."""

    rank: int = 0
    """Global rank."""

    world_size: int = 1
    """Number of processes."""

    local_rank: int = 0
    """CUDA device index on this host."""

    master_addr: str = "127.0.0.1"
    """Rendezvous host."""

    master_port: int = 29500
    """Rendezvous port for this child's process group."""

    tensor_model_parallel_size: int = 1
    """TP degree passed to initialize_model_parallel."""

    pipeline_model_parallel_size: int = 1
    """PP degree passed to initialize_model_parallel."""


def free_port() -> int:
    """An unused TCP port on this host (for single-process runs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def placement_for_child(child_index: int, *, tp: int = 1, pp: int = 1) -> Placement:
    """Placement of the `child_index`-th child of this process.

    Under torchrun every rank computes the same port (MASTER_PORT + 1 + child_index), so the ranks'
    children of one run meet; alone, a free port is picked.
    """
    env = os.environ
    if "WORLD_SIZE" in env and "RANK" in env:
        base = int(env.get("MASTER_PORT", "29500"))
        return Placement(
            rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=base + 1 + child_index,
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        )
    return Placement(master_port=free_port(), tensor_model_parallel_size=tp,
                     pipeline_model_parallel_size=pp)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """One child run: an implementation, a dropout, and where to put or find reference tensors."""

    impl: str
    """none | local | full_iteration | transformer_engine."""

    dropout: float
    """hidden_dropout and attention_dropout of this run."""

    config: dict[str, Any]
    """DiffConfig.to_dict() of the whole diff."""

    events_path: str
    """JSON-lines file the child appends its progress and result to."""

    reference_dir: str
    """Directory of per-step reference tensors (written by the eager run, read by graphed runs)."""

    role: str = "graphed"
    """reference (eager, saves tensors) | graphed (compares against reference_dir) | count
    (launch profiling only) | plain (no I/O, no observers)."""

    placement: Placement = field(default_factory=Placement)
    """Distributed placement."""

    artifacts_dir: str | None = None
    """Where the child may write snapshots and traces (None: write none)."""

    hunt_culprit: bool = False
    """Run every capture under sync-debug "error" so the first unsafe op raises at its own line."""

    eager_memory: dict[str, int] | None = None
    """Peak figures of the eager reference (memory cost of graphs is measured against them)."""

    keep_snapshots: bool = False
    """Write the memory snapshots (gzip pickles) into artifacts_dir."""

    taps: bool = False
    """Install capture-time taps (dropout masks, random draws, module outputs and gradients)."""

    def to_json(self) -> str:
        """Serialise."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        """Deserialise."""
        data = json.loads(text)
        data["placement"] = Placement(**data["placement"])
        return cls(**data)

    def write(self, path: Path) -> Path:
        """Write to `path` and return it."""
        path.write_text(self.to_json(), encoding="utf-8")
        return path


__all__ = ["ChildSpec", "Placement", "free_port", "placement_for_child"]
