"""The FP8 state of a model's Transformer Engine modules, fingerprinted every step as the gradients are, and
watched for state tensors that a graph captured and that later stop being the module's.

What is FP8 state (Transformer Engine 2.x, transformer_engine/pytorch/module/base.py and quantization.py):

- delayed scaling: every module's `fp8_meta["scaling_fwd"]` and `["scaling_bwd"]` hold a `scale` vector and an
  `amax_history` matrix that TE updates after each forward and backward; the quantizers the GEMMs use hold views of
  them;
- FP8 primary weights (`fp8_param`): each weight is a quantized tensor whose raw FP8 bytes (`_data`, or the row- and
  column-wise data of block scaling) are the parameter the step fingerprints cover, and whose scale inverses are
  FP8 state here;
- current (tensorwise) and block scaling keep no scale between steps: without FP8 primary weights there is no state.

A graph reads and writes the state tensors it captured. A tensor that is replaced later (a scale reset by
assignment, a quantizer rebuilt, an amax history resized) keeps being updated in eager but not in the graph: the
graphed run's rule GD521 names the module, the tensor and the step (fp8-state-rebound). Imported only inside
children.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from graphdoctor.child.names import strip_wrappers
from graphdoctor.protocol.events import Event, Fp8Layout, Hazard

FP8_META_KEYS: tuple[tuple[str, str], ...] = (("scaling_fwd", "fwd"), ("scaling_bwd", "bwd"))
"""fp8_meta keys of a TE module's forward and backward recipe state, and their short names."""

RECIPE_STATE: tuple[str, ...] = ("scale", "amax_history")
"""Tensor attributes of delayed scaling's recipe state (DelayedScalingRecipeState)."""

QUANTIZER_STATE: tuple[str, ...] = ("scale", "amax")
"""Tensor attributes of a quantizer (Float8Quantizer: views of the recipe state)."""

QUANTIZED_DATA: tuple[str, ...] = ("_data", "_rowwise_data", "_columnwise_data")
"""Raw FP8 bytes of a quantized weight (Float8Tensor; block-scaled tensors' row- and column-wise data)."""

QUANTIZED_SCALES: tuple[str, ...] = ("_scale_inv", "_rowwise_scale_inv", "_columnwise_scale_inv")
"""Scale inverses of a quantized weight."""

STATE_RULE = "GD521"
"""The catalogue rule of FP8 state replaced after capture (checks/gd5xx_causes.py)."""


def is_quantized(tensor: object) -> bool:
    """True for a Transformer Engine quantized tensor (Float8Tensor, MXFP8Tensor, ...) without importing TE."""
    return any(cls.__name__ == "QuantizedTensor" for cls in type(tensor).__mro__)


