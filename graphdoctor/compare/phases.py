"""The run schedule's phases compared: evaluation losses per evaluation, logged values (reported and
tracker values) that stay frozen across replays while eager's change, and the phase of a difference
after a checkpoint resume. Pure Python on RunRecords.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphdoctor.compare.divergence import Divergence, find_divergence
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.rules import rule_fix
from graphdoctor.types import EvalRecord, RankExit

EVAL_DIVERGENCE_RULE = "GD514"
"""Catalogue rule of an evaluation that differs from eager (checks/gd5xx_schedule.py)."""

FROZEN_VALUE_RULE = "GD513"
"""Catalogue rule of a logged value frozen at capture (checks/gd5xx_schedule.py)."""

CAPTURE_VALUE_RULE = "GD515"
"""Catalogue rule of a logged value that differs only at the capture iteration (checks/gd5xx_schedule.py)."""

MIN_REPLAYS = 2
"""Replay steps needed before a constant value counts as frozen."""


@dataclass(frozen=True, slots=True)
class EvalDivergence:
    """The first evaluation whose loss or a reported value differs from eager."""

    index: int
    after_step: int
    final: bool
    what: str
    """`loss` or `reported` (then `key` names the value)."""
    key: str | None
    eager: float
    graphed: float

    @property
    def label(self) -> str:
        """`loss` or `reported 'lm loss'`."""
        return f"reported {self.key!r}" if self.what == "reported" else self.what

    def note(self, steps_match: bool) -> str:
        """The ImplResult note naming the phase and the catalogue rule."""
        which = "final evaluation" if self.final else f"evaluation {self.index}"
        tail = " while every training step matches" if steps_match else ""
        return (f"{EVAL_DIVERGENCE_RULE} eval-after-train-divergence: phase eval: {which} (after step "
                f"{self.after_step}) differs in {self.label}: eager {self.eager!r}, graphed {self.graphed!r}{tail}")


@dataclass(frozen=True, slots=True)
class FrozenValue:
    """A logged value constant over the graphed run's replays while eager's changes over those steps."""

    key: str
    steps: tuple[int, ...]
    """The replay steps compared."""
    value: float
    """The graphed value at every one of them."""

    def note(self) -> str:
        """The ImplResult note naming the phase, the key and the catalogue rule."""
        return (f"{FROZEN_VALUE_RULE} frozen-logged-value: phase train: {self.key!r} stays {self.value!r} over "
                f"replay steps {self.steps[0]}-{self.steps[-1]} while eager's changes")


def _differs(a: float, b: float, rtol: float, atol: float) -> bool:
    if a != a and b != b:  # both NaN
        return False
    if rtol == 0.0 and atol == 0.0:
        return a != b
    return abs(a - b) > atol + rtol * abs(b)


def _first_eval_difference(ref: EvalRecord, rec: EvalRecord, rtol: float,
                           atol: float) -> tuple[str, str | None, float, float] | None:
    if _differs(rec.loss, ref.loss, rtol, atol):
        return "loss", None, ref.loss, rec.loss
    theirs = dict(rec.reported)
    for key, value in ref.reported:
        if key not in theirs or _differs(theirs[key], value, rtol, atol):
            return "reported", key, value, theirs.get(key, float("nan"))
    return None


def find_eval_divergence(reference: RunRecord, graphed: RunRecord, *, rtol: float = 0.0,
                         atol: float = 0.0) -> EvalDivergence | None:
    """The first evaluation (in order) whose loss or reported values differ; an evaluation only the
    eager run has (the graphed run stopped early) is not judged here."""
    for ref, rec in zip(reference.evals, graphed.evals, strict=False):
        found = _first_eval_difference(ref, rec, rtol, atol)
        if found is not None:
            what, key, eager, value = found
            return EvalDivergence(index=ref.index, after_step=ref.after_step, final=ref.final, what=what,
                                  key=key, eager=eager, graphed=value)
    return None


def _replays(run: RunRecord) -> list[StepRecord]:
    return [s for s in run.steps if s.phase == "replay" and not s.profiled]


def find_frozen_values(reference: RunRecord, graphed: RunRecord) -> tuple[FrozenValue, ...]:
    """Logged values (the step's reported and tracker values) that are the same number at every
    replay step of the graphed run while the eager run's values at those steps are not all equal."""
    replays = _replays(graphed)
    if len(replays) < MIN_REPLAYS:
        return ()
    eager_by_step = {s.step: dict(s.reported) for s in reference.steps}
    frozen: list[FrozenValue] = []
    for key, _ in replays[0].reported:
        ours = [dict(s.reported).get(key) for s in replays]
        theirs = [eager_by_step.get(s.step, {}).get(key) for s in replays]
        if any(v is None for v in ours) or any(v is None for v in theirs):
            continue
        if len(set(ours)) == 1 and len(set(theirs)) > 1:
            frozen.append(FrozenValue(key=key, steps=tuple(s.step for s in replays), value=float(ours[0])))  # type: ignore[arg-type]
    return tuple(frozen)


@dataclass(frozen=True, slots=True)
class CaptureLoggedValue:
    """A logged value that differs from eager's at a step of the graphed run's `capture` phase."""

    key: str
    step: int
    eager: float
    graphed: float

    @property
    def ratio(self) -> float | None:
        """graphed / eager (None when eager is 0)."""
        return self.graphed / self.eager if self.eager else None

    def note(self) -> str:
        """The ImplResult note naming the phase, the key, both values and the catalogue rule."""
        ratio = f" (ratio {self.ratio:.3f})" if self.ratio is not None else ""
        return (f"{CAPTURE_VALUE_RULE} logged-value-at-capture: phase capture: {self.key!r} at step {self.step}: "
                f"eager {self.eager!r}, graphed {self.graphed!r}{ratio}; the loss and every gradient and "
                "parameter match: the warmup and capture passes of that iteration added to the logged value "
                "(Megatron's MoE aux-loss tracker), so the value logged there is not the step's")


def find_capture_logged_values(reference: RunRecord, graphed: RunRecord, *, rtol: float = 0.0,
                               atol: float = 0.0) -> tuple[CaptureLoggedValue, ...]:
    """Reported (and tracker) values that differ from eager's at the graphed run's capture steps,
    for keys both runs reported there."""
    eager_by_step = {s.step: dict(s.reported) for s in reference.steps}
    found: list[CaptureLoggedValue] = []
    for rec in graphed.steps:
        eager = eager_by_step.get(rec.step)
        if rec.phase != "capture" or eager is None:
            continue
        for key, value in rec.reported:
            theirs = eager.get(key)
            if theirs is not None and _differs(value, theirs, rtol, atol):
                found.append(CaptureLoggedValue(key=key, step=rec.step, eager=theirs, graphed=value))
    return tuple(found)


def with_eager_capture_values(graphed: RunRecord, values: tuple[CaptureLoggedValue, ...]) -> RunRecord:
    """`graphed` with each of `values` replaced by eager's: what it would be if the capture passes had
    not added to the logged values (the verdict is judged on everything else)."""
    patch: dict[int, dict[str, float]] = {}
    for v in values:
        patch.setdefault(v.step, {})[v.key] = v.eager
    steps = tuple(dataclasses.replace(s, reported=tuple((k, patch[s.step].get(k, x)) for k, x in s.reported))
                  if s.step in patch else s for s in graphed.steps)
    return dataclasses.replace(graphed, steps=steps)


def phase_list(run: RunRecord) -> tuple[str, ...]:
    """The phases a run went through, in order of first appearance (e.g. capture, replay, eval)."""
    seen: list[str] = []
    for item in _timeline(run):
        if item not in seen:
            seen.append(item)
    return tuple(seen)


def _timeline(run: RunRecord) -> list[str]:
    evals_after: dict[int, list[EvalRecord]] = {}
    for e in run.evals:
        evals_after.setdefault(e.after_step, []).append(e)
    saved_after = {c.iteration - 1 for c in run.checkpoints if c.action == "save"}
    out: list[str] = []
    resumed = False
    for s in run.steps:
        if s.resumed and not resumed:
            out.append("resume")
            resumed = True
        out.append(s.phase)
        out.extend("eval" for _ in evals_after.get(s.step, ()))
        if s.step in saved_after and not s.resumed:
            out.append("checkpoint")
    return out


def resumed_steps(run: RunRecord) -> tuple[StepRecord, ...]:
    """The steps the resumed process of a --resume run trained (none without one)."""
    return tuple(s for s in run.steps if s.resumed)


def phases_summary(run: RunRecord) -> dict[str, Any]:
    """Counts per phase for the report: training steps by phase, evaluations, the training steps
    right after an evaluation (each compared like every other step), the checkpoint save and load
    (step and seconds) and the steps of the resumed process by phase."""
    counts: dict[str, int] = {}
    for s in run.steps:
        counts[s.phase] = counts.get(s.phase, 0) + 1
    after_eval = {e.after_step + 1 for e in run.evals}
    after_resume: dict[str, int] = {}
    for s in resumed_steps(run):
        after_resume[s.phase] = after_resume.get(s.phase, 0) + 1
    return {"steps": counts, "evals": len(run.evals),
            "steps_after_eval": sum(1 for s in run.steps if s.step in after_eval),
            "checkpoints": [(c.action, c.iteration, c.seconds) for c in run.checkpoints],
            "steps_after_resume": after_resume}


def resume_note(run: RunRecord, step: int, what: str) -> str | None:
    """The note naming phase resume when a run's first difference (`what` at `step`; an evaluation's
    after that step) lies in its resumed process; None when it does not."""
    resumed = resumed_steps(run)
    if not resumed or step < resumed[0].step:
        return None
    start = resumed[0].step
    here = next((s.phase for s in resumed if s.step == step), None)
    where = f"after step {step}" if what == "eval" else f"at step {step} ({here} in the new process)"
    return (f"phase resume: the first difference ({what}) is {where}, {step - start + 1} step(s) into the process "
            f"resumed from the checkpoint saved after step {start - 1}; every step before the checkpoint matches")


def eval_divergence(reference: RunRecord, graphed: RunRecord, *, rtol: float, atol: float) -> Divergence | None:
    """A Divergence of `what="eval"` at the first differing evaluation's step (training matched)."""

    found = find_eval_divergence(reference, graphed, rtol=rtol, atol=atol)
    if found is None:
        return None
    diff = abs(found.graphed - found.eager)
    return Divergence(step=found.after_step, what="eval", tensor=None, max_abs=diff,
                      max_rel=diff / abs(found.eager) if found.eager else diff, loss_max_abs=0.0, key=found.key)


def capture_only_values(reference: RunRecord, graphed: RunRecord, divergence: Divergence | None, *, rtol: float,
                        atol: float) -> tuple[tuple[str, ...], Divergence | None]:
    """(GD515 notes, divergence): when the only differences are reported values at capture steps (loss,
    gradients, parameters, every other step's values equal), a note per value and no divergence;
    otherwise no note and `divergence` unchanged."""

    if divergence is None or divergence.what != "reported":
        return (), divergence
    values = find_capture_logged_values(reference, graphed, rtol=rtol, atol=atol)
    if not values or find_divergence(reference, with_eager_capture_values(graphed, values),
                                     rtol=rtol, atol=atol) is not None:
        return (), divergence
    return tuple(v.note() for v in values), None


def schedule_notes(reference: RunRecord, graphed: RunRecord, *, rtol: float, atol: float,
                   steps_match: bool) -> tuple[str, ...]:
    """Notes naming the run schedule's phase and rule: each frozen logged value (GD513) and the first
    differing evaluation (GD514)."""

    notes = [f.note() for f in find_frozen_values(reference, graphed)]
    found = find_eval_divergence(reference, graphed, rtol=rtol, atol=atol)
    if found is not None:
        notes.append(found.note(steps_match))
    return tuple(notes)


def resume_notes(graphed: RunRecord, divergence: Divergence) -> tuple[str, ...]:
    """The phase-resume note when the first difference lies in the resumed process (--resume)."""

    note = resume_note(graphed, divergence.step, divergence.what)
    return () if note is None else (note,)


TEARDOWN_RULE = "GD516"
"""Catalogue rule of a process that did not exit after writing its results (checks/gd5xx_schedule.py)."""


def teardown_note(exits: Sequence[RankExit]) -> str | None:
    """The `teardown-hang` finding of a run whose ranks hung at exit, or None."""
    hung = [e for e in exits if e.hung]
    if not hung:
        return None
    who = ", ".join(f"rank {e.rank}" + (f" (in {e.stack.waiting_in or e.stack.frames[0]})"
                                        if e.stack and e.stack.frames else "") for e in hung)
    alive = max(e.graphs_alive for e in hung)
    kept = (f"; {alive} CUDA graph{'s' if alive != 1 else ''} still alive at destroy_process_group after "
            "Megatron's own graphs were deleted (kept by code outside Megatron-Core)" if alive else "")
    return (f"{TEARDOWN_RULE} teardown-hang: phase exit: {who} did not exit within the bound after writing its "
            f"results (destroy_process_group){kept}; the results stand; fix: {rule_fix(TEARDOWN_RULE)}")


__all__ = ["CAPTURE_VALUE_RULE", "EVAL_DIVERGENCE_RULE", "FROZEN_VALUE_RULE", "TEARDOWN_RULE", "CaptureLoggedValue",
           "EvalDivergence", "FrozenValue", "capture_only_values", "eval_divergence",
           "find_capture_logged_values", "find_eval_divergence", "find_frozen_values", "phase_list",
           "phases_summary", "resume_note", "resume_notes", "resumed_steps", "schedule_notes", "teardown_note",
           "with_eager_capture_values"]
