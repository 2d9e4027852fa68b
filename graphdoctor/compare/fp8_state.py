"""FP8 state of two runs compared step by step, as main_grads and parameters are: the fingerprints of every
module's scale and amax history (delayed scaling) and FP8 weights' scale inverses (graphdoctor.child.fp8_state),
the first differing module and step named. Pure Python on RunRecords."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphdoctor.compare.prints import prints_diff
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.strict_json import nullable


def module_of(name: str) -> str:
    """The module of a state tensor's name (`decoder.layers.0.mlp.linear_fc1:fwd.scale`)."""
    return name.partition(":")[0]


def step_layout(run: RunRecord, step: StepRecord) -> tuple[str, ...] | None:
    """The FP8 state tensors a step fingerprinted, None when it fingerprinted none."""
    if step.prints is None or step.prints.fp8_layout < 0 or step.prints.fp8_layout >= len(run.fp8_layouts):
        return None
    return run.fp8_layouts[step.prints.fp8_layout]


def step_difference(reference: RunRecord, graphed: RunRecord, ref: StepRecord, rec: StepRecord) -> str | None:
    """The first state tensor that differs at one step (`module:what`); when the two runs hold other
    state tensors there (the first tensor one has and the other not), None when they agree or there is nothing
    to compare."""
    ours, theirs = step_layout(reference, ref), step_layout(graphed, rec)
    if ours is None or theirs is None:
        return None
    if ours != theirs:
        apart = [b for a, b in zip(ours, theirs, strict=False) if a != b]
        longer = theirs if len(theirs) > len(ours) else ours
        return apart[0] if apart else longer[min(len(ours), len(theirs))]
    assert ref.prints is not None and rec.prints is not None
    diff = prints_diff(ours, ref.prints.fp8, rec.prints.fp8)
    return diff.first_tensor


@dataclass(frozen=True, slots=True)
class Fp8StateDiff:
    """The FP8 state of a graphed run against eager: how much was compared and where it first differs."""

    tensors: int
    """State tensors per step (the graphed run's first layout)."""
    modules: int
    """Modules holding them."""
    steps: int
    """Steps compared."""
    first_step: int | None = None
    """First step whose state differs (None: equal at every compared step)."""
    first_tensor: str | None = None
    """The first differing tensor there (`module:what`)."""
    differing_steps: tuple[int, ...] = ()

    @property
    def equal(self) -> bool:
        return self.first_step is None

    @property
    def module(self) -> str | None:
        """The first differing tensor's module."""
        return None if self.first_tensor is None else module_of(self.first_tensor)

    def line(self) -> str:
        """`FP8 state: 16 tensors in 8 modules, equal at 8 steps` or where it first differs."""
        held = f"{self.tensors} tensors in {self.modules} modules"
        if self.equal:
            return f"FP8 state: {held}, equal at {self.steps} steps"
        return (f"FP8 state: {held}, first differs at step {self.first_step} in {self.module} "
                f"({self.first_tensor.partition(':')[2] if self.first_tensor else ''}); "
                f"{len(self.differing_steps)} of {self.steps} steps differ")

    def to_dict(self) -> dict[str, Any]:
        """JSON view (docs/fp8.md, `impls[].fp8_state`)."""
        return {"tensors": self.tensors, "modules": self.modules, "steps": self.steps, "first_step": self.first_step,
                "first_tensor": self.first_tensor, "first_module": self.module,
                "differing_steps": list(self.differing_steps)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fp8StateDiff:
        """Inverse of to_dict."""
        return cls(tensors=int(data["tensors"]), modules=int(data["modules"]), steps=int(data["steps"]),
                   first_step=nullable(int, data.get("first_step")),
                   first_tensor=nullable(str, data.get("first_tensor")),
                   differing_steps=tuple(int(s) for s in data.get("differing_steps") or ()))


def compare_fp8_state(reference: RunRecord, graphed: RunRecord) -> Fp8StateDiff | None:
    """The FP8 state comparison of two runs; None when neither fingerprinted FP8 state."""
    if not reference.fp8_layouts and not graphed.fp8_layouts:
        return None
    names = (graphed.fp8_layouts or reference.fp8_layouts)[0]
    by_step = {s.step: s for s in reference.steps}
    compared = 0
    first: tuple[int, str] | None = None
    differing: list[int] = []
    for rec in graphed.steps:
        ref = by_step.get(rec.step)
        if ref is None or step_layout(reference, ref) is None or step_layout(graphed, rec) is None:
            continue
        compared += 1
        tensor = step_difference(reference, graphed, ref, rec)
        if tensor is not None:
            differing.append(rec.step)
            if first is None:
                first = (rec.step, tensor)
    return Fp8StateDiff(tensors=len(names), modules=len({module_of(n) for n in names}), steps=compared,
                        first_step=first[0] if first else None, first_tensor=first[1] if first else None,
                        differing_steps=tuple(differing))


__all__ = ["Fp8StateDiff", "compare_fp8_state", "module_of", "step_difference", "step_layout"]
