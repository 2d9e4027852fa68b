"""The returns a forward_step's loss function may give, exactly as Megatron-Core 0.19.2's schedules
accept them (`forward_step_calc_loss`), and each step's loss and reported values, reduced on the device
as Megatron-LM's trainer reduces them, for the step's one host copy.

Megatron-Core stores what the loss function reports and otherwise ignores it; it scales the loss in
place: `(loss, num_tokens, dict)` divides it by `num_tokens` and the micro-batch count unless
`calculate_per_token_loss`, `(loss, dict)` multiplies it by the context-parallel size and divides it
by the micro-batch count. The loss a step records is the sum of those scaled losses over micro-batches
(divided by the step's tokens with `calculate_per_token_loss`): the value the step trains on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphdoctor.errors import UsageError

ACCEPTED_FORMS = (
    "accepted: (loss, dict) or (loss, num_tokens, dict) as Megatron-Core's schedules take them, loss a "
    "one-element tensor, num_tokens a tensor, dict values tensors of 1 element (averaged over "
    "micro-batches) or 2 ([sum, count]: summed, then sum / count)"
)
"""The forms graphdoctor reads, named in every error about a return it cannot read."""

FORWARD_STEP_FORM = "forward_step(data_iterator, model) must return (output_tensor, loss_func)"


@dataclass(frozen=True, slots=True)
class MicrobatchReport:
    """One micro-batch's loss-function return, as the schedule stores it (its forward_data_store)."""

    values: Mapping[str, torch.Tensor]
    """The reported dict, as the loss function returned it."""

    loss: torch.Tensor
    """A detached view of the returned loss: the schedule's in-place scaling shows through it."""

    num_tokens: torch.Tensor | None
    """num_tokens of a 3-tuple return, None for a 2-tuple."""


def _refuse(where: str, problem: str) -> UsageError:
    return UsageError(f"{where}: {problem}; {ACCEPTED_FORMS}")


def read_loss_return(outputs: Any, where: str) -> tuple[Any, ...]:
    """Check one loss-function return (host-side only: types, lengths, element counts) and give the
    schedule the same tuple with the dict replaced by its MicrobatchReport.

    Args:
        outputs: what the loss function returned.
        where: the forward_step it came from, for the message.

    Returns:
        `(loss, report)` or `(loss, num_tokens, report)`, `loss` and `num_tokens` the very objects returned.

    Raises:
        UsageError: a return Megatron-Core's schedules or Megatron-LM's reduction cannot read; the
            one-line message names the accepted forms.
    """
    if not isinstance(outputs, tuple | list) or len(outputs) not in (2, 3):
        got = f"a {type(outputs).__name__} of {len(outputs)} items" if isinstance(outputs, tuple | list) \
            else type(outputs).__name__
        raise _refuse(where, f"its loss function returned {got}")
    loss, reported = outputs[0], outputs[-1]
    if not isinstance(loss, torch.Tensor):
        raise _refuse(where, f"its loss is {type(loss).__name__}, not a tensor")
    if loss.numel() != 1:
        raise _refuse(where, f"its loss has shape {tuple(loss.shape)}, not one element")
    num_tokens = outputs[1] if len(outputs) == 3 else None
    if len(outputs) == 3 and not isinstance(num_tokens, torch.Tensor):
        raise _refuse(where, f"its num_tokens is {type(num_tokens).__name__}, not a tensor")
    if not isinstance(reported, Mapping):
        raise _refuse(where, f"its last item is {type(reported).__name__}, not a dict")
    for key, value in reported.items():
        if not isinstance(key, str):
            raise _refuse(where, f"its dict has the key {key!r}, not a string")
        if not isinstance(value, torch.Tensor):
            raise _refuse(where, f"its dict reports {key!r} as {type(value).__name__}, not a tensor")
        if value.numel() not in (1, 2):
            raise _refuse(where, f"its dict reports {key!r} with shape {tuple(value.shape)}")
    report = MicrobatchReport(values=reported, loss=loss.detach(), num_tokens=num_tokens)
    return (loss, report) if num_tokens is None else (loss, num_tokens, report)


