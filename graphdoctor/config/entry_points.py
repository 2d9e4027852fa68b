"""User entry points (`pkg.mod:fn`) and the layer-spec names a run may give.

`layer_spec`, `model_provider` and `forward_step` are checked by form when a DiffConfig is built (no
import) and imported only in the process that builds the model (graphdoctor.config.build).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from graphdoctor.errors import UsageError


class NamedEntryPoints(Protocol):
    """What entry_point_modules reads of a run (a DiffConfig)."""

    layer_spec: str | None
    model_provider: str | None
    forward_step: str | None

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


def entry_point_modules(config: NamedEntryPoints) -> list[str]:
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


__all__ = ["BUILTIN_LAYER_SPECS", "TE_LAYER_SPECS", "NamedEntryPoints", "check_entry_point", "entry_point_modules",
           "resolve_entry_point"]
