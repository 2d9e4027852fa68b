"""`--fit`: a model's placement and batches shrunk, in one step, to the GPUs a diff has.

A user's launch line or recipe is written for its cluster (tensor 4 x pipeline 2 with a layout, expert 2, context
2, a global batch of hundreds of micro-batches). With --fit every parallel size is halved, context first, then
pipeline, expert tensor, expert and tensor, until the placement fits the processes diff starts; the pipeline
layout goes with a changed pipeline, sequence parallelism with tensor 1, and the micro-batches per step come down
to what a diff needs (one, or one per pipeline stage). Every kind of layer stays (the layer count is --num-layers'
business, graphdoctor.config.shrink keeps each kind). The sizes go in as Megatron settings before Megatron
validates them, and a note says what changed and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PLACEMENT: tuple[str, ...] = ("context_parallel_size", "pipeline_model_parallel_size", "expert_tensor_parallel_size",
                              "expert_model_parallel_size", "tensor_model_parallel_size")
"""The Megatron parallel sizes --fit shrinks, in the order it halves them."""
SHORT: dict[str, str] = {"tensor_model_parallel_size": "tensor", "pipeline_model_parallel_size": "pipeline",
                         "context_parallel_size": "context", "expert_model_parallel_size": "expert",
                         "expert_tensor_parallel_size": "expert-tensor"}
EVAL_ITERS_FIT = 2
"""Evaluation iterations a fitted run keeps (evaluation stays on where the model evaluates)."""


def gpus_at_hand(nproc_per_node: int | None, line_world: int | None = None) -> int:
    """The processes a fitted diff starts: --nproc-per-node where given, else the GPUs visible here (at most the
    launch's own count), at least 1 (a plan on a machine without a GPU is fitted to one)."""
    if nproc_per_node is not None:
        return int(nproc_per_node)
    import torch

    visible = torch.cuda.device_count() or 1  # CUDA_VISIBLE_DEVICES honoured; no context is made
    return max(1, min(visible, line_world) if line_world else visible)


def _fits(sizes: Mapping[str, int], world: int) -> bool:
    tp, pp, cp = sizes["tensor_model_parallel_size"], sizes["pipeline_model_parallel_size"], \
        sizes["context_parallel_size"]
    ep = sizes["expert_model_parallel_size"]
    etp = sizes["expert_tensor_parallel_size"] or tp
    return world % (tp * pp * cp) == 0 and world % (ep * etp * pp) == 0


def fit_placement(current: Mapping[str, Any], world: int) -> tuple[dict[str, Any], list[str]]:
    """(the Megatron settings that change, what changed) for parallel sizes `current` (PLACEMENT names; None or
    absent: 1, and for expert-tensor: the tensor size) to fit `world` processes."""
    sizes: dict[str, int] = {name: int(current.get(name) or 1) for name in PLACEMENT}
    etp_given = current.get("expert_tensor_parallel_size") is not None
    if not etp_given:
        sizes["expert_tensor_parallel_size"] = 0  # follows the tensor size
    before = dict(sizes)
    while not _fits(sizes, world):
        name = next(n for n in PLACEMENT if sizes[n] > 1)
        sizes[name] = sizes[name] // 2 if sizes[name] % 2 == 0 else 1
    changes: dict[str, Any] = {n: sizes[n] for n in PLACEMENT if sizes[n] != before[n]}
    shown = [f"{SHORT[n]} {before[n]} -> {sizes[n]}" for n in PLACEMENT if n in changes]
    if "pipeline_model_parallel_size" in changes and current.get("pipeline_model_parallel_layout"):
        changes["pipeline_model_parallel_layout"] = None
        shown.append("the pipeline layout dropped with its pipeline")
    if "tensor_model_parallel_size" in changes and sizes["tensor_model_parallel_size"] == 1 and \
            current.get("sequence_parallel"):
        changes["sequence_parallel"] = False
        shown.append("sequence parallel off with tensor 1")
    notes = [f"--fit: {', '.join(shown)}, to fit {world} process{'es' if world > 1 else ''}"] if shown else []
    return changes, notes


def fitted_microbatches(pipeline: int) -> int:
    """Micro-batches per step of a fitted run: one, or one per pipeline stage (the 1F1B schedule's warm-up)."""
    return max(1, int(pipeline))


__all__ = ["EVAL_ITERS_FIT", "PLACEMENT", "fit_placement", "fitted_microbatches", "gpus_at_hand"]
