"""ModelDescription: the model one run builds, as Megatron resolved it, in plain data that crosses to a child.

It holds a TransformerConfig (or MLATransformerConfig) and the GPTModelConfig (or HybridModelConfig) fields around
it, in Megatron's own dump format (graphdoctor.config.codec), as Megatron-LM's `core_transformer_config_from_args` and
`gpt_config_from_args` made them for a launch line, or as Megatron-Bridge's `model:` or graphdoctor's run file
gives them; only the fields that differ from the classes' defaults are kept. graphdoctor.config.build turns it back
into Megatron's objects and builds the model with Megatron's GPTModelBuilder (or HybridModelBuilder).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from graphdoctor.config.codec import NAME, TARGET, encode, is_target
from graphdoctor.errors import UsageError
from graphdoctor.inputs import describe

MODEL_KINDS: dict[str, str] = {
    "gpt": "megatron.training.models.gpt.GPTModelConfig",
    "hybrid": "megatron.training.models.hybrid.HybridModelConfig",
}
"""Model kinds and the Megatron model-config class each is built with."""

TRANSFORMER_CLASSES: tuple[str, ...] = (
    "megatron.core.transformer.transformer_config.TransformerConfig",
    "megatron.core.transformer.transformer_config.MLATransformerConfig",
)
"""The TransformerConfig classes a description may name (Megatron-LM picks MLATransformerConfig for
--multi-latent-attention)."""

MISSING: Any = object()


MODEL_OWNED: frozenset[str] = frozenset({"transformer", "transformer_layer_spec", "hybrid_stack_spec", "pre_wrap_hooks",
                                         "post_wrap_hooks", "extra_checkpoint_metadata", "tp_comm_overlap_cfg"})
"""Model-config fields a description does not carry as values: the TransformerConfig (its own section), the layer
spec (`layer_spec`, by name), hooks and checkpoint metadata (objects of a training job, not of the model)."""


BUILTIN_SOURCE = "graphdoctor defaults"
"""ModelDescription.source of graphdoctor's own model."""


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """One run's model, resolved."""

    kind: str
    """`gpt` or `hybrid` (MODEL_KINDS)."""

    transformer_class: str
    """The TransformerConfig class (TRANSFORMER_CLASSES)."""

    transformer: Mapping[str, Any]
    """TransformerConfig fields that differ from the class defaults, encoded (graphdoctor.config.codec)."""

    model: Mapping[str, Any] = field(default_factory=dict)
    """GPTModelConfig / HybridModelConfig fields besides the TransformerConfig that differ from their defaults."""

    layer_spec: str | None = None
    """`pkg.mod:fn` returning the layer ModuleSpec (graphdoctor's --layer-spec), `megatron.pkg.mod:name` (a launch
    line's --spec); None: Megatron's own choice for transformer_impl, MoE, MLA and the hybrid pattern."""

    te_rng_tracker: bool = False
    """Transformer Engine's RNG tracker, as Megatron-LM's validate_args decides it (on for CUDA graphs when TE
    builds the layers or the graphs)."""

    source: str = BUILTIN_SOURCE
    """Where the model came from: `launch line FILE`, `functional test FILE`, `Megatron-Bridge FILE`, `run file
    FILE` or `graphdoctor defaults` (BUILTIN_SOURCE)."""

    line: tuple[tuple[str, ...], ...] = ()
    """The Megatron-LM flags it was parsed from (each `--flag value...`), graphdoctor's overrides included; empty
    for a mapping (run file, Megatron-Bridge)."""

    overrides: Mapping[str, Any] = field(default_factory=dict)
    """TransformerConfig fields set over the line (encoded), applied again to each child's line: a run file's, and
    graphdoctor's own `use_cpu_initialization` (graphdoctor.config.fp8.initialisation), whose False no flag says."""

    unavailable: str | None = None
    """Why this machine cannot build the model (Megatron's TransformerConfig asks for Transformer Engine, which is
    not installed here); its fields are then Megatron's as given, not validated. None: validated by Megatron."""

    @property
    def builtin(self) -> bool:
        """graphdoctor's own GPT model, derived from DiffConfig's fields (no Megatron source describes it)."""
        return self.source == BUILTIN_SOURCE and not self.line

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise UsageError(f"model kind: got {describe(self.kind)}, expected one of {', '.join(MODEL_KINDS)}")
        if self.transformer_class not in TRANSFORMER_CLASSES:
            raise UsageError(f"transformer class: got {describe(self.transformer_class)}, expected one of "
                             f"{', '.join(c.rpartition('.')[2] for c in TRANSFORMER_CLASSES)}")

    def value(self, name: str, default: Any = MISSING) -> Any:
        """A field of the TransformerConfig or the model config in plain form (enums by name, functions by path);
        where the description keeps the class default, `default`, or (none given) the class default itself
        (Megatron is imported to read it; None for a name neither class has)."""
        if name in self.transformer:
            return plain(self.transformer[name])
        if name in self.model:
            return plain(self.model[name])
        if default is not MISSING:
            return default
        return plain(encode(class_defaults(self.transformer_class, self.kind).get(name)))

    def replace(self, **changes: Any) -> ModelDescription:
        """A copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON view (the `model` of a report's config and of a child spec)."""
        return {"kind": self.kind, "transformer_class": self.transformer_class,
                "transformer": dict(self.transformer), "model": dict(self.model), "layer_spec": self.layer_spec,
                "te_rng_tracker": self.te_rng_tracker, "source": self.source,
                "line": [list(group) for group in self.line], "overrides": dict(self.overrides),
                "unavailable": self.unavailable}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelDescription:
        """Inverse of to_dict.

        Raises:
            UsageError: a field of the wrong shape.
        """
        if not isinstance(data, Mapping):
            raise UsageError(f"model: got {describe(data)}, expected a mapping")
        for key in ("transformer", "model", "overrides"):
            if not isinstance(data.get(key, {}), Mapping):
                raise UsageError(f"model.{key}: got {describe(data.get(key))}, expected a mapping")
        line = data.get("line", [])
        if not isinstance(line, list) or not all(isinstance(g, list) and all(isinstance(t, str) for t in g)
                                                 for g in line):
            raise UsageError("model.line: expected a list of flag groups (lists of strings)")
        return cls(kind=str(data.get("kind", "gpt")), transformer_class=str(data.get("transformer_class", "")),
                   transformer=dict(data.get("transformer", {})), model=dict(data.get("model", {})),
                   layer_spec=data.get("layer_spec"), te_rng_tracker=bool(data.get("te_rng_tracker", False)),
                   source=str(data.get("source", "")), line=tuple(tuple(g) for g in line),
                   overrides=dict(data.get("overrides", {})), unavailable=data.get("unavailable"))


