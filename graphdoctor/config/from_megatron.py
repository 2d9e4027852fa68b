"""DiffConfig values from a model Megatron describes: a Megatron-LM launch line (or functional test) resolved by
Megatron-LM's own parser, or a Megatron-Bridge `model:` built as Megatron's TransformerConfig; and each child's
own model (child_model), with graphdoctor's part put in: the shrink, the graph settings per implementation, the
placement and the batches.

What graphdoctor owns goes in as Megatron settings before Megatron validates them (flags on a line, fields on a
mapping), so that what Megatron derives from them (sequence parallel off at T 1, the TE RNG tracker for graphs,
the padded vocabulary, default ffn size and kv channels) is what the run gets; the DiffConfig fields are then read
back from what Megatron resolved, so the report, the placement and the children say the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from graphdoctor.config.bridge import UNSET_EVAL_INTERVAL, BridgeConfig
from graphdoctor.config.codec import decode, encode
from graphdoctor.config.description import ModelDescription, describe_model, plain, unvalidated_class
from graphdoctor.config.diff_config import DiffConfig
from graphdoctor.config.fit import EVAL_ITERS_FIT, PLACEMENT, fit_placement, fitted_microbatches, gpus_at_hand
from graphdoctor.config.fp8 import initialisation
from graphdoctor.config.graph_settings import graph_choice
from graphdoctor.config.impl import MEGATRON_EAGER
from graphdoctor.config.launch_scan import parse_moe_layer_freq
from graphdoctor.config.megatron_line import (
    MEGATRON_ERRORS,
    NOT_APPLIED_WHY,
    MegatronLine,
    MegatronRefusal,
    describe_args,
    dest_values,
    megatron_args,
    megatron_message,
    needs_te,
    not_applied,
    torchrun_counts,
    with_values,
)
from graphdoctor.config.megatron_lm import megatron_flags
from graphdoctor.config.shrink import (
    format_freq,
    hybrid_layer_count,
    layer_kinds,
    shrink_hybrid_pattern,
    shrink_moe_layer_freq,
)
from graphdoctor.config.twins import BY_FIELD, SAME_NAME, TWINS, Getter, getter, megatron_of, read_twins
from graphdoctor.errors import UsageError

LINE_FIELDS: tuple[str, ...] = SAME_NAME
"""DiffConfig fields that are Megatron settings of the same name (config.twins): given by a flag or the run file,
they go into the model's settings before Megatron validates them."""

EAGER_GRAPHS: dict[str, Any] = {"cuda_graph_impl": MEGATRON_EAGER, "cuda_graph_modules": [], "enable_cuda_graph": False,
                                "external_cuda_graph": False}
GRAPH_SETTINGS: frozenset[str] = frozenset({"cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope",
                                            "enable_cuda_graph", "external_cuda_graph"})
"""Graph settings each child sets itself (EAGER_GRAPHS for the reference): not taken from explicit fields."""
PER_CHILD: frozenset[str] = frozenset({"cuda_graph_scope", "inference_cuda_graph_scope"})
"""Graph settings Megatron-LM derives from each child's cuda_graph_impl (validate_args normalises the inference
scope per implementation): not the run's, so not in the rules' view of it."""
DEFAULT_VOCAB = 1024
"""diff's vocabulary when the line names a tokenizer but no --vocab-size (synthetic tokens need a size)."""
def _required_defaults() -> dict[str, Any]:
    defaults = {f.name: f.default for f in dataclasses.fields(DiffConfig)}
    out: dict[str, Any] = {}
    for twin in TWINS:
        if twin.required:
            out[twin.field] = defaults[twin.field]
            if twin.field == "seq_length":  # Megatron-LM requires it too; it follows the sequence length
                out["max_position_embeddings"] = 0
    return out


REQUIRED_DEFAULTS: dict[str, Any] = _required_defaults()
"""Settings Megatron-LM requires that a partial line may leave out (config.twins, `required=True`): DiffConfig's
defaults, and max_position_embeddings, which follows the sequence length."""


