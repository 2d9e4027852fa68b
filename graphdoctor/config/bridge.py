"""A Megatron-Bridge ConfigContainer YAML (`ConfigContainer.to_yaml`, `run_recipe.py --dry-run`, or an override
file in its shape), read with safe YAML and never by importing Bridge: its `model:` section (a GPTModelProvider or
HybridModelProvider: TransformerConfig fields and the GPT model's arguments, flat) split into the TransformerConfig
and the model config Megatron builds, the CUDA-graph settings, `train:` batches, `rng:` seed, `ddp:` and `env_vars:`.

`_target_` entries stay in Megatron's dump format (graphdoctor.config.codec decodes them, Megatron's and torch's
names only); enums are read by `_name_` (Bridge's old CudaGraphScope numbers differ from CudaGraphModule's).
What a section sets that diff does not run (optimizer, scheduler, data, logging, checkpoints) is listed once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from graphdoctor.config.codec import NAME, TARGET, decode, is_target
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
APPLIED_SECTIONS: frozenset[str] = frozenset({"model", "train", "rng", "ddp", "env_vars", "mixed_precision"})


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
    """DiffConfig values: micro_batch_size, global_batch_size, seed, eval, DDP settings."""
    te_rng_tracker: bool = False
    env: dict[str, str] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    """`section.field` -> `path:line`."""
    not_applied: tuple[str, ...] = ()
    """`model.hf_model_id`, `optimizer`, ...: what diff does not take."""


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
    model_section: Mapping[str, Any] = sections["model"]
    transformer_names, gpt_names, hybrid_names = _field_names(bool(model_section.get("multi_latent_attention")))
    kind = _kind(model_section)
    model_names = gpt_names if kind == "gpt" else hybrid_names
    model_lines = lines.get(id(model_section), {})
    at = {f"model.{k}": f"{where}:{v}" for k, v in model_lines.items()}
    values = {**{k: v for k, v in BRIDGE_PROVIDER_DEFAULTS.items() if k not in model_section},
              **{str(k): v for k, v in model_section.items() if not str(k).startswith("_")}}
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
        else:
            skipped.append(f"model.{key}")
    if impl is not None:
        transformer["transformer_impl"] = impl
    run, rng_tracker = _run_values(sections, where)
    env = {str(k): "" if v is None else str(v) for k, v in (sections.get("env_vars") or {}).items()}
    precision = sections.get("mixed_precision")
    if isinstance(precision, Mapping):
        for key, value in precision.items():
            if str(key) in transformer_names and str(key) not in model_section and not str(key).startswith("_"):
                decode(value, f"{where}: mixed_precision.{key}")
                transformer[str(key)] = value
    elif precision is not None:
        skipped.append(f"mixed_precision {precision} (a Bridge recipe name; the model section's own bf16/fp16/fp8 "
                       "fields are read)")
    skipped.extend(sorted(name for name in sections if name not in APPLIED_SECTIONS and sections[name] is not None))
    return BridgeConfig(path=where, kind=kind, transformer=transformer, model=model, layer_spec=spec, graph=graph,
                        run=run, te_rng_tracker=rng_tracker or bool(values.get("use_te_rng_tracker")), env=env,
                        where=at, not_applied=tuple(skipped))


def _run_values(sections: Mapping[str, Any], where: str) -> tuple[dict[str, Any], bool]:
    """DiffConfig values of `train:`, `rng:` and `ddp:`, and whether `rng:` asks for TE's RNG tracker."""
    run: dict[str, Any] = {}
    train = sections.get("train") or {}
    for key, name in TRAIN_FIELDS.items():
        if train.get(key) is not None:
            run[name] = train[key]
    if "eval_iters" in train or "eval_interval" in train:
        iters, interval = train.get("eval_iters"), train.get("eval_interval")
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


__all__ = ["BRIDGE_PROVIDER_DEFAULTS", "LAYER_SPECS", "MAX_BRIDGE_BYTES", "BridgeConfig", "is_bridge_config",
           "read_bridge"]
