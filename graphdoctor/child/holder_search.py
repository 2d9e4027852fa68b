"""The bounded search behind the holder watch (graphdoctor.child.holders): from the run's roots to each object that
holds a tensor a graph read, as a path of links that can be followed again after every step (`resolve`).

Paths name what a user recognises: `decoder.layers.0.mlp.linear_fc1.weight`,
`optimizer.chained_optimizers[0].grad_scaler._scale`, `weighted_loss.<closure>.weight`,
`fixtures.planted.holder_global.GAIN` (a global: its module and name), `DampedMLP.damping` (a class attribute).
"""

from __future__ import annotations

import functools
import sys
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from graphdoctor.child.holder_lines import read_line

MAX_VISITED = 50_000
"""Objects one holder search visits at most."""

MAX_DEPTH = 7
"""Links from a root one holder search follows at most."""

MAX_ITEMS = 4096
"""Items of one list or dictionary a search looks into."""

MAX_SCALARS = 4096
"""Distinct host numbers kept from the captured operations."""
MISSING = object()

Link = tuple[str, Any]
"""(kind, key): `attr` (instance `__dict__`), `get` (getattr: a slot, a bound method's `__self__`), `item`
(a dict key or list index), `cell` (closure cell index), `cattr` (a class's own `__dict__`), `global` (a function's
`__globals__`)."""

_LEAVES = (str, bytes, bool, int, float, complex, type(None), types.ModuleType, type, torch.dtype, torch.device,
           torch.Generator, torch.cuda.Stream, torch.cuda.Event, torch.nn.Module, range, slice)
"""What a search never looks into (modules are searched as model roots, classes as class roots)."""


