"""One multi-GPU child's ranks folded into one RunRecord: eager rank r is compared with graphed rank r
tensor by tensor (each rank's tensors carry a `rank<r>:` prefix), and one status stands for all ranks.

The fold is pure (tested on CPU from event files); the per-rank records stay in RunRecord.ranks for
the JSON report (memory and launch figures of every rank).
"""

from __future__ import annotations

import dataclasses
import math

from graphdoctor.protocol.record import RunRecord, rank_prefix
from graphdoctor.protocol.steps import StepPrints, StepRecord
from graphdoctor.types import Diagnosis, TensorDiff

RANK_STATUS_ORDER: tuple[str, ...] = ("ok", "stopped", "crashed", "timeout", "unavailable", "error")
"""Which rank's status stands for the run, last wins: a rank that reported an error explains a run
whose other ranks were torn down after it (crashed) or waited for it (timeout); a rank the stopped parent
ended (stopped) stands over ranks that had finished."""


def deciding_rank(records: list[RunRecord]) -> int:
    """Index of the rank whose status stands for the run (RANK_STATUS_ORDER; the first such rank)."""
    def severity(record: RunRecord) -> int:
        return RANK_STATUS_ORDER.index(record.status) if record.status in RANK_STATUS_ORDER else 0
    worst = max(severity(r) for r in records)
    return next(i for i, r in enumerate(records) if severity(r) == worst)


def _fold_diffs(diffs: list[tuple[int, TensorDiff | None]]) -> TensorDiff | None:
    present = [(rank, d) for rank, d in diffs if d is not None]
    if not present:
        return None
    first = next(((rank, d) for rank, d in present if d.first_tensor is not None), None)
    last = next(((rank, d) for rank, d in reversed(present) if d.last_tensor is not None), None)
    return TensorDiff(
        num_tensors=sum(d.num_tensors for _, d in present), num_unequal=sum(d.num_unequal for _, d in present),
        max_abs=max(d.max_abs for _, d in present), max_rel=max(d.max_rel for _, d in present),
        first_tensor=None if first is None else rank_prefix(first[0]) + str(first[1].first_tensor),
        first_tensor_max_abs=0.0 if first is None else first[1].first_tensor_max_abs,
        measured=all(d.measured for _, d in present),
        last_tensor=None if last is None else rank_prefix(last[0]) + str(last[1].last_tensor))


def fold_step(steps: list[StepRecord]) -> StepRecord:
    """One step of every rank as one: the loss of the first rank that has one (the last pipeline
    stage; tensor-parallel peers agree), the slowest rank's time, every rank's fingerprints in rank
    order, the element-by-element comparisons summed with the first differing tensor's rank named."""
    lead = steps[0]
    scored = next((s for s in steps if not math.isnan(s.loss)), lead)
    prints = None
    if all(s.prints is not None for s in steps):
        layouts = {s.prints.fp8_layout for s in steps}  # type: ignore[union-attr]
        fp8 = tuple(v for s in steps for v in s.prints.fp8) if len(layouts) == 1 else ()  # type: ignore[union-attr]
        prints = StepPrints(grads=tuple(v for s in steps for v in s.prints.grads),  # type: ignore[union-attr]
                            params=tuple(v for s in steps for v in s.prints.params),  # type: ignore[union-attr]
                            fp8=fp8, fp8_layout=layouts.pop() if fp8 else -1)
    return dataclasses.replace(
        lead, loss=scored.loss, reported=scored.reported, step_time_ms=max(s.step_time_ms for s in steps),
        grads=_fold_diffs([(r, s.grads) for r, s in enumerate(steps)]),
        params=_fold_diffs([(r, s.params) for r, s in enumerate(steps)]),
        profiled=any(s.profiled for s in steps), quiet=all(s.quiet for s in steps), prints=prints)


def _fold_diagnosis(record: RunRecord, rank: int) -> Diagnosis | None:
    diag = record.diagnosis
    if diag is None:
        return None
    return dataclasses.replace(diag, message=f"rank {rank}: {diag.message}")


def fold_ranks(records: list[RunRecord], *, wall_s: float) -> RunRecord:
    """Rank 0's record, standing for every rank: the deciding rank's status and diagnosis, the steps
    every rank finished (folded by fold_step), tensors named per rank, the ranks kept in `ranks`.

    Args:
        records: one record per rank, in rank order.
        wall_s: the launcher's wall time (start to exit of every rank).
    """
    if len(records) == 1:
        return dataclasses.replace(records[0], wall_s=wall_s)
    decider = deciding_rank(records)
    num_steps = min(len(r.steps) for r in records)
    steps = tuple(fold_step([r.steps[i] for r in records]) for i in range(num_steps))
    lead = records[0]
    names = tuple(rank_prefix(rank) + n for rank, r in enumerate(records) for n in r.tensor_names)
    counts = {len(r.fp8_layouts) for r in records}
    layouts = tuple(tuple(rank_prefix(rank) + n for rank, r in enumerate(records) for n in r.fp8_layouts[i])
                    for i in range(counts.pop())) if len(counts) == 1 else ()
    return dataclasses.replace(
        lead, status=records[decider].status, diagnosis=_fold_diagnosis(records[decider], decider), steps=steps,
        wall_s=wall_s, train_s=max(r.train_s for r in records), compare_s=max(r.compare_s for r in records),
        hazards=tuple(h for r in records for h in r.hazards), tensor_names=names, fp8_layouts=layouts,
        num_parameters=sum(r.num_parameters for r in records),
        parameter_bytes=sum(r.parameter_bytes for r in records),
        fingerprint_bytes=max(r.fingerprint_bytes for r in records), ranks=tuple(records),
        experts=tuple(dataclasses.replace(shard, layer=rank_prefix(rank) + shard.layer)
                      for rank, r in enumerate(records) for shard in r.experts))


__all__ = ["RANK_STATUS_ORDER", "deciding_rank", "fold_ranks", "fold_step"]
