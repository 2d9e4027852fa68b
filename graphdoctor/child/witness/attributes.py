"""Module attributes the user's code sets during or after a capture (a patched `Module.__setattr__`): GD509, a
tensor attribute rebound (`self.t = new`); GD518, a Python number the module's forward reads set to a new value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from graphdoctor.child.witness.core import MAX_VALUES, Watcher, WitnessCore, is_number, storage_address
from graphdoctor.child.witness.frames import user_issuer
from graphdoctor.child.witness.source import forward_read_line
from graphdoctor.protocol.events import Hazard


@dataclass(slots=True)
class _Number:
    """A number-valued attribute of a module that the user's code set during or after a capture."""

    module: torch.nn.Module
    attr: str
    location: str
    step: int
    phase: str
    values: list[Any] = field(default_factory=list)


class AttributeWatcher(Watcher):
    """Tensor attributes rebound and number attributes changed on the model's modules, once a capture began."""

    def __init__(self, core: WitnessCore) -> None:
        super().__init__(core)
        self._numbers: dict[tuple[int, str], _Number] = {}

    def install(self) -> None:
        core = self.core
        watcher = self

        def make_setattr(original: Any) -> Any:
            def setattr_(module: torch.nn.Module, name: str, value: Any) -> None:
                if core.captures and not core.inside and id(module) in core.modules and (
                        is_number(value) or (isinstance(value, torch.Tensor)
                                             and not isinstance(value, torch.nn.Parameter))):
                    watcher._on_setattr(module, name, value)
                original(module, name, value)
            return setattr_

        core.patch(torch.nn.Module, "__setattr__", make_setattr)

    def settle(self) -> None:
        """One GD518 per changed number that a user forward reads."""
        for number in self._numbers.values():
            self._number_hazard(number)

    def _on_setattr(self, module: torch.nn.Module, name: str, value: Any) -> None:
        core = self.core

        def handle() -> None:
            location = user_issuer(2)
            if location is None:
                return
            old = module.__dict__.get(name, module.__dict__.get("_buffers", {}).get(name))
            qualname = core.names.get(id(module), type(module).__name__)
            if isinstance(value, torch.Tensor):
                if isinstance(old, torch.Tensor) and old is not value \
                        and storage_address(old) != storage_address(value):
                    core.add(Hazard(rule="GD509", module=qualname, subject=name, location=location, step=core.step,
                                    phase=core.capture_phase,
                                    message=(f"{qualname}.{name} was rebound to a new tensor {core.when} (step "
                                             f"{core.step}); a graph keeps reading the tensor it captured, so the "
                                             "new values never reach a replay")))
                return
            if not is_number(old) or old == value:
                return
            number = self._numbers.get((id(module), name))
            if number is None:
                number = self._numbers[(id(module), name)] = _Number(module, name, location, core.step,
                                                                     core.capture_phase, [old])
            if len(number.values) < MAX_VALUES:
                number.values.append(value)
        core.guarded(handle)

    def _number_hazard(self, number: _Number) -> None:
        read = forward_read_line(type(number.module), number.attr)
        if read is None:
            return
        qualname = self.core.names.get(id(number.module), type(number.module).__name__)
        shown = ", ".join(repr(v) for v in number.values[:4])
        self.core.add(Hazard(rule="GD518", module=qualname, subject=number.attr, location=read, step=number.step,
                             phase=number.phase,
                             also_at=(number.location,), message=(
                                 f"{qualname}.forward reads the Python number self.{number.attr}, which changes "
                                 f"from step {number.step} on ({shown}, set at {number.location}); a graph captured "
                                 "the value it had at capture and every replay uses that one")))


__all__ = ["AttributeWatcher"]
