"""What a child run is asked to do: ChildSpec (diff and count children) and ProbeJob (probe workers),
written by the parent as one JSON file and read back by the child with the same types.

Distributed placement comes from torchrun's environment when present (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); every child of one rank gets its own rendezvous port so runs never collide. A
child alone (one process) needs no port: its process group keeps its store in memory.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from graphdoctor.config import DiffConfig
from graphdoctor.config.description import ModelDescription
from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.errors import GraphDoctorError

EAGER = Impl.EAGER
"""graphdoctor's name of the eager reference."""
LEGACY_EAGER = MEGATRON_EAGER
"""What reports before schema 2 called the eager reference; read, never written (Megatron's cuda_graph_impl
of the eager reference)."""


def impl_name(value: str) -> str:
    """An implementation name as current code writes it (`none` from old reports reads as `eager`)."""
    return EAGER if value == LEGACY_EAGER else value


class Role(enum.StrEnum):
    """Why a child runs; it decides what the child does besides training."""

    REFERENCE = "reference"
    """Eager (or a control pair's eager): saves per-step reference tensors for graphed runs."""

    GRAPHED = "graphed"
    """Compares its main_grads and parameters against a reference's, step by step."""

    TAPPED = "tapped"
    """Trains with capture-time taps only: no reference I/O, no memory or launch observers."""

    COUNT = "count"
    """Launch accounting only (live `graphdoctor count`): no reference I/O, no memory recording."""

    @property
    def reference_io(self) -> bool:
        """Whether this role saves or compares per-step tensors."""
        return self in (Role.REFERENCE, Role.GRAPHED)


class ProtocolError(GraphDoctorError):
    """A spec or event file does not have the shape this version of graphdoctor writes."""


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

    launcher: bool = False
    """The ranks were started by torch.distributed.run (graphdoctor's own launch of a multi-GPU
    child): rank, local rank and rendezvous come from its environment (init_method env://)."""

    @property
    def data_parallel_size(self) -> int:
        """world_size / (TP x PP)."""
        return self.world_size // (self.tensor_model_parallel_size * self.pipeline_model_parallel_size)


def placement_for_child(child_index: int, *, tp: int = 1, pp: int = 1) -> Placement:
    """Placement of the `child_index`-th child of this process.

    Under torchrun every rank computes the same port (MASTER_PORT + 1 + child_index), so the ranks'
    children of one run meet; alone, no port is needed (the child keeps its store in memory:
    graphdoctor.child.megatron_setup.init_distributed).
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
    return Placement(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)


def rank_path(path: str, rank: int, world_size: int) -> str:
    """A run's file of one rank: `events-<name>-rank<r>.jsonl` when the run has several ranks, the
    path itself for one."""
    if world_size <= 1:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-rank{rank}{p.suffix}"))


LAUNCHER_VARIABLES: tuple[str, ...] = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torch.distributed.run sets in every rank's environment that a placement reads."""


def launched_placement(place: Placement, env: dict[str, str]) -> Placement:
    """This rank's placement inside a child started by torch.distributed.run (from its environment)."""
    return Placement(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                     local_rank=int(env.get("LOCAL_RANK", "0")), master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                     master_port=int(env.get("MASTER_PORT", "29500")),
                     tensor_model_parallel_size=place.tensor_model_parallel_size,
                     pipeline_model_parallel_size=place.pipeline_model_parallel_size, launcher=True)


