"""A Megatron-Bridge ConfigContainer YAML (`ConfigContainer.to_yaml`, `run_recipe.py --dry-run`, or an override
file in its shape), read with safe YAML and never by importing Bridge: its `model:` section (a GPTModelProvider or
HybridModelProvider: TransformerConfig fields and the GPT model's arguments, flat) split into the TransformerConfig
and the model config Megatron builds, the CUDA-graph settings, `train:` batches, `rng:` seed, `ddp:`, `env_vars:`,
and the optimizer's fp16 loss scaling (fp16 and a static loss scale, as `mixed_precision:` leaves them).

`_target_` entries stay in Megatron's dump format (graphdoctor.config.codec decodes them, Megatron's and torch's
names only); enums are read by `_name_` (Bridge's old CudaGraphScope numbers differ from CudaGraphModule's).
What a section sets that diff does not run (optimizer, scheduler, data, logging, checkpoints) is listed once;
what Bridge's own validate()/provide() refuse a start on is kept as BridgeGuards for `check`'s GD141-GD145, with
the optimizer's fp16 loss scaling (`optimizer:`, `mixed_precision:`) for GD312.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from graphdoctor.config.bridge_precision import BRIDGE_VERSION, PRECISION_RECIPES, precision_recipe
from graphdoctor.config.codec import NAME, TARGET, decode, is_target
from graphdoctor.config.container import (
    MEGATRON_CONTAINER,
    container_target,
    load_megatron_container,
    nested_model,
)
from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.config.schema import loaded_yaml
from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.inputs import describe

MAX_BRIDGE_BYTES = 4 << 20

BRIDGE_PROVIDER_DEFAULTS: dict[str, Any] = {
    "share_embeddings_and_output_weights": True,
    "masked_softmax_fusion": True,
    "cross_entropy_loss_fusion": True,
    "deallocate_pipeline_outputs": True,
    "rope_scaling_factor": 1.0,
}
"""Megatron-Bridge's GPTModelProvider defaults that differ from Megatron's GPTModelConfig and TransformerConfig
(megatron/bridge/models/gpt_provider.py): they apply to a `model:` section that does not set them (an override
file; a dump writes every field)."""

LAYER_SPECS: dict[str, str | None] = {
    "default_layer_spec": "transformer_engine",
    "transformer_engine_layer_spec": "transformer_engine",
    "local_layer_spec": "local",
}
"""Bridge's own layer-spec functions (gpt_provider.py) and the transformer_impl whose Megatron layer spec is the
same; another Bridge spec is refused, a Megatron one (`megatron.core...`) is built by name."""

GRAPH_FIELDS: tuple[str, ...] = ("cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope", "enable_cuda_graph",
                                 "external_cuda_graph")
TRAIN_FIELDS: dict[str, str] = {"micro_batch_size": "micro_batch_size", "global_batch_size": "global_batch_size"}
UNSET_EVAL_INTERVAL = 1 << 20
"""eval_interval for an unset `train.eval_interval`: no evaluation between steps, one after the last."""
DDP_FIELDS: dict[str, str] = {"overlap_grad_reduce": "overlap_grad_reduce",
                              "use_distributed_optimizer": "use_distributed_optimizer", "bucket_size": "ddp_bucket_size"}
APPLIED_SECTIONS: frozenset[str] = frozenset({"model", "train", "validation", "rng", "ddp", "env_vars",
                                              "mixed_precision"})


CONTAINER_FUNCTIONS: dict[str, str] = {"activation_func": "torch.nn.functional.gelu"}
"""TransformerConfig functions a Megatron container's dump cannot hold (ModelConfig.as_dict skips callables), and
the default its loader gives them."""
BRIDGE_OWNER = "Megatron-Bridge"
MEGATRON_OWNER = "Megatron's PretrainConfigContainer"
BRIDGE_SOURCE = "Megatron-Bridge 067f987 (2026-08-22)"
"""The Bridge sources BridgeGuards mirrors (src/megatron/bridge/utils/cuda_graph.py, training/config.py,
models/gpt_provider.py); read them again before relying on a line."""
FULL_NAMES: frozenset[str] = frozenset({"full_iteration", "full_iteration_inference", "full"})
"""Module names Bridge's `cuda_graph_module_names` drops (utils/cuda_graph.py)."""