def required_settings(given: Mapping[str, Any], settings: Mapping[str, Any], who: str,
                      ) -> tuple[dict[str, Any], str | None]:
    """The REQUIRED_DEFAULTS neither the line (`given`, dest -> values) nor `settings` set, and the note saying so
    (`who`: "diff takes")."""
    missing = {dest: value for dest, value in REQUIRED_DEFAULTS.items() if dest not in settings and dest not in given}
    if "max_position_embeddings" in missing:
        sequence = settings.get("seq_length", missing.get("seq_length"))
        try:
            missing["max_position_embeddings"] = int(sequence if sequence is not None else given["seq_length"][0])
        except (TypeError, ValueError, IndexError):
            missing["max_position_embeddings"] = REQUIRED_DEFAULTS["seq_length"]
    if not missing:
        return {}, None
    return missing, ("the line sets no " + ", ".join(f"--{d.replace('_', '-')}" for d in missing) + " (Megatron-LM "
                     f"needs them): {who} " + ", ".join(f"{d} {v}" for d, v in missing.items()))


def converted_twins(get: Getter) -> dict[str, Any]:
    """`dtype`, `dropout` and `layer_spec` of a complete Megatron configuration (validated args, a
    TransformerConfig): fp32 where neither bf16 nor fp16 is set, the TE spec for any transformer_impl but local."""
    read = read_twins(get, tuple(BY_FIELD[name] for name in ("dtype", "dropout", "layer_spec")))
    return {"dtype": read.get("dtype", "fp32"), "dropout": read["dropout"], "layer_spec": read.get("layer_spec", "te")}


def megatron_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The Megatron settings (TransformerConfig / Megatron-LM names) of the DiffConfig values given explicitly."""
    # transformer_impl after the fp8 settings: the order a line's added flags are written in
    out = megatron_of(dict(values), tuple(twin for twin in TWINS if twin.field != "layer_spec"))
    if values.get("fp8_format") is not None:
        out["fp8"] = values["fp8_format"]
    if values.get("fp8_recipe") is not None:
        out["fp8_recipe"] = values["fp8_recipe"]
    if values.get("fp8_param_gather"):
        out["fp8_param_gather"] = True
    out.update(megatron_of(dict(values), (BY_FIELD["layer_spec"],)))
    return out


def _moe_kinds(freq: Any) -> int:
    """Kinds of layer a moe_layer_freq makes: dense and MoE, or one (every layer MoE, or no pattern)."""
    pattern = parse_moe_layer_freq(freq) if isinstance(freq, str) else freq
    if isinstance(pattern, list):
        return len(set(pattern)) or 1
    return 2 if isinstance(pattern, int) and pattern > 1 else 1


def _shrink(current: Mapping[str, Any], settings: dict[str, Any], notes: list[str], fit: bool = False) -> None:
    """Per-layer patterns made to fit a smaller --num-layers, and a pipeline layout dropped with its pipeline; with
    --fit, a --num-layers below the pattern's kinds of layer is raised to keep each kind."""
    layers = settings.get("num_layers")
    freq = current.get("moe_layer_freq")
    if fit and layers is not None:
        kinds = max(layer_kinds(current.get("hybrid_layer_pattern")), _moe_kinds(freq))
        if kinds > layers:
            notes.append(f"--fit: --num-layers {layers} raised to {kinds}, one layer of each kind the model has")
            layers = settings["num_layers"] = kinds
    if layers is not None and freq is not None:
        pattern = parse_moe_layer_freq(freq) if isinstance(freq, str) else freq
        shrunk = shrink_moe_layer_freq(pattern, layers)
        if shrunk != pattern:
            settings["moe_layer_freq"] = format_freq(shrunk) if isinstance(freq, str) else shrunk
            notes.append(f"--moe-layer-freq shrunk to {format_freq(shrunk)} for {layers} layers (every kind of "
                         "layer kept)")
    hybrid = current.get("hybrid_layer_pattern")
    if layers is not None and hybrid and hybrid_layer_count(str(hybrid)) != layers:
        settings["hybrid_layer_pattern"] = shrink_hybrid_pattern(str(hybrid), layers)
        notes.append(f"--hybrid-layer-pattern shrunk to {settings['hybrid_layer_pattern']} for {layers} layers")
    layout = current.get("pipeline_model_parallel_layout")
    if layout and settings.get("pipeline_model_parallel_size", 0) == 1:
        settings["pipeline_model_parallel_layout"] = None
        notes.append("--pipeline-model-parallel-layout dropped with the pipeline (pipeline size 1)")
    elif layout and layers is not None:
        raise UsageError(f"--num-layers {layers}: the line's --pipeline-model-parallel-layout {layout} places its "
                         "own layers on pipeline stages; give --pipeline-model-parallel-size 1 or a line with a "
                         f"layout for {layers} layers")


