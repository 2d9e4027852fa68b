"""Placement rules of a multi-GPU diff: processes per child, tensor- and pipeline-parallel sizes, and
what the model and the schedule must allow for them. Pure; DiffConfig validates with it on creation,
so a bad placement is refused (exit 2) before any GPU work. The GPU count is checked where the GPUs
are counted (graphdoctor.parent.gpus.plan_jobs); sequence parallel's need of Apex or Transformer
Engine (GD308), and selective recompute's need of Transformer Engine in megatron-core 0.19.2 (GD309), by
diff() and advise() before any GPU work, through those rules (graphdoctor.parent.static.refuse_what_cannot_build).
"""

from __future__ import annotations

from typing import Any, Protocol

from graphdoctor.errors import UsageError


class PlacedRun(Protocol):
    """What placement reads of a run (a DiffConfig)."""

    nproc_per_node: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int | None
    sequence_parallel: bool
    ddp_bucket_size: int | None
    num_attention_heads: int
    num_layers: int
    transformer: dict[str, Any]
    model: Any


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name}: got {value!r}, expected an integer >= 1")
    return value


def data_parallel_size(config: PlacedRun) -> int:
    """nproc_per_node / (T x P): the data-parallel size of every child run."""
    model_parallel = config.tensor_model_parallel_size * config.pipeline_model_parallel_size
    return config.nproc_per_node // model_parallel


def check_placement(config: PlacedRun) -> None:
    """Refuse a placement Megatron would refuse (or that cannot be built), with one line naming it.

    A model Megatron resolved (config.model: a launch line, functional test or Megatron-Bridge config) was
    validated by Megatron itself (heads, query groups, layers and pipeline layouts, sequence parallel at T 1), so
    only the processes are checked here; graphdoctor's own model gets Megatron's rules on its fields.

    Raises:
        UsageError: T x P not dividing nproc_per_node, expert parallel not fitting the data-parallel ranks or the
            experts, heads or query groups not divisible by T, layers not divisible by P, sequence_parallel
            without T > 1, a bucket size below 1.
    """
    nproc = _positive("nproc_per_node", config.nproc_per_node)
    tp = _positive("tensor_model_parallel_size", config.tensor_model_parallel_size)
    pp = _positive("pipeline_model_parallel_size", config.pipeline_model_parallel_size)
    ep = _positive("expert_model_parallel_size", config.expert_model_parallel_size)
    etp = tp if config.expert_tensor_parallel_size is None else _positive(
        "expert_tensor_parallel_size", config.expert_tensor_parallel_size)
    if nproc % (tp * pp):
        raise UsageError(f"placement: tensor_model_parallel_size {tp} x pipeline_model_parallel_size {pp} "
                         f"= {tp * pp} does not divide nproc_per_node {nproc}")
    if (nproc // pp) % (ep * etp):
        raise UsageError(f"placement: expert_model_parallel_size {ep} x expert_tensor_parallel_size {etp} = "
                         f"{ep * etp} does not divide the {nproc // pp} ranks of a pipeline stage "
                         f"(nproc_per_node {nproc} / pipeline {pp})")
    bucket = config.ddp_bucket_size
    if bucket is not None and (isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1):
        raise UsageError(f"ddp_bucket_size: got {bucket!r}, expected an integer >= 1 (elements)")
    if config.model is not None and not config.model.builtin:
        return
    experts = config.transformer.get("num_moe_experts")
    if isinstance(experts, int) and not isinstance(experts, bool) and experts and experts % ep:
        raise UsageError(f"placement: num_moe_experts {experts} is not divisible by expert_model_parallel_size {ep}")
    if config.num_attention_heads % tp:
        raise UsageError(f"placement: num_attention_heads {config.num_attention_heads} is not divisible by "
                         f"tensor_model_parallel_size {tp}")
    groups = config.transformer.get("num_query_groups")
    if isinstance(groups, int) and not isinstance(groups, bool) and groups % tp:
        raise UsageError(f"placement: num_query_groups {groups} is not divisible by tensor_model_parallel_size {tp}")
    if config.num_layers % pp:
        raise UsageError(f"placement: num_layers {config.num_layers} is not divisible by "
                         f"pipeline_model_parallel_size {pp}")
    # Fewer microbatches than stages is allowed: Megatron's non-interleaved schedule (the only one here, no
    # virtual pipeline) takes min(P - rank - 1, num_microbatches) warm-up microbatches (schedules.py:2244).
    if config.sequence_parallel and tp == 1:
        raise UsageError("placement: sequence_parallel needs tensor_model_parallel_size > 1, got 1")


LOCAL_LAYER_SPECS: tuple[str | None, ...] = (None, "local")
"""layer_spec values that select megatron-core's local GPT spec (get_gpt_layer_local_spec)."""


RECOMPUTE_NEEDING_TE: tuple[str, ...] = ("layernorm", "moe_act", "gdn_norm_out")
"""recompute_modules megatron-core 0.19.2 recomputes through `CheckpointWithoutOutput()` built with its
default `fp8=False` (transformer_layer.py:633, :766; moe/experts.py:883; ssm/gated_delta_net/gdn.py:256):
`self.fp8 = fp8 is not None` is then True (tensor_parallel/random.py:740), and the forward calls
`FP8GlobalStateManager` (random.py:693), which is imported only with Transformer Engine (random.py:87)."""


__all__ = ["LOCAL_LAYER_SPECS", "RECOMPUTE_NEEDING_TE", "PlacedRun", "check_placement",
           "data_parallel_size"]
