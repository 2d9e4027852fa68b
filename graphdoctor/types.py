"""Frozen data shared by every stage of `diff`: tensor comparisons, diagnoses and verdicts.

What one child run reported as a whole is graphdoctor.protocol.RunRecord, its steps graphdoctor.protocol.steps.

Nothing here imports torch; every record round-trips through plain JSON (`to_dict` / `from_dict`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Verdict(enum.StrEnum):
    """Outcome of one implementation against the eager reference (the JSON uses these values)."""

    MATCH = "match"
    """Losses, main_grads and parameters agree at every step (bitwise, or within --rtol/--atol)."""

    RNG_DIVERGENCE = "rng-divergence"
    """Differs only because dropout draws differ: the dropout-free control pair matches."""

    NUMERIC_DIVERGENCE = "numeric-divergence"
    """Differs with dropout off (or the control pair differs too)."""

    FROZEN_RNG = "frozen-rng"
    """A random draw inside a graph repeats the same values on every replay while eager draws new
    ones (for example a host-drawn mask copied in through pinned memory)."""

    SETUP_FAILED = "setup-failed"
    """Megatron refused to build the model or its graphs, before any step: a set-up the rule catalogue knows fails
    (no child is started for it) or a child's error while it built the model, with Megatron's file:line."""

    CAPTURE_FAILED = "capture-failed"
    """An error during warmup or capture."""

    CRASHED = "crashed"
    """The run died outside capture (replay, optimizer, child process killed by a signal)."""

    TIMEOUT = "timeout"
    """The child run exceeded its time limit and was killed."""

    HANG = "hang"
    """The child run exceeded its time limit while a rank waited in a collective (NCCL/gloo) or a CUDA
    synchronize; the diagnosis names every rank's phase, last finished step and stack."""

    UNAVAILABLE = "unavailable"
    """The implementation cannot run here (for example Transformer Engine is not installed)."""

    REFERENCE_FAILED = "reference-failed"
    """The eager reference itself failed, so nothing could be compared."""

    ENVIRONMENT_FAILED = "environment-failed"
    """The machine failed the run, not the model: before its first step, NCCL's or CUDA's set-up failed, memory
    ran out, the GPU was busy or lost, or a port was taken (or memory ran out at any step beside other children on
    its GPU), and again when the run was retried (graphdoctor.parent.environment). The eager reference's such
    failure makes every row environment-failed."""

    STOPPED = "stopped"
    """graphdoctor was stopped (SIGTERM, SIGHUP, SIGINT) before this implementation's comparison finished; the
    report says how far eager and graphed got, the first difference seen by then, and each stopped run's
    stacks."""

    @property
    def passed(self) -> bool:
        """True for verdicts that count as a pass without --strict-rng."""
        return self in (Verdict.MATCH, Verdict.RNG_DIVERGENCE)


