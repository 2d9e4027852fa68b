"""Module-level probes that need no operator recording: hooks on captured modules (GD508) and
tensor attributes whose address changes between eager steps (GD509).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from graphdoctor.child.probe.recorder import current_location, pick_location
from graphdoctor.probes.types import Observation

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@contextmanager
def track_hook_registrations() -> Iterator[dict[int, str]]:
    """Remember where each module hook is registered: handle id -> `path:line`.

    Wrap model construction in it so that GD508 can point at the `register_*_hook` call.
    """
    registrations: dict[int, str] = {}
    names = ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
             "register_full_backward_pre_hook")
    originals = {name: getattr(torch.nn.Module, name) for name in names}

    def make(original: Any) -> Any:
        def wrapper(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            handle = original(module, *args, **kwargs)
            where, user = current_location(2)
            if user:
                registrations[handle.id] = where
            return handle
        return wrapper

    for name, original in originals.items():
        setattr(torch.nn.Module, name, make(original))
    try:
        yield registrations
    finally:
        for name, original in originals.items():
            setattr(torch.nn.Module, name, original)


def _hook_location(hook: Any) -> tuple[str, bool]:
    target = inspect.unwrap(getattr(hook, "__func__", hook))
    code = getattr(target, "__code__", None)
    if code is None:
        return "<unknown>", False
    return pick_location([(code.co_filename, code.co_firstlineno)])


def scan_hooks(
    root: torch.nn.Module,
    prefix: str,
    registrations: dict[int, str] | None = None,
    *,
    ignore: Iterable[Any] = (),
) -> list[Observation]:
    """GD508: hooks registered on `root` or its submodules (user hooks only).

    Args:
        root: the unit that will be captured.
        prefix: its qualified name.
        registrations: from track_hook_registrations, to point at the registering line.
        ignore: hook callables to skip (the probe's own).

    Returns:
        One observation per user hook; hooks defined and registered inside libraries are skipped.
    """
    registrations = registrations or {}
    skip = {id(h) for h in ignore}
    found: list[Observation] = []
    for name, module in root.named_modules(prefix=prefix):
        for dict_name in _HOOK_DICTS:
            for handle_id, hook in getattr(module, dict_name, {}).items():
                if id(hook) in skip:
                    continue
                if handle_id in registrations:
                    where, user = registrations[handle_id], True
                else:
                    where, user = _hook_location(hook)
                if not user:
                    continue
                kind = dict_name.strip("_").rstrip("s").replace("_", " ")
                hook_name = getattr(hook, "__qualname__", type(hook).__name__)
                found.append(Observation(
                    code="GD508", operator=f"{kind} {hook_name}", module=name, location=where,
                    user_code=True, seq=len(found), detail=f"{kind} on {type(module).__name__}",
                ))
    return found


def tensor_attribute_ptrs(root: torch.nn.Module, prefix: str) -> dict[tuple[str, str], int]:
    """(module name, attribute) -> data_ptr for every non-parameter tensor attribute and buffer."""
    ptrs: dict[tuple[str, str], int] = {}
    for name, module in root.named_modules(prefix=prefix):
        candidates = dict(module._buffers)
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                candidates[attr] = value
        for attr, value in candidates.items():
            if isinstance(value, torch.Tensor) and not value.is_meta:
                ptrs[(name, attr)] = value.data_ptr()
    return ptrs


def changed_attributes(
    before: dict[tuple[str, str], int], after: dict[tuple[str, str], int]
) -> list[tuple[str, str]]:
    """Keys present in both snapshots whose address changed (GD509 by comparison)."""
    return sorted(k for k in before.keys() & after.keys() if before[k] != after[k])


__all__ = ["changed_attributes", "scan_hooks", "tensor_attribute_ptrs", "track_hook_registrations"]
