"""A Megatron-LM launch line -> DiffConfig values: model shape, TransformerConfig fields, run settings,
and one note naming the flags that do not apply.

The line is scanned by graphdoctor.rules.megatron_args (the scan `check --megatron-args` uses); flags
are Megatron-LM's own (graphdoctor.config.megatron_lm); flag -> TransformerConfig field follows Megatron-LM's
core_transformer_config_from_args (megatron/training/argument_utils.py of megatron-core 0.19.2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.config.graph_settings import MODULE_NAMES, GraphSettings, normalize
from graphdoctor.config.launch_scan import FlagUse, convert_value, scan_launch_line, unresolved_note
from graphdoctor.config.megatron_lm import (
    MegatronFlag,
    config_fields,
    enum_default_name,
    launcher_flags,
    megatron_flags,
)
from graphdoctor.config.schema import check_field_range
from graphdoctor.errors import UsageError
from graphdoctor.inputs import describe
from graphdoctor.suggest import did_you_mean

RUN_FIELDS = frozenset({"num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                        "seed", "cuda_graph_warmup_steps", "vocab_size"})
"""Megatron-LM dests that are DiffConfig fields of the same name."""
PARALLEL_FIELDS = frozenset({"tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
                             "overlap_grad_reduce", "use_distributed_optimizer", "ddp_bucket_size"})
"""Megatron-LM dests of the placement and DDP settings that are DiffConfig fields of the same name
(docs/multi-gpu.md); the processes come from torchrun's --nproc-per-node."""
GRAPH_DESTS = frozenset({"cuda_graph_impl", "enable_cuda_graph", "external_cuda_graph", "cuda_graph_modules",
                         "cuda_graph_scope_deprecated"})
MODEL_BUILDER = frozenset({"spec", "fp16_lm_cross_entropy", "position_embedding_type", "rotary_percent",
                           "rotary_base", "use_rope_scaling", "rotary_seq_len_interpolation_factor",
                           "max_position_embeddings", "untie_embeddings_and_output_weights", "padded_vocab_size"})
