"""Megatron config values as plain data, in the format Megatron's own YAML dump writes them
(megatron.training.config.yaml_utils, the format Megatron-Bridge's ConfigContainer dump shares): a function,
class or dtype is `{_target_: path, _call_: false}`, an enum `{_target_, _call_: true, _args_: [value], _name_}`,
a functools.partial `{_target_, _partial_: true, _args_: [...], **keywords}`.

encode() writes it (what crosses to a child is plain JSON); decode() reads it back, importing a `_target_` only
from ALLOWED_PREFIXES and only to look a name up, never to call anything but an enum by its member name, so a
description read from a file names Megatron's functions but cannot run code of its own.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import sys
from collections.abc import Mapping
from typing import Any

from graphdoctor.errors import UsageError
from graphdoctor.inputs import describe

ALLOWED_PREFIXES: tuple[str, ...] = ("torch.nn.functional.", "torch.nn.init.", "megatron.core.")
"""Where a `_target_` may point: torch's activation and init functions and Megatron-Core's own functions,
classes and enums (and torch's dtypes, `torch.bfloat16`)."""

TARGET, CALL, ARGS, NAME, PARTIAL = "_target_", "_call_", "_args_", "_name_", "_partial_"
MAX_DEPTH = 32


def _path(obj: Any) -> str:
    module = inspect.getmodule(obj)
    return f"{module.__name__ if module else obj.__module__}.{obj.__qualname__}"


def encode(value: Any) -> Any:
    """`value` as Megatron's YAML dump writes it, as plain data (JSON-safe).

    Raises:
        UsageError: an object none of the dump's forms can carry (the description could not cross to a child).
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return {TARGET: _path(type(value)), CALL: True, ARGS: [encode(value.value)], NAME: value.name}
    torch = sys.modules.get("torch")  # a dtype exists only once torch is imported: plain values need no import
    if torch is not None and isinstance(value, torch.dtype):
        return {TARGET: str(value), CALL: False}
    if isinstance(value, functools.partial):
        keywords = {str(k): encode(v) for k, v in value.keywords.items()}
        return {TARGET: _path(value.func), PARTIAL: True, ARGS: [encode(a) for a in value.args], **keywords}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value):
        return {TARGET: _path(value), CALL: False}
    raise UsageError(f"a Megatron setting of type {type(value).__name__} ({describe(value)}) has no plain form "
                     "that a child run can receive")


def _lookup(target: str, where: str) -> Any:
    """The object at a dotted path under ALLOWED_PREFIXES, or a torch dtype (the module imported, the attributes
    looked up)."""
    import torch

    if isinstance(target, str) and target.count(".") == 1 and target.startswith("torch."):
        dtype = getattr(torch, target[len("torch."):], None)
        if isinstance(dtype, torch.dtype):
            return dtype
    if not isinstance(target, str) or not target.startswith(ALLOWED_PREFIXES):
        raise UsageError(f"{where}: _target_ {describe(target)} is outside what graphdoctor reads "
                         f"({', '.join(p.rstrip('.') for p in ALLOWED_PREFIXES)} and torch dtypes); expected one of Megatron's "
                         "or torch's own names")
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise UsageError(f"{where}: _target_ {target} does not exist in this installation")


def decode(value: Any, where: str = "model", *, depth: int = 0) -> Any:
    """The inverse of encode(): `_target_` mappings back to functions, dtypes, enum members and partials.

    An enum whose class this installation lacks (Megatron-Bridge dumps of older releases) decodes to its
    member name, which Megatron's config classes accept where they take enums by name.

    Raises:
        UsageError: a `_target_` outside ALLOWED_PREFIXES or missing here, or a form that would construct
            an object (`_call_: true` on anything but an enum).
    """
    if depth > MAX_DEPTH:
        raise UsageError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list):
        return [decode(v, where, depth=depth + 1) for v in value]
    if not isinstance(value, Mapping):
        return value
    if TARGET not in value:
        return {str(k): decode(v, f"{where}.{k}", depth=depth + 1) for k, v in value.items()}
    target = value[TARGET]
    if NAME in value:
        try:
            cls = _lookup(target, where)
        except UsageError:
            return str(value[NAME])
        if not (inspect.isclass(cls) and issubclass(cls, enum.Enum)) or value[NAME] not in cls.__members__:
            raise UsageError(f"{where}: {describe(value[NAME])} is not a member of enum {target}")
        return cls[value[NAME]]
    if value.get(PARTIAL):
        func = _lookup(target, where)
        args = [decode(a, where, depth=depth + 1) for a in value.get(ARGS, [])]
        keywords = {k: decode(v, f"{where}.{k}", depth=depth + 1) for k, v in value.items()
                    if k not in (TARGET, PARTIAL, ARGS)}
        return functools.partial(func, *args, **keywords)
    if value.get(CALL, False) is False and set(value) <= {TARGET, CALL}:
        return _lookup(target, where)
    raise UsageError(f"{where}: _target_ {describe(target)} would construct an object; graphdoctor reads only "
                     "functions, dtypes, enums and partials")


def is_target(value: Any) -> bool:
    """A mapping in the dump's `_target_` form."""
    return isinstance(value, Mapping) and TARGET in value


__all__ = ["ALLOWED_PREFIXES", "decode", "encode", "is_target"]