@dataclass(frozen=True, slots=True)
class TensorDiff:
    """Comparison of one tensor family (grads or params) at one step, reduced on the GPU."""

    num_tensors: int
    """Tensors compared."""

    num_unequal: int
    """Tensors that are not bitwise equal (or outside tolerance when one is set)."""

    max_abs: float
    """Largest absolute difference over all tensors."""

    max_rel: float
    """Largest relative difference |a-b|/|b| over elements where the reference b is non-zero."""

    first_tensor: str | None = None
    """First tensor, in parameter order, that differs."""

    first_tensor_max_abs: float = 0.0
    """Largest absolute difference inside `first_tensor`."""

    measured: bool = True
    """False when only fingerprints were compared: which tensors differ is known, by how much is not
    (max_abs, max_rel and first_tensor_max_abs are then 0)."""

    last_tensor: str | None = None
    """Last tensor, in parameter order, that differs: the first in backward order (Megatron's GPT computes
    its gradients in reverse parameter order: output layer, last layer's fc2 ... first layer, embedding)."""

    @property
    def equal(self) -> bool:
        """True when every tensor agreed."""
        return self.num_unequal == 0

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {
            "num_tensors": self.num_tensors,
            "num_unequal": self.num_unequal,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "first_tensor": self.first_tensor,
            "first_tensor_max_abs": self.first_tensor_max_abs,
            "measured": self.measured,
            "last_tensor": self.last_tensor,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorDiff:
        """Inverse of to_dict (a non-finite magnitude may come back as the string JSON writers give it, 'nan')."""
        numbers = ("max_abs", "max_rel", "first_tensor_max_abs")
        values: dict[str, Any] = {k: float(v) if k in numbers else v for k, v in data.items()}
        return cls(**values)


MAX_STACK_FRAMES = 24
"""Frames of a rank's main thread kept in a RankStack (innermost first); the JSON stays small."""


@dataclass(frozen=True, slots=True)
class RankStack:
    """One process of a child at the moment it was stopped: a rank, or torchrun's launcher."""

    label: str
    """`rank0`, `rank1`, ... or `launcher`."""

    frames: tuple[str, ...] = ()
    """Its main thread's Python stack, innermost first, `file:line in function` (at most
    MAX_STACK_FRAMES)."""

    phase: str | None = None
    """The phase it was in (setup, warmup, capture, replay, teardown; None: it sent no events)."""

    last_step: int = -1
    """The last step it finished (-1: none)."""

    waiting_in: str | None = None
    """What it waits in when that is a collective or a CUDA synchronize, e.g. `all_reduce
    (torch/distributed/distributed_c10d.py:2950)`; None otherwise."""

    user_frame: str | None = None
    """`file:line in function` of the innermost user or Megatron frame."""

    num_threads: int = 0
    """Python threads in the dump."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"label": self.label, "phase": self.phase, "last_step": self.last_step,
                "waiting_in": self.waiting_in, "user_frame": self.user_frame,
                "num_threads": self.num_threads, "frames": list(self.frames)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankStack:
        """Inverse of to_dict."""
        return cls(label=str(data["label"]), frames=tuple(str(f) for f in data.get("frames", ())),
                   phase=data.get("phase"), last_step=int(data.get("last_step", -1)),
                   waiting_in=data.get("waiting_in"), user_frame=data.get("user_frame"),
                   num_threads=int(data.get("num_threads", 0)))


@dataclass(frozen=True, slots=True)
class RankExit:
    """How one rank exited after writing its results: process-group destruction under a watchdog."""

    rank: int
    teardown_s: float
    """Seconds spent in teardown (destroy_process_group); the bound when it hung."""

    since_last_step_s: float
    """Seconds from the end of its last step to its exit."""

    hung: bool = False
    """Teardown did not finish within the bound; the watchdog dumped its stack and ended it."""

    stack: RankStack | None = None
    """Its stack when it hung."""

    graphs_released: int = 0
    """CUDA graphs Megatron-Core held at exit, deleted before destroy_process_group."""

    graphs_alive: int = 0
    """torch.cuda.CUDAGraph objects still alive at destroy_process_group (kept by other code)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"rank": self.rank, "teardown_s": self.teardown_s, "since_last_step_s": self.since_last_step_s,
                "hung": self.hung, "stack": self.stack.to_dict() if self.stack else None,
                "graphs_released": self.graphs_released, "graphs_alive": self.graphs_alive}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankExit:
        """Inverse of to_dict (reports without the graph counts read 0)."""
        stack = data.get("stack")
        return cls(rank=int(data["rank"]), teardown_s=float(data["teardown_s"]),
                   since_last_step_s=float(data["since_last_step_s"]), hung=bool(data.get("hung")),
                   stack=RankStack.from_dict(stack) if stack else None,
                   graphs_released=int(data.get("graphs_released", 0)), graphs_alive=int(data.get("graphs_alive", 0)))


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """What one evaluation of one child run recorded (Megatron's forward-only schedule, eval mode)."""

    index: int
    """0-based evaluation index within the run."""

    after_step: int
    """The training step it ran after (the last step for the final evaluation)."""

    loss: float
    """Mean over the evaluation's iterations of each iteration's loss, scaled as in training."""

    final: bool = False
    """True for the evaluation after the last training step."""

    reported: tuple[tuple[str, float], ...] = ()
    """The loss function's reported values, reduced over every micro-batch of every iteration as
    Megatron-LM's `evaluate` does ([sum, count]: sum / count; one element: the mean)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view (also the eval event's fields)."""
        return {"index": self.index, "after_step": self.after_step, "loss": self.loss, "final": self.final,
                "reported": dict(self.reported)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalRecord:
        """Inverse of to_dict."""
        return cls(index=int(data["index"]), after_step=int(data["after_step"]), loss=float(data["loss"]),
                   final=bool(data.get("final", False)),
                   reported=tuple((str(k), float(v)) for k, v in (data.get("reported") or {}).items()))


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why a run failed, in a user's terms."""

    error_type: str
    """Python exception type (or `timeout`, `signal`)."""

    message: str
    """First line of the error message."""

    cuda_error: str | None = None
    """CUDA error name, e.g. cudaErrorStreamCaptureUnsupported."""

    meaning: str | None = None
    """What the error means."""

    fix: str | None = None
    """What to do about it, where known."""

    rule: str | None = None
    """Matching code in the checks catalogue, where one exists."""

    module: str | None = None
    """Qualified name of the innermost module on the failing stack."""

    location: str | None = None
    """`file:line` of the innermost user frame on the failing stack."""

    step: int | None = None
    """Step at which it failed."""

    phase: str | None = None
    """Phase at which it failed."""

    traceback_tail: list[str] = field(default_factory=list)
    """Last frames of the traceback, `file:line in function`."""

    reported_as: str | None = None
    """What CUDA/torch reported at the point of failure when that is not the culprit (the 901
    cascade at capture_end), e.g. `cudaErrorStreamCaptureInvalidated at torch/cuda/graphs.py:126`."""

    stacks: tuple[RankStack, ...] = ()
    """A hang or timeout: every process's stack when it was stopped (ranks, then the launcher)."""

    also_at: tuple[str, ...] = ()
    """Other `file:line`s of the cause: where an attribute is set, where a hook function is defined, where
    Megatron replays a graph."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {
            "error_type": self.error_type,
            "message": self.message,
            "cuda_error": self.cuda_error,
            "meaning": self.meaning,
            "fix": self.fix,
            "rule": self.rule,
            "module": self.module,
            "location": self.location,
            "step": self.step,
            "phase": self.phase,
            "traceback_tail": list(self.traceback_tail),
            "reported_as": self.reported_as,
            "stacks": [s.to_dict() for s in self.stacks],
            "also_at": list(self.also_at),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        """Inverse of to_dict (reports without stacks have none)."""
        data = dict(data)
        data["stacks"] = tuple(RankStack.from_dict(s) for s in data.get("stacks") or ())
        data["also_at"] = tuple(str(a) for a in data.get("also_at") or ())
        return cls(**data)


__all__ = ["MAX_STACK_FRAMES", "Diagnosis", "RankExit", "RankStack", "TensorDiff",
           "Verdict"]
