"""Hazards a child sees in how the model is called: facts no static check has (observers, no hooks).

NoneMaskObserver: Megatron's transformer_engine graphs replace a None attention mask by an all-False
mask at replay (transformer_layer.py:1394-1402 in megatron-core 0.19.2); with the local spec's
DotProductAttention, whose softmax applies the given mask instead of a causal one, graphed attention
turns non-causal (rule GD511).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from graphdoctor.protocol.events import Event, Hazard


class NoneMaskObserver:
    """Watches the first step's TransformerLayer calls for attention_mask=None with local attention.

    Patches `TransformerLayer.forward` at class level for step 0 only (a method patch, not a module
    hook: Transformer Engine refuses modules with hooks at capture, and graph creation comes later).
    """

    def __init__(self, model: Any, names: dict[int, str]) -> None:
        from megatron.core.transformer.dot_product_attention import DotProductAttention
        from megatron.core.transformer.transformer_layer import TransformerLayer

        self._cls = TransformerLayer
        self._original = TransformerLayer.__dict__["forward"]
        self._local: dict[int, str] = {}
        for module in model.modules():
            if not isinstance(module, TransformerLayer):
                continue
            core = getattr(getattr(module, "self_attention", None), "core_attention", None)
            if isinstance(core, DotProductAttention):
                self._local[id(module)] = names.get(id(core), type(core).__name__)
        self.found: list[Hazard] = []
        if self._local:
            self._install()

    def _install(self) -> None:
        original, local, found = self._original, self._local, self.found
        signature = inspect.signature(original)

        @functools.wraps(original)
        def forward(layer: Any, *args: Any, **kwargs: Any) -> Any:
            if id(layer) in local and not found:
                bound = signature.bind_partial(layer, *args, **kwargs)
                if bound.arguments.get("attention_mask") is None:
                    found.append(Hazard(rule="GD511", module=local[id(layer)], message=(
                        "attention_mask=None reaches a TransformerLayer whose core attention is "
                        "Megatron's local DotProductAttention; transformer_engine graphs replay it "
                        "with an all-False mask, so graphed attention is not causal")))
            return original(layer, *args, **kwargs)

        self._cls.forward = forward  # type: ignore[method-assign]

    def _uninstall(self) -> None:
        self._cls.forward = self._original  # type: ignore[method-assign]

    def begin_step(self, step: int, phase: str) -> None:
        """Nothing to do before a step."""

    def end_step(self, step: int, phase: str) -> None:
        """Uninstall after step 0 (the patch costs a bind per layer call)."""
        if step == 0:
            self._uninstall()

    def finish(self) -> list[Event]:
        """One Hazard event per hazard seen."""
        self._uninstall()
        return list(self.found)


__all__ = ["NoneMaskObserver"]
