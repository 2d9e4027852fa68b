"""The witness's shared core: its patches and their undoing, the step and phase, the capture state, the user's
module on the stack, guarded evidence handling and the one hazard list every watcher adds to."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from graphdoctor.child.taps import graph_method_owner
from graphdoctor.protocol.events import Hazard

MAX_VALUES = 8
"""Distinct values kept per call site or attribute (enough to tell constant from changing)."""

MAX_HAZARDS = 32
"""Hazard events one child reports at most (the first ones; a note-sized report, not a log)."""


def is_number(value: Any) -> bool:
    """A Python int or float (not a bool, not a tensor)."""
    return type(value) in (int, float)


def storage_address(tensor: torch.Tensor) -> int:
    """The address of the tensor's storage; 0 where it has none to read."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


class WitnessCore:
    """What the watchers of one graphed child run share.

    Args:
        model: the model (its modules are the ones watched).
        names: id(module) -> qualified name.
    """

    def __init__(self, model: torch.nn.Module, names: dict[int, str]) -> None:
        self.names = names
        self.device_type = next((p.device.type for p in model.parameters()), "cuda")
        self.modules = {id(m): m for m in model.modules()}
        self.step = -1
        self.phase = "setup"
        self.depth = 0
        """Captures under way (capture_begin without its capture_end yet)."""
        self.captures = 0
        """Captures begun so far."""
        self.grad_at_capture: dict[int, bool] = {}
        """id(graph) -> grad enabled when it was captured."""
        self.found: dict[tuple[str, str, str], Hazard] = {}
        self.inside = False
        """True while an evidence handler runs: the witness's own calls are not evidence."""
        self._undo: list[Callable[[], None]] = []

    # -- patches -------------------------------------------------------------------------------------
    def patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        """Replace `owner.attr` by `make(original)`, undone by close()."""
        original = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
        setattr(owner, attr, make(original))
        self._undo.append(lambda: setattr(owner, attr, original))

    def close(self) -> None:
        """Undo every patch, the last first (idempotent)."""
        while self._undo:
            self._undo.pop()()

    def watch_captures(self) -> None:
        """Follow the capture state: captures under way and begun, and each graph's grad mode at capture."""
        core = self
        klass = graph_method_owner("capture_begin", "capture_end", "replay")

        def make_begin(original: Any) -> Any:
            def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(graph, *args, **kwargs)
                core.depth += 1
                core.captures += 1
                core.grad_at_capture[id(graph)] = torch.is_grad_enabled()
                return result
            return capture_begin

        def make_end(original: Any) -> Any:
            def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
                core.depth = max(0, core.depth - 1)
                return original(graph, *args, **kwargs)
            return capture_end

        self.patch(klass, "capture_begin", make_begin)
        self.patch(klass, "capture_end", make_end)

    # -- evidence ------------------------------------------------------------------------------------
    @property
    def when(self) -> str:
        """When the evidence happens, in words."""
        return "during a capture" if self.depth else "after the first capture"

    @property
    def capture_phase(self) -> str:
        """The phase evidence belongs to: `capture` while a capture is under way, else the step's."""
        return "capture" if self.depth else self.phase

    def module(self, skip: int = 1) -> str | None:
        """The innermost named module on the stack (a frame whose `self` is one of the model's modules)."""
        frame: Any = sys._getframe(skip + 1)
        while frame is not None:
            owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
            if owner is not None and id(owner) in self.names and isinstance(owner, torch.nn.Module):
                return self.names[id(owner)]
            frame = frame.f_back
        return None

    def guarded(self, fn: Callable[[], None]) -> None:
        """Run one evidence handler with the witness's own patches bypassed, never raising into training."""
        self.inside = True
        try:
            fn()
        except Exception:  # noqa: BLE001, S110 - evidence is best effort; training must go on
            pass
        finally:
            self.inside = False

    def add(self, hazard: Hazard) -> None:
        """Keep a hazard: the first one per (rule, module, where), at most MAX_HAZARDS."""
        key = (hazard.rule, hazard.module, hazard.location or hazard.subject or "")
        if key not in self.found and len(self.found) < MAX_HAZARDS:
            self.found[key] = hazard


class Watcher:
    """One job of the witness: the patches it installs and the hazards it settles at the end of the run.

    Args:
        core: the state the watchers share.
    """

    def __init__(self, core: WitnessCore) -> None:
        self.core = core

    def install(self) -> None:
        """Install this watcher's patches (through core.patch, so core.close undoes them)."""

    def settle(self) -> None:
        """Add the hazards judged at the end of the run, once the patches are undone."""


__all__ = ["MAX_HAZARDS", "MAX_VALUES", "Watcher", "WitnessCore", "is_number", "storage_address"]
