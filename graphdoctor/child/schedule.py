"""The run schedule inside a child: which training steps are followed by an evaluation, the evaluation
itself as Megatron-LM's `evaluate` runs it (forward-only schedule, model.eval(), torch.no_grad), and
the values Megatron's trackers logged during a step, read with the step's one host copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from graphdoctor.child.reported import MicrobatchReport, StepValues, reduce_step
from graphdoctor.config import DiffConfig
from graphdoctor.types import EvalRecord

EVAL_BATCH_BASE = 1_000_000
"""Evaluation batches are synthetic_batch(config, EVAL_BATCH_BASE + n, microbatch): never a training
step's batch, the same on every side (Megatron's validation iterator continues across evaluations)."""

TRACKER_PREFIX = "tracker/"
"""Reported keys of values read from Megatron's trackers rather than the loss function's dict."""


@dataclass(frozen=True, slots=True)
class EvalPoint:
    """One evaluation of the schedule: its index, the training step it follows, whether it is final."""

    index: int
    after_step: int
    final: bool


def eval_plan(steps: int, eval_interval: int) -> tuple[EvalPoint, ...]:
    """The evaluations of a run of `steps` training steps: after every `eval_interval` steps (after
    0-based step s when (s + 1) % eval_interval == 0, as Megatron-LM's `iteration % eval_interval`
    after its increment), and a final one after the last step (one evaluation there when both fall
    on it). No evaluation when eval_interval is 0.
    """
    if eval_interval <= 0:
        return ()
    after = [s for s in range(steps) if (s + 1) % eval_interval == 0 and s != steps - 1]
    points = [EvalPoint(index=i, after_step=s, final=False) for i, s in enumerate(after)]
    points.append(EvalPoint(index=len(points), after_step=steps - 1, final=True))
    return tuple(points)


def tracker_values() -> dict[str, torch.Tensor]:
    """Every metric in Megatron's MoE metrics tracker (moe_logging.py MoEMetricsTracker: aux loss,
    z-loss, load-balancing statistics), summed over layers, still on the device; empty without MoE."""
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    metrics = get_moe_metrics_tracker().metrics
    return {f"{TRACKER_PREFIX}{name}": entry.values.detach().float().sum() for name, entry in metrics.items()}


def with_tracker_values(values: StepValues) -> StepValues:
    """The step's values with the trackers' appended (one device tensor: still one host copy)."""
    logged = tracker_values()
    if not logged:
        return values
    parts = [values.values.float()] + [v.reshape(1).to(values.values.device) for v in logged.values()]
    return StepValues(keys=values.keys + tuple(logged), values=torch.cat(parts))


def eval_batches(config: DiffConfig, iteration: int) -> Iterator[dict[str, torch.Tensor]]:
    """The micro-batches of one evaluation iteration (a running count over the run's evaluations)."""
    from graphdoctor.child.batches import synthetic_batch

    return iter([synthetic_batch(config, EVAL_BATCH_BASE + iteration, m)
                 for m in range(config.num_microbatches)])


def _kept(report: Any) -> Any:
    """A copy of one micro-batch's report: a full_iteration validation graph returns the same static
    tensors from every replay, so each iteration's values are copied before the next replay."""
    if not isinstance(report, MicrobatchReport):
        return report
    return MicrobatchReport(values={k: v.detach().clone() for k, v in report.values.items()},
                            loss=report.loss.detach().clone(),
                            num_tokens=None if report.num_tokens is None else report.num_tokens.detach().clone())


def run_eval(config: DiffConfig, setup: Any, point: EvalPoint, *, where: str, taps: Any = None) -> EvalRecord:
    """One evaluation as Megatron-LM's `evaluate` (training.py): model.eval(), torch.no_grad(),
    `eval_iters` calls of the forward-only schedule (full_iteration: its validation graph), the
    reported values reduced over every micro-batch, model.train() again. One host copy."""
    from graphdoctor.child.megatron_setup import clear_moe_metrics

    if taps is not None:
        taps.detach_module_hooks()
    setup.model.eval()
    reports: list[Any] = []
    try:
        with torch.no_grad():
            for it in range(config.eval_iters):
                out = setup.forward_backward(
                    forward_step_func=setup.forward_step,
                    data_iterator=eval_batches(config, point.index * config.eval_iters + it),
                    model=[setup.model], num_microbatches=config.num_microbatches,
                    seq_length=config.seq_length, micro_batch_size=config.micro_batch_size, forward_only=True)
                reports.extend(_kept(r) for r in out)
    finally:
        setup.model.train()
        if taps is not None:
            taps.attach_module_hooks()
    per_token = bool(getattr(setup.config, "calculate_per_token_loss", False))
    values = reduce_step(reports, per_token_loss=per_token, where=where)
    clear_moe_metrics()  # the evaluation's router statistics are not the next training step's
    loss, reported = values.host()
    return EvalRecord(index=point.index, after_step=point.after_step, loss=loss / config.eval_iters,
                      final=point.final, reported=reported)


__all__ = ["EVAL_BATCH_BASE", "TRACKER_PREFIX", "EvalPoint", "eval_batches", "eval_plan", "run_eval",
           "tracker_values", "with_tracker_values"]