"""GPTModel arguments of Megatron-LM's gpt_config_from_args (argument_utils.py) that diff's GPTModel
(graphdoctor/child/megatron_setup.py build_model) does not take: it keeps GPTModel's defaults."""
FUNCTION_VALUED = frozenset({"squared_relu", "quick_geglu", "init_method_xavier_uniform"})
"""Flags Megatron-LM turns into a function-valued TransformerConfig field (activation_func, init_method);
a child spec carries plain values only."""
PER_GPU_MODEL_PARALLEL = frozenset({
    "gradient_accumulation_fusion", "deterministic_mode", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
    "cpu_offloading_num_layers", "cpu_offloading_retain_pinned_cpu_buffers", "use_cpu_initialization",
    "perform_initialization", "delay_wgrad_compute",
})
"""ModelParallelConfig fields that mean the same on one GPU; the others are distributed settings."""
PIPELINE_FIELDS = frozenset({"account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                             "pipeline_model_parallel_layout", "cp_comm_type", "delta_offload_bytes_across_pp_ranks"})
TOKENIZER_DESTS = frozenset({"tokenizer_type", "vocab_file", "merge_file", "tokenizer_model"})
MEGATRON_DROPOUT = 0.1
"""Megatron-LM's default --hidden-dropout and --attention-dropout."""
MEGATRON_EVAL_INTERVAL, MEGATRON_EVAL_ITERS = 1000, 100
"""Megatron-LM's default --eval-interval and --eval-iters (megatron/training/arguments.py)."""
EVAL_DESTS = frozenset({"eval_interval", "eval_iters"})
DEFAULT_VOCAB_DIVISOR = 128
"""Megatron-LM's default --make-vocab-size-divisible-by."""

CATEGORIES: dict[str, str] = {
    "launcher": "launcher (torchrun)",
    "distributed": "distributed (diff applies tensor- and pipeline-parallel sizes, sequence parallel and the "
                   "processes per node only)",
    "ddp": "DDP and optimizer (diff applies overlap_grad_reduce, the distributed optimizer and the bucket size; "
           "its optimizer is Adam: lr 1e-3, weight decay 0.01, clip 1.0)",
    "builder": "model builder (diff's GPTModel keeps its defaults: learned absolute positions, tied embeddings)",
    "function": "function- or enum-valued (a child run takes plain values)",
    "inference": "inference",
    "checkpoint": "checkpointing (diff neither reads nor writes the line's checkpoints; --save-at S --resume saves "
                  "one after step S and resumes from it in a fresh process, eager and graphed alike)",
    "other": "training loop, data, logging",
}
"""Why a flag does not apply, in the order the note lists them."""


@dataclass(frozen=True, slots=True)
class LaunchLine:
    """What a launch line sets: DiffConfig values and the notes that explain what it did not set."""

    values: dict[str, Any]
    """DiffConfig field -> value (`transformer` holds the TransformerConfig fields)."""
    sources: dict[str, str]
    """DiffConfig field -> the flag it came from (for the override note)."""
    notes: tuple[tuple[str | None, str], ...]
    """(the DiffConfig field a note is about or None, note)."""


@dataclass(slots=True)
class _Reading:
    values: dict[str, Any] = field(default_factory=dict)
    transformer: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    given: dict[str, Any] = field(default_factory=dict)
    """Megatron-LM dest -> value, for the flags that combine (graphs, dropout, batch, vocab)."""
    skipped: dict[str, list[str]] = field(default_factory=dict)
    notes: list[tuple[str | None, str]] = field(default_factory=list)

    def skip(self, category: str, flag: str) -> None:
        flags = self.skipped.setdefault(category, [])
        if flag not in flags:
            flags.append(flag)


def _value(use: FlagUse, spec: MegatronFlag) -> Any:
    """The flag's value as Megatron-LM's parser would store it (enums by name).

    Raises:
        UsageError: a value where none is taken, the wrong number of values, the wrong type or choice.
    """
    values = list(use.values)
    if spec.kind in ("true", "false"):
        if values:
            raise UsageError(f"{use.flag}: takes no value, got {describe(values[0])}")
        return spec.kind == "true"
    count = spec.nargs
    if count is None and len(values) != 1:
        raise UsageError(f"{use.flag}: expected one value, got {len(values)} ({' '.join(values)[:80]})")
    if isinstance(count, int) and len(values) != count:
        raise UsageError(f"{use.flag}: expected {count} values, got {len(values)}")
    if count == "+" and not values:
        raise UsageError(f"{use.flag}: expected a value")
    kind = spec.kind if spec.kind in ("int", "float", "freq") else "str"
    items = [convert_value(use.flag, kind, [v]) for v in values]
    if spec.choices is not None:
        for item in items:
            if str(item) not in spec.choices:
                raise UsageError(f"{use.flag}: got {describe(item)}, expected one of {', '.join(spec.choices)}")
    return items[0] if count is None else items


def _route(use: FlagUse, spec: MegatronFlag, value: Any, state: _Reading) -> None:
    """Put one Megatron-LM flag's value where diff uses it, or in the not-applied list."""
    dest = spec.dest
    if dest in RUN_FIELDS:
        state.values[dest], state.sources[dest] = value, use.flag
    elif dest in PARALLEL_FIELDS:
        state.values[dest], state.sources[dest] = value, use.flag
        state.given[dest] = value  # also read by the micro-batch and vocabulary arithmetic
    elif dest in ("bf16", "fp16"):
        if value:
            state.values["dtype"], state.sources["dtype"] = dest, use.flag
    elif dest in GRAPH_DESTS or dest in ("hidden_dropout", "attention_dropout", "global_batch_size",
                                         "make_vocab_size_divisible_by", "group_query_attention",
                                         "num_query_groups", "swiglu", "bias_gelu_fusion", "bias_swiglu_fusion",
                                         "tensor_model_parallel_size", "pipeline_model_parallel_size",
                                         "context_parallel_size") or dest in TOKENIZER_DESTS or dest in EVAL_DESTS:
        state.given[dest] = value
        state.sources.setdefault(dest, use.flag)
        if dest.endswith("parallel_size"):
            state.skip("distributed", use.flag)
        elif dest in TOKENIZER_DESTS:
            state.skip("other", use.flag)
    elif dest == "transformer_impl":
        if value is None:
            return
        if value == "inference_optimized":
            state.skip("inference", use.flag)
        else:
            state.values["layer_spec"] = "local" if value == "local" else "te"
            state.sources["layer_spec"] = use.flag
    elif dest == "num_experts":
        state.transformer["num_moe_experts"] = value
    elif dest == "no_persist_layer_norm":
        state.transformer["persist_layer_norm"] = not value
    else:
        _route_other(use, spec, value, state)


def _route_other(use: FlagUse, spec: MegatronFlag, value: Any, state: _Reading) -> None:
    dest = spec.dest
    transformer, model_parallel = config_fields("transformer"), config_fields("model_parallel")
    if dest in MODEL_BUILDER:
        state.skip("builder", use.flag)
    elif dest in FUNCTION_VALUED:
        state.skip("function", use.flag)
    elif spec.group == "inference" or dest.startswith("inference_"):
        state.skip("inference", use.flag)
    elif dest in PIPELINE_FIELDS or (dest in model_parallel and dest not in PER_GPU_MODEL_PARALLEL):
        state.skip("distributed", use.flag)
    elif dest in config_fields("ddp") or dest in config_fields("optimizer") or dest.startswith("ddp_") \
            or spec.group in ("learning rate and weight decay", "mixed precision"):
        state.skip("ddp", use.flag)
    elif spec.group == "distributed init":
        state.skip("distributed", use.flag)
    elif spec.group == "checkpointing":
        state.skip("checkpoint", use.flag)
    elif dest in transformer:
        if spec.kind == "enum":
            if value != enum_default_name(dest):
                state.skip("function", use.flag)  # an enum member cannot cross to the child as JSON
            return
        state.transformer[dest] = value
    else:
        state.skip("other", use.flag)


def read_launch_line(text_or_at: str) -> LaunchLine:
    """Read a Megatron-LM launch line (or `@file`) into DiffConfig values.

    Raises:
        UsageError: an unknown flag (with the closest Megatron-LM flag), a value of the wrong type.
        InputFileError: an unreadable @file (missing, not a regular file, over 1 MiB, not UTF-8).
        MissingDependencyError: Megatron-LM's argument parser does not import.
    """
    uses = scan_launch_line(text_or_at)
    table, state = megatron_flags(), _Reading()
    applied: list[FlagUse] = []
    for use in uses:
        spec = table.get(use.flag)
        if spec is None or use.launcher:
            if use.launcher or use.flag in launcher_flags():
                if use.flag.replace("_", "-") != "--nproc-per-node":  # read as nproc_per_node
                    state.skip("launcher", use.flag)
                state.given.setdefault(use.flag.replace("_", "-"), use.values)
                continue
            at = f" ({use.where})" if use.where else ""
            raise UsageError(f"--megatron-args: {use.flag}{at} is not a Megatron-LM flag"
                             f"{did_you_mean(use.flag, table, cutoff=0.6)}")
        if use.unresolved and not use.values and spec.kind not in ("true", "false"):
            probe = _Reading()
            _route(use, spec, None, probe)  # where it would go: a flag that does not apply is listed there
            for category, flags in probe.skipped.items():
                state.skip(category, flags[0])
            if not probe.skipped:
                applied.append(use)
            continue
        value = _value(use, spec)
        if spec.dest in RUN_FIELDS or spec.dest in ("num_experts",):
            check_field_range(spec.dest if spec.dest != "num_experts" else "num_moe_experts", value, use.flag)
        _route(use, spec, value, state)
    note = unresolved_note(applied)
    if note:
        state.notes.append((None, note))
    for use in uses:
        if use.unresolved and use.values == () and table.get(use.flag, None) is not None \
                and table[use.flag].kind in ("true", "false"):
            state.notes.append((None, f"{use.flag} is followed by {use.unresolved[0]}, which the text does not "
                                      "set: flags it may hold were not read"))
    _combine(state)
    values = dict(state.values)
    if state.transformer:
        from graphdoctor.config.megatron_lm import validate_transformer

        for key, value in state.transformer.items():
            check_field_range(key, value, f"--megatron-args: transformer.{key}")
        validate_transformer(state.transformer, "--megatron-args")
        values["transformer"] = dict(state.transformer)
    _not_applied_note(state)
    return LaunchLine(values=values, sources=state.sources, notes=tuple(state.notes))


def _combine(state: _Reading) -> None:
    """The values that combine several flags: graphs, dropout, micro-batches, vocabulary, activation."""
    _graphs(state)
    given = state.given
    if "hidden_dropout" in given or "attention_dropout" in given:
        hidden = given.get("hidden_dropout", MEGATRON_DROPOUT)
        attention = given.get("attention_dropout", MEGATRON_DROPOUT)
        state.values["dropout"] = max(hidden, attention)
        state.sources["dropout"] = "--hidden-dropout" if hidden >= attention else "--attention-dropout"
        if hidden != attention:
            state.notes.append(("dropout", f"diff applies one dropout to hidden and attention; the line has "
                                           f"--hidden-dropout {hidden:g} and --attention-dropout {attention:g}: "
                                           f"took {max(hidden, attention):g}, the larger, so graphed random draws "
                                           f"are still exercised"))
    _microbatches(state)
    _vocab(state)
    _processes(state)
    _evaluation(state)
    if "layer_spec" not in state.values:
        state.notes.append(("layer_spec", "no --transformer-impl: Megatron-LM builds Transformer Engine layers by "
                                          "default, diff its local spec (--layer-spec te to build TE layers)"))
    if given.get("swiglu"):
        state.transformer["gated_linear_unit"] = True
        fusion = given.get("bias_swiglu_fusion")
        state.notes.append((None, "--swiglu: gated_linear_unit is set; activation_func stays GELU (Megatron-LM "
                                  "sets SiLU, a function a child run cannot take): the same shapes, another "
                                  "activation"))
    else:
        fusion = given.get("bias_gelu_fusion")
    if fusion is not None:
        state.transformer["bias_activation_fusion"] = fusion
    if given.get("group_query_attention"):
        state.transformer["num_query_groups"] = given.get("num_query_groups", 1)
    elif "num_query_groups" in given:
        state.skip("other", "--num-query-groups")  # Megatron-LM reads it only with --group-query-attention


GRAPH_DEFAULTS: dict[str, Any] = {"cuda_graph_impl": "none", "enable_cuda_graph": False, "external_cuda_graph": False,
                                  "cuda_graph_modules": []}
"""TransformerConfig's defaults of the CUDA-graph settings graph_choice reads (the deprecated scope: None)."""


def graph_choice(value: Callable[[str], Any], name: Callable[[str], str]) -> GraphSettings:
    """What diff takes from Megatron's CUDA-graph settings, a launch line's or a run file's `transformer:`: the
    implementation to diff (`impl`, "none" where they build no graphs) and its `modules`, as Megatron normalises
    them (rules.graphconfig.normalize: the legacy flags, the deprecated scope, the MoE modules added for `local`).

    Args:
        value: a TransformerConfig field's value, None where unset (GRAPH_DEFAULTS apply).
        name: how the user wrote a field, for the error (`--cuda-graph-modules`, `run.yaml: transformer.cuda_graph_modules`).

    Raises:
        UsageError: a module Megatron does not know, or modules with full_iteration (Megatron-LM refuses the pair).
    """
    settings = normalize(lambda field: GRAPH_DEFAULTS.get(field) if value(field) is None else value(field))
    if settings.bad_entries:
        bad = str(settings.bad_entries[0])
        raise UsageError(f"{name('cuda_graph_modules')}: got {describe(bad)}, expected one of "
                         f"{', '.join(MODULE_NAMES)}{did_you_mean(bad, MODULE_NAMES)}")
    if settings.impl == "full_iteration" and settings.modules:
        raise UsageError(f"{name('cuda_graph_modules')}: expected none with {name('cuda_graph_impl')} full_iteration "
                         "(Megatron-LM refuses the pair)")
    return settings


def _graphs(state: _Reading) -> None:
    given = state.given
    if not any(d in given for d in GRAPH_DESTS):
        state.notes.append(("impls", "the line builds no CUDA graphs: diff compares its default implementations"))
        return
    scope = given.get("cuda_graph_scope_deprecated")
    values: dict[str, Any] = {k: given[k] for k in ("cuda_graph_impl", "enable_cuda_graph", "external_cuda_graph")
                              if k in given}
    values["cuda_graph_modules"] = scope if scope is not None else given.get("cuda_graph_modules")
    settings = graph_choice(values.get, lambda field: "--" + field.replace("_", "-"))
    if settings.impl == "none":
        state.notes.append(("impls", "the line builds no CUDA graphs (--cuda-graph-impl none): diff compares "
                                     "its default implementations"))
    else:
        state.values["impls"], state.sources["impls"] = (settings.impl,), "--cuda-graph-impl"
    if settings.modules:
        state.values["cuda_graph_modules"] = settings.modules
        state.sources["cuda_graph_modules"] = "--cuda-graph-modules"


def _world_size(given: dict[str, Any]) -> int | None:
    """GPUs of the launch from torchrun's --nproc-per-node and --nnodes, when both are plain integers."""
    counts = []
    for flag, default in (("--nproc-per-node", None), ("--nnodes", ("1",))):
        values = given.get(flag, default)
        if not values or not str(values[0]).isdigit():
            return None
        counts.append(int(values[0]))
    return counts[0] * counts[1]


def _processes(state: _Reading) -> None:
    """nproc_per_node from torchrun's --nproc-per-node (one node: diff runs every child on one host)."""
    world = _world_size(state.given)
    if world is None or world == 1:
        return
    nodes = state.given.get("--nnodes", ("1",))[0]
    if str(nodes) != "1":
        state.notes.append(("nproc_per_node", f"--nnodes {nodes}: diff runs on one host; nproc_per_node keeps "
                                              f"its default (--nproc-per-node N to choose)"))
        return
    state.values["nproc_per_node"], state.sources["nproc_per_node"] = world, "--nproc-per-node"


def _microbatches(state: _Reading) -> None:
    given = state.given
    if "global_batch_size" not in given:
        return
    global_batch = given["global_batch_size"]
    micro = state.values.get("micro_batch_size", 1)
    model_parallel = 1
    for dest in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        model_parallel *= given.get(dest, 1)
    world = _world_size(given)
    data_parallel = world // model_parallel if world and world % model_parallel == 0 else 1
    per_step = micro * data_parallel
    if global_batch % per_step:
        state.notes.append(("num_microbatches", f"--global-batch-size {global_batch} is not a multiple of "
                                                f"micro-batch {micro} x data-parallel {data_parallel}: "
                                                f"num_microbatches keeps its default"))
        return
    state.values["num_microbatches"] = global_batch // per_step
    state.sources["num_microbatches"] = "--global-batch-size"
    if data_parallel > 1:
        state.notes.append(("num_microbatches", f"num_microbatches {global_batch // per_step}: global batch "
                                                f"{global_batch} / (micro-batch {micro} x data-parallel "
                                                f"{data_parallel}), what one rank runs per step"))


def _evaluation(state: _Reading) -> None:
    """eval_interval and eval_iters from --eval-interval and --eval-iters, with Megatron-LM's defaults for the
    one not given. Megatron-LM evaluates every eval_interval iterations and once after training, and only
    when eval_iters > 0 (its do_valid); diff's schedule does the same within its --steps."""
    given = state.given
    if not EVAL_DESTS & given.keys():
        return
    interval = given.get("eval_interval", MEGATRON_EVAL_INTERVAL)
    iters = given.get("eval_iters", MEGATRON_EVAL_ITERS)
    source = state.sources.get("eval_interval", state.sources.get("eval_iters", "--eval-interval"))
    for dest, value in (("eval_interval", interval), ("eval_iters", iters)):
        if value < 0:
            raise UsageError(f"{state.sources[dest]}: got {value}, expected >= 0")
    if not iters or not interval:
        flag = "--eval-iters" if not iters else "--eval-interval"
        state.values["eval_interval"], state.sources["eval_interval"] = 0, flag
        state.notes.append(("eval_interval", f"{flag} 0: the line never evaluates; diff runs no evaluation"))
        return
    state.values["eval_interval"], state.sources["eval_interval"] = interval, source
    state.values["eval_iters"], state.sources["eval_iters"] = iters, state.sources.get("eval_iters", source)
    state.notes.append(("eval_interval", f"evaluation after every {interval} training steps and after the last, "
                                         f"{iters} forward-only iterations each, as Megatron-LM would run them "
                                         f"(--eval-interval K --eval-iters E to choose)"))


def _vocab(state: _Reading) -> None:
    given = state.given
    vocab = state.values.get("vocab_size")
    if vocab is None:
        named = [state.sources[d] for d in ("tokenizer_type", "vocab_file", "tokenizer_model") if d in given]
        if named:
            state.notes.append(("vocab_size", f"the line names a tokenizer ({', '.join(named)}) but no "
                                              f"--vocab-size; diff trains on synthetic tokens and needs --vocab-size "
                                              f"N for the model's vocabulary (its default is used)"))
        return
    divisor = given.get("make_vocab_size_divisible_by", DEFAULT_VOCAB_DIVISOR) * given.get(
        "tensor_model_parallel_size", 1)
    padded = -(-vocab // divisor) * divisor
    if padded != vocab:
        state.values["vocab_size"] = padded
        state.notes.append(("vocab_size", f"--vocab-size {vocab} padded to {padded} (a multiple of {divisor}), "
                                          f"as Megatron-LM pads it"))


def _not_applied_note(state: _Reading) -> None:
    parts = [f"{CATEGORIES[c]}: {', '.join(state.skipped[c])}" for c in CATEGORIES if state.skipped.get(c)]
    if parts:
        state.notes.append((None, "flags that do not apply to diff: " + "; ".join(parts)))


def apply_launch_line(values: dict[str, Any]) -> dict[str, Any]:
    """DiffConfig values: the launch line of `values["megatron_args"]`, then `values` over it (the run
    file's `run:` and `transformer:`, then flags), with `launch_notes` set.

    Raises:
        UsageError / InputFileError / MissingDependencyError: as read_launch_line.
    """
    line = read_launch_line(str(values["megatron_args"]))
    merged = {**line.values, **values}
    transformer = {**line.values.get("transformer", {}), **values.get("transformer", {})}
    if transformer:
        merged["transformer"] = transformer
    overridden = [k for k in values if k in line.sources and k in line.values
                  and _show(values[k]) != _show(line.values[k])]
    notes = [text for about, text in line.notes if about not in overridden]
    if overridden:
        notes.append("explicit values override the launch line: " + ", ".join(
            f"{k} {_show(values[k])} (line: {line.sources[k]} {_show(line.values[k])})" for k in overridden))
    merged["launch_notes"] = tuple(notes)
    return merged


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


__all__ = ["CATEGORIES", "GRAPH_DEFAULTS", "LaunchLine", "apply_launch_line", "graph_choice", "read_launch_line"]
