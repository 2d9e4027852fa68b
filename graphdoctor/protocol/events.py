"""Every event a child run sends back, with the one encoder and decoder for them.

A child appends one JSON object per line to its events file as things happen (so a crash, a CUDA
error or a kill still leaves what came before); the parent decodes the file into these types. Each
line carries `"event": <kind>` and the event's fields; docs/protocol.md lists them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any, ClassVar

from graphdoctor.launches.compare import LaunchSection
from graphdoctor.memory.sections import MemorySection
from graphdoctor.protocol.experts import ExpertShard
from graphdoctor.protocol.spec import ProtocolError
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.protocol.taptable import TapTable
from graphdoctor.strict_json import nullable
from graphdoctor.types import EvalRecord

Frame = tuple[str, int, str]
"""(filename, line, function) of one traceback frame, outermost first."""


@dataclass(frozen=True, slots=True)
class RunEnv:
    """Versions and device of a child run."""

    torch: str
    pid: int
    rank: int = 0
    world_size: int = 1
    megatron_core: str | None = None
    gpu: str | None = None
    capability: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"torch": self.torch, "pid": self.pid, "rank": self.rank,
                "world_size": self.world_size, "megatron_core": self.megatron_core, "gpu": self.gpu,
                "capability": list(self.capability) if self.capability else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunEnv:
        """Inverse of to_dict (keys this version does not know are ignored)."""
        cap = data.get("capability")
        return cls(torch=str(data.get("torch", "")), pid=int(data.get("pid", 0)),
                   rank=int(data.get("rank", 0)), world_size=int(data.get("world_size", 1)),
                   megatron_core=data.get("megatron_core"), gpu=data.get("gpu"),
                   capability=(int(cap[0]), int(cap[1])) if cap else None)


@dataclass(frozen=True, slots=True)
class Started:
    """The child is up: versions and device."""

    kind: ClassVar[str] = "started"
    env: RunEnv


@dataclass(frozen=True, slots=True)
class Step:
    """One training step finished."""

    kind: ClassVar[str] = "step"
    record: StepRecord


@dataclass(frozen=True, slots=True)
class Eval:
    """One evaluation finished (between training steps, or the final one)."""

    kind: ClassVar[str] = "eval"
    record: EvalRecord


@dataclass(frozen=True, slots=True)
class Tensors:
    """The tensors every step's fingerprints cover, in their order (parameter names)."""

    kind: ClassVar[str] = "tensors"
    names: tuple[str, ...]
    num_parameters: int = 0
    """Elements over all of them (the model's trainable parameters on this rank)."""
    parameter_bytes: int = 0
    """Their bytes in the parameters' own dtypes."""
    fingerprint_bytes: int = 0
    """Peak device bytes the fingerprints use during a step (computed by their plan)."""
    experts: tuple[ExpertShard, ...] = ()
    """The MoE experts this rank holds, layer by layer (graphdoctor.protocol.experts); () without MoE layers."""


@dataclass(frozen=True, slots=True)
class Fp8Layout:
    """The FP8 state tensors the FP8 lanes of the steps from `step` on cover (graphdoctor.child.fp8_state): a new
    layout whenever the state appears or a tensor changes size."""

    kind: ClassVar[str] = "fp8_layout"
    index: int
    """The layout's number in the run (a step's `prints.fp8_layout`)."""
    step: int
    """First step fingerprinted with it."""
    names: tuple[str, ...]
    """`module:what` of each tensor, in order."""


@dataclass(frozen=True, slots=True)
class Capture:
    """Graphs were captured during `step` (local and full_iteration at the end of that step's
    forward-backward; transformer_engine by TECudaGraphHelper.create_cudagraphs before it)."""

    kind: ClassVar[str] = "capture"
    step: int
    seconds: float
    """Wall time of the step (local, full_iteration) or of graph creation (transformer_engine)."""


@dataclass(frozen=True, slots=True)
class Memory:
    """The memory observer's section."""

    kind: ClassVar[str] = "memory"
    section: MemorySection


@dataclass(frozen=True, slots=True)
class Launches:
    """The launch observer's section."""

    kind: ClassVar[str] = "launches"
    section: LaunchSection


@dataclass(frozen=True, slots=True)
class Taps:
    """The capture-time tap table (forensics)."""

    kind: ClassVar[str] = "taps"
    table: TapTable


RNG_HOLDER = "rng_tracker.states_["
"""How a Hazard's subject begins when the holder is a generator state of Megatron's RNG tracker (the holder watch,
graphdoctor.child.holders): the evidence behind a row whose dropout draws differ."""


