"""A toy training run for the holder watch's CPU tests (tests/unit/test_holders.py): a module, an optimizer with a
loss scaler and a parameter group, a config callback, a forward_step made by a factory, globals and a class
attribute, each read by "captured" code and each rebound by a schedule; the lines marked `# [holder]` are the
assignments the watch names."""

from __future__ import annotations

from typing import Any

import torch

WEIGHT = torch.ones(3)
ALPHA = 0.5


class Scaler:
    """Megatron's DynamicGradScaler in small: update() binds a new scale tensor."""

    def __init__(self) -> None:
        self._scale = torch.tensor([4.0])

    def update(self) -> None:
        self._scale = self._scale * 2  # [scaler]


class Optimizer:
    """An optimizer holding the scaler and one parameter group."""

    def __init__(self) -> None:
        self.grad_scaler = Scaler()
        self.param_groups = [{"aux": torch.ones(3)}]

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.grad_scaler._scale * loss

    def step(self) -> None:
        """Megatron's order: the scaler updates inside the optimizer step, the schedule right after it."""
        self.grad_scaler.update()
        for hook in self.post_hooks:
            hook(self)

    post_hooks: list[Any] = []


class Linear(torch.nn.Module):
    """Reads a parameter, a tensor attribute, a global tensor, a global number and a class attribute number."""

    beta = 2.0

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))
        self.gain = torch.ones(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * self.gain * WEIGHT * ALPHA * self.beta  # [read]


def make_forward_step() -> tuple[Any, Any]:
    """A forward_step over a closure's loss weight, and the schedule that rebinds it."""
    loss_weight = torch.ones(3)

    def forward_step(x: torch.Tensor, model: torch.nn.Module) -> tuple[torch.Tensor, None]:
        return model(x) * loss_weight, None

    def rebind() -> None:
        nonlocal loss_weight
        loss_weight = torch.full((3,), 2.0)  # [closure]

    return forward_step, rebind


def schedule(optimizer: Optimizer) -> None:
    """Every holder rebound, as a training loop's schedule might after an optimizer step."""
    global WEIGHT, ALPHA
    WEIGHT = torch.full((3,), 3.0)  # [global]
    ALPHA = 0.25  # [number]
    Linear.beta = 3.0
    optimizer.param_groups[0]["aux"] = torch.zeros(3)  # [item]


def schedule_in_place(optimizer: Optimizer) -> None:
    """The same schedule done in place: nothing a graph read is rebound."""
    WEIGHT.fill_(3.0)
    optimizer.param_groups[0]["aux"].zero_()
    optimizer.grad_scaler._scale.mul_(2)