def _line_settings(line: MegatronLine) -> dict[str, Any]:
    """The line's own values of the settings _shrink reads (their text)."""
    given = dest_values(line)
    return {k: (v[0] if v else None) for k, v in given.items()
            if k in ("moe_layer_freq", "hybrid_layer_pattern", "pipeline_model_parallel_layout")}


def _world(values: Mapping[str, Any], line: MegatronLine, notes: list[str]) -> int:
    """Processes of every child: --nproc-per-node, else the line's torchrun (one node), else 1."""
    if values.get("nproc_per_node") is not None:
        return int(values["nproc_per_node"])
    counts = torchrun_counts(line)
    if counts is None:
        return 1
    per_node, nodes = counts
    if nodes != 1:
        notes.append(f"--nnodes {nodes}: diff runs on one host; nproc_per_node keeps its default "
                     "(--nproc-per-node N to choose)")
        return 1
    return per_node


def _fit_line(values: Mapping[str, Any], given: Mapping[str, tuple[str, ...]], line: MegatronLine,
              settings: dict[str, Any], notes: list[str]) -> tuple[int, dict[str, Any]]:
    """--fit on a line: its parallel sizes (the line's, under explicit ones) shrunk into `settings` for the GPUs at
    hand; (the processes, the values with the fitted micro-batches per step)."""
    counts = torchrun_counts(line)
    world = gpus_at_hand(values.get("nproc_per_node"), counts[0] * counts[1] if counts else None)
    current: dict[str, Any] = {}
    for dest in (*PLACEMENT, "pipeline_model_parallel_layout", "sequence_parallel"):
        if dest in given:
            first = given[dest][0] if given[dest] else "true"
            current[dest] = int(first) if first.isdigit() else first
    current.update({k: settings[k] for k in PLACEMENT if k in settings})
    changes, fitted = fit_placement(current, world)
    settings.update(changes)
    notes.extend(fitted)
    out = {**values, "nproc_per_node": world}
    if values.get("num_microbatches") is None:
        pipeline = settings.get("pipeline_model_parallel_size", current.get("pipeline_model_parallel_size") or 1)
        out["num_microbatches"] = fitted_microbatches(int(pipeline))
        notes.append(f"--fit: {out['num_microbatches']} micro-batch{'es' if out['num_microbatches'] > 1 else ''} "
                     "per step (the line's global batch is its cluster's; --num-microbatches N to choose)")
    return world, out


def _fit_evaluation(out: dict[str, Any], notes: list[str]) -> None:
    """--fit keeps evaluation on where the model evaluates, with EVAL_ITERS_FIT iterations at most."""
    if out.get("fit") and out.get("eval_interval") and (out.get("eval_iters") or 0) > EVAL_ITERS_FIT:
        notes.append(f"--fit: evaluation kept, {EVAL_ITERS_FIT} iterations instead of {out['eval_iters']}")
        out["eval_iters"] = EVAL_ITERS_FIT


def _overridden(line: MegatronLine, settings: Mapping[str, Any]) -> list[str]:
    """`num_layers 2 (line: --num-layers 32)` for each setting given over a different one of the line's."""
    table = megatron_flags()
    out = []
    for group in line.groups:
        dest = table[group[0]].dest
        if dest in settings and _show(list(group[1:])) != _show(settings[dest]):
            out.append(f"{dest} {_show(settings[dest])} (line: {' '.join(group)})")
    return list(dict.fromkeys(out))