def gpu_turn_path(gpu: int | str) -> str:
    """The lock file through which children take turns on one GPU (by index or UUID), per user."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"graphdoctor-{os.getuid()}-gpu{gpu}.lock")


def run_name(impl: str, dropout: float, role: Role, *, attempt: int = 0, hunt: bool = False,
             taps: bool = False, io_steps: tuple[int, ...] = (), resumed: bool = False) -> str:
    """The one name of a child run: its files in the work directory are `<kind>-<name>.<ext>`.

    Every distinct run of one diff gets a distinct name (a culprit hunt is not the graphed run it
    repeats; a retry after a taken port is another attempt; the resumed process of a --resume run is
    `<name>-resumed`).
    """
    name = f"{impl}-{role.value}-d{dropout:g}"
    if hunt:
        name += "-hunt"
    if taps:
        name += "-taps"
    if io_steps:
        name += "-steps" + "_".join(map(str, io_steps))
    if attempt:
        name += f"-attempt{attempt}"
    if resumed:
        name += "-resumed"
    return name


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """One child run: an implementation, a dropout, a role, and where to put or find reference tensors."""

    impl: str
    """eager | local | full_iteration | transformer_engine."""

    dropout: float
    """hidden_dropout and attention_dropout of this run."""

    config: DiffConfig
    """The whole diff's configuration (model, steps, tolerances, run-file sections)."""

    role: Role
    """What the child does besides training (see Role)."""

    name: str
    """run_name() of this run; names its files and trace."""

    events_path: str
    """JSON-lines file the child appends its events to (graphdoctor.protocol.events)."""

    reference_dir: str
    """Directory of per-step reference tensors (written by the eager run, read by graphed runs)."""

    placement: Placement = field(default_factory=Placement)
    """Distributed placement."""

    artifacts_dir: str | None = None
    """Where the child may write snapshots and traces (None: write none)."""

    hunt_culprit: bool = False
    """Run every capture under sync-debug "error" so the first unsafe op raises at its own line."""

    keep_snapshots: bool = False
    """Write the memory snapshots (gzip pickles) into config.snapshot_dir."""

    taps: bool = False
    """Install capture-time taps (dropout masks, random draws, module outputs and gradients)."""

    import_dir: str | None = None
    """A directory the child appends to its import path (last) for the user's `pkg.mod:fn`."""

    io_steps: tuple[int, ...] = ()
    """Steps whose main_grads and parameters the child saves (reference role) or compares element by
    element against the saved ones (graphed role); every step is fingerprinted regardless."""

    stop_after: int | None = None
    """Last step to run (a targeted re-run ends there); None: every step."""

    fingerprints: bool = True
    """Fingerprint every step's main_grads and parameters (off only for baseline timings)."""

    holders: bool = True
    """Watch the holders of what the graphs read (graphdoctor.child.holders; off only for its cost benchmark)."""

    gpu_turn: str | None = None
    """Lock file of the GPU this child shares with other children (graphdoctor.child.gpu_turn); None
    when it runs alone, and never for a multi-process child."""

    checkpoint_dir: str | None = None
    """Where the run's Megatron distributed checkpoint goes after config.save_at training steps (or,
    when `resumed`, where it is loaded from); None: no checkpoint."""

    resumed: bool = False
    """This process loads the checkpoint before its first step and trains steps config.save_at on
    (--resume: the second process of the run)."""

    memory_gate: str | None = None
    """Path prefix of this child's memory gate (graphdoctor.protocol.gate): the child imports what it needs, then
    waits there until the parent grants it the GPU memory of a slot, before it builds its model; None: no wait."""

    model: ModelDescription | None = None
    """The model this child builds (graphdoctor.config.child_model of its config, impl and dropout), resolved once
    by the parent; None: the child resolves it (where the parent could not, so the child fails the same way)."""

    gate: str | None = None
    """Path prefix of the parent's gate (graphdoctor.protocol.gate): the child waits there after its set-up,
    before its first training step, until the parent's plan-time checks passed; None: no wait."""

    @property
    def graphed(self) -> bool:
        """True for every implementation but eager."""
        return self.impl != EAGER

    def to_json(self) -> str:
        """Serialise (the inverse of from_json)."""
        data = asdict(self)
        data["config"] = self.config.to_dict()
        data["role"] = self.role.value
        data["model"] = self.model.to_dict() if self.model is not None else None
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        """Deserialise what to_json wrote.

        Raises:
            ProtocolError: the text is not a spec this version writes.
        """
        try:
            data = json.loads(text)
            data["config"] = DiffConfig.from_dict(data["config"])
            data["placement"] = Placement(**data["placement"])
            data["role"] = Role(data["role"])
            data["io_steps"] = tuple(data.get("io_steps", ()))
            if data.get("model") is not None:
                data["model"] = ModelDescription.from_dict(data["model"])
            return cls(**data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"child spec: {type(exc).__name__}: {exc}") from None

    def write(self, path: Path) -> Path:
        """Write to `path` and return it."""
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    def for_rank(self, env: dict[str, str]) -> ChildSpec:
        """This spec as one rank of a child started by torch.distributed.run sees it: its placement from
        the launcher's environment, its own events file (rank_path) and name (`<name>-rank<r>`, which
        names its trace and snapshots)."""
        from dataclasses import replace

        place = launched_placement(self.placement, env)
        name = f"{self.name}-rank{place.rank}" if place.world_size > 1 else self.name
        return replace(self, placement=place, name=name,
                       events_path=rank_path(self.events_path, place.rank, place.world_size))


@dataclass(frozen=True, slots=True)
class ProbeJob:
    """What one probe worker does: build the diff's model (the same set-up path) and probe layers."""

    config: DiffConfig
    """The model to build, exactly as `graphdoctor diff` would build it."""

    layers: tuple[int, ...]
    """Decoder layer indices to record and capture, in order."""

    warmup_iters: int = 2
    """Eager calls on a side stream before each capture."""

    import_dir: str | None = None
    """A directory the worker appends to its import path (last) for the user's `pkg.mod:fn`."""

    def to_json(self) -> str:
        """Serialise (the inverse of from_json)."""
        return json.dumps({"config": self.config.to_dict(), "layers": list(self.layers),
                           "warmup_iters": self.warmup_iters, "import_dir": self.import_dir},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProbeJob:
        """Deserialise what to_json wrote; raises ProtocolError."""
        try:
            data: dict[str, Any] = json.loads(text)
            return cls(config=DiffConfig.from_dict(data["config"]),
                       layers=tuple(int(i) for i in data["layers"]),
                       warmup_iters=int(data["warmup_iters"]), import_dir=data.get("import_dir"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"probe job: {type(exc).__name__}: {exc}") from None


__all__ = [
    "LAUNCHER_VARIABLES",
    "launched_placement",
    "rank_path",
    "EAGER",
    "LEGACY_EAGER",
    "ChildSpec",
    "Placement",
    "ProbeJob",
    "ProtocolError",
    "Role",
    "gpu_turn_path",
    "impl_name",
    "placement_for_child",
    "run_name",
]
