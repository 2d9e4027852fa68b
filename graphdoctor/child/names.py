"""Module and parameter names as the reports give them: without the wrappers Megatron puts around a model."""

from __future__ import annotations


def strip_wrappers(name: str) -> str:
    """A module or parameter name without the DDP/Float16Module `module.` prefixes ("" for them)."""
    while name.startswith("module."):
        name = name[len("module."):]
    return "" if name == "module" else name


__all__ = ["strip_wrappers"]
