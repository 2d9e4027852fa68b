"""What one child run reports of each training step: its StepRecord (loss, timings, the step's tensor comparisons)
and the bitwise fingerprints of its tensors (StepPrints, encoded by graphdoctor.protocol.lanes).

Nothing here imports torch; every record round-trips through plain JSON (`to_dict` / `from_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphdoctor.protocol.lanes import decode_step, encode_step, pairs
from graphdoctor.types import TensorDiff


@dataclass(frozen=True, slots=True)
class StepPrints:
    """Bitwise fingerprints of one step (graphdoctor.compare.bitprint): two 64-bit lanes per tensor,
    for every main_grad (after the backward) and every parameter (after the optimizer step)."""

    grads: tuple[int, ...]
    """Lanes of each tensor in order: tensor 0 lane 0, tensor 0 lane 1, tensor 1 lane 0, ..."""

    params: tuple[int, ...]
    """Likewise for the parameters."""

    fp8: tuple[int, ...] = ()
    """Likewise for the FP8 state tensors (graphdoctor.child.fp8_state; empty without FP8 state)."""

    fp8_layout: int = -1
    """Index of the run's FP8 layout those lanes follow (RunRecord.fp8_layouts); -1 without FP8 state."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view: one 32-hex-digit string per tensor (protocol.lanes.encode_step; exact in every
        JSON reader); `fp8` and `fp8_layout` only where the step fingerprinted FP8 state."""
        data: dict[str, Any] = {"grads": encode_step(pairs(self.grads)), "params": encode_step(pairs(self.params))}
        if self.fp8_layout >= 0:
            data.update(fp8=encode_step(pairs(self.fp8)), fp8_layout=self.fp8_layout)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepPrints:
        """Inverse of to_dict."""
        return cls(grads=tuple(v for pair in decode_step(data["grads"]) for v in pair),
                   params=tuple(v for pair in decode_step(data["params"]) for v in pair),
                   fp8=tuple(v for pair in decode_step(data.get("fp8") or []) for v in pair),
                   fp8_layout=int(data.get("fp8_layout", -1)))


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one training step of one child run recorded."""

    step: int
    """0-based step index."""

    phase: str
    """eager | record | warmup | capture | replay."""

    loss: float
    """The step's loss: the loss function's loss as the schedule scales it, summed over micro-batches
    (graphdoctor.child.reported); for Megatron-LM's GPT loss with as many tokens in every
    micro-batch, its `lm loss`."""

    step_time_ms: float
    """CUDA-event time of forward_backward + optimizer step."""

    grad_norm: float | None = None
    """Gradient norm reported by the Megatron optimizer."""

    grads: TensorDiff | None = None
    """main_grad comparison against the reference (graphed runs only)."""

    params: TensorDiff | None = None
    """Parameter comparison after the optimizer step (graphed runs only)."""

    profiled: bool = False
    """Step ran under torch.profiler (excluded from steady-state timing)."""

    quiet: bool = True
    """No other graphdoctor child used the GPU while this step ran (its time is comparable)."""

    prints: StepPrints | None = None
    """Bitwise fingerprints of the step's main_grads and parameters (not in the report JSON)."""

    reported: tuple[tuple[str, float], ...] = ()
    """Every value the loss function reported, (key, value) in its dict's order, reduced over
    micro-batches as Megatron-LM's trainer does ([sum, count]: sum / count; one element: the mean);
    then every value Megatron's trackers logged that step, as `tracker/<name>` (summed over layers)."""

    resumed: bool = False
    """Run by the process that resumed from the run's checkpoint (--resume): `phase` counts from that
    process's first step (it warms up and captures again, as Megatron does after a restart)."""

    skipped: bool = False
    """The optimizer skipped its update: fp16's loss scaler found non-finite gradients (Megatron's
    `optimizer.step()` returned update_successful False); the parameters are those of the step before."""

    loss_scale: float | None = None
    """The fp16 loss scale after the step (the scaler's current value); None without a loss scaler."""

    def to_dict(self) -> dict[str, Any]:
        """JSON view."""
        return {
            "skipped": self.skipped,
            "loss_scale": self.loss_scale,
            "profiled": self.profiled,
            "step": self.step,
            "phase": self.phase,
            "loss": self.loss,
            "step_time_ms": self.step_time_ms,
            "grad_norm": self.grad_norm,
            "grads": self.grads.to_dict() if self.grads else None,
            "params": self.params.to_dict() if self.params else None,
            "quiet": self.quiet,
            "reported": dict(self.reported),
            "resumed": self.resumed,
        }

    def to_event(self) -> dict[str, Any]:
        """The step event's fields: the JSON view plus the fingerprints."""
        data = self.to_dict()
        data["prints"] = self.prints.to_dict() if self.prints else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """Inverse of to_dict (a non-finite number may come back as the string JSON writers give it, 'nan')."""
        data = dict(data)
        for key in ("loss", "step_time_ms", "grad_norm", "loss_scale"):
            if isinstance(data.get(key), str):
                data[key] = float(data[key])
        for key in ("grads", "params"):
            if data.get(key) is not None:
                data[key] = TensorDiff.from_dict(data[key])
        if data.get("prints") is not None:
            data["prints"] = StepPrints.from_dict(data["prints"])
        # Reports before the reported values were recorded have none.
        data["reported"] = tuple((str(k), float(v)) for k, v in (data.get("reported") or {}).items())
        return cls(**data)


__all__ = ["StepPrints", "StepRecord"]
