"""Hooks the user's code registers: each registration site (`hook`: context for the backward side), and GD520,
a hook that keeps a reference to a tensor it receives when a later call receives a tensor in that same storage
while the kept one is still alive (a graph's static buffer, rewritten by every replay)."""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from graphdoctor.child.witness.core import Watcher, WitnessCore, storage_address
from graphdoctor.child.witness.frames import user_issuer
from graphdoctor.compare.cause import HOOK
from graphdoctor.locations import format_location
from graphdoctor.protocol.events import Hazard


@dataclass(slots=True)
class _HookSite:
    """One registration site of a user hook: what it kept (weak references) and what it is on."""

    location: str
    function: str
    kind: str
    module: str
    """The module it is on or inside ("" when unknown)."""
    subject: str
    """What it is on, in words."""
    kept: list[tuple[weakref.ref[torch.Tensor], int, int, int]] = field(default_factory=list)
    """(tensor, storage address, step, call index) of each tensor the hook kept a reference to."""
    calls: int = 0
    reported: bool = False


class HookWatcher(Watcher):
    """Tensor, forward and full-backward hooks the user's code registers, each call of each one observed.

    Args:
        core: the state the watchers share.
        model: the model (its parameters are named in the evidence).
    """

    def __init__(self, core: WitnessCore, model: torch.nn.Module) -> None:
        super().__init__(core)
        self.param_names = {id(p): n for n, p in _named_parameters(model)}
        self._hooks: dict[str, _HookSite] = {}

    def install(self) -> None:
        core = self.core
        watcher = self

        def make_register(kind: str) -> Callable[[Any], Any]:
            def make(original: Any) -> Any:
                def register(owner: Any, hook: Any, *args: Any, **kwargs: Any) -> Any:
                    where = None if core.inside else user_issuer(1)
                    if where is not None:
                        hook = watcher._observed_hook(kind, owner, hook, where)
                    return original(owner, hook, *args, **kwargs)
                return register
            return make

        core.patch(torch.Tensor, "register_hook", make_register("tensor"))
        core.patch(torch.nn.Module, "register_forward_hook", make_register("forward"))
        core.patch(torch.nn.Module, "register_full_backward_hook", make_register("backward"))

    def settle(self) -> None:
        """One `hook` hazard per registration site called and not already reported as GD520."""
        for site in self._hooks.values():
            if site.calls and not site.reported:
                self.core.add(Hazard(rule=HOOK, module=site.module, subject=site.function, location=site.location,
                                     also_at=(site.function,), message=(
                                         f"{site.kind} hook {site.function} registered at {site.location} on "
                                         f"{site.subject}, called {site.calls} times")))

    def _observed_hook(self, kind: str, owner: Any, hook: Any, location: str) -> Any:
        site = self._hooks.get(location)
        if site is None:
            module, subject = self._subject(kind, owner)
            site = self._hooks[location] = _HookSite(location=location, function=_function_location(hook),
                                                     kind=kind, module=module, subject=subject)
        core = self.core
        watcher = self

        @functools.wraps(hook)
        def observed(*args: Any) -> Any:
            if core.inside:
                return hook(*args)
            received = [t for t in _tensors(args[-1] if kind == "tensor" else args[1:])
                        if t.device.type == core.device_type]
            before = [sys.getrefcount(t) for t in received]
            result = hook(*args)
            core.guarded(lambda: watcher._after_hook(site, received, before, result))
            return result

        return observed

    def _subject(self, kind: str, owner: Any) -> tuple[str, str]:
        """(module name, what the hook is on in words)."""
        if kind != "tensor":
            name = self.core.names.get(id(owner), type(owner).__name__)
            return name, f"module {name}"
        if id(owner) in self.param_names:
            name = self.param_names[id(owner)]
            return name.rsplit(".", 1)[0] if "." in name else name, f"parameter {name}"
        module = self.core.module(2)
        return module or "", f"an output of {module}" if module else "a tensor"

    def _after_hook(self, site: _HookSite, received: list[torch.Tensor], before: list[int], result: Any) -> None:
        after = [sys.getrefcount(t) for t in received]  # the same expression as `before`: the same baseline
        site.calls += 1
        returned = {id(t) for t in _tensors(result)}
        step = self.core.step
        for tensor, count, now in zip(received, before, after, strict=True):
            storage = storage_address(tensor)
            for ref, kept_storage, kept_step, kept_call in site.kept:
                kept = ref()
                if kept is None or kept_storage != storage or not storage or site.reported:
                    continue
                site.reported = True
                self.core.add(Hazard(
                    rule="GD520", module=site.module, subject=site.function, location=site.location,
                    step=step, phase=self.core.phase, also_at=(site.function,), message=(
                        f"the hook registered at {site.location} ({site.function}) keeps a reference to "
                        f"the tensor it receives ({site.subject}); call {site.calls} (step {step}) "
                        f"received a tensor in the same storage as the one kept at call {kept_call} "
                        f"(step {kept_step}), which is still alive: a graph's static buffer, rewritten "
                        "by every replay, so the kept reference no longer holds its own values")))
            grew = now - count - (1 if id(tensor) in returned else 0)
            if grew > 0:
                site.kept.append((weakref.ref(tensor), storage, step, site.calls))
        site.kept = [k for k in site.kept if k[0]() is not None][-64:]


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _function_location(fn: Any) -> str:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", repr(fn))
    return format_location(code.co_filename, code.co_firstlineno)


def _named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    from graphdoctor.child.names import strip_wrappers

    return [(strip_wrappers(n), p) for n, p in model.named_parameters()]


__all__ = ["HookWatcher"]
