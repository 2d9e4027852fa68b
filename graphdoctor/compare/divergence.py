"""Where a graphed run first leaves the eager reference: the Divergence record and find_divergence, which
compares losses and reported values by value and main_grads and parameters by their bitwise fingerprints
(or element by element where a targeted re-run measured them). Pure Python on RunRecords.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphdoctor.compare.fp8_state import step_difference
from graphdoctor.compare.prints import FAMILIES, family_diff
from graphdoctor.compare.scaler import both_skipped, finite_difference, skip_difference
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.strict_json import nullable


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a graphed run first leaves the reference, and by how much overall."""

    step: int
    """First step whose loss, main_grads or parameters differ."""

    what: str
    """loss | reported | skipped | grads | params | fp8_state: the first quantity of that step that differs (in that
    order; `skipped`: fp16's loss scaler skipped the update in one run only, `key` says which; `fp8_state`: an FP8 scale or amax history, `tensor` its `module:what`; `reported`: a value the loss function reported, named by `key`); `eval` when every
    training step matches and the evaluation after `step` differs (its loss, or the value `key`)."""

    tensor: str | None
    """First differing tensor (parameter name) of that step, None for a loss-only difference."""

    max_abs: float
    """Largest absolute difference over every step and quantity."""

    max_rel: float
    """Largest relative difference over every step and quantity."""

    loss_max_abs: float
    """Largest absolute loss difference over every step."""

    measured: bool = True
    """The first differing tensors were compared element by element (max abs / max rel include
    them); False when only their fingerprints are known to differ."""

    key: str | None = None
    """The key of the first reported value that differs at that step (None when none does); `what`
    is `reported` when the loss is equal there."""

    backward_tensor: str | None = None
    """The first differing main_grad of that step in backward order (the last in parameter order); None
    when no main_grad differs there."""

    @property
    def label(self) -> str:
        """`loss`, `grads`, `params`, or `reported 'lm loss'`."""
        if self.what == "eval":
            return f"eval {self.key!r}" if self.key else "eval loss"
        if self.what == "fp8_state":
            return "FP8 state"
        if self.what == "skipped":
            return f"loss-scaler skip ({self.key})" if self.key else "loss-scaler skip"
        return f"reported {self.key!r}" if self.what == "reported" else self.what

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"step": self.step, "what": self.what, "key": self.key, "tensor": self.tensor,
                "max_abs": self.max_abs, "max_rel": self.max_rel,
                "loss_max_abs": self.loss_max_abs, "measured": self.measured,
                "backward_tensor": self.backward_tensor}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Divergence:
        """Inverse of to_dict."""
        return cls(step=int(data["step"]), what=str(data["what"]), tensor=data.get("tensor"),
                   max_abs=float(data["max_abs"]), max_rel=float(data["max_rel"]),
                   loss_max_abs=float(data.get("loss_max_abs", 0.0)), measured=bool(data.get("measured", True)),
                   key=nullable(str, data.get("key")),
                   backward_tensor=nullable(str, data.get("backward_tensor")))


def _loss_differs(a: float, b: float, rtol: float, atol: float) -> bool:
    if rtol == 0.0 and atol == 0.0:
        return a != b and not (a != a and b != b)  # NaN == NaN for our purpose
    return abs(a - b) > atol + rtol * abs(b)


def _reported_differences(ref: StepRecord, rec: StepRecord, rtol: float,
                          atol: float) -> tuple[list[str], float, float]:
    """Keys whose reported values differ at one step, in the reference's order (a key only one side
    reported differs), with the largest absolute and relative difference of the values."""
    theirs = dict(rec.reported)
    ours = dict(ref.reported)
    differing: list[str] = []
    max_abs = max_rel = 0.0
    for key, value in ref.reported:
        if key not in theirs:
            differing.append(key)
            continue
        delta = abs(theirs[key] - value)
        if delta == delta:  # NaN on either side contributes no magnitude
            max_abs = max(max_abs, delta)
            if value:
                max_rel = max(max_rel, delta / abs(value))
        if _loss_differs(theirs[key], value, rtol, atol):
            differing.append(key)
    differing += [key for key in theirs if key not in ours]
    return differing, max_abs, max_rel


def find_divergence(reference: RunRecord, graphed: RunRecord, *, rtol: float = 0.0,
                    atol: float = 0.0) -> Divergence | None:
    """First step where `graphed` leaves `reference`, with maxima over what was measured; None when
    they agree.

    Losses and reported values compare by value (bitwise, or within rtol/atol). main_grads, parameters and
    FP8 state (scales, amax histories) compare by the steps' bitwise fingerprints, or element by element where the graphed
    run measured them (a targeted re-run); only measured comparisons contribute max abs / max rel.
    """
    ref_steps = {s.step: s for s in reference.steps}
    names = graphed.tensor_names or reference.tensor_names
    first: tuple[int, str, str | None, str | None, str | None] | None = None
    max_abs = max_rel = loss_max = 0.0
    measured = True
    for rec in graphed.steps:
        ref = ref_steps.get(rec.step)
        if ref is None:
            continue
        loss_abs = abs(rec.loss - ref.loss)
        loss_max = max(loss_max, loss_abs)
        max_abs = max(max_abs, loss_abs)
        if ref.loss:
            max_rel = max(max_rel, loss_abs / abs(ref.loss))
        candidates: list[tuple[str, str | None]] = []
        if _loss_differs(rec.loss, ref.loss, rtol, atol):
            candidates.append(("loss", None))
        keys, reported_abs, reported_rel = _reported_differences(ref, rec, rtol, atol)
        max_abs, max_rel = max(max_abs, reported_abs), max(max_rel, reported_rel)
        if keys:
            candidates.append(("reported", None))
        skip = skip_difference(ref, rec)
        if skip is not None:
            candidates.append(("skipped", None))
        unmeasured = False
        backward = None
        for what in FAMILIES:
            diff = family_diff(names, ref, rec, what)
            if diff is None or (what == "grads" and both_skipped(ref, rec) and not finite_difference(diff)):
                continue  # both loss scalers discarded these gradients (compare.scaler notes where they differ)
            if diff.measured:
                max_abs = max(max_abs, diff.max_abs)
                max_rel = max(max_rel, diff.max_rel)
            if not diff.equal:
                candidates.append((what, diff.first_tensor))
                if what == "grads":
                    backward = diff.last_tensor
                unmeasured = unmeasured or not diff.measured
        fp8 = step_difference(reference, graphed, ref, rec)
        if fp8 is not None:
            candidates.append(("fp8_state", fp8))
            unmeasured = True
        if candidates and first is None:
            tensor = next((t for _, t in candidates if t is not None), None)
            first = (rec.step, candidates[0][0], tensor, skip if candidates[0][0] == "skipped" else
                     keys[0] if keys else None, backward)
            measured = not unmeasured
    if first is None:
        return None
    return Divergence(step=first[0], what=first[1], tensor=first[2], max_abs=max_abs,
                      max_rel=max_rel, loss_max_abs=loss_max, measured=measured, key=first[3],
                      backward_tensor=first[4])


__all__ = ["Divergence", "find_divergence"]
