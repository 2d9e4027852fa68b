"""User entry points (`pkg.mod:fn`) and the transformer layer spec a run names.

`layer_spec`, `model_provider` and `forward_step` are checked by form when a DiffConfig is built (no
import) and imported only in the process that builds the model; `build_layer_spec` turns `local`, `te`
or `pkg.mod:fn` into Megatron's ModuleSpec, with the MoE arguments the run's `transformer:` names.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from graphdoctor.errors import UsageError

if TYPE_CHECKING:
    from graphdoctor.config import DiffConfig

TE_LAYER_SPECS: tuple[str, ...] = ("te", "transformer_engine")
"""layer_spec values selecting get_gpt_layer_with_transformer_engine_spec() (aliases)."""

BUILTIN_LAYER_SPECS: tuple[str, ...] = ("local", *TE_LAYER_SPECS)
"""layer_spec values naming Megatron's own GPT layer specs."""

def check_entry_point(name: str, value: str) -> None:
    """Validate the `pkg.mod:fn` form (no import happens here).

    Raises:
        UsageError: when `value` is not of the form `pkg.mod:fn`.
    """
    module, sep, attr = value.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in module.split(".")) \
            or not all(p.isidentifier() for p in attr.split(".")):
        raise UsageError(f"{name}: got {value!r}, expected the form pkg.module:function")


def entry_point_modules(config: DiffConfig) -> list[str]:
    """The modules of the `pkg.mod:fn` values a run names (layer spec, model provider, forward step)."""
    values = [config.layer_spec if config.layer_spec not in BUILTIN_LAYER_SPECS else None,
              config.model_provider, config.forward_step]
    return [v.partition(":")[0] for v in values if v]


def resolve_entry_point(value: str, field: str = "layer_spec") -> Any:
    """Import `pkg.mod:fn` (the working directory is importable, after installed packages).

    Args:
        value: the `pkg.mod:fn` string.
        field: the option it came from, for messages.

    Raises:
        UsageError: the module or attribute does not exist or is not callable.
    """
    import importlib
    import sys

    check_entry_point(field, value)
    module_name, _, attr = value.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        # Last, so that a stray torch.py or megatron/ in the working directory never shadows them.
        sys.path.append(os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{field}: got {value!r}, cannot import {module_name} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{field}: got {value!r}, {module_name} has no attribute {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{field}: got {value!r}, expected a callable")
    return target


MOE_SPEC_FIELDS: tuple[str, ...] = ("num_moe_experts", "moe_grouped_gemm")
"""TransformerConfig fields the built-in layer specs take as arguments (num_experts, moe_grouped_gemm):
read from the run's `transformer:` mapping, the one place MoE is configured."""


def moe_spec_arguments(transformer: dict[str, Any] | None) -> dict[str, Any]:
    """get_gpt_layer_*_spec keyword arguments for MoE, derived from TransformerConfig field values.

    Args:
        transformer: the run's `transformer:` mapping (TransformerConfig names), or None.

    Returns:
        {} for a dense model; else num_experts and moe_grouped_gemm.
    """
    values = transformer or {}
    experts = values.get("num_moe_experts")
    if not experts:
        return {}
    return {"num_experts": experts, "moe_grouped_gemm": bool(values.get("moe_grouped_gemm", False))}


def build_layer_spec(name: str | None, transformer: dict[str, Any] | None = None) -> Any:
    """The transformer layer ModuleSpec that a `layer_spec` value names (imports megatron).

    Args:
        name: `local` or None (Megatron's local GPT spec), `te`/`transformer_engine` (its
            Transformer Engine spec), or `pkg.mod:fn` returning a ModuleSpec.
        transformer: the run's `transformer:` mapping; `num_moe_experts` (and `moe_grouped_gemm`,
            TE's grouped GEMM; the local spec always builds SequentialMLP experts) make the
            built-in specs build MoE layers. A `pkg.mod:fn` spec is called as given.

    Raises:
        UsageError: a `pkg.mod:fn` that cannot be imported or called.
    """
    moe = moe_spec_arguments(transformer)
    if name in TE_LAYER_SPECS:
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        return get_gpt_layer_with_transformer_engine_spec(**moe)
    if name and name != "local":
        return resolve_entry_point(name, "layer_spec")()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(**moe)


__all__ = ["BUILTIN_LAYER_SPECS", "MOE_SPEC_FIELDS", "TE_LAYER_SPECS", "build_layer_spec", "check_entry_point",
           "entry_point_modules", "moe_spec_arguments", "resolve_entry_point"]
