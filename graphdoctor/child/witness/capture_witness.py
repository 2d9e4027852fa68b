"""CaptureWitness: the observer that attaches every watcher of the witness to one graphed child run and reports
their Hazard events at its end."""

from __future__ import annotations

import torch

from graphdoctor.child.witness.attributes import AttributeWatcher
from graphdoctor.child.witness.core import MAX_HAZARDS, Watcher, WitnessCore
from graphdoctor.child.witness.factories import FactoryWatcher
from graphdoctor.child.witness.fp8_scales import Fp8ScaleWatcher
from graphdoctor.child.witness.hooks import HookWatcher
from graphdoctor.child.witness.queries import CaptureQueryWatcher
from graphdoctor.child.witness.replays import EvalReplayWatcher
from graphdoctor.protocol.events import Event


class CaptureWitness:
    """Patches installed for one graphed child run; `finish()` returns its Hazard events.

    Only calls issued by the user's code count (graphdoctor.child.probe.recorder.is_user_file: not torch,
    megatron, transformer_engine, graphdoctor, the standard library or site-packages), so a clean model gives
    no evidence. The patches are Python wrappers with no kernel and no host synchronisation; they never change
    what runs on the device.

    Args:
        model: the model (its modules and parameters are named in the evidence).
        names: id(module) -> qualified name.
    """

    def __init__(self, model: torch.nn.Module, names: dict[int, str]) -> None:
        self.core = WitnessCore(model, names)
        self.attributes = AttributeWatcher(self.core)
        self.factories = FactoryWatcher(self.core)
        self.queries = CaptureQueryWatcher(self.core)
        self.replays = EvalReplayWatcher(self.core)
        self.hooks = HookWatcher(self.core, model)
        self.fp8_scales = Fp8ScaleWatcher(self.core)
        self.core.watch_captures()
        for watcher in (self.replays, self.queries, self.attributes, self.hooks, self.fp8_scales, self.factories):
            watcher.install()

    @property
    def watchers(self) -> tuple[Watcher, ...]:
        """Every watcher, in the order their end-of-run hazards are settled: the numbers and factories judged,
        then the eval replays placed after every hazard gathered so far, then the hook sites not yet reported."""
        return (self.attributes, self.factories, self.replays, self.hooks, self.queries, self.fp8_scales)

    @property
    def captures(self) -> int:
        """Captures begun so far."""
        return self.core.captures

    @captures.setter
    def captures(self, value: int) -> None:
        self.core.captures = value

    def begin_step(self, step: int, phase: str) -> None:
        """The step (and phase) later evidence belongs to."""
        self.core.step = step
        self.core.phase = phase

    def end_step(self, step: int, phase: str) -> None:
        """Nothing to do after a step (the evidence is kept as it happens)."""

    def finish(self) -> list[Event]:
        """Remove the patches; one Hazard per piece of evidence (at most MAX_HAZARDS)."""
        self.close()
        for watcher in self.watchers:
            watcher.settle()
        events: list[Event] = []
        events.extend(list(self.core.found.values())[:MAX_HAZARDS])
        return events

    def close(self) -> None:
        """Undo every patch (idempotent)."""
        self.core.close()


__all__ = ["CaptureWitness"]