def _show(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) if value else "true"
    return str(value).lower() if isinstance(value, bool) else str(value)


def resolve_line(values: dict[str, Any], line: MegatronLine, source: str) -> dict[str, Any]:
    """DiffConfig values of a Megatron-LM line: the explicit `values` (flags, run file) put into the line, the line
    parsed and validated by Megatron-LM for diff's processes, the eager reference's model described, and the
    DiffConfig fields read back from Megatron's args.

    Raises:
        UsageError: Megatron-LM refuses the line or a value; a placement that does not fit; a shrink that loses a kind
            of layer.
        MissingDependencyError: megatron.training does not import, or the model needs Transformer Engine.
    """
    try:
        return _resolve_line(values, line, source)
    except MegatronRefusal as refusal:
        if refusal.stage != "placement" or values.get("fit"):
            raise
        return _as_fitted(resolve_line({**values, "fit": True}, line, source), str(refusal))


def _as_fitted(out: dict[str, Any], refusal: str) -> dict[str, Any]:
    """A resolution made with --fit because the source's placement does not fit: described as --fit would place
    it, the refusal kept for the plan's list and for a run to refuse."""
    notes = [n for n in out.get("launch_notes", ()) if not n.startswith("--fit:")]
    notes.append("the placement does not fit the processes diff starts: the plan shows the model as --fit would "
                 "place it, and a run refuses it as written")
    return {**out, "fit": False, "placement_refusal": refusal, "launch_notes": tuple(notes)}


def _resolve_line(values: dict[str, Any], line: MegatronLine, source: str) -> dict[str, Any]:
    """resolve_line on the line's own placement (MegatronRefusal `placement` where it does not fit)."""
    notes = list(line.notes)
    graph_choice(lambda name: _given(line, name), lambda name: "--" + name.replace("_", "-"))
    settings = megatron_settings(values)
    _shrink(_line_settings(line), settings, notes, fit=bool(values.get("fit")))
    overridden = _overridden(line, settings)
    world = _world(values, line, notes)
    given = dest_values(line)
    if values.get("fit"):
        world, values = _fit_line(values, given, line, settings, notes)
    if "vocab_size" not in settings and "vocab_size" not in given and "padded_vocab_size" not in given:
        settings["vocab_size"] = DEFAULT_VOCAB
        notes.append(f"the line sets no --vocab-size (its tokenizer decides it in Megatron-LM); diff trains "
                     f"synthetic tokens over {DEFAULT_VOCAB} (--vocab-size N to choose)")
    missing, note = required_settings(given, settings, "diff takes")
    if note:
        settings.update(missing)
        notes.append(note)
    weights = initialisation(bool(settings.get("fp8_param_gather", "fp8_param_gather" in given)))
    line = with_values(line, {**settings, **weights})
    args, warned = megatron_args(line, world_size=world)
    if values.get("num_microbatches") is not None:
        batch = args.micro_batch_size * int(values["num_microbatches"]) * args.data_parallel_size
        line = with_values(line, {"global_batch_size": batch})
        args, warned = megatron_args(line, world_size=world)
    graphs = graph_choice(lambda name: _graph_arg(args, name), lambda name: "--" + name.replace("_", "-"))
    eager = with_values(line, EAGER_GRAPHS | {"cuda_graph_scope_deprecated": None})
    eager_args, _ = megatron_args(eager, world_size=world)
    run_transformer = {**{k: v for k, v in (values.get("transformer") or {}).items() if k not in LINE_FIELDS},
                       **weights}
    model = describe_args(eager_args, eager, source=source, transformer=run_transformer)
    out = dict(values)
    out.update(_read_back(args, world))
    if values.get("layer_spec") not in (None, "local", "te", "transformer_engine"):
        out["layer_spec"] = values["layer_spec"]
        model = model.replace(layer_spec=values["layer_spec"])
    if "impls" not in values and graphs.impl != MEGATRON_EAGER:
        out["impls"] = (graphs.impl,)
    elif graphs.impl != MEGATRON_EAGER and tuple(values["impls"]) != (graphs.impl,):
        overridden.append(f"impls {','.join(values['impls'])} (line: --cuda-graph-impl {graphs.impl})")
    if "cuda_graph_modules" not in values and graphs.modules:
        out["cuda_graph_modules"] = graphs.modules
    if "eval_interval" not in values and ("eval_interval" in given or "eval_iters" in given):
        out.update(_evaluation(args, notes))
    _fit_evaluation(out, notes)
    out["model"] = dataclasses.replace(model, overrides={k: encode(v) for k, v in run_transformer.items()})
    out["transformer"] = model_view(out["model"])
    changed = "explicit values override the launch line: " + ", ".join(overridden) if overridden else None
    out["launch_notes"] = tuple(n for n in (*notes, *warned, not_applied(line), changed) if n)
    return out


