"""Host numbers the user's code turns into a device tensor while a graph is captured (`torch.full`,
`torch.tensor`, `fill_`, ...): GD518 where the call site's numbers change from call to call."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from graphdoctor.child.witness.core import MAX_VALUES, Watcher, WitnessCore, is_number
from graphdoctor.child.witness.frames import user_issuer
from graphdoctor.compare.cause import FACTORIES
from graphdoctor.protocol.events import Hazard


@dataclass(slots=True)
class _Factory:
    """A user call site that made a device tensor from host numbers."""

    op: str
    location: str
    module: str | None
    values: list[Any] = field(default_factory=list)
    captured_step: int | None = None


class FactoryWatcher(Watcher):
    """The tensor factories of graphdoctor.compare.cause.FACTORIES, called by the user's code with host numbers."""

    def __init__(self, core: WitnessCore) -> None:
        super().__init__(core)
        self._factories: dict[str, _Factory] = {}

    def install(self) -> None:
        for op in FACTORIES:  # the value becomes a kernel argument or a copied constant of a captured graph
            method = op.endswith("_")
            self.core.patch(torch.Tensor if method else torch, op, self._factory_wrapper(op, method=method))

    def settle(self) -> None:
        """One GD518 per call site used while capturing whose numbers changed."""
        for factory in self._factories.values():
            if factory.captured_step is not None and len(set(map(repr, factory.values))) > 1:
                shown = ", ".join(repr(v) for v in factory.values[:3])
                self.core.add(Hazard(
                    rule="GD518", module=factory.module or "", subject=factory.op, location=factory.location,
                    step=factory.captured_step, phase="capture", message=(
                        f"{_qualified(factory.op)} turned host numbers into a device tensor while a graph "
                        f"was captured at step {factory.captured_step}; its numbers change from call "
                        f"to call ({shown}), and every replay reuses the one captured")))

    def _factory_wrapper(self, op: str, *, method: bool = False) -> Callable[[Any], Any]:
        core = self.core
        watcher = self
        position, keyword = (1, "fill_value") if method or op in ("full", "full_like") else (0, "data")

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def factory(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                if not core.inside:
                    value = args[position] if len(args) > position else kwargs.get(keyword)
                    if _host_numbers(value) and isinstance(result, torch.Tensor) \
                            and result.device.type == core.device_type:
                        watcher._on_factory(op, value)
                return result
            return factory
        return make

    def _on_factory(self, op: str, value: Any) -> None:
        core = self.core

        def handle() -> None:
            location = user_issuer(2)
            if location is None:
                return
            module = core.module(2)
            site = self._factories.get(location)
            if site is None:
                site = self._factories[location] = _Factory(op=op, location=location, module=module)
            if len(site.values) < MAX_VALUES and value not in site.values:
                site.values.append(value)
            if core.depth and site.captured_step is None:
                site.captured_step = core.step
        core.guarded(handle)


def _qualified(op: str) -> str:
    """`torch.full`, `Tensor.fill_`: how the user's code spells the factory."""
    return f"Tensor.{op}" if op.endswith("_") else f"torch.{op}"


def _host_numbers(value: Any) -> bool:
    if is_number(value):
        return True
    return isinstance(value, (list, tuple)) and 0 < len(value) <= 64 and all(is_number(v) for v in value)


__all__ = ["FactoryWatcher"]