@dataclass(frozen=True, slots=True)
class Hazard:
    """A run-time hazard the child saw in how the model is called (a catalogue rule)."""

    kind: ClassVar[str] = "hazard"
    rule: str
    module: str
    message: str
    location: str | None = None
    """`file:line` of the user's code the evidence points at (None when only the module is known)."""
    step: int | None = None
    """Step at which the child saw it."""
    subject: str | None = None
    """What it is about: an attribute, a hook function, a torch function."""
    also_at: tuple[str, ...] = ()
    """Other `file:line`s of the same evidence (where an attribute is set, where a hook is defined)."""
    phase: str | None = None
    """Phase at which the child saw it (capture, replay, eval, ...)."""
    fix: str | None = None
    """The fix where it is particular to what the evidence names (Megatron's loss scaler); None: the rule's."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view (a run record's `hazards`)."""
        return {"rule": self.rule, "module": self.module, "message": self.message, "location": self.location,
                "step": self.step, "subject": self.subject, "also_at": list(self.also_at),
                "phase": self.phase, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hazard:
        """Inverse of to_dict (records written before location and step have only rule, module, message)."""
        return cls(rule=str(data.get("rule")), module=str(data.get("module")), message=str(data.get("message")),
                   location=nullable(str, data.get("location")),
                   step=nullable(int, data.get("step")),
                   subject=nullable(str, data.get("subject")),
                   also_at=tuple(str(a) for a in data.get("also_at") or ()),
                   phase=nullable(str, data.get("phase")),
                   fix=nullable(str, data.get("fix")))


@dataclass(frozen=True, slots=True)
class Error:
    """The run failed; what was raised, where and when."""

    kind: ClassVar[str] = "error"
    error_type: str
    message: str
    frames: tuple[Frame, ...] = ()
    final_error: str | None = None
    """The exception that ended the run, when the culprit is an earlier one in its chain."""
    module: str | None = None
    """Qualified name of the innermost nn.Module on the failing stack."""
    step: int = -1
    phase: str = "setup"
    unavailable: bool = False
    """The implementation cannot run here (a missing dependency), not a failure of it."""
    culprit_rule: str | None = None
    """Rule of the operation a culprit hunt classified as the cause (the probes' Recorder)."""
    culprit_operator: str | None = None
    """That operation, e.g. `aten::nonzero`."""
    culprit_location: str | None = None
    """Where the user's code issued it (`file:line`), when the recording saw a user frame."""
    culprit_module: str | None = None
    """The module it ran in, when known."""


@dataclass(frozen=True, slots=True)
class End:
    """The run finished; its timings and end-of-run memory figures."""

    kind: ClassVar[str] = "end"
    train_s: float
    """The training steps, observers' and comparison's seconds taken out."""
    compare_s: float
    setup_s: float
    startup_s: float = 0.0
    """Spawn (graphdoctor.protocol.processes.SPAWNED_AT_ENV) to the start of set-up."""
    observers: dict[str, float] = field(default_factory=dict)
    """Seconds each observer took, by name (graphdoctor.protocol.seconds.OBSERVER_NAMES)."""
    hooks: dict[str, float] = field(default_factory=dict)
    """Of those, the seconds of each observer's step hooks (what recurs every step)."""
    watched: dict[str, dict[str, int]] = field(default_factory=dict)
    """What each observer that reports it watched every step, counted by kind (the holder watch's paths), by
    observer name: what its step hooks' seconds were spent on."""
    waited_s: float = 0.0
    """Seconds waited at the parent's gate after set-up (graphdoctor.protocol.gate)."""
    peak_allocated_bytes: int | None = None
    """torch.cuda.max_memory_allocated while the graphs were alive."""
    end_reserved_bytes: int | None = None
    """Reserved bytes while the graphs were alive."""
    end_allocated_bytes: int | None = None
    """Allocated bytes after the graphs were released."""
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds of each start-up and set-up stage (graphdoctor.protocol.seconds.STAGE_NAMES)."""


@dataclass(frozen=True, slots=True)
class Phase:
    """The child entered a phase (setup, warmup, capture, replay, eager, teardown): sent when the
    phase changes, never per step; a hang's diagnosis names each rank's last one."""

    kind: ClassVar[str] = "phase"
    phase: str
    step: int = -1
    """The step that starts the phase (-1: none)."""


@dataclass(frozen=True, slots=True)
class Weights:
    """The weights a gpu_init child built (graphdoctor.child.weights): equal digests, equal weights."""

    kind: ClassVar[str] = "weights"
    digest: str
    """A bitwise digest of every parameter after initialisation, in name order."""
    num_seeded: int = 0
    """Tensors filled again from their own seed."""
    unseeded: tuple[str, ...] = ()
    """Parameters that no recorded init method filled and that are not constant (may differ between children)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The run's Megatron distributed checkpoint was saved (after `iteration` training steps) or
    loaded by the resumed process (--save-at, --resume)."""

    kind: ClassVar[str] = "checkpoint"
    action: str
    """`save` or `load`."""
    iteration: int
    """Training steps done when it was saved (the resumed process starts at this 0-based step)."""
    seconds: float
    """Wall time of the save or the load."""


@dataclass(frozen=True, slots=True)
class Teardown:
    """The child's exit after its end event (process-group destruction under the watchdog)."""

    kind: ClassVar[str] = "teardown"
    rank: int
    seconds: float
    """Seconds the teardown took (the watchdog's bound when it hung)."""
    since_last_step_s: float
    """Seconds from the end of the last step to the exit."""
    hung: bool = False
    """The watchdog fired: its stacks were dumped and the process was ended."""
    graphs_released: int = 0
    """CUDA graphs Megatron-Core held at exit, deleted before destroy_process_group."""
    graphs_alive: int = 0
    """torch.cuda.CUDAGraph objects still alive at destroy_process_group (kept by other code)."""


Event = (Started | Tensors | Step | Eval | Capture | Memory | Launches | Taps | Hazard | Error | End | Phase
         | Teardown | Checkpoint | Fp8Layout | Weights)
EVENT_TYPES: dict[str, type[Any]] = {
    cls.kind: cls for cls in (Started, Tensors, Step, Eval, Capture, Memory, Launches, Taps, Hazard, Error, End,
                              Phase, Teardown, Checkpoint, Fp8Layout, Weights)
}


def encode(event: Event) -> str:
    """One JSON line (no newline) for `event`: its kind, then its fields (a step record's and a
    run environment's fields are written flat, as schema 1 reports hold them)."""
    data: dict[str, Any] = {"event": event.kind}
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, StepRecord):
            data.update(value.to_event())
        elif isinstance(value, EvalRecord):
            data.update(value.to_dict())
        elif isinstance(value, RunEnv):
            data.update(value.to_dict())
        elif isinstance(value, MemorySection | LaunchSection | TapTable):
            data[f.name] = value.to_dict()
        elif f.name == "experts":
            data[f.name] = [shard.to_dict() for shard in value]
        elif f.name == "frames":
            data[f.name] = [list(frame) for frame in value]
        else:
            data[f.name] = value
    return json.dumps(data, default=str)


