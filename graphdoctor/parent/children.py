"""Diff and count children from the parent's side: write the spec, run the child isolated (the one
runner), fold its events into a RunRecord. A ChildSession numbers the children of one diff or count,
names their files, and re-runs a child whose rendezvous port was taken.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from graphdoctor.config import DiffConfig, entry_point_modules
from graphdoctor.parent.diagnose import diagnose, is_capture_error
from graphdoctor.parent.runner import ProcessResult, child_env, python_command, run_isolated, with_port_retries
from graphdoctor.protocol.events import End, Error, EventLog, Hazard, Launches, Memory, Started, Step, Taps, read_events
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import ChildSpec, EagerMemory, Role, placement_for_child, run_name
from graphdoctor.types import Diagnosis

CHILD_MODULE = "graphdoctor.child"
"""What the parent runs: `python -P -m graphdoctor.child SPEC.json`."""


def record_from_events(spec: ChildSpec, log: EventLog, ended: ProcessResult) -> RunRecord:
    """Fold a child's events and how its process ended into a RunRecord (pure; tested on CPU)."""
    steps = tuple(e.record for e in log.of(Step))
    started: Started | None = log.first(Started)
    end: End | None = log.first(End)
    error: Error | None = log.first(Error)
    memory: Memory | None = log.first(Memory)
    launches: Launches | None = log.first(Launches)
    taps: Taps | None = log.first(Taps)
    status, diagnosis = _outcome(spec, steps[-1].step if steps else -1, end, error, ended)
    return RunRecord(
        impl=spec.impl, dropout=spec.dropout, status=status, steps=steps, diagnosis=diagnosis,
        wall_s=ended.wall_s, train_s=end.train_s if end else 0.0, compare_s=end.compare_s if end else 0.0,
        memory=memory.section if memory else None, launches=launches.section if launches else None,
        env=started.env if started else None, forensics=taps.table if taps else None,
        hazards=tuple(log.of(Hazard)), name=spec.name,
        peak_allocated_bytes=end.peak_allocated_bytes if end else None,
        end_reserved_bytes=end.end_reserved_bytes if end else None,
        end_allocated_bytes=end.end_allocated_bytes if end else None,
    )


def _outcome(spec: ChildSpec, last_step: int, end: End | None, error: Error | None,
             ended: ProcessResult) -> tuple[str, Diagnosis | None]:
    if ended.timed_out:
        return "timeout", Diagnosis(error_type="timeout",
                                    message=f"no result within {spec.config.timeout_s:.0f} s; killed",
                                    step=last_step + 1, phase=None)
    if error is not None:
        frames = list(error.frames)
        diagnosis = diagnose(error.error_type, error.message, frames, module=error.module,
                             step=error.step, phase=error.phase)
        if error.unavailable:
            return "unavailable", diagnosis
        if is_capture_error(error.error_type, error.message, frames):
            diagnosis = dataclasses.replace(diagnosis, phase="capture")
        return "error", diagnosis
    if end is None or ended.returncode not in (0, None):
        how = ended.describe_exit() + ("" if end is None else " after its end event")
        return "crashed", Diagnosis(error_type="crashed", message=f"child {how} without a result",
                                    step=last_step + 1, traceback_tail=ended.log_tail.splitlines()[-8:])
    return "ok", None


def run_child(spec: ChildSpec, workdir: Path) -> RunRecord:
    """Run one child isolated, with the diff's time limit; never raises for a failing child.

    Leaves `spec-<name>.json`, `events-<name>.jsonl` and `log-<name>.txt` in `workdir`.
    """
    spec_path = spec.write(workdir / f"spec-{spec.name}.json")
    Path(spec.events_path).unlink(missing_ok=True)
    ended = run_isolated(python_command(CHILD_MODULE, str(spec_path)), timeout_s=spec.config.timeout_s,
                         log_path=workdir / f"log-{spec.name}.txt", env=child_env(spec.config.env))
    return record_from_events(spec, read_events(spec.events_path), ended)


def port_taken(record: RunRecord) -> bool:
    """True when a child failed in setup because its rendezvous port was already in use."""
    diag = record.diagnosis
    return (record.status == "error" and diag is not None and diag.phase == "setup"
            and "EADDRINUSE" in diag.message)


def user_import_dir(config: DiffConfig) -> str | None:
    """The working directory, when a `pkg.mod:fn` the run names is importable from there (children
    then append it to their import path, last); None otherwise."""
    cwd = os.getcwd()
    for module in entry_point_modules(config):
        top = module.split(".")[0]
        if os.path.isdir(os.path.join(cwd, top)) or os.path.isfile(os.path.join(cwd, f"{top}.py")):
            return cwd
    return None


class ChildSession:
    """One diff's (or count's) working directory and the children it ran."""

    def __init__(self, config: DiffConfig, workdir: Path,
                 progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.workdir = workdir
        self.progress = progress or (lambda _msg: None)
        self.num_children = 0
        self.child_wall_s = 0.0
        self.eager_memory: EagerMemory | None = None
        self.import_dir = user_import_dir(config)

    def spec(self, impl: str, dropout: float, role: Role, ref_dir: Path, *, hunt: bool = False,
             taps: bool = False, attempt: int = 0) -> ChildSpec:
        """The spec of the next child (each gets its own rendezvous port and file names)."""
        config = self.config
        if role is Role.TAPPED:
            config = config.replace(memory=False, launches=False)
        name = run_name(impl, dropout, role, attempt=attempt, hunt=hunt, taps=taps)
        placement = placement_for_child(self.num_children)
        self.num_children += 1
        return ChildSpec(impl=impl, dropout=dropout, config=config, role=role, name=name,
                         events_path=str(self.workdir / f"events-{name}.jsonl"),
                         reference_dir=str(ref_dir), placement=placement,
                         artifacts_dir=self.config.trace_dir or str(self.workdir),
                         hunt_culprit=hunt, eager_memory=self.eager_memory,
                         keep_snapshots=self.config.snapshot_dir is not None, taps=taps,
                         import_dir=self.import_dir)

    def run(self, impl: str, dropout: float, role: Role, ref_dir: Path, *, hunt: bool = False,
            taps: bool = False) -> RunRecord:
        """Run one child (again, on a new port, when its port was taken) and account its time."""
        what = "culprit hunt" if hunt else ("tapped " + role.value if taps else role.value)
        self.progress(f"running {impl} (dropout {dropout:g}, {what})")

        def attempt(number: int) -> RunRecord:
            spec = self.spec(impl, dropout, role, ref_dir, hunt=hunt, taps=taps, attempt=number)
            return run_child(spec, self.workdir)

        retries = 2 if not _under_torchrun() else 0
        record, failed = with_port_retries(attempt, port_taken, retries)
        self.child_wall_s += record.wall_s + sum(r.wall_s for r in failed)
        self.progress(f"  {impl}: {record.status} in {record.wall_s:.1f} s")
        return record


def _under_torchrun() -> bool:
    # Under torchrun every rank derives the same port; a retry on one rank alone would split them.
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


__all__ = ["CHILD_MODULE", "ChildSession", "port_taken", "record_from_events", "run_child", "user_import_dir"]