def storage_of(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return 0


def is_number(value: Any) -> bool:
    return type(value) in (int, float)


def resolve(root: Any, links: tuple[Link, ...]) -> Any:
    """Follow `links` from `root`; MISSING where a link no longer leads anywhere."""
    obj = root
    for kind, key in links:
        try:
            if kind == "attr":
                obj = vars(obj).get(key, MISSING)
            elif kind == "get":
                obj = getattr(obj, key, MISSING)
            elif kind == "item":
                obj = obj[key]
            elif kind == "cell":
                obj = obj.__closure__[key].cell_contents
            elif kind == "cattr":
                obj = obj.__dict__.get(key, MISSING)
            elif kind == "global":
                obj = obj.__globals__.get(key, MISSING)
            else:
                return MISSING
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            return MISSING
        if obj is MISSING:
            return MISSING
    return obj


def _key_name(key: Any) -> str:
    if isinstance(key, torch.Tensor):
        return f"<tensor {tuple(key.shape)}>"
    return type(key).__name__


@dataclass(frozen=True, slots=True)
class Parameters:
    """A search root standing for one module's own parameters and buffers (searched before anything else, so a
    parameter is named by its module rather than by an optimizer's list that also holds it)."""

    module: torch.nn.Module


@dataclass(slots=True)
class Found:
    path: str
    root: Any
    links: tuple[Link, ...]
    value: torch.Tensor
    owner: Any
    module: str


class Search:
    """Breadth-first search from roots for tensors whose storage is one of `targets` (bounded)."""

    def __init__(self, targets: set[int], names: dict[int, str], device_type: str = "cuda") -> None:
        self.targets = targets
        self.device_type = device_type
        self.names = names
        self.found: list[Found] = []
        self.visited: set[int] = set()

    def run(self, name: str, root: Any, links: tuple[Link, ...], module: str) -> None:
        """Search from one root (its holders' paths start with `name`)."""
        if not self.targets or len(self.visited) >= MAX_VISITED:
            return
        if isinstance(root, Parameters):
            self._parameters(name, root.module, module)
            return
        queue: deque[tuple[Any, tuple[Link, ...], str]] = deque([(root, links, name)])
        model_root = isinstance(root, torch.nn.Module)
        while queue and len(self.visited) < MAX_VISITED:
            obj, path_links, label = queue.popleft()
            if id(obj) in self.visited and obj is not root:
                continue
            self.visited.add(id(obj))
            if len(path_links) >= MAX_DEPTH:
                continue
            for segment, child, child_label in _children(obj, label, obj is root and model_root):
                child_links = (*path_links, *segment)
                if isinstance(child, torch.Tensor):
                    self._tensor(child, root, child_links, child_label, obj, module)
                    for attr, extra in list(vars(child).items()):
                        if isinstance(extra, torch.Tensor):
                            self._tensor(extra, root, (*child_links, ("attr", attr)), f"{child_label}.{attr}", child,
                                         module)
                    continue
                if isinstance(child, _LEAVES) or id(child) in self.visited or (
                        isinstance(child, types.FunctionType) and "_gd_internal" in child.__dict__):
                    continue
                queue.append((child, child_links, child_label))

    def _parameters(self, name: str, module: torch.nn.Module, qualname: str) -> None:
        """A module's own parameters and buffers, and the tensors set on them (a parameter's `main_grad`)."""
        for key in ("_parameters", "_buffers"):
            for attr, tensor in getattr(module, key, {}).items():
                if not isinstance(tensor, torch.Tensor):
                    continue
                links: tuple[Link, ...] = (("attr", key), ("item", attr))
                self._tensor(tensor, module, links, f"{name}.{attr}", module, qualname)
                for extra, value in list(vars(tensor).items()):
                    if isinstance(value, torch.Tensor):
                        self._tensor(value, module, (*links, ("attr", extra)), f"{name}.{attr}.{extra}", tensor,
                                     qualname)

    def _tensor(self, tensor: torch.Tensor, root: Any, links: tuple[Link, ...], label: str, owner: Any,
                module: str) -> None:
        if tensor.device.type != self.device_type or id(tensor) in self.visited:
            return
        self.visited.add(id(tensor))
        ptr = storage_of(tensor)
        if ptr in self.targets:
            self.found.append(Found(path=label, root=root, links=links, value=tensor, owner=owner, module=module))


def _children(obj: Any, label: str, model_root: bool) -> Iterator[tuple[tuple[Link, ...], Any, str]]:
    """(links to the child, child, its path) of each object `obj` holds that a search follows."""
    if isinstance(obj, dict):
        for key, value in list(obj.items())[:MAX_ITEMS]:
            shown = f"[{key!r}]" if isinstance(key, (str, int)) else f"[{_key_name(key)}]"
            yield (("item", key),), value, label + shown
        return
    if isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj[:MAX_ITEMS]):
            yield (("item", index),), value, f"{label}[{index}]"
        return
    if isinstance(obj, functools.partial):
        yield (("get", "func"),), obj.func, f"{label}.func"
        return
    if isinstance(obj, types.MethodType):
        yield (("get", "__self__"),), obj.__self__, f"{label}.__self__"
        yield (("get", "__func__"),), obj.__func__, label
        return
    if isinstance(obj, types.FunctionType):
        names = obj.__code__.co_freevars
        for index, cell in enumerate(obj.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            name = names[index] if index < len(names) else str(index)
            yield (("cell", index),), value, f"{label}.<closure>.{name}"
        if user_code(obj):
            module = obj.__globals__.get("__name__", "?")
            for name in sorted(_global_names(obj.__code__)):
                if name in obj.__globals__:
                    yield (("global", name),), obj.__globals__[name], f"{module}.{name}"
        return
    if isinstance(obj, type):
        for name, value in list(vars(obj).items()):
            if not name.startswith("__") and isinstance(value, torch.Tensor):
                yield (("cattr", name),), value, f"{label}.{name}"
        return
    if model_root and isinstance(obj, torch.nn.Module):
        for key, value in vars(obj).items():
            if key in ("_parameters", "_buffers", "_modules") or key.startswith(("_forward", "_backward", "_state_dict",
                                                                                  "_load_state_dict")) \
                    or isinstance(value, torch.nn.Module):
                continue
            yield (("attr", key),), value, f"{label}.{key}"
        return
    if isinstance(obj, types.ModuleType):
        return
    try:
        values = vars(obj)
    except TypeError:
        values = None
    if isinstance(values, dict):
        for key, value in list(values.items())[:MAX_ITEMS]:
            yield (("attr", key),), value, f"{label}.{key}"
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            value = getattr(obj, slot, MISSING)
            if value is not MISSING and slot != "__weakref__":
                yield (("get", slot),), value, f"{label}.{slot}"


def _global_names(code: types.CodeType) -> set[str]:
    """Every name a code object (and the code nested in it) loads from its globals or attributes."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def user_code(fn: Any) -> bool:
    from graphdoctor.child.probe.recorder import is_user_file

    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is not None and is_user_file(code.co_filename)


def user_class(cls: type) -> bool:
    from graphdoctor.child.probe.recorder import is_user_file

    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    return filename is not None and is_user_file(filename)


def short_qualname(fn: Any) -> str:
    """`weighted_loss` for `_make_forward_step.<locals>.weighted_loss`: how a path names a function."""
    return str(getattr(fn, "__qualname__", "loss_func")).rsplit("<locals>.", 1)[-1]


def unwrapped(fn: Any) -> Any:
    seen = 0
    while hasattr(fn, "__wrapped__") and seen < 8:
        fn, seen = fn.__wrapped__, seen + 1
    return fn


def function_of(loss_func: Any) -> Any:
    """The function behind a loss function (a partial's `func`): stable across calls, unlike its arguments."""
    fn = loss_func
    for _ in range(8):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            break
    return fn if isinstance(fn, types.FunctionType) else None


def model_classes(model: torch.nn.Module) -> list[type]:
    """The classes of the model's modules and their bases, outside torch, in model order."""
    out: dict[type, None] = {}
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls.__module__.startswith(("torch.", "builtins")) or cls is object:
                continue
            out.setdefault(cls, None)
    return list(out)


def megatron_holder_classes() -> list[type]:
    """Megatron classes that hold a captured tensor as a class attribute (the MoE aux-loss scale), where loaded."""
    module = sys.modules.get("megatron.core.transformer.moe.moe_utils")
    cls = getattr(module, "MoEAuxLossAutoScaler", None) if module is not None else None
    return [cls] if isinstance(cls, type) else []


def captured_numbers(functions: list[Any], model: torch.nn.Module) -> Iterator[tuple[str, Any, tuple[Link, ...], Any,
                                                                                      str | None]]:
    """(path, root, links, value, read line) of each number the functions read from their globals, their closures
    or a class attribute of the model's classes."""
    for fn in functions:
        fn = getattr(fn, "__func__", fn)
        code = fn.__code__
        module = fn.__globals__.get("__name__", "?")
        for name in sorted(_global_names(code)):
            value = fn.__globals__.get(name, MISSING)
            if is_number(value):
                yield f"{module}.{name}", fn.__globals__, (("item", name),), value, read_line(fn, name)
        for index, cell in enumerate(fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if is_number(value):
                name = code.co_freevars[index]
                yield f"{short_qualname(fn)}.<closure>.{name}", fn, (("cell", index),), value, read_line(fn, name)
    for cls in model_classes(model):
        for name, value in list(cls.__dict__.items()):
            if name.startswith("__") or not is_number(value) or not user_class(cls):
                continue
            read = _class_attribute_read(cls, model, name)
            if read is not None:
                yield f"{cls.__qualname__}.{name}", cls, (("cattr", name),), value, read


def _class_attribute_read(owner: type, model: torch.nn.Module, name: str) -> str | None:
    """`file:line` where a user forward of the model reads the class attribute `name` (`self.name` on an instance
    without its own, or `Owner.name`); None when none does."""
    from graphdoctor.child.witness import forward_read_line

    for module in model.modules():
        if isinstance(module, owner) and name not in vars(module):
            line = forward_read_line(type(module), name)
            if line is not None:
                return line
    for cls in model_classes(model):
        forward = cls.__dict__.get("forward")
        if forward is not None and user_code(forward):
            line = read_line(forward, name, owner=owner.__name__)
            if line is not None:
                return line
    return None



__all__ = ["MAX_DEPTH", "MAX_ITEMS", "MAX_VISITED", "MISSING", "Found", "Link", "Parameters", "Search", "captured_numbers",
           "function_of", "is_number", "megatron_holder_classes", "model_classes", "resolve", "short_qualname",
           "storage_of", "unwrapped", "user_class", "user_code"]