def decode(line: str) -> Event:
    """The event of one line written by encode().

    Raises:
        ProtocolError: not an event of this version (unknown kind, missing or mistyped field).
    """
    try:
        data = json.loads(line)
        kind = data.pop("event")
        cls = EVENT_TYPES[kind]
        if cls is Started:
            return Started(env=RunEnv.from_dict(data))
        if cls is Step:
            return Step(record=StepRecord.from_dict(data))
        if cls is Eval:
            return Eval(record=EvalRecord.from_dict(data))
        if cls is Memory:
            return Memory(section=MemorySection.from_dict(data["section"]))
        if cls is Launches:
            return Launches(section=LaunchSection.from_dict(data["section"]))
        if cls is Taps:
            return Taps(table=TapTable.from_dict(data["table"], "taps.table"))
        if cls is Error:
            data["frames"] = tuple((str(f), int(n), str(fn)) for f, n, fn in data.get("frames", ()))
        if cls in (Tensors, Fp8Layout):
            data["names"] = tuple(str(n) for n in data["names"])
        if cls is Tensors:
            data["experts"] = tuple(ExpertShard.from_dict(e) for e in data.get("experts") or ())
        if cls is Weights:
            data["unseeded"] = tuple(str(n) for n in data.get("unseeded", ()))
        if cls is Hazard:
            return Hazard.from_dict(data)
        event: Event = cls(**data)
        return event
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"event {line[:80]!r}: {type(exc).__name__}: {exc}") from None


class EventWriter:
    """Append-only writer of one child's events file, flushed per event."""

    def __init__(self, path: str | Path) -> None:
        self._fh: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the whole child

    def emit(self, event: Event) -> None:
        """Write one event and flush it (a kill right after still leaves it behind)."""
        self._fh.write(encode(event) + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the file (a child that ends with os._exit need not)."""
        self._fh.close()


@dataclass(frozen=True, slots=True)
class EventLog:
    """What the parent read back from one events file."""

    events: tuple[Event, ...]
    problems: tuple[str, ...] = ()
    """Lines that did not decode (a torn last line after a kill is expected, and is listed here)."""

    def of(self, cls: type[Any]) -> list[Any]:
        """Every event of one type, in order."""
        return [e for e in self.events if isinstance(e, cls)]

    def first(self, cls: type[Any]) -> Any:
        """The first event of one type, or None."""
        return next((e for e in self.events if isinstance(e, cls)), None)


def read_events(path: str | Path) -> EventLog:
    """Decode a child's events file; a missing file is an empty log."""
    file = Path(path)
    if not file.exists():
        return EventLog(events=())
    events: list[Event] = []
    problems: list[str] = []
    for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            events.append(decode(line))
        except ProtocolError as exc:
            problems.append(str(exc))
    return EventLog(events=tuple(events), problems=tuple(problems))


__all__ = [
    "EVENT_TYPES",
    "Capture",
    "Checkpoint",
    "End",
    "Error",
    "Eval",
    "Event",
    "EventLog",
    "EventWriter",
    "Fp8Layout",
    "Frame",
    "Hazard",
    "Launches",
    "Memory",
    "Phase",
    "RunEnv",
    "Started",
    "Step",
    "Taps",
    "Teardown",
    "Tensors",
    "Weights",
    "decode",
    "encode",
    "read_events",
]