def checked_forward_step(forward_step: Callable[..., Any], where: str) -> Callable[..., Any]:
    """`forward_step` whose loss function's returns are checked and carried as MicrobatchReports.

    The check adds no device work, so it is the same inside a captured full iteration as outside.
    """

    def forward_step_checked(data_iterator: Any, model: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        result = forward_step(data_iterator, model, *args, **kwargs)
        if not isinstance(result, tuple | list) or len(result) != 2 or not callable(result[1]):
            raise UsageError(f"{where}: returned {type(result).__name__}; {FORWARD_STEP_FORM}")
        output, loss_func = result

        def loss_func_checked(output_tensor: Any, *more: Any, **named: Any) -> tuple[Any, ...]:
            return read_loss_return(loss_func(output_tensor, *more, **named), where)

        loss_func_checked.__wrapped__ = loss_func  # type: ignore[attr-defined]
        return output, loss_func_checked

    forward_step_checked.__wrapped__ = forward_step  # type: ignore[attr-defined]  # the user's, for the holder watch
    return forward_step_checked


@dataclass(frozen=True, slots=True)
class StepValues:
    """A step's loss and reported values, still on the device."""

    keys: tuple[str, ...]
    """The reported keys, in the first micro-batch's order."""

    values: torch.Tensor
    """float32 [1 + len(keys)]: the loss, then each reported value."""

    def host(self) -> tuple[float, tuple[tuple[str, float], ...]]:
        """(loss, ((key, value), ...)) with one device-to-host copy."""
        numbers = self.values.tolist()
        return float(numbers[0]), tuple(zip(self.keys, (float(v) for v in numbers[1:]), strict=True))


def _reduce_key(key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Megatron-LM's train_step: [sum, count] summed then sum / count; one element averaged."""
    flat = [t.detach().reshape(-1).float() for t in tensors]
    if flat[0].numel() == 2:
        total = torch.stack(flat).sum(dim=0)
        return total[0] / total[1]
    return torch.cat(flat).mean()


def reduce_step(microbatches: Sequence[Any], *, per_token_loss: bool, where: str) -> StepValues:
    """The step's loss and reported values from the schedule's forward_data_store.

    Args:
        microbatches: what forward_backward returned: one MicrobatchReport per micro-batch.
        per_token_loss: TransformerConfig.calculate_per_token_loss.
        where: the forward_step, for messages.

    Raises:
        UsageError: micro-batches report different keys or element counts under one key.
    """
    reports = [m for m in microbatches if isinstance(m, MicrobatchReport)]
    if len(reports) != len(microbatches):
        raise _refuse(where, "the schedule returned something its loss function did not report")
    if not reports:
        return StepValues(keys=(), values=torch.full((1,), float("nan")))
    keys = tuple(reports[0].values)
    for report in reports[1:]:
        if tuple(report.values) != keys:
            raise _refuse(where, f"micro-batches report different keys ({list(keys)} and {list(report.values)})")
    loss = torch.stack([r.loss.reshape(()).float() for r in reports]).sum()
    counts = [r.num_tokens for r in reports]
    if per_token_loss and all(c is not None for c in counts):
        loss = loss / torch.stack([c.reshape(()) for c in counts if c is not None]).sum().clamp_min(1)
    parts = [loss]
    for key in keys:
        tensors = [r.values[key] for r in reports]
        if len({t.numel() for t in tensors}) != 1:
            raise _refuse(where, f"micro-batches report {key!r} with different element counts")
        parts.append(_reduce_key(key, tensors).to(loss.device))
    return StepValues(keys=keys, values=torch.stack(parts))


__all__ = ["ACCEPTED_FORMS", "MicrobatchReport", "StepValues", "checked_forward_step", "read_loss_return",
           "reduce_step"]
