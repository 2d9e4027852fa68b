"""FP8 state the user's code replaces after a capture: GD521, a scale or amax tensor of a Transformer Engine
quantizer or recipe state rebound (`quantizer.scale = torch.ones(...)`), where Transformer Engine is loaded."""

from __future__ import annotations

import sys
from typing import Any

import torch

from graphdoctor.child.witness.core import Watcher, storage_address
from graphdoctor.child.witness.frames import user_issuer
from graphdoctor.protocol.events import Hazard


class Fp8ScaleWatcher(Watcher):
    """Tensor attributes set on Transformer Engine's quantizers and recipe states once a capture began."""

    def install(self) -> None:
        for owner in _te_state_classes():
            self.core.patch(owner, "__setattr__", self._fp8_setattr)

    def _fp8_setattr(self, original: Any) -> Any:
        core = self.core
        watcher = self

        def setattr_(obj: Any, name: str, value: Any) -> None:
            if core.captures and not core.inside and isinstance(value, torch.Tensor):
                watcher._on_fp8_setattr(obj, name, value)
            original(obj, name, value)
        return setattr_

    def _fp8_owner(self, obj: Any) -> tuple[str, str] | None:
        """(module name, `fwd.q3` / `bwd`) of a quantizer or recipe state held by one of the model's modules."""
        for module_id, module in self.core.modules.items():
            meta = getattr(module, "fp8_meta", None)
            quantizers = getattr(module, "quantizers", None)
            if not isinstance(meta, dict):
                continue
            for key, short in (("scaling_fwd", "fwd"), ("scaling_bwd", "bwd")):
                if meta.get(key) is obj:
                    return self.core.names.get(module_id, type(module).__name__), short
                held = quantizers.get(key, ()) if isinstance(quantizers, dict) else ()
                for index, quantizer in enumerate(held):
                    if quantizer is obj:
                        return self.core.names.get(module_id, type(module).__name__), f"{short}.q{index}"
        return None

    def _on_fp8_setattr(self, obj: Any, name: str, value: torch.Tensor) -> None:
        core = self.core

        def handle() -> None:
            location = user_issuer(2)
            old = obj.__dict__.get(name) if hasattr(obj, "__dict__") else None
            if location is None or not isinstance(old, torch.Tensor) or storage_address(old) == storage_address(value):
                return
            owner = self._fp8_owner(obj)
            if owner is None:
                return
            module, what = owner
            core.add(Hazard(rule="GD521", module=module, subject=f"{what}.{name}", location=location,
                            step=core.step, phase=core.capture_phase, message=(
                                f"FP8 state {what}.{name} of {module} was replaced by a new tensor {core.when} "
                                f"(step {core.step}); the graph keeps quantizing with the tensor it captured, so "
                                "the new scale never reaches a replay")))
        core.guarded(handle)


def _te_state_classes() -> tuple[type, ...]:
    """Transformer Engine's quantizer and recipe-state base classes, where TE is already loaded (never imported
    here: a run without FP8 does not load it)."""
    if "transformer_engine.pytorch" not in sys.modules:
        return ()
    found: list[type] = []
    for module_name, attr in (("transformer_engine.pytorch.quantized_tensor", "Quantizer"),
                              ("transformer_engine.pytorch.quantization", "RecipeState")):
        module = sys.modules.get(module_name)
        cls = getattr(module, attr, None) if module is not None else None
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


__all__ = ["Fp8ScaleWatcher"]
