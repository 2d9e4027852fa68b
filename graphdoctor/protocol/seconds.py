"""Where one child's seconds went: start-up, set-up, training, each observer, comparison, teardown, and when
its process started and ended (the diff's timeline: docs/diff.md, "What a diff costs")."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

OBSERVER_NAMES: tuple[str, ...] = ("memory", "launches", "phases", "none_mask", "witness", "holders")
"""The observers a child can attach (graphdoctor.child.observers), as the seconds name them."""

STAGE_NAMES: tuple[str, ...] = ("template", "interpreter", "imports", "megatron_args", "distributed", "model", "ddp",
                                "optimizer", "graphs", "observers", "taps")
"""A child's start-up and set-up stages, in order, as the seconds name them: `template` (a child forked from the
template process: the parent's request to the child's entry, mostly the wait for the template's imports) or
`interpreter` (a child started as its own interpreter: spawn to the child's entry), `imports` (torch and Megatron,
the memory gate's wait taken out), `megatron_args` (the child's model
description and Megatron's TransformerConfig), `distributed` (process group, model-parallel groups, seeds),
`model` (Megatron's builder, weights initialised, moved to the GPU), `ddp` (Megatron DDP), `optimizer`
(get_megatron_optimizer), `graphs` (FullCudaGraphWrapper or TECudaGraphHelper, the forward step), `observers`
(attached) and `taps` (installed)."""


class StageClock:
    """Seconds of each named stage of a child's set-up (STAGE_NAMES), added up when a stage runs twice."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        """Count `seconds` to stage `name`."""
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, seconds)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage `name` (counted even when it raises)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)


@dataclass(frozen=True, slots=True)
class ChildSeconds:
    """One child process's wall time, split. The parts add up to its wall time, less the parent's own
    bookkeeping around the process (spawn and the read of its events)."""

    startup_s: float = 0.0
    """Spawn to the start of set-up: the interpreter and the imports of torch and graphdoctor's child."""
    setup_s: float = 0.0
    """Set-up: process group, model build, DDP, optimizer, observers attached."""
    waited_s: float = 0.0
    """Waiting at the parent's gate after set-up, for its plan-time checks (graphdoctor.protocol.gate)."""
    train_s: float = 0.0
    """The training steps themselves (observers' and comparison's seconds taken out)."""
    observers: dict[str, float] = field(default_factory=dict)
    """Seconds each observer took, by name (OBSERVER_NAMES): its hooks and analysis, and for `launches`
    the extra profiled step."""
    hooks: dict[str, float] = field(default_factory=dict)
    """Of each observer's seconds, those of its step hooks (the part that recurs every step; the rest is
    attaching, capture-time work and its finish)."""
    watched: dict[str, dict[str, int]] = field(default_factory=dict)
    """What each observer watched every step, counted by kind, where it reports it (the holder watch: its tensor,
    number and generator paths): the size behind its hooks' seconds."""
    compare_s: float = 0.0
    """Fingerprints of every step, and saving or comparing reference tensors (targeted re-runs)."""
    teardown_s: float = 0.0
    """After the end event: graphs released, process group destroyed."""
    started_at: float = 0.0
    """time.time() when the parent started the process (0.0: unknown)."""
    ended_at: float = 0.0
    """time.time() when the parent saw it exit."""
    stages: dict[str, float] = field(default_factory=dict)
    """Of start-up and set-up, the seconds of each stage (STAGE_NAMES) the child timed."""

    @property
    def observers_s(self) -> float:
        """All observers together."""
        return sum(self.observers.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON view (docs/diff.md)."""
        return {"startup_s": self.startup_s, "setup_s": self.setup_s, "waited_s": self.waited_s,
                "train_s": self.train_s,
                "observers": dict(self.observers), "observers_s": self.observers_s, "hooks": dict(self.hooks),
                "watched": {k: dict(v) for k, v in self.watched.items()}, "compare_s": self.compare_s,
                "teardown_s": self.teardown_s, "started_at": self.started_at, "ended_at": self.ended_at,
                "stages": dict(self.stages)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChildSeconds:
        """Inverse of to_dict."""
        observers = data.get("observers") or {}
        return cls(startup_s=float(data.get("startup_s", 0.0)), setup_s=float(data.get("setup_s", 0.0)),
                   waited_s=float(data.get("waited_s", 0.0)),
                   train_s=float(data.get("train_s", 0.0)),
                   observers={str(k): float(v) for k, v in observers.items()},
                   hooks={str(k): float(v) for k, v in (data.get("hooks") or {}).items()},
                   watched={str(k): {str(n): int(c) for n, c in (v or {}).items()}
                            for k, v in (data.get("watched") or {}).items()},
                   compare_s=float(data.get("compare_s", 0.0)), teardown_s=float(data.get("teardown_s", 0.0)),
                   started_at=float(data.get("started_at", 0.0)), ended_at=float(data.get("ended_at", 0.0)),
                   stages={str(k): float(v) for k, v in (data.get("stages") or {}).items()})

    def plus(self, other: ChildSeconds) -> ChildSeconds:
        """Two processes of one run (a checkpoint's first process and the resumed one), added; the timeline
        from the first's start to the second's end."""
        names = {*self.observers, *other.observers}
        return ChildSeconds(
            startup_s=self.startup_s + other.startup_s, setup_s=self.setup_s + other.setup_s,
            waited_s=self.waited_s + other.waited_s,
            train_s=self.train_s + other.train_s,
            observers={n: self.observers.get(n, 0.0) + other.observers.get(n, 0.0) for n in sorted(names)},
            hooks={n: self.hooks.get(n, 0.0) + other.hooks.get(n, 0.0) for n in sorted({*self.hooks, *other.hooks})},
            watched={**self.watched, **other.watched},
            compare_s=self.compare_s + other.compare_s, teardown_s=self.teardown_s + other.teardown_s,
            started_at=self.started_at or other.started_at, ended_at=other.ended_at or self.ended_at,
            stages={n: self.stages.get(n, 0.0) + other.stages.get(n, 0.0)
                    for n in dict.fromkeys([*self.stages, *other.stages])})


__all__ = ["OBSERVER_NAMES", "STAGE_NAMES", "ChildSeconds", "StageClock"]
