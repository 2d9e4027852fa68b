"""Step fingerprints of two runs -> which tensors differ (pure Python; the fingerprints themselves are
computed on the GPU by graphdoctor.compare.bitprint inside each child)."""

from __future__ import annotations

from graphdoctor.errors import GraphDoctorError
from graphdoctor.protocol.lanes import NUM_LANES, BitprintError, differing_tensors, pairs
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.types import TensorDiff

FAMILIES: tuple[str, ...] = ("grads", "params")


class TensorMismatchError(GraphDoctorError):
    """Two runs fingerprinted different tensors (not the same model)."""


def prints_diff(names: tuple[str, ...], reference: tuple[int, ...], graphed: tuple[int, ...]) -> TensorDiff:
    """Which tensors' fingerprints differ, as a TensorDiff without magnitudes (measured=False).

    Raises:
        TensorMismatchError: the runs fingerprinted different numbers of tensors.
    """
    try:
        unequal = differing_tensors(pairs(reference), pairs(graphed))
    except BitprintError as exc:
        raise TensorMismatchError(f"{exc}: the runs did not build the same model") from None
    num = len(reference) // NUM_LANES
    def name(i: int) -> str:
        return names[i] if i < len(names) else f"tensor {i}"

    return TensorDiff(num_tensors=num, num_unequal=len(unequal), max_abs=0.0, max_rel=0.0,
                      first_tensor=name(unequal[0]) if unequal else None, measured=False,
                      last_tensor=name(unequal[-1]) if unequal else None)


def family_diff(names: tuple[str, ...], reference: StepRecord, graphed: StepRecord, family: str) -> TensorDiff | None:
    """The comparison of one family at one step: the element-wise one when the graphed run measured
    it (a targeted re-run), else the fingerprints', else None (nothing to compare)."""
    measured: TensorDiff | None = getattr(graphed, family)
    if measured is not None:
        return measured
    if reference.prints is None or graphed.prints is None:
        return None
    return prints_diff(names, getattr(reference.prints, family), getattr(graphed.prints, family))


def differing_steps(names: tuple[str, ...], reference: tuple[StepRecord, ...],
                    graphed: tuple[StepRecord, ...]) -> tuple[int, ...]:
    """Steps at which some main_grad or parameter fingerprint differs."""
    by_step = {s.step: s for s in reference}
    found = []
    for rec in graphed:
        ref = by_step.get(rec.step)
        if ref is None or ref.prints is None or rec.prints is None:
            continue
        if any(not prints_diff(names, getattr(ref.prints, f), getattr(rec.prints, f)).equal for f in FAMILIES):
            found.append(rec.step)
    return tuple(found)


__all__ = ["FAMILIES", "TensorMismatchError", "differing_steps", "family_diff", "prints_diff"]
