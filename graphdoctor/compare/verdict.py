"""(reference RunRecord, graphed RunRecord[, control pair]) -> ImplResult with a Verdict.

Pure Python over recorded statistics: first divergent step and tensor, maximum differences, steady-state
step times, and the verdict rules of `graphdoctor diff` (documented in docs/diff.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from graphdoctor.compare.cause import Cause
from graphdoctor.compare.divergence import Divergence, find_divergence
from graphdoctor.compare.experts import ExpertsDiff, compare_experts
from graphdoctor.compare.forensics import Forensics
from graphdoctor.compare.fp8_state import Fp8StateDiff, compare_fp8_state
from graphdoctor.compare.phases import (
    EVAL_DIVERGENCE_RULE,
    capture_only_values,
    eval_divergence,
    phase_list,
    resume_notes,
    schedule_notes,
)
from graphdoctor.compare.scaler import scaler_notes
from graphdoctor.launches.compare import LaunchComparison, compare_launches
from graphdoctor.memory.sections import MemorySection
from graphdoctor.protocol.record import ENVIRONMENT_FAILED, RunRecord
from graphdoctor.protocol.spec import impl_name
from graphdoctor.types import Diagnosis, Verdict


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Median, min and max CUDA-event time of one run's steady-state steps."""

    median_ms: float
    min_ms: float
    max_ms: float
    num_steps: int

    @classmethod
    def of(cls, times: list[float]) -> StepTimes | None:
        """The statistics of `times` (None when there is none)."""
        if not times:
            return None
        return cls(median_ms=statistics.median(times), min_ms=min(times), max_ms=max(times),
                   num_steps=len(times))

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms,
                "num_steps": self.num_steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTimes:
        """Inverse of to_dict."""
        return cls(median_ms=float(data["median_ms"]), min_ms=float(data["min_ms"]),
                   max_ms=float(data["max_ms"]), num_steps=int(data["num_steps"]))