def raw_data(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes a quantized weight stores (its first raw data tensor), else the tensor itself."""
    if is_quantized(tensor):
        for attr in QUANTIZED_DATA:
            data = getattr(tensor, attr, None)
            if isinstance(data, torch.Tensor):
                return data
    return tensor


@dataclass(frozen=True, slots=True)
class StateTensor:
    """One FP8 state tensor of one module."""

    module: str
    """Qualified module name (wrappers stripped)."""
    what: str
    """`fwd.scale`, `bwd.amax_history`, `fwd.q3.scale` (a quantizer's), `weight._scale_inv`, `weight._data`."""
    tensor: torch.Tensor
    printed: bool
    """Fingerprinted every step (False: only watched for replacement: quantizer views, FP8 weight bytes, which
    the parameters' fingerprints already cover)."""

    @property
    def name(self) -> str:
        """`module:what`."""
        return f"{self.module}:{self.what}"


def state_tensors(model: torch.nn.Module) -> list[StateTensor]:
    """Every FP8 state tensor of the model, in module order (empty when no module holds any)."""
    out: list[StateTensor] = []
    for qualified, module in model.named_modules():
        meta = getattr(module, "fp8_meta", None)
        name = strip_wrappers(qualified)
        if isinstance(meta, dict):
            quantizers = getattr(module, "quantizers", None)
            for key, short in FP8_META_KEYS:
                state = meta.get(key)
                for attr in RECIPE_STATE:
                    value = getattr(state, attr, None)
                    if isinstance(value, torch.Tensor):
                        out.append(StateTensor(name, f"{short}.{attr}", value, printed=True))
                for index, quantizer in enumerate(quantizers.get(key, ()) if isinstance(quantizers, dict) else ()):
                    for attr in QUANTIZER_STATE:
                        value = getattr(quantizer, attr, None)
                        if isinstance(value, torch.Tensor):
                            out.append(StateTensor(name, f"{short}.q{index}.{attr}", value, printed=False))
        for pname, param in module.named_parameters(recurse=False):
            if not is_quantized(param):
                continue
            for attr in QUANTIZED_SCALES:
                value = getattr(param, attr, None)
                if isinstance(value, torch.Tensor):
                    out.append(StateTensor(name, f"{pname}.{attr}", value, printed=True))
            for attr in QUANTIZED_DATA:
                value = getattr(param, attr, None)
                if isinstance(value, torch.Tensor):
                    out.append(StateTensor(name, f"{pname}.{attr}", value, printed=False))
    return out


class Fp8Watch:
    """Per step: the lanes of every printed FP8 state tensor (and its layout's index), and, in a graphed run,
    which state tensors are no longer the ones the capture saw.

    Args:
        model: the model.
        emit: where the layout events and GD521 hazards go.
        graphed: watch for replaced state (graphed runs only: eager has no captured tensors).
    """

    def __init__(self, model: torch.nn.Module, emit: Callable[[Event], None], *, graphed: bool) -> None:
        self.model = model
        self.emit = emit
        self.graphed = graphed
        self.layout: tuple[tuple[str, int, torch.dtype], ...] | None = None
        self.index = -1
        self._printer: object = None
        self._captured: dict[str, tuple[int, int]] | None = None
        """name -> (data_ptr, numel) at the end of the capture step."""
        self._capture_step = -1
        self._reported: set[str] = set()

    def prints(self, step: int, phase: str) -> tuple[tuple[int, ...], int] | None:
        """The step's FP8 lanes and layout index (after the optimizer step); None when the model has no FP8
        state. A new layout (state appeared, a tensor resized or replaced by one of another size) is emitted
        before its first lanes."""
        from graphdoctor.compare.bitprint import BitFingerprinter, host_lanes

        tensors = state_tensors(self.model)
        if self.graphed:
            self._watch(tensors, step, phase)
        printed = [t for t in tensors if t.printed]
        if not printed:
            return None
        layout = tuple((t.name, t.tensor.numel(), t.tensor.dtype) for t in printed)
        if layout != self.layout:
            self.layout = layout
            self.index += 1
            self._printer = BitFingerprinter(list(layout), printed[0].tensor.device)
            self.emit(Fp8Layout(index=self.index, step=step, names=tuple(t.name for t in printed)))
        assert isinstance(self._printer, BitFingerprinter)
        lanes = host_lanes(self._printer.fingerprint([t.tensor.detach() for t in printed]))
        return tuple(v for pair in lanes for v in pair), self.index

    def _watch(self, tensors: list[StateTensor], step: int, phase: str) -> None:
        """Record the state tensors at the end of the capture step; later, one GD521 hazard per module whose
        tensor of the same name is another tensor."""
        if phase == "capture":
            self._captured = {t.name: (t.tensor.data_ptr(), t.tensor.numel()) for t in tensors}
            self._capture_step = step
            return
        if self._captured is None:
            return
        for state in tensors:
            before = self._captured.get(state.name)
            if before is None or before[0] == state.tensor.data_ptr() or state.module in self._reported:
                continue
            self._reported.add(state.module)
            resized = "" if before[1] == state.tensor.numel() else f" ({before[1]} -> {state.tensor.numel()} elements)"
            self.emit(Hazard(
                rule=STATE_RULE, module=state.module, subject=state.what, step=step, phase=phase,
                message=(f"FP8 state {state.what} of {state.module} is a new tensor at step {step}{resized}: the "
                         f"graph captured at step {self._capture_step} still reads and updates the old one, so the "
                         "graphed run quantizes with other scales than eager")))


__all__ = ["STATE_RULE", "Fp8Watch", "StateTensor", "is_quantized", "raw_data", "state_tensors"]
