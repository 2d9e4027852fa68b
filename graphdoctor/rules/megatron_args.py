"""Parse a Megatron-LM launch line into TransformerConfig fields, Megatron-LM-only settings and run facts.

Only the CUDA-graph related flags (and the ones their rules depend on) are understood; every other
flag is ignored and counted in the notes. Accepts a string or `@path` (a flag list, a torchrun line or
a whole shell script: `\\` continuations, `#` comments, variables and arrays it sets), and remembers
where each flag was so findings can point at it. `graphdoctor diff` reads the same scan
(graphdoctor.config.from_megatron).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphdoctor.config.launch_scan import (
    FlagUse,
    convert_value,
    parse_moe_layer_freq,
    scan_launch,
    scan_launch_line,
    unresolved_note,
)
from graphdoctor.config.schema import check_field_range
from graphdoctor.errors import UsageError

# flag -> (section, key, kind); kind: true/false (store_true/store_false), int, float, str, list,
# freq (moe_layer_freq int or pattern), list3 (nargs=3).
FLAGS: dict[str, tuple[str, str, str]] = {
    "--cuda-graph-impl": ("transformer", "cuda_graph_impl", "str"),
    "--cuda-graph-modules": ("transformer", "cuda_graph_modules", "list"),
    "--cuda-graph-scope": ("transformer", "cuda_graph_scope", "list"),
    "--enable-cuda-graph": ("transformer", "enable_cuda_graph", "true"),
    "--external-cuda-graph": ("transformer", "external_cuda_graph", "true"),
    "--cuda-graph-warmup-steps": ("transformer", "cuda_graph_warmup_steps", "int"),
    "--inference-cuda-graph-scope": ("transformer", "inference_cuda_graph_scope", "str"),
    "--te-rng-tracker": ("args", "te_rng_tracker", "true"),
    "--no-check-for-nan-in-loss-and-grad": ("args", "check_for_nan_in_loss_and_grad", "false"),
    "--recompute-granularity": ("transformer", "recompute_granularity", "str"),
    "--recompute-modules": ("transformer", "recompute_modules", "list"),
    "--recompute-method": ("transformer", "recompute_method", "str"),
    "--recompute-num-layers": ("transformer", "recompute_num_layers", "int"),
    "--cpu-offloading": ("transformer", "cpu_offloading", "true"),
    "--cpu-offloading-num-layers": ("transformer", "cpu_offloading_num_layers", "int"),
    "--fine-grained-activation-offloading": ("transformer", "fine_grained_activation_offloading", "true"),
    "--offload-modules": ("transformer", "offload_modules", "list"),
    "--delay-wgrad-compute": ("transformer", "delay_wgrad_compute", "true"),
    "--overlap-grad-reduce": ("args", "overlap_grad_reduce", "true"),
    "--overlap-moe-expert-parallel-comm": ("transformer", "overlap_moe_expert_parallel_comm", "true"),
    "--num-experts": ("transformer", "num_moe_experts", "int"),
    "--moe-layer-freq": ("transformer", "moe_layer_freq", "freq"),
    "--moe-router-topk": ("transformer", "moe_router_topk", "int"),
    "--moe-router-load-balancing-type": ("transformer", "moe_router_load_balancing_type", "str"),
    "--moe-router-padding-for-fp8": ("transformer", "moe_router_padding_for_fp8", "true"),
    "--moe-expert-capacity-factor": ("transformer", "moe_expert_capacity_factor", "float"),
    "--moe-pad-expert-input-to-capacity": ("transformer", "moe_pad_expert_input_to_capacity", "true"),
    "--moe-token-dispatcher-type": ("transformer", "moe_token_dispatcher_type", "str"),
    "--moe-flex-dispatcher-backend": ("transformer", "moe_flex_dispatcher_backend", "str"),
    "--moe-input-jitter-eps": ("transformer", "moe_input_jitter_eps", "float"),
    "--moe-shared-expert-intermediate-size": ("transformer", "moe_shared_expert_intermediate_size", "int"),
    "--moe-shared-expert-overlap": ("transformer", "moe_shared_expert_overlap", "true"),
    "--moe-grouped-gemm": ("transformer", "moe_grouped_gemm", "true"),
    "--expert-model-parallel-size": ("transformer", "expert_model_parallel_size", "int"),
    "--hidden-dropout": ("transformer", "hidden_dropout", "float"),
    "--attention-dropout": ("transformer", "attention_dropout", "float"),
    "--transformer-impl": ("transformer", "transformer_impl", "str"),
    "--fp8-format": ("transformer", "fp8", "str"),
    "--fp8-recipe": ("transformer", "fp8_recipe", "str"),
    "--fp8-param-gather": ("transformer", "fp8_param", "true"),
    "--fp4-format": ("transformer", "fp4", "str"),
    "--fp4-recipe": ("transformer", "fp4_recipe", "str"),
    "--load": ("args", "load", "str"),
    "--hybrid-layer-pattern": ("args", "hybrid_layer_pattern", "str"),
    "--bf16": ("transformer", "bf16", "true"),
    "--fp16": ("transformer", "fp16", "true"),
    "--loss-scale": ("args", "loss_scale", "float"),
    "--num-layers": ("transformer", "num_layers", "int"),
    "--hidden-size": ("transformer", "hidden_size", "int"),
    "--ffn-hidden-size": ("transformer", "ffn_hidden_size", "int"),
    "--num-attention-heads": ("transformer", "num_attention_heads", "int"),
    "--tensor-model-parallel-size": ("transformer", "tensor_model_parallel_size", "int"),
    "--pipeline-model-parallel-size": ("transformer", "pipeline_model_parallel_size", "int"),
    "--sequence-parallel": ("transformer", "sequence_parallel", "true"),
    "--variable-seq-lengths": ("transformer", "variable_seq_lengths", "true"),
    "--disable-bias-linear": ("transformer", "add_bias_linear", "false"),
    "--add-qkv-bias": ("transformer", "add_qkv_bias", "true"),
    "--no-gradient-accumulation-fusion": ("args", "gradient_accumulation_fusion", "false"),
    "--eval-iters": ("args", "eval_iters", "int"),
    "--eval-interval": ("args", "eval_interval", "int"),
    "--skip-train": ("args", "skip_train", "true"),
    "--rampup-batch-size": ("args", "rampup_batch_size", "list3"),
    "--seq-length": ("run", "seq_length", "int"),
    "--micro-batch-size": ("run", "micro_batch_size", "int"),
}

SHOWN_IGNORED = 6
"""The flags no rule reads that the note names (the rest are counted)."""

ARGS_DEFAULTS: dict[str, Any] = {
    "check_for_nan_in_loss_and_grad": True,
    "te_rng_tracker": False,
    "overlap_grad_reduce": False,
    "gradient_accumulation_fusion": True,
    "eval_iters": 100,
    "skip_train": False,
    "loss_scale": None,
}
"""Megatron-LM defaults of the `args.*` settings (training/arguments.py)."""

TRANSFORMER_DEFAULTS_FROM_ARGS: dict[str, Any] = {"cuda_graph_modules": []}
"""TransformerConfig fields whose Megatron-LM default differs from the dataclass default."""


@dataclass(slots=True)
class MegatronArgs:
    """The parsed launch line."""

    transformer: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    locations: dict[str, str] = field(default_factory=dict)
    """`section.key` -> where it was given (`launch.txt:4` or `--flag`)."""
    notes: list[str] = field(default_factory=list)
    uses: list[FlagUse] = field(default_factory=list)
    """Every flag of the line as scanned (Megatron-LM's parser reads them all: graphdoctor.rules.megatron_reading)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables a launch script exports with values it sets (the run's environment)."""


def _is_megatron_flag(flag: str) -> bool:
    """True when Megatron-LM's own parser knows `flag` (with the inference scripts' flags)."""
    from graphdoctor.config.megatron_lm import megatron_flags
    from graphdoctor.errors import MissingDependencyError

    try:
        return flag in megatron_flags("inference")
    except MissingDependencyError:
        return False


def parse_megatron_args(text_or_at: str) -> MegatronArgs:
    """Parse a launch line (or `@file`) into the flags `check` understands (FLAGS).

    Raises:
        UsageError: a known flag without its value or with a value of the wrong type.
        InputFileError: an unreadable @file.
    """
    uses, env = scan_launch(text_or_at)
    parsed = parse_megatron_uses(uses)
    parsed.env.update(env)
    return parsed


def parse_megatron_uses(uses: list[FlagUse]) -> MegatronArgs:
    """The flags `check` understands (FLAGS) of scanned flag uses (a launch line's, a functional test's).

    Raises:
        UsageError: a known flag without its value or with a value of the wrong type.
    """
    result = MegatronArgs(uses=list(uses))
    ignored: list[str] = []
    for use in uses:
        flag, values = use.flag, list(use.values)
        spec = FLAGS.get(flag)
        if spec is None:
            # a flag Megatron-LM's parser refuses is GD130's (graphdoctor.rules.megatron_reading); the launcher's
            # flags are torchrun's
            if not use.launcher and flag not in ignored and _is_megatron_flag(flag):
                ignored.append(flag)
            continue
        section, key, kind = spec
        if kind in ("true", "false"):
            value: Any = kind == "true"
        elif not values and use.unresolved:
            continue  # named once in unresolved_note
        elif not values:
            raise UsageError(f"{flag}: expected a value")
        else:
            value = convert_value(flag, kind, values if kind in ("list", "list3") else values[:1])
        if key == "cpu_offloading_num_layers" and value > 0:
            result.transformer["cpu_offloading"] = True
        if section != "args":
            check_field_range(key, value, flag)
        getattr(result, section)[key] = value
        result.locations[f"{section}.{key}"] = use.where or flag
    if ignored:
        noun = "flag" if len(ignored) == 1 else f"{len(ignored)} flags"
        shown = ", ".join(ignored[:SHOWN_IGNORED]) + (f" and {len(ignored) - SHOWN_IGNORED} more"
                                                      if len(ignored) > SHOWN_IGNORED else "")
        result.notes.append(f"{noun} no rule reads (Megatron-LM's parser takes them): {shown}")
    note = unresolved_note([u for u in uses if u.flag in FLAGS and FLAGS[u.flag][2] not in ("true", "false")])
    if note:
        result.notes.append(note)
    return result


__all__ = ["ARGS_DEFAULTS", "FLAGS", "TRANSFORMER_DEFAULTS_FROM_ARGS", "FlagUse", "convert_value", "MegatronArgs", "parse_megatron_args",
           "parse_megatron_uses",
           "scan_launch_line", "unresolved_note",
           "parse_moe_layer_freq"]