def _given(line: MegatronLine, name: str) -> Any:
    """A graph setting as the line gives it, before Megatron's parser (whose own check of a module name says only
    KeyError: 'atn'): modules as a list, a flag without values as True, else its value."""
    given = dest_values(line)
    dest = "cuda_graph_scope_deprecated" if name == "cuda_graph_scope" else name
    if dest not in given:
        return None
    values = list(given[dest])
    if name in ("cuda_graph_modules", "cuda_graph_scope"):
        return values
    return values[0] if values else True


def _graph_arg(args: Any, name: str) -> Any:
    value = getattr(args, "cuda_graph_scope_deprecated" if name == "cuda_graph_scope" else name, None)
    if isinstance(value, list):
        return [getattr(v, "name", v) for v in value]
    return value


def _read_back(args: Any, world: int) -> dict[str, Any]:
    """DiffConfig fields from Megatron-LM's validated args."""
    return {
        "num_layers": args.num_layers, "hidden_size": args.hidden_size,
        "num_attention_heads": args.num_attention_heads, "seq_length": args.seq_length,
        "micro_batch_size": args.micro_batch_size,
        "num_microbatches": max(1, args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)),
        "vocab_size": args.vocab_size or args.padded_vocab_size, **converted_twins(getter(args)), "seed": args.seed,
        "cuda_graph_warmup_steps": args.cuda_graph_warmup_steps, "nproc_per_node": world,
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "sequence_parallel": bool(args.sequence_parallel),
        "expert_model_parallel_size": args.expert_model_parallel_size,
        "expert_tensor_parallel_size": args.expert_tensor_parallel_size,
        "overlap_grad_reduce": bool(args.overlap_grad_reduce),
        "use_distributed_optimizer": bool(args.use_distributed_optimizer),
        "ddp_bucket_size": args.ddp_bucket_size,
        "fp8_format": args.fp8, "fp8_recipe": str(getattr(args.fp8_recipe, "value", args.fp8_recipe)) if args.fp8
        else None, "fp8_param_gather": bool(args.fp8 and args.fp8_param_gather),
        # Megatron's test is `if config.loss_scale` (0 is the dynamic scaler too); a scale beside bf16 or fp32 is
        # kept so that DiffConfig warns that it has no effect (only fp16 scales the loss).
        "loss_scale": float(args.loss_scale) if args.loss_scale else None,
    }


def _evaluation(args: Any, notes: list[str]) -> dict[str, Any]:
    """eval_interval and eval_iters as Megatron-LM runs them: every interval and after the last step, only with
    eval_iters > 0 (its do_valid)."""
    interval, iters = args.eval_interval, args.eval_iters or 0
    if not iters or interval == 0:
        notes.append("--eval-iters 0 or --eval-interval 0: the line never evaluates; diff runs no evaluation")
        return {"eval_interval": 0}
    if interval is None:
        notes.append(f"evaluation after the last training step only (no --eval-interval), {iters} forward-only "
                     "iterations, as Megatron-LM would run it (--eval-interval K --eval-iters E to choose)")
        return {"eval_interval": UNSET_EVAL_INTERVAL, "eval_iters": iters}
    notes.append(f"evaluation after every {interval} training steps and after the last, {iters} forward-only "
                 "iterations each, as Megatron-LM would run them (--eval-interval K --eval-iters E to choose)")
    return {"eval_interval": interval, "eval_iters": iters}