def model_facts(model: ModelDescription) -> dict[str, Any]:
    """What a person asks of the model built, in plain values: the header's and the report's `model`."""
    value = model.value
    experts = value("num_moe_experts")
    activation = str(value("activation_func") or "").rpartition(".")[2]
    gated = bool(value("gated_linear_unit"))
    heads, groups = value("num_attention_heads"), value("num_query_groups")
    hidden = value("hidden_size")
    # TransformerConfig.__post_init__ makes an unset ffn_hidden_size 4 x hidden_size
    ffn = value("ffn_hidden_size") or (4 * hidden if isinstance(hidden, int) else None)
    facts: dict[str, Any] = {
        "kind": model.kind, "source": model.source,
        "num_layers": value("num_layers"), "hidden_size": hidden,
        "ffn_hidden_size": ffn, "num_attention_heads": heads,
        "num_query_groups": groups or heads,
        "attention": "MLA" if model.transformer_class.endswith("MLATransformerConfig") else
        ("GQA" if groups and groups != heads else "MHA"),
        "position_embedding": value("position_embedding_type"),
        "rotary_base": value("rotary_base") if value("position_embedding_type") in ("rope", "yarn") else None,
        "normalization": value("normalization"),
        "activation": f"{activation} gated" if gated else activation,
        "tied_embeddings": bool(value("share_embeddings_and_output_weights")),
        "vocab_size": value("vocab_size"),
        "layer_spec": model.layer_spec or value("transformer_impl"),
        "dtype": "bf16" if value("bf16") else "fp16" if value("fp16") else "fp32",
        "fp8": value("fp8"), "fp8_recipe": _name(value("fp8_recipe")) if value("fp8") else None,
        "fp8_param": bool(value("fp8_param")) if value("fp8") else None,
        "fp4": value("fp4"), "fp4_recipe": _name(value("fp4_recipe")) if value("fp4") else None,
        "moe": None if not experts else {
            "num_experts": experts, "topk": value("moe_router_topk"),
            "dispatcher": value("moe_token_dispatcher_type"), "layer_freq": value("moe_layer_freq"),
            "ffn_hidden_size": value("moe_ffn_hidden_size"),
            "shared_expert_size": value("moe_shared_expert_intermediate_size"),
        },
        "mla": None if not model.transformer_class.endswith("MLATransformerConfig") else {
            name: value(name) for name in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                                           "v_head_dim")},
        "mtp_num_layers": value("mtp_num_layers"),
        "hybrid_layer_pattern": value("hybrid_layer_pattern") if model.kind == "hybrid" else None,
        "unavailable": model.unavailable,
    }
    return facts


