"""Checkpoint save and resume from the parent's side (`--save-at S`, `--resume`): which children save,
the two processes of a resumed run (the first saves after S steps and ends; the second loads the
checkpoint in a fresh process and trains on), and their two records stitched into one run.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from graphdoctor.config import DiffConfig
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import ChildSpec, Role

RESUMED_PREFIX = "in the process resumed at step"
"""How a failure of the resumed process begins its message (`... at step 4: <error>`)."""

CHECKPOINT_METADATA = "metadata.json"
"""The file Megatron-Core's dist_checkpointing writes last into a finished checkpoint directory."""


def checkpoint_dir(workdir: Path, name: str) -> Path:
    """Where the run `name` keeps its checkpoint: `checkpoint-<name>` in the work directory."""
    return workdir / f"checkpoint-{name}"


def saves(config: DiffConfig, role: Role, stop_after: int | None) -> bool:
    """Whether a child of this role saves the checkpoint: with --save-at, the reference and graphed
    runs that reach step save_at (a tapped or count child trains straight through)."""
    return (config.save_at > 0 and role in (Role.REFERENCE, Role.GRAPHED)
            and (stop_after is None or stop_after >= config.save_at))


def first_process(spec: ChildSpec, directory: Path) -> ChildSpec:
    """The spec of the run's (first) process: saves into `directory` after save_at steps; with
    --resume it ends there (and profiles no step: the resumed process profiles the run's last)."""
    if not spec.config.resume:
        return dataclasses.replace(spec, checkpoint_dir=str(directory))
    return dataclasses.replace(spec, checkpoint_dir=str(directory), stop_after=spec.config.save_at - 1,
                               config=spec.config.replace(launches=False))


def resumed_process(spec: ChildSpec, directory: Path) -> ChildSpec:
    """The spec of the resumed process (`spec` named `<name>-resumed` by its session): loads
    `directory` and trains steps save_at on, up to the run's own last step."""
    return dataclasses.replace(spec, checkpoint_dir=str(directory), resumed=True)


def clear_checkpoint(directory: Path) -> None:
    """Remove a checkpoint this diff wrote: a directory holding only what dist_checkpointing writes
    (`*.distcp`, `common.pt`, `.metadata`, `metadata.json`), whole, half-written or empty; anything
    else in that place stays (and the child's save refuses a directory that is not empty)."""
    if not directory.is_dir():
        return
    entries = {p.name for p in directory.iterdir()}
    if all(n.endswith((".distcp", ".pt")) or n in (CHECKPOINT_METADATA, ".metadata") for n in entries):
        shutil.rmtree(directory, ignore_errors=True)


def stitched(first: RunRecord, resumed: RunRecord) -> RunRecord:
    """One run from its two processes, named as the run: the steps and evaluations of both in order
    (the resumed process's steps carry `resumed`), both processes' checkpoint events, hazards (each
    once) and exits, times summed; status, diagnosis and the end-of-run sections (memory, launches: the
    profiled last step) are the resumed process's, which ran the run's last steps.

    A first process that failed is the run's record as it is (no resumed process ran); a failure of
    the resumed process is told as one after the resume (its phase is `resume` when the load failed).
    """
    if first.status != "ok":
        return first
    diagnosis = resumed.diagnosis
    if diagnosis is not None and not diagnosis.message.startswith(RESUMED_PREFIX):
        start = next((c.iteration for c in first.checkpoints if c.action == "save"), len(first.steps))
        diagnosis = dataclasses.replace(diagnosis, message=f"{RESUMED_PREFIX} {start}: {diagnosis.message}")
    ranks = resumed.ranks
    if first.ranks and len(first.ranks) == len(resumed.ranks):
        ranks = tuple(stitched(a, b) for a, b in zip(first.ranks, resumed.ranks, strict=True))
    shift = len(first.fp8_layouts)
    later = tuple(dataclasses.replace(s, prints=dataclasses.replace(s.prints, fp8_layout=s.prints.fp8_layout + shift))
                  if s.prints is not None and s.prints.fp8_layout >= 0 else s for s in resumed.steps)
    return dataclasses.replace(
        resumed, name=first.name, steps=first.steps + later, fp8_layouts=first.fp8_layouts + resumed.fp8_layouts, evals=first.evals + resumed.evals,
        wall_s=first.wall_s + resumed.wall_s, train_s=first.train_s + resumed.train_s,
        compare_s=first.compare_s + resumed.compare_s,
        seconds=first.seconds.plus(resumed.seconds) if first.seconds and resumed.seconds else resumed.seconds,
        hazards=first.hazards + tuple(h for h in resumed.hazards if h not in first.hazards),
        teardown=first.teardown + resumed.teardown, checkpoints=first.checkpoints + resumed.checkpoints,
        tensor_names=resumed.tensor_names or first.tensor_names, experts=resumed.experts or first.experts,
        env=first.env or resumed.env, ranks=ranks,
        diagnosis=diagnosis)


__all__ = ["CHECKPOINT_METADATA", "RESUMED_PREFIX", "checkpoint_dir", "clear_checkpoint", "first_process", "resumed_process", "saves",
           "stitched"]