GUARD_KEYS: tuple[str, ...] = (
    "model.cuda_graph_impl", "model.cuda_graph_modules", "model.cuda_graph_scope", "model.inference_cuda_graph_scope",
    "model.use_te_rng_tracker", "rng.te_rng_tracker", "rerun_state_machine.check_for_nan_in_loss",
    "dataset.offline_packing_specs", "dataset.offline_packing_specs.pad_cu_seqlens", "dataset.pad_to_max_length",
    "dataset.dataset_kwargs.pad_to_max_length", "optimizer.fp16", "optimizer.loss_scale", "mixed_precision",
    "mixed_precision.fp16", "mixed_precision.loss_scale",
)
"""The keys BridgeGuards reads (BridgeGuards.given: those the file sets)."""


@dataclass(frozen=True, slots=True)
class BridgeGuards:
    """What Megatron-Bridge's own ConfigContainer.validate() and GPTModelProvider.provide() read before they refuse
    a start (GD141-GD145), and the optimizer's fp16 loss scaling (GD312), plain, with Bridge's defaults for a key
    the file does not set (`given` says which)."""

    cuda_graph_impl: str = MEGATRON_EAGER
    """`model.cuda_graph_impl` (TransformerConfig's default `none`)."""
    graph_names: tuple[str, ...] = ()
    """`model.cuda_graph_modules` then the deprecated `model.cuda_graph_scope`, by member name as Bridge's
    `_member_name_list` reads them (a string splits at commas; `full` or empty is no module)."""
    inference_scopes: tuple[str, ...] = ()
    """`model.inference_cuda_graph_scope` by member name."""
    check_for_nan_in_loss: bool = True
    """`rerun_state_machine.check_for_nan_in_loss` (megatron-training's RerunStateMachineConfig default True)."""
    rng_te_rng_tracker: bool = False
    """`rng.te_rng_tracker` (RNGConfig default False)."""
    model_use_te_rng_tracker: bool = False
    """`model.use_te_rng_tracker` (GPTModelProvider default False)."""
    offline_packing: bool = False
    """`dataset.offline_packing_specs` is set (not null): validate()'s packing checks run."""
    pad_cu_seqlens: bool = False
    """`dataset.offline_packing_specs.pad_cu_seqlens` (PackedSequenceSpecs default False)."""
    pad_to_max_length: bool = False
    """`dataset.pad_to_max_length is True or dataset.dataset_kwargs.pad_to_max_length is True` (validate()'s own
    test, before it turns padding on for pipeline or expert parallelism)."""
    fp16: bool | None = None
    """fp16 as Bridge's `MixedPrecisionConfig.setup` leaves the optimizer config: where a `mixed_precision` is
    given, its `fp16` (a mapping's, or a recipe named `fp16_*`; setup writes every field of it over the model's and
    the optimizer's), else `optimizer.fp16` where set; None: neither is given (the model's `fp16` decides)."""
    loss_scale: float | None = None
    """The optimizer's static loss scale: `mixed_precision.loss_scale` where a mixed_precision is given (a recipe's
    is None, and setup writes it over the optimizer's), else `optimizer.loss_scale`; None: Megatron's dynamic loss
    scaler for fp16 (megatron/core/optimizer/__init__.py, `if config.loss_scale`)."""
    given: frozenset[str] = frozenset()
    """The GUARD_KEYS the file sets (the others are Bridge's defaults above)."""

    @property
    def graph_modules(self) -> list[str]:
        """Bridge's `cuda_graph_module_names`: the per-layer modules, without the full-iteration names."""
        return [name for name in dict.fromkeys(self.graph_names) if name not in FULL_NAMES]

    @property
    def full_iteration(self) -> bool:
        """Bridge's `is_full_iteration_cuda_graph`: impl full_iteration, or local with a `full_iteration` module."""
        if self.cuda_graph_impl == Impl.FULL_ITERATION:
            return True
        return self.cuda_graph_impl == Impl.LOCAL and "full_iteration" in self.graph_names

    @property
    def local_refused(self) -> bool:
        """`validate_cuda_graph_configuration` refuses `local`: not a full-iteration graph and not a local
        inference graph (no modules and an inference scope of `layer` or `block`)."""
        inference = not self.graph_modules and bool({"layer", "block"} & set(self.inference_scopes))
        return self.cuda_graph_impl == Impl.LOCAL and not self.full_iteration and not inference


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """What a ConfigContainer YAML sets for diff."""

    path: str
    kind: str
    """`gpt` or `hybrid` (from `model._target_`)."""
    transformer: dict[str, Any]
    """TransformerConfig fields of `model:` (dump format)."""
    model: dict[str, Any]
    """GPTModelConfig / HybridModelConfig fields of `model:` (dump format)."""
    layer_spec: str | None = None
    """A Megatron layer spec named by `model.transformer_layer_spec` (`megatron.pkg.mod:name`); None: Megatron's
    default for transformer_impl."""
    graph: dict[str, Any] = field(default_factory=dict)
    """The CUDA-graph settings of `model:` (GRAPH_FIELDS), plain."""
    run: dict[str, Any] = field(default_factory=dict)
    """DiffConfig values: micro_batch_size, global_batch_size, seed, eval, DDP settings, and the optimizer's
    fp16 loss scaling (`dtype` fp16, `loss_scale`; precision_values)."""
    te_rng_tracker: bool = False
    env: dict[str, str] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    """`section`, `section.field` (and `dataset.offline_packing_specs.field`, `dataset.dataset_kwargs.field`) ->
    `path:line`."""
    not_applied: tuple[str, ...] = ()
    """`model.hf_model_id`, `optimizer`, ...: what diff does not take."""
    guards: BridgeGuards = field(default_factory=BridgeGuards)
    """What Bridge's own validate()/provide() refuse on (`check` only)."""
    notes: tuple[str, ...] = ()
    """What the run gets that the file does not say (a function Megatron's to_yaml leaves out)."""
    owner: str = "Megatron-Bridge"
    """Who runs the file: BRIDGE_OWNER, or MEGATRON_OWNER for Megatron's own PretrainConfigContainer (Bridge's
    refusals, GD141-GD145, are Bridge's only)."""
    checkpoint: dict[str, str] = field(default_factory=dict)
    """`checkpoint.load` and `checkpoint.pretrained_checkpoint` where set: the checkpoint the run loads (diff never
    loads it; GD406 reads it)."""