def resolve_bridge(values: dict[str, Any], bridge: BridgeConfig) -> dict[str, Any]:
    """DiffConfig values of a Megatron-Bridge `model:`: the explicit `values` and graphdoctor's settings put into its
    TransformerConfig fields, the TransformerConfig built (Megatron validates it), the model described, the
    DiffConfig fields read back from it.

    A model that needs Transformer Engine where it is not installed is described and marked unavailable.

    Raises:
        UsageError: Megatron's TransformerConfig refuses the settings; a placement that does not fit.
    """
    notes: list[str] = []
    run = {k: v for k, v in bridge.run.items() if k not in ("global_batch_size",)}
    merged = {**run, **values}
    settings = megatron_settings(merged)
    model_fields = dict(bridge.model)
    for name in ("seq_length", "vocab_size"):
        if name in settings:
            model_fields[name] = settings.pop(name)
    for name in ("micro_batch_size", "seed", "overlap_grad_reduce", "use_distributed_optimizer", "ddp_bucket_size",
                 "loss_scale"):
        settings.pop(name, None)
    world = int(merged.get("nproc_per_node") or 1)
    if merged.get("fit"):
        world = gpus_at_hand(values.get("nproc_per_node"))
        current = {k: plain(bridge.transformer.get(k)) for k in (*PLACEMENT, "pipeline_model_parallel_layout",
                                                                  "sequence_parallel")}
        changes, fitted = fit_placement({**current, **{k: settings[k] for k in PLACEMENT if k in settings}}, world)
        settings.update(changes)
        notes.extend(fitted)
        merged["nproc_per_node"] = world
    _shrink({k: bridge.transformer.get(k) for k in ("moe_layer_freq", "pipeline_model_parallel_layout")}
            | {"hybrid_layer_pattern": model_fields.get("hybrid_layer_pattern")}, settings, notes,
            fit=bool(merged.get("fit")))
    if "hybrid_layer_pattern" in settings:
        model_fields["hybrid_layer_pattern"] = settings.pop("hybrid_layer_pattern")
    overrides = {k: v for k, v in (values.get("transformer") or {}).items() if k not in GRAPH_SETTINGS}
    fields = {**decode(dict(bridge.transformer), f"{bridge.path}: model"), **settings, **overrides}
    fields.update(**initialisation(bool(fields.get("fp8_param"))), **EAGER_GRAPHS)
    tconfig, model_config, unavailable = _bridge_objects(bridge, fields, decode(model_fields,
                                                                                f"{bridge.path}: model"))
    model = describe_model(tconfig, model_config, source=f"{bridge.owner} {bridge.path}",
                           layer_spec=bridge.layer_spec, te_rng_tracker=bridge.te_rng_tracker,
                           unavailable=unavailable)
    model_parallel = tconfig.tensor_model_parallel_size * tconfig.pipeline_model_parallel_size * \
        tconfig.context_parallel_size
    if world % model_parallel and not merged.get("fit"):
        refusal = (f"placement: {bridge.path}'s model parallelism (tensor {tconfig.tensor_model_parallel_size} "
                   f"x pipeline {tconfig.pipeline_model_parallel_size} x context "
                   f"{tconfig.context_parallel_size}) needs a multiple of {model_parallel} processes, diff "
                   f"starts {world}; give --fit to shrink every placement to the GPUs at hand, or "
                   f"--nproc-per-node {model_parallel}")
        return _as_fitted(resolve_bridge({**values, "fit": True}, bridge), refusal)
    micro = int(merged.get("micro_batch_size") or 1)
    out = dict(merged)
    out.update({
        "num_layers": tconfig.num_layers, "hidden_size": tconfig.hidden_size,
        "num_attention_heads": tconfig.num_attention_heads, "seq_length": int(model_config.seq_length),
        "micro_batch_size": micro, "vocab_size": int(model_config.vocab_size or DEFAULT_VOCAB),
        **converted_twins(getter(tconfig)),
        "cuda_graph_warmup_steps": tconfig.cuda_graph_warmup_steps, "nproc_per_node": world,
        "tensor_model_parallel_size": tconfig.tensor_model_parallel_size,
        "pipeline_model_parallel_size": tconfig.pipeline_model_parallel_size,
        "sequence_parallel": bool(tconfig.sequence_parallel),
        "expert_model_parallel_size": tconfig.expert_model_parallel_size,
        "expert_tensor_parallel_size": tconfig.expert_tensor_parallel_size,
    })
    batch = bridge.run.get("global_batch_size")
    if values.get("num_microbatches") is None and merged.get("fit"):
        out["num_microbatches"] = fitted_microbatches(tconfig.pipeline_model_parallel_size)
        notes.append(f"--fit: {out['num_microbatches']} micro-batch(es) per step (the config's global batch "
                     f"{batch} is its cluster's; --num-microbatches N to choose)")
    elif values.get("num_microbatches") is None and batch:
        data_parallel = world // model_parallel
        out["num_microbatches"] = max(1, int(batch) // (micro * data_parallel))
    _fit_evaluation(out, notes)
    graphs = graph_choice(lambda name: bridge.graph.get(name), lambda name: f"{bridge.path}: model.{name}")
    if "impls" not in values and graphs.impl != MEGATRON_EAGER:
        out["impls"] = (graphs.impl,)
    if "cuda_graph_modules" not in values and graphs.modules:
        out["cuda_graph_modules"] = graphs.modules
    out["model"] = model
    out["transformer"] = model_view(model)
    skipped = f"settings that do not apply ({NOT_APPLIED_WHY}): {', '.join(bridge.not_applied)}" \
        if bridge.not_applied else None
    out["launch_notes"] = tuple(n for n in (*bridge.notes, *notes, skipped) if n)
    return out


def _bridge_objects(bridge: BridgeConfig, fields: dict[str, Any], model_fields: dict[str, Any],
                    ) -> tuple[Any, Any, str | None]:
    """Megatron's TransformerConfig and model config of a Bridge `model:` (Megatron validates them), and why they
    are unavailable here: where the TransformerConfig refuses the settings because Transformer Engine is not
    installed, they are made without its checks (description.unvalidated_class) and marked, as a launch line's
    are (megatron_line.describe_args): a plan describes the model with its rows `unavailable`."""
    import warnings

    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.training.models import GPTModelConfig, HybridModelConfig

    cls = MLATransformerConfig if fields.get("multi_latent_attention") else TransformerConfig
    model_cls = GPTModelConfig if bridge.kind == "gpt" else HybridModelConfig
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tconfig = cls(**fields)
            return tconfig, model_cls(transformer=tconfig, **model_fields), None
    except MEGATRON_ERRORS as exc:
        if not needs_te(exc):
            raise UsageError(f"{bridge.path}: Megatron's TransformerConfig refuses model: {megatron_message(exc)}") \
                from None
        unavailable = f"the model needs Transformer Engine, which is not installed here (Megatron: " \
                      f"{megatron_message(exc)})"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tconfig = unvalidated_class(cls)(**fields)
        return tconfig, model_cls(transformer=tconfig, **model_fields), unavailable


def model_view(model: ModelDescription) -> dict[str, Any]:
    """The TransformerConfig fields of a resolved model, plain (enums by name), without the graph settings each
    child sets: what the rule catalogue reads of the run (DiffConfig.transformer)."""
    return {k: model.value(k) for k in model.transformer if k not in EAGER_GRAPHS and k not in PER_CHILD}


__all__ = ["DEFAULT_VOCAB", "EAGER_GRAPHS", "LINE_FIELDS", "megatron_settings", "model_view",
           "required_settings",
           "resolve_bridge", "resolve_line"]
