"""RunRecord: everything one child run reported, folded from its events, typed section by section.

It round-trips through the diff report's JSON (`to_dict` / `from_dict`); `from_dict` also reads the
reports of schema 1 (eager called `none`, end-of-run memory figures inside `env`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphdoctor.launches.compare import LaunchSection
from graphdoctor.memory.sections import MemorySection
from graphdoctor.protocol.events import Checkpoint, Hazard, RunEnv, Weights
from graphdoctor.protocol.experts import ExpertShard
from graphdoctor.protocol.seconds import ChildSeconds
from graphdoctor.protocol.spec import impl_name
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.protocol.taptable import TapTable
from graphdoctor.types import Diagnosis, EvalRecord, RankExit

END_MEMORY_FIELDS: tuple[str, ...] = ("peak_allocated_bytes", "end_reserved_bytes", "end_allocated_bytes")


def rank_prefix(rank: int) -> str:
    """How a rank's tensors (and MoE layers) are named in a multi-GPU run's folded record: `rank1:decoder...`."""
    return f"rank{rank}:"


def split_rank(name: str) -> tuple[int | None, str]:
    """(rank, name) of a folded record's tensor or layer name; (None, name) for a one-process record."""
    head, sep, rest = name.partition(":")
    if sep and head.startswith("rank") and head[4:].isdigit():
        return int(head[4:]), rest
    return None, name