@dataclass(frozen=True, slots=True)
class Timing:
    """Steady-state step time of eager and graphed (CUDA events over replay steps after the first
    SETTLE_STEPS; capture, warmup and profiled steps excluded) and the speedup with its spread."""

    eager: StepTimes | None
    graphed: StepTimes | None
    quiet: bool = True
    """Every timed step ran while no other graphdoctor child used that GPU."""

    @property
    def eager_ms(self) -> float | None:
        """Median eager step time."""
        return self.eager.median_ms if self.eager else None

    @property
    def graphed_ms(self) -> float | None:
        """Median graphed step time."""
        return self.graphed.median_ms if self.graphed else None

    @property
    def num_steps(self) -> int:
        """Graphed steps timed."""
        return self.graphed.num_steps if self.graphed else 0

    @property
    def speedup(self) -> float | None:
        """eager median / graphed median, when both are known."""
        if not self.eager_ms or not self.graphed_ms:
            return None
        return self.eager_ms / self.graphed_ms

    @property
    def speedup_range(self) -> tuple[float, float] | None:
        """(eager min / graphed max, eager max / graphed min): the spread of the speedup."""
        if self.eager is None or self.graphed is None or not self.graphed.min_ms or not self.graphed.max_ms:
            return None
        return self.eager.min_ms / self.graphed.max_ms, self.eager.max_ms / self.graphed.min_ms

    @property
    def measurable(self) -> bool:
        """False when the speedup's spread straddles 1.0 (no measurable speedup or slowdown)."""
        spread = self.speedup_range
        return spread is not None and not (spread[0] <= 1.0 <= spread[1])

    def to_dict(self) -> dict[str, Any]:
        """JSON view (eager_ms, graphed_ms and num_steps as in schema 1, plus the spread)."""
        spread = self.speedup_range
        return {"eager_ms": self.eager_ms, "graphed_ms": self.graphed_ms, "num_steps": self.num_steps,
                "speedup": self.speedup,
                "speedup_min": spread[0] if spread else None, "speedup_max": spread[1] if spread else None,
                "measurable": self.measurable, "quiet": self.quiet,
                "eager": self.eager.to_dict() if self.eager else None,
                "graphed": self.graphed.to_dict() if self.graphed else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timing:
        """Inverse of to_dict; a schema 1 timing (medians only) reads as a spread of zero width."""
        def side(key: str) -> StepTimes | None:
            if data.get(key):
                return StepTimes.from_dict(data[key])
            median = data.get(f"{key}_ms")
            return None if median is None else StepTimes(median, median, median, int(data.get("num_steps", 0)))

        return cls(eager=side("eager"), graphed=side("graphed"), quiet=bool(data.get("quiet", True)))


@dataclass(frozen=True, slots=True)
class ControlPair:
    """The dropout-free control pair of a divergent implementation: what it found."""

    verdict: Verdict
    first_divergence: Divergence | None = None
    diagnosis: Diagnosis | None = None
    dropout: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {"dropout": self.dropout, "verdict": self.verdict.value,
                "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
                "diagnosis": self.diagnosis.to_dict() if self.diagnosis else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControlPair:
        """Inverse of to_dict."""
        div, diag = data.get("first_divergence"), data.get("diagnosis")
        return cls(verdict=Verdict(data["verdict"]), dropout=float(data.get("dropout", 0.0)),
                   first_divergence=Divergence.from_dict(div) if div else None,
                   diagnosis=Diagnosis.from_dict(diag) if diag else None)


@dataclass(frozen=True, slots=True)
class ImplResult:
    """One row of the diff report."""

    impl: str
    verdict: Verdict
    divergence: Divergence | None = None
    timing: Timing | None = None
    diagnosis: Diagnosis | None = None
    control: ControlPair | None = None
    """The dropout-free control pair, when it ran."""
    notes: tuple[str, ...] = ()
    memory: MemorySection | None = None
    """The graphed run's memory section."""
    launches: LaunchComparison | None = None
    """The graphed run's profiled step beside the eager one."""
    runs: tuple[RunRecord, ...] = field(default=(), repr=False)
    """The child records behind this row (graphed run, then control run)."""
    forensics: Forensics | None = None
    """RNG and localization forensics from capture-time taps (graphdoctor.compare.forensics)."""
    causes: tuple[Cause, ...] = ()
    """Every rule the graphed run's evidence names (graphdoctor.compare.causes); the one that explains the
    difference is the diagnosis."""
    fp8_state: Fp8StateDiff | None = None
    """The FP8 state (scales, amax histories, FP8 weights' scales) against eager, step by step; None without
    FP8 state (graphdoctor.compare.fp8_state)."""
    experts: ExpertsDiff | None = None
    """Every MoE expert of every rank against eager, step by step; None without MoE experts
    (graphdoctor.compare.experts)."""

    @property
    def passed(self) -> bool:
        """The verdict passes and no cause explains a difference (an rng-divergence whose masks differ because a
        generator state was replaced after capture fails)."""
        return self.verdict.passed and not any(c.explains for c in self.causes)

    def to_dict(self, *, include_steps: bool = True) -> dict[str, Any]:
        """JSON view (schema in docs/diff.md)."""
        data: dict[str, Any] = {
            "impl": self.impl,
            "verdict": self.verdict.value,
            "passed": self.passed,
            "first_divergence": self.divergence.to_dict() if self.divergence else None,
            "timing": self.timing.to_dict() if self.timing else None,
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis else None,
            "control": self.control.to_dict() if self.control else None,
            "notes": list(self.notes),
            "phases": _phases(self.runs),
            "memory": self.memory.to_dict() if self.memory else None,
            "launches": self.launches.to_dict() if self.launches else None,
            "forensics": self.forensics.to_dict() if self.forensics else None,
            "causes": [c.to_dict() for c in self.causes],
            "fp8_state": self.fp8_state.to_dict() if self.fp8_state else None,
            "experts": self.experts.to_dict() if self.experts else None,
        }
        if include_steps:
            data["runs"] = [r.to_dict() for r in self.runs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImplResult:
        """Inverse of to_dict; reads schema 1 rows too."""
        def opt(key: str, load: Any) -> Any:
            value = data.get(key)
            return load(value) if value else None

        return cls(impl=impl_name(str(data["impl"])), verdict=Verdict(data["verdict"]),
                   divergence=opt("first_divergence", Divergence.from_dict),
                   timing=opt("timing", Timing.from_dict), diagnosis=opt("diagnosis", Diagnosis.from_dict),
                   control=opt("control", ControlPair.from_dict), notes=tuple(data.get("notes", ())),
                   memory=opt("memory", MemorySection.from_dict),
                   launches=opt("launches", LaunchComparison.from_dict),
                   runs=tuple(RunRecord.from_dict(r) for r in data.get("runs", ())),
                   forensics=opt("forensics", Forensics.from_dict),
                   causes=tuple(Cause.from_dict(c) for c in data.get("causes") or ()),
                   fp8_state=opt("fp8_state", Fp8StateDiff.from_dict),
                   experts=opt("experts", ExpertsDiff.from_dict))


def _phases(runs: tuple[RunRecord, ...]) -> list[str]:
    """The phases of the implementation's run in order (compare.phases.phase_list), for the JSON."""
    return list(phase_list(runs[0])) if runs else []


SETTLE_STEPS = 2
"""Steps after capture left out of timing (first replays; allocator history is recorded there)."""


def steady_times(run: RunRecord, warmup_steps: int) -> list[float]:
    """Step times of a run's steady-state steps: eager or replay, from step warmup_steps + 1 +
    SETTLE_STEPS on, not profiled."""
    first = warmup_steps + 1 + SETTLE_STEPS
    return [s.step_time_ms for s in run.steps
            if s.step >= first and s.phase in ("eager", "replay") and not s.profiled]


def steady_timing(reference: RunRecord, graphed: RunRecord, warmup_steps: int) -> Timing:
    """Median, min and max step time over the steady-state steps of both runs (see steady_times)."""
    first = warmup_steps + 1 + SETTLE_STEPS
    # the timed steps only: the profiled step after them is not timed, and runs shared like any other step
    quiet = all(s.quiet for run in (reference, graphed) for s in run.steps
                if s.step >= first and s.phase in ("eager", "replay") and not s.profiled)
    return Timing(eager=StepTimes.of(steady_times(reference, warmup_steps)),
                  graphed=StepTimes.of(steady_times(graphed, warmup_steps)), quiet=quiet)


def verdict_for_failure(record: RunRecord) -> Verdict:
    """Verdict of a run that did not finish."""
    if record.status == "unavailable":
        return Verdict.UNAVAILABLE
    if record.status == "timeout":
        return Verdict.TIMEOUT
    if record.status == "hang":
        return Verdict.HANG
    if record.status == "stopped":
        return Verdict.STOPPED
    if record.status == ENVIRONMENT_FAILED:
        return Verdict.ENVIRONMENT_FAILED
    if record.status == "error":
        phase = record.diagnosis.phase if record.diagnosis else None
        if phase == "setup":
            return Verdict.SETUP_FAILED
        return Verdict.CAPTURE_FAILED if phase in ("warmup", "capture") else Verdict.CRASHED
    return Verdict.CRASHED


def judge(
    reference: RunRecord,
    graphed: RunRecord,
    *,
    warmup_steps: int,
    rtol: float = 0.0,
    atol: float = 0.0,
    control_reference: RunRecord | None = None,
    control_graphed: RunRecord | None = None,
) -> ImplResult:
    """The verdict of one implementation.

    Args:
        reference: eager run at the configured dropout.
        graphed: graphed run at the configured dropout.
        warmup_steps: cuda_graph_warmup_steps (steady state starts after it).
        rtol: relative tolerance (0 with atol 0: bitwise).
        atol: absolute tolerance.
        control_reference: eager run with dropout 0 (only when dropout > 0 and graphed differs).
        control_graphed: graphed run with dropout 0.

    Returns:
        The ImplResult: match / rng-divergence / numeric-divergence / capture-failed / crashed /
        hang / timeout / unavailable / reference-failed.
    """
    runs = tuple(r for r in (graphed, control_graphed) if r is not None)
    if reference.status != "ok":
        return reference_failed(graphed.impl, reference)
    launches = None
    if graphed.launches is not None:
        eager_step = reference.launches.step if reference.launches is not None else None
        taps = graphed.forensics.num_graph_nodes if graphed.forensics is not None else None
        launches = compare_launches(eager_step, graphed.launches, taps)
    common: dict[str, Any] = {"impl": graphed.impl, "memory": graphed.memory, "launches": launches, "runs": runs}
    if graphed.status != "ok":
        return ImplResult(verdict=verdict_for_failure(graphed), diagnosis=graphed.diagnosis,
                          **common)  # type: ignore[arg-type]
    timing = steady_timing(reference, graphed, warmup_steps)
    common["fp8_state"] = compare_fp8_state(reference, graphed)
    common["experts"] = compare_experts(reference, graphed)
    divergence = find_divergence(reference, graphed, rtol=rtol, atol=atol)
    capture_notes, divergence = capture_only_values(reference, graphed, divergence, rtol=rtol, atol=atol)
    phase_notes = capture_notes + scaler_notes(reference, graphed) + schedule_notes(
        reference, graphed, rtol=rtol, atol=atol, steps_match=divergence is None)
    divergence = divergence or eval_divergence(reference, graphed, rtol=rtol, atol=atol)
    if divergence is not None:
        phase_notes += resume_notes(graphed, divergence)
    if divergence is None:
        return ImplResult(verdict=Verdict.MATCH, timing=timing, notes=phase_notes,
                          **common)  # type: ignore[arg-type]
    if graphed.dropout == 0.0:
        return ImplResult(verdict=Verdict.NUMERIC_DIVERGENCE, divergence=divergence,
                          timing=timing, notes=phase_notes, **common)  # type: ignore[arg-type]
    control, verdict, notes = _control(control_reference, control_graphed, warmup_steps, rtol, atol)
    if verdict == Verdict.RNG_DIVERGENCE:
        phase_notes = tuple(explained_by_masks(n) for n in phase_notes)
    return ImplResult(verdict=verdict, divergence=divergence, timing=timing, control=control,
                      notes=phase_notes + notes, **common)  # type: ignore[arg-type]


def explained_by_masks(note: str) -> str:
    """A schedule note of a run whose control pair matches: an evaluation that differs there differs because
    training ran on other dropout masks (rng-divergence), not because evaluation replays a training graph, so
    its GD514 note is restated without the rule."""
    prefix = f"{EVAL_DIVERGENCE_RULE} eval-after-train-divergence: "
    if not note.startswith(prefix):
        return note
    return ("evaluation differs too, explained by the dropout masks (the dropout-free control pair, evaluations "
            "included, matches): " + note[len(prefix):])


def stopped_row(reference: RunRecord, graphed: RunRecord | None, impl: str, *, stopped_by: str,
                warmup_steps: int, rtol: float = 0.0, atol: float = 0.0) -> ImplResult:
    """The row of one implementation when graphdoctor was stopped (`stopped_by`: the signal) during its diff.

    A comparison that had finished keeps its verdict where nothing after it could change that verdict
    (match; numeric-divergence at dropout 0), with a note saying what did not run. Otherwise the verdict is
    `stopped`: the steps both runs reached are compared, and the note says how far each got and the first
    difference seen, or how long they were equal. A graphed run that had already failed keeps its failure.
    """
    if graphed is None:
        return ImplResult(impl=impl, verdict=Verdict.STOPPED, notes=(f"stopped by {stopped_by} before it started",))
    if reference.status not in ("ok", "stopped"):
        return reference_failed(impl)
    runs = (graphed,)
    if graphed.status not in ("ok", "stopped"):
        return ImplResult(impl=impl, verdict=verdict_for_failure(graphed), diagnosis=graphed.diagnosis,
                          memory=graphed.memory, runs=runs)
    if reference.status == "ok" and graphed.status == "ok":
        result = judge(reference, graphed, warmup_steps=warmup_steps, rtol=rtol, atol=atol)
        final = result.verdict == Verdict.MATCH or (result.verdict == Verdict.NUMERIC_DIVERGENCE
                                                     and graphed.dropout == 0.0)
        note = (f"stopped by {stopped_by} after this comparison: what follows it (measurement, culprit hunt, "
                "control pair, forensics) did not run" if final else
                f"stopped by {stopped_by} before the dropout-free control pair told random draws from numerics")
        return replace(result, verdict=result.verdict if final else Verdict.STOPPED,
                        notes=(*result.notes, note))
    divergence = find_divergence(reference, graphed, rtol=rtol, atol=atol)
    last_ref, last_graphed = _last_step(reference), _last_step(graphed)
    reached = f"eager {_reached(last_ref)}, {impl} {_reached(last_graphed)}"
    if divergence is not None:
        seen = f"first difference at step {divergence.step} ({divergence.label})"
    elif min(last_ref, last_graphed) >= 0:
        seen = f"equal through step {min(last_ref, last_graphed)}"
    else:
        seen = "no step to compare"
    diagnosis = graphed.diagnosis if graphed.status == "stopped" else reference.diagnosis
    return ImplResult(impl=impl, verdict=Verdict.STOPPED, divergence=divergence, diagnosis=diagnosis,
                      memory=graphed.memory, runs=runs, notes=(f"stopped by {stopped_by}: {reached}; {seen}",))


def _last_step(record: RunRecord) -> int:
    return max((s.step for s in record.steps), default=-1)


def _reached(last: int) -> str:
    return f"finished step {last}" if last >= 0 else "finished no step"


REFERENCE_FAILED_NOTE = "not run: the eager reference failed"
"""The note of every implementation's row when the eager reference failed."""


REFERENCE_ENVIRONMENT_NOTE = "not run: the machine failed the eager reference (environment-failed)"
"""The note of every implementation's row when the machine, not the model, failed the eager reference."""


def reference_failed(impl: str, reference: RunRecord | None = None) -> ImplResult:
    """The row of `impl` when the eager reference failed: named as the implementation, with nothing
    judged; the failure itself is the reference's (DiffReport.reference), told once. A reference the machine
    failed (status environment-failed) makes the row environment-failed, never reference-failed."""
    if reference is not None and reference.status == ENVIRONMENT_FAILED:
        return ImplResult(impl=impl, verdict=Verdict.ENVIRONMENT_FAILED, notes=(REFERENCE_ENVIRONMENT_NOTE,))
    return ImplResult(impl=impl, verdict=Verdict.REFERENCE_FAILED, notes=(REFERENCE_FAILED_NOTE,))


def _control(control_reference: RunRecord | None, control_graphed: RunRecord | None,
             warmup_steps: int, rtol: float, atol: float
             ) -> tuple[ControlPair | None, Verdict, tuple[str, ...]]:
    if control_reference is not None and control_reference.status != "ok":
        diag = control_reference.diagnosis
        why = f": {diag.error_type}: {diag.message}" if diag is not None else ""
        control = ControlPair(verdict=Verdict.REFERENCE_FAILED, diagnosis=diag)
        return control, Verdict.NUMERIC_DIVERGENCE, (
            f"the dropout-free control reference failed{why[:300]}, so RNG and numerics could not "
            "be told apart; treated as numeric-divergence",)
    if control_reference is None or control_graphed is None:
        return None, Verdict.NUMERIC_DIVERGENCE, ("no dropout-free control pair ran",)
    inner = judge(control_reference, control_graphed, warmup_steps=warmup_steps, rtol=rtol,
                  atol=atol)
    control = ControlPair(verdict=inner.verdict, first_divergence=inner.divergence,
                          diagnosis=inner.diagnosis)
    if inner.verdict == Verdict.MATCH:
        return control, Verdict.RNG_DIVERGENCE, (
            "differs only with dropout on: the dropout-free control pair matches, so the "
            "dropout masks (the random stream) differ from eager",)
    return control, Verdict.NUMERIC_DIVERGENCE, ("the dropout-free control pair differs too",)


__all__ = ["REFERENCE_FAILED_NOTE", "ControlPair", "Divergence", "ImplResult", "StepTimes", "steady_times", "Timing",
           "find_divergence", "judge", "reference_failed", "steady_timing", "stopped_row", "verdict_for_failure"]