def is_bridge_config(data: Any) -> bool:
    """A ConfigContainer's shape: a `model:` mapping beside at least one other ConfigContainer section, or a
    `model:` with a `_target_`."""
    if not isinstance(data, Mapping) or not isinstance(data.get("model"), Mapping):
        return False
    others = {"train", "optimizer", "ddp", "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "rng", "dist"}
    return TARGET in data["model"] or bool(others & set(map(str, data)))


@cache
def _field_names(mla: bool) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(the TransformerConfig's fields, MLATransformerConfig's with `mla`; GPTModelConfig fields; HybridModelConfig
    fields)."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.training.models import GPTModelConfig, HybridModelConfig

    def names(cls: type) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)

    return (names(MLATransformerConfig if mla else TransformerConfig), names(GPTModelConfig) - {"transformer"},
            names(HybridModelConfig) - {"transformer"})


@cache
def _computed_fields() -> frozenset[str]:
    """TransformerConfig's and MLATransformerConfig's fields it computes itself (init=False), which a dump
    writes and Megatron's loader drops."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    return frozenset(f.name for cls in (TransformerConfig, MLATransformerConfig) for f in dataclasses.fields(cls)
                     if not f.init)


def _kind(model: Mapping[str, Any]) -> str:
    target = str(model.get(TARGET, ""))
    hybrid = any(k in target for k in ("Hybrid", "Mamba", "NemotronH", "Nemotron3"))
    return "hybrid" if hybrid or model.get("hybrid_layer_pattern") or model.get("hybrid_override_pattern") else "gpt"


def _plain_graph(value: Any) -> Any:
    if is_target(value):
        return value.get(NAME, value[TARGET])
    if isinstance(value, list):
        return [_plain_graph(v) for v in value]
    return value


def _layer_spec(value: Any, where: str) -> tuple[str | None, str | None]:
    """(transformer_impl to set, Megatron spec by name) for `model.transformer_layer_spec`."""
    if value is None:
        return None, None
    target = str(value.get(TARGET, "")) if is_target(value) else str(value)
    name = target.rpartition(".")[2]
    if target.startswith("megatron.bridge.") and name in LAYER_SPECS:
        return LAYER_SPECS[name], None
    if target.startswith("megatron.core."):
        module, _, attr = target.rpartition(".")
        return None, f"{module}:{attr}"
    raise UsageError(f"{where}: model.transformer_layer_spec {describe(target)} is Megatron-Bridge's own; diff builds "
                     f"Bridge's {', '.join(LAYER_SPECS)} (as Megatron's specs) or a megatron.core spec")


def read_bridge(path: str | Path, data: Any = None, lines: Mapping[int, Mapping[str, int]] | None = None,
                ) -> BridgeConfig:
    """Read a ConfigContainer YAML (or its already-loaded `data` with the strict loader's `lines`).

    Raises:
        InputFileError: unreadable, bad YAML, not a ConfigContainer's shape, a section of the wrong type.
        UsageError: a `model:` value that does not decode (a `_target_` outside Megatron's and torch's names).
    """
    where = str(path)
    data, lines = loaded_yaml(path, "Megatron-Bridge config", MAX_BRIDGE_BYTES, data, lines)
    if not is_bridge_config(data):
        raise InputFileError(f"{where}: expected a Megatron-Bridge ConfigContainer with a model: section")
    sections = {str(k): v for k, v in data.items() if not str(k).startswith("_")}
    for name in APPLIED_SECTIONS - {"mixed_precision"}:
        if name in sections and sections[name] is not None and not isinstance(sections[name], Mapping):
            raise InputFileError(f"{where}: {name}: expected a mapping, got {describe(sections[name])}")
    if container_target(data) == MEGATRON_CONTAINER:  # screened, then loaded by Megatron's own loader: what it
        load_megatron_container(data, where)  # refuses is the file's error (a Bridge file is never loaded by Bridge)
    model_section, nested = nested_model(sections["model"])
    sections["model"] = model_section
    transformer_names, gpt_names, hybrid_names = _field_names(bool(model_section.get("multi_latent_attention")))
    kind = _kind(model_section)
    model_names = gpt_names if kind == "gpt" else hybrid_names
    at = _key_lines(data, lines, where, nested)
    provider = {} if nested else {k: v for k, v in BRIDGE_PROVIDER_DEFAULTS.items() if k not in model_section}
    values = {**provider, **{str(k): v for k, v in model_section.items() if not str(k).startswith("_")}}
    transformer: dict[str, Any] = {}
    model: dict[str, Any] = {}
    graph: dict[str, Any] = {}
    skipped: list[str] = []
    impl, spec = _layer_spec(values.pop("transformer_layer_spec", None), where)
    values.pop("hybrid_stack_spec", None)
    for key, value in values.items():
        if key in GRAPH_FIELDS:
            graph[key] = _plain_graph(value)
            continue
        if key in transformer_names or key in model_names:
            decode(value, f"{where}: model.{key}")  # a name outside Megatron's and torch's is refused here
            if key in transformer_names:
                transformer[key] = value
            if key in model_names:  # MLA's rotary settings are both the config's and the model's
                model[key] = value
        elif is_target(value) and NAME not in value and value.get("_call_", True) is not False:
            raise InputFileError(f"{at.get(f'model.{key}', where)}: model.{key}: a nested config "
                                 f"({value[TARGET]}) graphdoctor does not read; expected the model's settings "
                                 "as TransformerConfig and model-config fields")
        elif key not in _computed_fields():
            skipped.append(f"model.{key}")
    unread = [name for name in ("num_layers", "hidden_size", "num_attention_heads") if name not in transformer]
    if len(unread) == 3:
        raise InputFileError(f"{at.get('model', where)}: model: graphdoctor read no TransformerConfig field of it "
                             f"({', '.join(unread)} unset); expected them in model:"
                             f"{' or model.transformer:' if not nested else ''}")
    if impl is not None:
        transformer["transformer_impl"] = impl
    run, rng_tracker = _run_values(sections, where)
    env = {str(k): "" if v is None else str(v) for k, v in (sections.get("env_vars") or {}).items()}
    precision = sections.get("mixed_precision")
    if isinstance(precision, str):  # a recipe by name: Bridge's setup() writes every field of it over the model's
        recipe = precision_recipe(precision)
        if recipe is None:
            raise UsageError(f"{at.get('mixed_precision', where)}: mixed_precision {describe(precision)} is not one of "
                             f"Megatron-Bridge {BRIDGE_VERSION}'s recipes ({', '.join(sorted(PRECISION_RECIPES))})")
        transformer.update({k: v for k, v in recipe.items() if k in transformer_names})
    elif isinstance(precision, Mapping):
        whole = is_target(precision)  # a dumped MixedPrecisionConfig: setup() writes each of its fields over the model
        for key, value in precision.items():
            if str(key) in transformer_names and (whole or str(key) not in model_section) and \
                    not str(key).startswith("_"):
                decode(value, f"{where}: mixed_precision.{key}")
                transformer[str(key)] = value
    guards = _guards(sections, at, where)
    run.update(precision_values(guards))
    skipped.extend(_not_read(sections, guards))
    notes = tuple(f"model.transformer.{name} is not in the file (Megatron's to_yaml leaves functions out): "
                  f"Megatron's loader, and diff, build its default {default}"
                  for name, default in CONTAINER_FUNCTIONS.items() if nested and name not in model_section)
    return BridgeConfig(path=where, kind=kind, notes=notes, transformer=transformer, model=model, layer_spec=spec, graph=graph,
                        run=run, te_rng_tracker=rng_tracker or bool(values.get("use_te_rng_tracker")), env=env,
                        where=at, not_applied=tuple(skipped), guards=guards,
                        owner=MEGATRON_OWNER if container_target(data) == MEGATRON_CONTAINER else BRIDGE_OWNER,
                        checkpoint=_checkpoint_paths(sections.get("checkpoint")))


def precision_values(guards: BridgeGuards) -> dict[str, Any]:
    """The DiffConfig values of the optimizer's fp16 loss scaling as Bridge sets it up (BridgeGuards): `dtype`
    fp16 where the optimizer trains in fp16, and `loss_scale` where a static loss scale is set (Megatron's
    ConstantGradScaler; unset: its dynamic scaler). Explicit values (flags, the run file) sit over them."""
    values: dict[str, Any] = {}
    if guards.fp16:
        values["dtype"] = "fp16"
    if guards.loss_scale is not None:
        values["loss_scale"] = guards.loss_scale
    return values


def _not_read(sections: Mapping[str, Any], guards: BridgeGuards) -> list[str]:
    """What diff does not take of the sections besides `model:`: each section outside APPLIED_SECTIONS (an
    `optimizer` but for its fp16 loss scaling, where no mixed_precision writes over it)."""
    precision, optimizer = sections.get("mixed_precision"), sections.get("optimizer")
    out = []
    loss_scaling = precision is None and isinstance(optimizer, Mapping) and \
        bool({"fp16", "loss_scale"} & set(optimizer))
    for name in sorted(name for name in sections if name not in APPLIED_SECTIONS and sections[name] is not None):
        out.append("optimizer (all but fp16 and loss_scale)" if name == "optimizer" and loss_scaling else name)
    return out


def _run_values(sections: Mapping[str, Any], where: str) -> tuple[dict[str, Any], bool]:
    """DiffConfig values of `train:`, `validation:`, `rng:` and `ddp:`, and whether `rng:` asks for TE's RNG tracker."""
    run: dict[str, Any] = {}
    train = sections.get("train") or {}
    for key, name in TRAIN_FIELDS.items():
        if train.get(key) is not None:
            run[name] = train[key]
    validation = sections.get("validation") or {}
    evaluation = {**{k: train[k] for k in ("eval_iters", "eval_interval") if k in train},
                  **{k: validation[k] for k in ("eval_iters", "eval_interval") if k in validation}}
    if evaluation:  # Bridge 0.6 and Megatron's container hold them in validation:, older Bridge in train:
        iters, interval = evaluation.get("eval_iters"), evaluation.get("eval_interval")
        if not iters or interval == 0:
            run["eval_interval"] = 0  # Megatron evaluates only with eval_iters > 0
        else:
            run.update(eval_interval=interval or UNSET_EVAL_INTERVAL, eval_iters=iters)
    rng = sections.get("rng") or {}
    if rng.get("seed") is not None:
        run["seed"] = rng["seed"]
    ddp = sections.get("ddp") or {}
    for key, name in DDP_FIELDS.items():
        if ddp.get(key) is not None:
            run[name] = ddp[key]
    for key, value in run.items():
        if isinstance(value, bool) != (key in ("overlap_grad_reduce", "use_distributed_optimizer")):
            raise UsageError(f"{where}: {key}: got {describe(value)}, expected "
                             f"{'true or false' if key.startswith(('overlap', 'use_')) else 'an integer'}")
    return run, bool(rng.get("te_rng_tracker"))


def _checkpoint_paths(section: Any) -> dict[str, str]:
    """The checkpoint paths a `checkpoint:` section loads from (non-empty strings only)."""
    if not isinstance(section, Mapping):
        return {}
    return {key: section[key] for key in ("load", "pretrained_checkpoint")
            if isinstance(section.get(key), str) and section[key]}


def _key_lines(data: Mapping[str, Any], lines: Mapping[int, Mapping[str, int]], where: str,
               nested_model: bool = False) -> dict[str, str]:
    """`section` and `section.key` -> `path:line` for every section, and one level deeper for the dataset's
    `offline_packing_specs` and `dataset_kwargs` (what the GD141-GD145 findings point at); a container's
    `model.transformer.key` is also `model.key`, where the rest of graphdoctor reads it."""
    at = {str(name): f"{where}:{line}" for name, line in lines.get(id(data), {}).items()}
    nested = [(str(name), body) for name, body in data.items() if isinstance(body, Mapping)]
    dataset = data.get("dataset")
    if isinstance(dataset, Mapping):
        nested += [(f"dataset.{key}", dataset[key]) for key in ("offline_packing_specs", "dataset_kwargs")
                   if isinstance(dataset.get(key), Mapping)]
    model = data.get("model")
    if nested_model and isinstance(model, Mapping):
        nested.append(("model.transformer", model["transformer"]))
    for name, body in nested:
        for key, line in lines.get(id(body), {}).items():
            at[f"{name}.{key}"] = f"{where}:{line}"
            if name == "model.transformer":
                at.setdefault(f"model.{key}", f"{where}:{line}")
    return at


def _names(value: Any) -> list[str]:
    """Bridge's `_member_name_list` of a plain graph value (utils/cuda_graph.py `_as_list`, `_member_name`)."""
    value = _plain_graph(value)
    if value is None:
        return []
    if isinstance(value, str):
        items: list[Any] = [] if value in ("", "full") else value.split(",")
    else:
        items = list(value) if isinstance(value, list) else [value]
    return [str(item).rsplit(".", 1)[-1] for item in items]


def _flag(section: Mapping[str, Any], key: str, default: bool, at: Mapping[str, str], where: str) -> bool:
    """The true/false setting `key` (`section.name`) of a Bridge section; null reads false, as Bridge's truth
    tests read it.

    Raises:
        UsageError: anything but true, false or null.
    """
    name = key.rpartition(".")[2]
    if name not in section:
        return default
    value = section[name]
    if value is not None and not isinstance(value, bool):
        raise UsageError(f"{at.get(key, where)}: {key}: got {describe(value)}, expected true or false")
    return bool(value)


def _mapping(sections: Mapping[str, Any], key: str, at: Mapping[str, str], where: str) -> Mapping[str, Any]:
    """The Bridge sub-config `key` (`section` or `section.name`), {} when absent or null.

    Raises:
        InputFileError: set to something other than a mapping.
    """
    value = sections.get(key.rpartition(".")[2])
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputFileError(f"{at.get(key, where)}: {key}: expected a mapping, got {describe(value)}")
    return value


def _guards(sections: Mapping[str, Any], at: Mapping[str, str], where: str) -> BridgeGuards:
    """BridgeGuards of a ConfigContainer's sections (`at`: their key lines, for errors)."""
    model: Mapping[str, Any] = sections["model"]
    rerun = _mapping(sections, "rerun_state_machine", at, where)
    rng = _mapping(sections, "rng", at, where)
    dataset = _mapping(sections, "dataset", at, where)
    specs = _mapping(dataset, "dataset.offline_packing_specs", at, where)
    kwargs = _mapping(dataset, "dataset.dataset_kwargs", at, where)
    impl = model.get("cuda_graph_impl")
    fp16, loss_scale = _precision(sections, at, where)
    return BridgeGuards(
        cuda_graph_impl=impl if isinstance(impl, str) else MEGATRON_EAGER,
        graph_names=(*_names(model.get("cuda_graph_modules")), *_names(model.get("cuda_graph_scope"))),
        inference_scopes=tuple(_names(model.get("inference_cuda_graph_scope"))),
        check_for_nan_in_loss=_flag(rerun, "rerun_state_machine.check_for_nan_in_loss", True, at, where),
        rng_te_rng_tracker=_flag(rng, "rng.te_rng_tracker", False, at, where),
        model_use_te_rng_tracker=_flag(model, "model.use_te_rng_tracker", False, at, where),
        offline_packing=dataset.get("offline_packing_specs") is not None,
        pad_cu_seqlens=_flag(specs, "dataset.offline_packing_specs.pad_cu_seqlens", False, at, where),
        pad_to_max_length=dataset.get("pad_to_max_length") is True or kwargs.get("pad_to_max_length") is True,
        fp16=fp16, loss_scale=loss_scale,
        given=frozenset(key for key in GUARD_KEYS if _has(sections, key)),
    )


def _precision(sections: Mapping[str, Any], at: Mapping[str, str], where: str) -> tuple[bool | None, float | None]:
    """(fp16, static loss scale) of the optimizer as Bridge sets them up (BridgeGuards.fp16 and .loss_scale).

    Raises:
        UsageError: an fp16 that is not true or false, a loss scale that is not a number >= 0 (or null).
    """
    optimizer = sections.get("optimizer")
    if not isinstance(optimizer, Mapping):
        optimizer = {}
    precision = sections.get("mixed_precision")
    if isinstance(precision, str):
        return precision.replace("-", "_").startswith("fp16_"), None  # a recipe: fp16_mixed, fp16_with_fp8_...
    if isinstance(precision, Mapping):
        return _flag(precision, "mixed_precision.fp16", False, at, where), \
            _loss_scale(precision, "mixed_precision.loss_scale", at, where)
    fp16 = _flag(optimizer, "optimizer.fp16", False, at, where) if "fp16" in optimizer else None
    return fp16, _loss_scale(optimizer, "optimizer.loss_scale", at, where)


def _loss_scale(section: Mapping[str, Any], key: str, at: Mapping[str, str], where: str) -> float | None:
    """The loss scale `key` of a Bridge section: a number > 0, or None (null, unset, or 0: Megatron's test is
    `if config.loss_scale`, megatron/core/optimizer/__init__.py).

    Raises:
        UsageError: anything else.
    """
    value = section.get(key.rpartition(".")[2])
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise UsageError(f"{at.get(key, where)}: {key}: got {describe(value)}, expected a number >= 0 or null")
    return float(value) or None


def _has(sections: Mapping[str, Any], key: str) -> bool:
    """The dotted `key` is set in the file (every part of its path a mapping holding the next)."""
    node: Any = sections
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


__all__ = ["BRIDGE_OWNER", "BRIDGE_PROVIDER_DEFAULTS", "BRIDGE_SOURCE", "MEGATRON_OWNER", "LAYER_SPECS", "MAX_BRIDGE_BYTES", "BridgeConfig",
           "BridgeGuards", "is_bridge_config", "precision_values", "read_bridge"]