ENVIRONMENT_FAILED = "environment-failed"
"""RunRecord.status of a run the machine failed twice: before its first step, or out of memory beside other
children on its GPU (graphdoctor.parent.environment)."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """Everything a child run reports back to the parent."""

    impl: str
    """eager | local | full_iteration | transformer_engine."""

    dropout: float
    """Dropout the run used."""

    status: str
    """ok | error | hang | timeout | crashed | unavailable | stopped (graphdoctor was stopped first) |
    environment-failed (ENVIRONMENT_FAILED: the machine failed it twice)."""

    steps: tuple[StepRecord, ...] = ()
    """Recorded steps, in order (possibly fewer than asked when the run failed)."""

    diagnosis: Diagnosis | None = None
    """Set when status is not ok."""

    evals: tuple[EvalRecord, ...] = ()
    """Evaluations, in order (none unless the run schedule evaluates)."""

    wall_s: float = 0.0
    """Wall-clock time of the child process, start to exit."""

    train_s: float = 0.0
    """Wall-clock time of the child's training loop alone (model built, steps run, no comparison)."""

    compare_s: float = 0.0
    """Wall-clock time the child spent saving or comparing reference tensors."""

    memory: MemorySection | None = None
    """Memory section when recorded."""

    launches: LaunchSection | None = None
    """Launch section when recorded."""

    env: RunEnv | None = None
    """Versions and device of the child (torch, megatron-core, GPU name, rank, world size)."""

    forensics: TapTable | None = None
    """Capture-time tap table when the run was tapped."""

    hazards: tuple[Hazard, ...] = ()
    """Run-time hazards the child saw, e.g. GD511."""

    peak_allocated_bytes: int | None = None
    """torch.cuda.max_memory_allocated at the end of the run, graphs alive."""

    end_reserved_bytes: int | None = None
    """Reserved bytes at the end of the run, graphs alive."""

    end_allocated_bytes: int | None = None
    """Allocated bytes at the end of the run, after the graphs were released."""

    name: str = ""
    """run_name() of the child (names its files in the work directory)."""

    tensor_names: tuple[str, ...] = ()
    """The tensors the steps' fingerprints cover, in order (not in the report JSON)."""

    num_parameters: int = 0
    """Trainable parameters (elements) of the model on this rank."""

    parameter_bytes: int = 0
    """Their bytes."""

    fingerprint_bytes: int = 0
    """Peak device bytes the step fingerprints used (their computed plan)."""

    teardown: tuple[RankExit, ...] = ()
    """How each rank exited after its results (a hung teardown is a finding, not a failure)."""
    checkpoints: tuple[Checkpoint, ...] = ()
    """The run's checkpoint save and, with --resume, its load by the resumed process (in order)."""
    seconds: ChildSeconds | None = None
    """Where the process's wall time went (start-up, set-up, training, observers, comparison, teardown) and
    when it started and ended; None in reports written before it."""
    fp8_layouts: tuple[tuple[str, ...], ...] = ()
    """The FP8 state tensors (`module:what`) of each FP8 layout the run's steps fingerprinted, by layout index
    (StepPrints.fp8_layout); empty without FP8 state."""
    experts: tuple[ExpertShard, ...] = ()
    """The MoE experts the run's tensors hold, layer by layer (graphdoctor.protocol.experts): a folded record's
    layers carry their rank (`rank1:decoder.layers.0.mlp`); () without MoE layers."""
    weights: Weights | None = None
    """The weights a gpu_init child built: their digest and what was seeded (None: CPU initialisation)."""
    ranks: tuple[RunRecord, ...] = ()
    """A multi-GPU run's records of every rank, in rank order (empty for one process). This record is
    then their fold (graphdoctor.parent.ranks): rank 0's figures, the deciding rank's status, every
    rank's tensors named `rank<r>:...` (docs/multi-gpu.md)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {
            "impl": self.impl,
            "name": self.name,
            "num_parameters": self.num_parameters,
            "parameter_bytes": self.parameter_bytes,
            "fingerprint_bytes": self.fingerprint_bytes,
            "dropout": self.dropout,
            "status": self.status,
            "steps": [s.to_dict() for s in self.steps],
            "evals": [e.to_dict() for e in self.evals],
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis else None,
            "wall_s": self.wall_s,
            "train_s": self.train_s,
            "compare_s": self.compare_s,
            "memory": self.memory.to_dict() if self.memory else None,
            "launches": self.launches.to_dict() if self.launches else None,
            "env": self.env.to_dict() if self.env else {},
            "forensics": self.forensics.to_dict() if self.forensics else None,
            "hazards": [h.to_dict() for h in self.hazards],
            "teardown": [t.to_dict() for t in self.teardown],
            "checkpoints": [{"action": c.action, "iteration": c.iteration, "seconds": c.seconds}
                            for c in self.checkpoints],
            **{key: getattr(self, key) for key in END_MEMORY_FIELDS},
            "seconds": self.seconds.to_dict() if self.seconds else None,
            "fp8_layouts": [list(names) for names in self.fp8_layouts],
            "experts": [shard.to_dict() for shard in self.experts],
            "weights": None if self.weights is None else {"digest": self.weights.digest,
                                                          "num_seeded": self.weights.num_seeded,
                                                          "unseeded": list(self.weights.unseeded)},
            "ranks": [r.to_dict() for r in self.ranks],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Inverse of to_dict; reads schema 1 records too."""
        env = dict(data.get("env") or {})
        memory, launches, forensics = data.get("memory"), data.get("launches"), data.get("forensics")
        return cls(
            impl=impl_name(str(data["impl"])), dropout=float(data["dropout"]), status=str(data["status"]),
            steps=tuple(StepRecord.from_dict(s) for s in data.get("steps", ())),
            evals=tuple(EvalRecord.from_dict(e) for e in data.get("evals", ())),
            diagnosis=Diagnosis.from_dict(data["diagnosis"]) if data.get("diagnosis") else None,
            wall_s=float(data.get("wall_s", 0.0)), train_s=float(data.get("train_s", 0.0)),
            compare_s=float(data.get("compare_s", 0.0)),
            memory=MemorySection.from_dict(memory) if memory else None,
            launches=LaunchSection.from_dict(launches) if launches else None,
            env=RunEnv.from_dict(env) if env else None,
            forensics=TapTable.from_dict(forensics) if forensics else None,
            hazards=tuple(Hazard.from_dict(h) for h in data.get("hazards", ())),
            name=str(data.get("name", "")), num_parameters=int(data.get("num_parameters", 0)),
            parameter_bytes=int(data.get("parameter_bytes", 0)),
            fingerprint_bytes=int(data.get("fingerprint_bytes", 0)),
            peak_allocated_bytes=data.get("peak_allocated_bytes", env.get("peak_allocated_bytes")),
            end_reserved_bytes=data.get("end_reserved_bytes", env.get("end_reserved_bytes")),
            end_allocated_bytes=data.get("end_allocated_bytes", env.get("end_allocated_bytes")),
            teardown=tuple(RankExit.from_dict(t) for t in data.get("teardown", ())),
            checkpoints=tuple(Checkpoint(action=str(c["action"]), iteration=int(c["iteration"]),
                                         seconds=float(c["seconds"])) for c in data.get("checkpoints", ())),
            seconds=ChildSeconds.from_dict(data["seconds"]) if isinstance(data.get("seconds"), dict) else None,
            fp8_layouts=tuple(tuple(str(n) for n in names) for names in data.get("fp8_layouts", ())),
            experts=tuple(ExpertShard.from_dict(e) for e in data.get("experts") or ()),
            weights=_weights(data.get("weights")),
            ranks=tuple(cls.from_dict(r) for r in data.get("ranks", ())),
        )


def _weights(data: Any) -> Weights | None:
    if not isinstance(data, dict):
        return None
    return Weights(digest=str(data.get("digest", "")), num_seeded=int(data.get("num_seeded", 0)),
                   unseeded=tuple(str(n) for n in data.get("unseeded", ())))


__all__ = ["END_MEMORY_FIELDS", "ENVIRONMENT_FAILED", "RunRecord", "rank_prefix", "split_rank"]
