"""The model values DiffConfig owns and their Megatron spellings, in one table.

A twin is a DiffConfig field that stands for one or more Megatron settings: `num_layers` for `--num-layers` /
`TransformerConfig.num_layers`, `dropout` for hidden_dropout and attention_dropout, `dtype` for bf16/fp16,
`layer_spec` for transformer_impl. Every reader and writer of those settings loops over TWINS: the launch-line
and run-file readers (Megatron settings -> DiffConfig), the Megatron settings written for a line or a model
(DiffConfig -> Megatron), the run file's `transformer:` copies made to agree with the DiffConfig, and the fields a
child never takes from `transformer:`. A new twin is one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphdoctor.config.entry_points import BUILTIN_LAYER_SPECS

MISSING: Any = object()
"""What a getter returns for a setting that is not there, and what `Twin.read` returns when the settings do not
give this twin a usable value."""

Getter = Callable[[str], Any]
"""name -> value, or MISSING (`mapping.get(name, MISSING)`, `getattr(args, name, MISSING)`)."""

BUILTIN_SPECS: dict[str, str] = {spec: "local" if spec == "local" else "transformer_engine" for spec in BUILTIN_LAYER_SPECS}
"""diff's built-in layer specs and the transformer_impl Megatron builds each with."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Twin:
    """One DiffConfig field and the Megatron settings it stands for."""

    field: str
    names: tuple[str, ...]
    """The Megatron settings (Megatron-LM argument dests / TransformerConfig fields) this field stands for."""
    transformer: bool
    """The settings are TransformerConfig fields that the run owns: a run file's `transformer:` fills the field
    (unless `run:` or a flag sets it), its copies are made to agree with the field, and a child takes them from
    the field, never from `transformer:`."""
    required: bool = False
    """Megatron-LM requires the setting; a partial line that leaves it out gets DiffConfig's default."""
    write: Callable[[Any], dict[str, Any]] | None = None
    """DiffConfig value -> Megatron settings; None: the one setting of the same name, as is."""
    read_: Callable[[Getter], Any] | None = None
    """Megatron settings -> DiffConfig value (MISSING: not given, or not a value diff reads); None: the one
    setting of the same name."""

    def to_megatron(self, value: Any) -> dict[str, Any]:
        """The Megatron settings for the DiffConfig value `value`."""
        return self.write(value) if self.write is not None else {self.field: value}

    def read(self, get: Getter) -> Any:
        """The DiffConfig value the Megatron settings behind `get` give, or MISSING."""
        return self.read_(get) if self.read_ is not None else get(self.field)


def _dropout(get: Getter) -> Any:
    given = [get(name) for name in ("hidden_dropout", "attention_dropout")]
    given = [value for value in given if value is not MISSING]
    return max(given) if given and all(_number(value) for value in given) else MISSING


def _dtype(get: Getter) -> Any:
    return "bf16" if get("bf16") is True else "fp16" if get("fp16") is True else MISSING


def _layer_spec(get: Getter) -> Any:
    impl = get("transformer_impl")
    return {"local": "local", "transformer_engine": "te"}.get(impl, MISSING) if isinstance(impl, str) else MISSING


def _same(name: str, *, transformer: bool = False, required: bool = False,
          write: Callable[[Any], dict[str, Any]] | None = None) -> Twin:
    return Twin(field=name, names=(name,), transformer=transformer, required=required, write=write)


TWINS: tuple[Twin, ...] = (
    _same("num_layers", transformer=True, required=True),
    _same("hidden_size", transformer=True, required=True),
    _same("num_attention_heads", transformer=True, required=True),
    _same("seq_length", required=True),
    _same("micro_batch_size", required=True),
    _same("vocab_size"),
    _same("seed"),
    _same("cuda_graph_warmup_steps", transformer=True),
    _same("tensor_model_parallel_size", transformer=True),
    _same("pipeline_model_parallel_size", transformer=True),
    _same("sequence_parallel", transformer=True),
    _same("expert_model_parallel_size"),
    _same("expert_tensor_parallel_size"),
    _same("overlap_grad_reduce"),
    _same("use_distributed_optimizer"),
    _same("ddp_bucket_size"),
    _same("recompute_granularity"),
    _same("recompute_method"),
    _same("recompute_num_layers"),
    _same("recompute_modules", write=lambda value: {"recompute_modules": list(value)}),
    _same("loss_scale"),
    Twin(field="dtype", names=("bf16", "fp16"), transformer=True,
         write=lambda value: {"bf16": value == "bf16", "fp16": value == "fp16"}, read_=_dtype),
    Twin(field="dropout", names=("hidden_dropout", "attention_dropout"), transformer=True,
         write=lambda value: {"hidden_dropout": value, "attention_dropout": value}, read_=_dropout),
    Twin(field="layer_spec", names=("transformer_impl",), transformer=False,
         write=lambda value: {"transformer_impl": BUILTIN_SPECS[value]} if value in BUILTIN_SPECS else {},
         read_=_layer_spec),
)
"""Every twin. `transformer=True` rows are the TransformerConfig fields the run owns; the others are Megatron-LM
settings of the line (layer_spec's transformer_impl stays the run file's where a `pkg.mod:fn` spec is given)."""

BY_FIELD: dict[str, Twin] = {twin.field: twin for twin in TWINS}

SAME_NAME: tuple[str, ...] = tuple(twin.field for twin in TWINS if twin.names == (twin.field,))
"""DiffConfig fields that are Megatron settings of the same name."""

RUN_OWNED_NAMES: frozenset[str] = frozenset(name for twin in TWINS if twin.transformer for name in twin.names)
"""The TransformerConfig fields the run owns (a child takes them from DiffConfig, never from `transformer:`)."""


def megatron_of(values: dict[str, Any] | Any, fields: tuple[Twin, ...] = TWINS) -> dict[str, Any]:
    """The Megatron settings of the twins `values` gives (a mapping of DiffConfig fields, or a DiffConfig), those
    that are not None."""
    get = getter(values)
    out: dict[str, Any] = {}
    for twin in fields:
        value = get(twin.field)
        if value is not None and value is not MISSING:
            out.update(twin.to_megatron(value))
    return out


def read_twins(get: Getter, fields: tuple[Twin, ...] = TWINS) -> dict[str, Any]:
    """The DiffConfig values the Megatron settings behind `get` give, for the twins `fields`."""
    out: dict[str, Any] = {}
    for twin in fields:
        value = twin.read(get)
        if value is not MISSING:
            out[twin.field] = value
    return out


def getter(source: Any) -> Getter:
    """A Getter over a mapping or an object's attributes."""
    if isinstance(source, dict):
        return lambda name: source.get(name, MISSING)
    return lambda name: getattr(source, name, MISSING)


OWNED: tuple[Twin, ...] = tuple(twin for twin in TWINS if twin.transformer)
"""The twins a run file's `transformer:` fills and whose copies are made to agree."""

__all__ = ["BUILTIN_SPECS", "BY_FIELD", "MISSING", "OWNED", "RUN_OWNED_NAMES", "SAME_NAME", "TWINS", "Getter", "Twin",
           "getter", "megatron_of", "read_twins"]
