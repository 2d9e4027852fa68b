"""Each child's own model: the run's model (config.model: Megatron's resolution of the run's source, or graphdoctor's
own GPT model) with the child's graph settings and dropout, resolved the way the run's model was: a Megatron-LM
line parsed and validated again with the child's flags (so validate_args decides the child's RNG tracker and
refuses what it refuses for that implementation), a mapping with the child's fields set.

The parent calls child_model() to plan and screen; each child calls it to build (graphdoctor.config.build): one
function, the same answer on both sides.
"""

from __future__ import annotations

from typing import Any

from graphdoctor.config.builtin import graph_fields
from graphdoctor.config.codec import decode, encode
from graphdoctor.config.description import ModelDescription
from graphdoctor.config.diff_config import DiffConfig
from graphdoctor.config.impl import Impl
from graphdoctor.config.megatron_line import MegatronLine, describe_args, megatron_args, with_values
from graphdoctor.config.twins import BY_FIELD
from graphdoctor.errors import MissingDependencyError

DROPOUT = BY_FIELD["dropout"]

ONE_GPU: dict[str, Any] = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                           "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
                           "context_parallel_size": 1, "sequence_parallel": False,
                           "pipeline_model_parallel_layout": None}
"""The Megatron settings of one process: no model parallelism."""


def one_gpu(config: DiffConfig) -> DiffConfig:
    """The run on one process (the probe worker's model, `--plan`'s skeleton): no tensor, pipeline, expert or
    sequence parallelism; a line-described model resolved again so."""
    if config.nproc_per_node == 1 and config.tensor_model_parallel_size == 1 \
            and config.pipeline_model_parallel_size == 1 and config.expert_model_parallel_size == 1:
        return config
    model = config.model
    if model.line:
        line = with_values(MegatronLine(groups=model.line, env=config.env), ONE_GPU)
        model = model.replace(line=line.groups)
    elif not model.builtin:  # graphdoctor's own model is derived again from the fields below
        fields = {k: v for k, v in model.transformer.items() if k not in ONE_GPU}
        model = model.replace(transformer=fields)
    return config.replace(nproc_per_node=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                          expert_model_parallel_size=1, expert_tensor_parallel_size=None, sequence_parallel=False,
                          model=model)


def te_rng_tracker(description: ModelDescription, impl: str) -> bool:
    """Megatron-LM's rule (training/arguments.py:1873-1879) for a model its parser does not see: TE's RNG tracker
    once CUDA graphs are on and Transformer Engine builds the layers or the graphs, or where the source asks."""
    kind = Impl(impl)
    layers = description.value("transformer_impl", "transformer_engine")
    return description.te_rng_tracker or (kind.graphed and (kind is Impl.TRANSFORMER_ENGINE or
                                                            layers == "transformer_engine"))


def child_model(config: DiffConfig, impl: str, dropout: float) -> ModelDescription:
    """The model one child builds: the run's, with the child's graph settings, and `dropout` for both dropouts
    where it differs from the run's (a control pair's 0).

    Raises:
        UsageError: Megatron refuses the child's settings (its message).
        MissingDependencyError: megatron.training does not import, or the model needs Transformer Engine.
    """
    base = config.model
    if base.unavailable is not None:
        raise MissingDependencyError(base.unavailable)
    fields = graph_fields(impl, config.cuda_graph_modules, config.cuda_graph_warmup_steps)
    if dropout != config.dropout:
        fields.update(DROPOUT.to_megatron(dropout))
    if base.line:
        changes = {**fields, "cuda_graph_scope_deprecated": None}
        if impl == Impl.FULL_ITERATION:
            changes["check_for_nan_in_loss_and_grad"] = False  # validate_args asks for it with full_iteration
        line = with_values(MegatronLine(groups=base.line, env=config.env), changes)
        args, _ = megatron_args(line, world_size=config.nproc_per_node)
        model = describe_args(args, line, source=base.source, transformer=decode(dict(base.overrides)))
        return model.replace(layer_spec=base.layer_spec if base.layer_spec else model.layer_spec,
                             overrides=base.overrides)
    transformer = {**base.transformer, **{k: encode(v) for k, v in fields.items()}}
    child = base.replace(transformer=transformer)
    return child.replace(te_rng_tracker=te_rng_tracker(child, impl))


__all__ = ["ONE_GPU", "child_model", "one_gpu", "te_rng_tracker"]
