"""Each child's own model: the run's model (config.model, or graphdoctor's own GPT model when no Megatron source
describes one) with the child's graph settings and dropout, resolved the way the run's model was: a Megatron-LM
line parsed and validated again with the child's flags (so validate_args decides the child's RNG tracker and
refuses what it refuses for that implementation), a mapping with the child's fields set.

The parent calls child_model() to plan and screen; each child calls it to build (graphdoctor.config.build): one
function, the same answer on both sides.
"""

from __future__ import annotations

from typing import Any

from graphdoctor.config.codec import CALL, TARGET, decode, encode
from graphdoctor.config.description import TRANSFORMER_CLASSES, ModelDescription
from graphdoctor.config.diff_config import RUN_OWNED_FIELDS, DiffConfig
from graphdoctor.config.entry_points import BUILTIN_LAYER_SPECS
from graphdoctor.config.fp8 import fp8_fields, initialisation
from graphdoctor.config.megatron_line import MegatronLine, describe_args, megatron_args, with_values
from graphdoctor.config.twins import BUILTIN_SPECS, BY_FIELD
from graphdoctor.errors import MissingDependencyError

DROPOUT = BY_FIELD["dropout"]

EAGER = "eager"
"""graphdoctor's name of the eager reference (Megatron's cuda_graph_impl `none`)."""

DTYPE_FIELDS: dict[str, dict[str, Any]] = {
    "fp32": {"params_dtype": {TARGET: "torch.float32", CALL: False}},
    "bf16": {"bf16": True, "params_dtype": {TARGET: "torch.bfloat16", CALL: False}},
    "fp16": {"fp16": True, "params_dtype": {TARGET: "torch.float16", CALL: False}},
}
"""TransformerConfig precision fields per dtype, encoded."""


def megatron_impl(impl: str) -> str:
    """TransformerConfig.cuda_graph_impl of one of graphdoctor's implementation names."""
    return "none" if impl == EAGER else impl


def graph_fields(config: DiffConfig, impl: str) -> dict[str, Any]:
    """The CUDA-graph settings of one child: its implementation, the run's modules for local and
    transformer_engine (none for eager and full_iteration), the run's warm-up."""
    modules = [] if impl in (EAGER, "full_iteration") else list(config.cuda_graph_modules)
    return {"cuda_graph_impl": megatron_impl(impl), "cuda_graph_modules": modules,
            "cuda_graph_warmup_steps": config.cuda_graph_warmup_steps, "enable_cuda_graph": False,
            "external_cuda_graph": False}


def moe_defaults(transformer: dict[str, Any]) -> dict[str, Any]:
    """TransformerConfig defaults an MoE run of graphdoctor's own model needs and did not set: add_bias_linear False,
    since MoELayer.forward asserts the experts return no bias (moe_layer.py:675-677 in megatron-core 0.19.2) and
    Megatron-LM's MoE recipes pass --disable-bias-linear."""
    if not transformer.get("num_moe_experts") or "add_bias_linear" in transformer:
        return {}
    return {"add_bias_linear": False}


