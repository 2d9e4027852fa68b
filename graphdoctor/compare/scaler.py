"""fp16's loss scaler in the comparison: the steps it skipped in each run, and what a skipped step's gradients say.

Megatron's fp16 optimizer skips its update when the scaled gradients hold an inf or a NaN (the scaler then backs
off). A skipped step's gradients are non-finite in both runs and discarded by both; fp16 runs fingerprint them with
every NaN alike (graphdoctor.compare.bitprint, canonical_nan), so they compare by where their non-finite values
are. Where both runs skipped a step, differing main_grads are not a divergence but their own note; where one run
skipped and the other updated, the skip decision is the first difference of that step (find_divergence). A
skipped step whose gradients were measured element by element (a targeted re-run) is compared like any other:
finite values that differ are a divergence, though both runs discarded them. Pure Python on RunRecords.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from graphdoctor.compare.prints import family_diff
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.types import TensorDiff


def skip_difference(reference: StepRecord, graphed: StepRecord) -> str | None:
    """`eager updated, graphed skipped` (or the other way) when the two runs' optimizers decided differently at
    one step; None when they agree."""
    if reference.skipped == graphed.skipped:
        return None
    return "eager skipped, graphed updated" if reference.skipped else "eager updated, graphed skipped"


def both_skipped(reference: StepRecord, graphed: StepRecord) -> bool:
    """Both runs' loss scalers skipped the step: its gradients were discarded by both."""
    return reference.skipped and graphed.skipped


def steps_named(steps: Iterable[int]) -> str:
    """`step 15` or `steps 0-14, 17`."""
    ordered = sorted(set(steps))
    return f"{'step' if len(ordered) == 1 else 'steps'} {step_ranges(ordered)}"


def finite_difference(diff: TensorDiff) -> bool:
    """Whether a skipped step's gradient comparison shows finite values that differ (a divergence, though both runs
    discarded them): measured element by element, with a finite largest difference. An infinite one is a non-finite
    value where the other run has another value (the non-finite pattern differs: its own note); the fingerprints
    alone cannot tell the two apart."""
    return diff.measured and not diff.equal and math.isfinite(diff.max_abs)


def step_ranges(steps: Iterable[int]) -> str:
    """`0-14, 17, 19-20`: sorted steps as ranges."""
    ordered = sorted(set(steps))
    parts: list[str] = []
    start = prev = None
    for step in ordered:
        if start is None:
            start = prev = step
        elif step == prev + 1:  # type: ignore[operator]
            prev = step
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = step
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def scaler_notes(reference: RunRecord, graphed: RunRecord) -> tuple[str, ...]:
    """The loss scaler's skipped steps in both runs, in one line each: skipped by both, by one only, and skipped
    steps whose non-finite main_grads sit in other places in the two runs."""
    ref_steps = {s.step: s for s in reference.steps if not s.profiled}
    pairs = [(ref_steps[s.step], s) for s in graphed.steps if s.step in ref_steps and not s.profiled]
    if not any(r.skipped or g.skipped for r, g in pairs):
        return ()
    impl = graphed.impl
    names = graphed.tensor_names or reference.tensor_names
    both = [g.step for r, g in pairs if both_skipped(r, g)]
    eager_only = [g.step for r, g in pairs if r.skipped and not g.skipped]
    graphed_only = [g.step for r, g in pairs if g.skipped and not r.skipped]
    notes = []
    if both:
        notes.append(f"{steps_named(both)} skipped by the loss scaler in both runs (non-finite gradients): "
                     "their main_grads compare by where the non-finite values are, and neither run updated")
    if graphed_only:
        notes.append(f"{steps_named(graphed_only)} skipped by the loss scaler in {impl} only (eager updated)")
    if eager_only:
        notes.append(f"{steps_named(eager_only)} skipped by the loss scaler in eager only ({impl} updated)")
    moved: dict[int, int] = {}
    patterns: list[int] = []
    for ref, rec in pairs:
        if not both_skipped(ref, rec):
            continue
        diff = family_diff(names, ref, rec, "grads")
        if diff is None or diff.equal or finite_difference(diff):
            continue  # equal, or finite values that differ: find_divergence's
        moved[rec.step] = diff.num_unequal
        if diff.measured:
            patterns.append(rec.step)
    if moved:
        first = min(moved)
        count = f"{moved[first]} tensor{'s' if moved[first] != 1 else ''}"
        measured = (f"; measured at {steps_named(patterns)}: non-finite values where the other run has other "
                    "values" if patterns else "")
        notes.append(f"{steps_named(moved)}: both runs skipped and discarded their main_grads, which differ ({count} "
                     f"at step {first}{measured}); not a divergence, since neither run used them")
    return tuple(notes)


__all__ = ["both_skipped", "finite_difference", "scaler_notes", "skip_difference", "step_ranges", "steps_named"]
