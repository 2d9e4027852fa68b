"""A package whose names load on first use (PEP 562's module `__getattr__`): importing the package runs none of
its modules, so a process that needs one module of it (a child, the template, the command before it asks for the
template) pays for that module only."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def names_from(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: a name of `modules` (a module of `package` -> the names it defines) is
    imported from its module when first asked for; any other name raises AttributeError as a module would."""
    home = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__


__all__ = ["names_from"]