def builtin_model(config: DiffConfig, *, source: str = "graphdoctor defaults") -> ModelDescription:
    """graphdoctor's own GPT model: DiffConfig's shape, precision, dropout and placement, then the run file's
    `transformer:` fields (but what the run owns, RUN_OWNED_FIELDS), the recompute settings, the layer spec
    (`local`, `te`, or the user's `pkg.mod:fn`), weights initialised where `initialisation` says; the eager
    reference's graphs."""
    fields: dict[str, Any] = {
        "num_layers": config.num_layers, "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads, **initialisation(config.fp8_param_gather),
        **DROPOUT.to_megatron(config.dropout), **graph_fields(config, EAGER), **DTYPE_FIELDS[config.dtype],
        "transformer_impl": BUILTIN_SPECS.get(config.layer_spec or "local", "local"),  # pkg.mod:fn: the run file's
    }
    if config.tensor_model_parallel_size > 1:
        fields["tensor_model_parallel_size"] = config.tensor_model_parallel_size
    if config.pipeline_model_parallel_size > 1:
        fields["pipeline_model_parallel_size"] = config.pipeline_model_parallel_size
        fields["pipeline_dtype"] = fields["params_dtype"]  # Megatron asserts it is set for P > 1
    if config.expert_model_parallel_size > 1:
        fields["expert_model_parallel_size"] = config.expert_model_parallel_size
    if config.expert_tensor_parallel_size is not None:
        fields["expert_tensor_parallel_size"] = config.expert_tensor_parallel_size
    if config.sequence_parallel:
        fields["sequence_parallel"] = True
    for key, value in {**config.transformer, **config.recompute_settings()}.items():
        if key not in RUN_OWNED_FIELDS:
            fields[key] = encode(value)
    fields.update(moe_defaults(config.transformer))
    fields.update({key: value for key, value in fp8_fields(config.fp8_format, config.fp8_recipe,
                                                           config.fp8_param_gather).items()})
    spec = config.layer_spec if config.layer_spec not in (None, *BUILTIN_LAYER_SPECS) else None
    return ModelDescription(kind="gpt", transformer_class=TRANSFORMER_CLASSES[0], transformer=fields,
                            model={"vocab_size": config.vocab_size, "seq_length": config.seq_length},
                            layer_spec=spec, source=source)


def run_model(config: DiffConfig) -> ModelDescription:
    """The run's model: config.model, else graphdoctor's own."""
    return config.model if config.model is not None else builtin_model(config)


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
    if model is not None and model.line:
        line = with_values(MegatronLine(groups=model.line, env=config.env), ONE_GPU)
        model = model.replace(line=line.groups)
    elif model is not None:
        fields = {k: v for k, v in model.transformer.items() if k not in ONE_GPU}
        model = model.replace(transformer=fields)
    return config.replace(nproc_per_node=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                          expert_model_parallel_size=1, expert_tensor_parallel_size=None, sequence_parallel=False,
                          model=model)


def te_rng_tracker(description: ModelDescription, impl: str) -> bool:
    """Megatron-LM's rule (training/arguments.py:1873-1879) for a model its parser does not see: TE's RNG tracker
    once CUDA graphs are on and Transformer Engine builds the layers or the graphs, or where the source asks."""
    graphs = megatron_impl(impl)
    layers = description.value("transformer_impl", "transformer_engine")
    return description.te_rng_tracker or (graphs != "none" and "transformer_engine" in (layers, graphs))


def child_model(config: DiffConfig, impl: str, dropout: float) -> ModelDescription:
    """The model one child builds: the run's, with the child's graph settings, and `dropout` for both dropouts
    where it differs from the run's (a control pair's 0).

    Raises:
        UsageError: Megatron refuses the child's settings (its message).
        MissingDependencyError: megatron.training does not import, or the model needs Transformer Engine.
    """
    base = run_model(config)
    if base.unavailable is not None:
        raise MissingDependencyError(base.unavailable)
    fields = graph_fields(config, impl)
    if dropout != config.dropout:
        fields.update(DROPOUT.to_megatron(dropout))
    if base.line:
        changes = {**fields, "cuda_graph_scope_deprecated": None}
        if impl == "full_iteration":
            changes["check_for_nan_in_loss_and_grad"] = False  # validate_args asks for it with full_iteration
        line = with_values(MegatronLine(groups=base.line, env=config.env), changes)
        args, _ = megatron_args(line, world_size=config.nproc_per_node)
        model = describe_args(args, line, source=base.source, transformer=decode(dict(base.overrides)))
        return model.replace(layer_spec=base.layer_spec if base.layer_spec else model.layer_spec,
                             overrides=base.overrides)
    transformer = {**base.transformer, **{k: encode(v) for k, v in fields.items()}}
    child = base.replace(transformer=transformer)
    return child.replace(te_rng_tracker=te_rng_tracker(child, impl))


__all__ = ["DTYPE_FIELDS", "EAGER", "ONE_GPU", "builtin_model", "child_model", "graph_fields", "megatron_impl",
           "moe_defaults", "one_gpu", "run_model", "te_rng_tracker"]