def _name(value: Any) -> Any:
    """An enum's value (Fp8Recipe.delayed -> `delayed`), anything else as it is."""
    return getattr(value, "value", value)


def plain(value: Any) -> Any:
    """An encoded value as the rules and the report read it: an enum by its member name, a function, dtype or
    partial by its `_target_` path, lists and mappings element by element."""
    if is_target(value):
        return value[NAME] if NAME in value else value[TARGET]
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


@cache
def class_defaults(transformer_class: str, kind: str) -> dict[str, Any]:
    """The defaults of a description's TransformerConfig class and model-config class (its own win)."""
    import importlib

    def load(path: str) -> type:
        module, _, name = path.rpartition(".")
        cls: type = getattr(importlib.import_module(module), name)
        return cls

    return {**_defaults(load(MODEL_KINDS[kind])), **_defaults(load(transformer_class))}


def _defaults(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _differing(obj: Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """obj's init fields whose values differ from the class defaults, encoded."""
    defaults = _defaults(type(obj))
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if not f.init or f.name in skip:
            continue
        value = getattr(obj, f.name)
        if f.name in defaults:
            default = defaults[f.name]
            try:
                same = type(value) is type(default) and bool(value == default)
            except (RuntimeError, TypeError, ValueError):  # tensors and the like compare element-wise
                same = False
            if same:
                continue
        out[f.name] = encode(value)
    return out


def describe_model(transformer_config: Any, model_config: Any, *, source: str, layer_spec: str | None = None,
                   te_rng_tracker: bool = False, line: tuple[tuple[str, ...], ...] = (),
                   unavailable: str | None = None) -> ModelDescription:
    """The description of Megatron's own objects: a built TransformerConfig and a GPTModelConfig or HybridModelConfig
    (whose `transformer` is that config).

    Raises:
        UsageError: a class this version does not build, or a field no plain form can carry.
    """
    cls = type(transformer_config)
    if unavailable is not None:
        cls = cls.__mro__[1]  # built unvalidated (unvalidated_class): described as the class it stands for
    transformer_class = f"{cls.__module__}.{cls.__qualname__}"
    model_class = f"{type(model_config).__module__}.{type(model_config).__qualname__}"
    kinds = {path: kind for kind, path in MODEL_KINDS.items()}
    if model_class not in kinds:
        raise UsageError(f"model config: got {model_class}, expected one of {', '.join(MODEL_KINDS.values())}")
    return ModelDescription(kind=kinds[model_class], transformer_class=transformer_class,
                            transformer=_differing(transformer_config), model=_differing(model_config, MODEL_OWNED),
                            layer_spec=layer_spec, te_rng_tracker=te_rng_tracker, source=source, line=line,
                            unavailable=unavailable)


def unvalidated_class(cls: type) -> type:
    """A subclass of a TransformerConfig class that takes the same fields without __post_init__'s checks: what a
    machine without Transformer Engine can still say of a model whose checks ask for it (never built)."""

    def skip_checks(self: Any) -> None:
        return None

    return dataclasses.dataclass(type(f"Unvalidated{cls.__name__}", (cls,), {"__post_init__": skip_checks}))


__all__ = ["BUILTIN_SOURCE", "MODEL_KINDS", "MODEL_OWNED", "TRANSFORMER_CLASSES", "ModelDescription", "class_defaults",
           "describe_model", "model_facts", "plain", "unvalidated_class"]
