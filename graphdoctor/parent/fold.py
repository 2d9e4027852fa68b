"""One child's events and the way its process ended, folded into a RunRecord (pure; tested on the CPU):
its steps, evaluations, memory, launches, taps, checkpoints and exits, and its status and diagnosis
(timeout or hang, error, unavailable, crashed, or ok; a hung exit after the results is a finding, not a
failure). Used for one-process children (parent/children.py) and per rank (parent/launch.py).
"""

from __future__ import annotations

import dataclasses

from graphdoctor.parent.diagnose import diagnose, is_capture_error
from graphdoctor.parent.hangs import stopped_outcome, teardown_exits, timeout_outcome
from graphdoctor.parent.runner import ProcessResult
from graphdoctor.protocol.events import (
    Checkpoint,
    End,
    Error,
    Eval,
    EventLog,
    Fp8Layout,
    Hazard,
    Launches,
    Memory,
    Started,
    Step,
    Taps,
    Tensors,
    Weights,
)
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.seconds import ChildSeconds
from graphdoctor.protocol.spec import ChildSpec
from graphdoctor.types import Diagnosis, RankExit


def record_from_events(spec: ChildSpec, log: EventLog, ended: ProcessResult) -> RunRecord:
    """Fold a child's events and how its process ended into a RunRecord (pure; tested on CPU)."""
    steps = tuple(e.record for e in log.of(Step))
    evals = tuple(e.record for e in log.of(Eval))
    started: Started | None = log.first(Started)
    end: End | None = log.first(End)
    error: Error | None = log.first(Error)
    memory: Memory | None = log.first(Memory)
    launches: Launches | None = log.first(Launches)
    taps: Taps | None = log.first(Taps)
    tensors: Tensors | None = log.first(Tensors)
    rank = started.env.rank if started else spec.placement.rank
    teardown = teardown_exits({rank: log}, ended.stacks)
    status, diagnosis = _outcome(spec, {rank: log}, end, error, ended, teardown)
    return RunRecord(
        impl=spec.impl, dropout=spec.dropout, status=status, steps=steps, evals=evals, diagnosis=diagnosis,
        wall_s=ended.wall_s, train_s=end.train_s if end else 0.0, compare_s=end.compare_s if end else 0.0,
        memory=memory.section if memory else None, launches=launches.section if launches else None,
        env=started.env if started else None, forensics=taps.table if taps else None,
        hazards=tuple(log.of(Hazard)), name=spec.name, tensor_names=tensors.names if tensors else (),
        num_parameters=tensors.num_parameters if tensors else 0,
        parameter_bytes=tensors.parameter_bytes if tensors else 0,
        fingerprint_bytes=tensors.fingerprint_bytes if tensors else 0,
        peak_allocated_bytes=end.peak_allocated_bytes if end else None,
        end_reserved_bytes=end.end_reserved_bytes if end else None,
        end_allocated_bytes=end.end_allocated_bytes if end else None, teardown=teardown,
        checkpoints=tuple(log.of(Checkpoint)), seconds=child_seconds(end, teardown, ended),
        fp8_layouts=tuple(e.names for e in sorted(log.of(Fp8Layout), key=lambda e: e.index)),
        weights=log.first(Weights), experts=tensors.experts if tensors else (),
    )


def child_seconds(end: End | None, teardown: tuple[RankExit, ...], ended: ProcessResult) -> ChildSeconds:
    """The process's seconds from its end event, its teardown and how the parent saw it run (a run without an
    end event has only its start and end)."""
    if end is None:
        return ChildSeconds(started_at=ended.started_at, ended_at=ended.ended_at)
    return ChildSeconds(startup_s=end.startup_s, setup_s=end.setup_s, waited_s=end.waited_s, train_s=end.train_s,
                        observers=dict(end.observers), hooks=dict(end.hooks), watched=dict(end.watched),
                        compare_s=end.compare_s,
                        teardown_s=max((t.teardown_s for t in teardown), default=0.0),
                        started_at=ended.started_at, ended_at=ended.ended_at, stages=dict(end.stages))


def _outcome(spec: ChildSpec, logs: dict[int, EventLog], end: End | None, error: Error | None,
             ended: ProcessResult, teardown: tuple[RankExit, ...]) -> tuple[str, Diagnosis | None]:
    steps = [s.record.step for log in logs.values() for s in log.of(Step)]
    last_step = max(steps) if steps else -1
    if ended.timed_out:
        return timeout_outcome(spec.config.timeout_s, logs, ended.stacks, ended.group_gone, ended.left_running)
    if ended.stopped is not None and end is None:
        return stopped_outcome(ended.stopped, logs, ended.stacks)
    if error is not None:
        frames = list(error.frames)
        diagnosis = diagnose(error.error_type, error.message, frames, module=error.module,
                             step=error.step, phase=error.phase, culprit_rule=error.culprit_rule,
                             culprit_operator=error.culprit_operator, culprit_location=error.culprit_location,
                             culprit_module=error.culprit_module)
        if error.unavailable:
            return "unavailable", diagnosis
        if is_capture_error(error.error_type, error.message, frames):
            diagnosis = dataclasses.replace(diagnosis, phase="capture")
        return "error", diagnosis
    if end is not None and any(t.hung for t in teardown):
        return "ok", None  # the results stand; the hung exit is a teardown-hang finding
    if end is None or ended.returncode not in (0, None):
        how = ended.describe_exit() + ("" if end is None else " after its end event")
        return "crashed", Diagnosis(error_type="crashed", message=f"child {how} without a result",
                                    step=last_step + 1, traceback_tail=ended.log_tail.splitlines()[-8:])
    return "ok", None


__all__ = ["record_from_events"]
