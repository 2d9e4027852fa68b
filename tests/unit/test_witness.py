"""The graphed child's witness on the CPU with real modules and tensors: attribute rebinding and number
changes after a capture, the user's forward lines that read them, mode-dependent lines, and a hook whose
kept references alias a static buffer (an autograd Function returning one preallocated gradient, as a
graph's backward does). Captures are marked by the witness's own counters (no CUDA graph on a CPU)."""

from __future__ import annotations

from typing import Any

import torch

from graphdoctor.child.witness import CaptureWitness, forward_read_line, mode_query_lines
from graphdoctor.protocol.events import Hazard


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.temperature = 1.0
        self.gain = torch.ones(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) * self.gain
        if self.training:
            y = y * 2
        return y / self.temperature  # the temperature read


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def _line_of(text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(Scaled.forward)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _witness(model: torch.nn.Module) -> CaptureWitness:
    names = {id(m): n for n, m in model.named_modules()}
    witness = CaptureWitness(model, names)
    witness.begin_step(0, "capture")
    witness.captures = 1  # what the patched capture_begin counts on a GPU
    return witness


def _by_rule(events: list[Any], rule: str) -> list[Hazard]:
    return [e for e in events if isinstance(e, Hazard) and e.rule == rule]


def test_forward_lines_come_from_the_users_source() -> None:
    assert forward_read_line(Scaled, "temperature") == f"tests/unit/test_witness.py:{_line_of('temperature read')}"
    assert forward_read_line(Scaled, "not_read") is None
    assert mode_query_lines(Scaled) == [f"tests/unit/test_witness.py:{_line_of('if self.training')}"]
    assert forward_read_line(torch.nn.Linear, "weight") is None  # torch's own forward is not the user's


def test_rebound_tensor_and_changed_number_after_capture_are_evidence() -> None:
    model = Model()
    witness = _witness(model)
    try:
        witness.begin_step(1, "replay")
        model.block.gain = torch.full((), 2.0)  # rebinding line
        rebind_line = _this_line() - 1
        model.block.temperature = 1.5
        model.block.temperature = 2.0
        model.block.fc.in_features = 4  # the same value: not a change
    finally:
        events = witness.finish()
    (rebound,) = _by_rule(events, "GD509")
    assert (rebound.module, rebound.subject, rebound.step) == ("block", "gain", 1)
    assert rebound.location == f"tests/unit/test_witness.py:{rebind_line}"
    (number,) = _by_rule(events, "GD518")
    assert number.subject == "temperature" and number.module == "block"
    assert number.location == f"tests/unit/test_witness.py:{_line_of('temperature read')}"
    assert "1.0, 1.5, 2.0" in number.message
    assert torch.nn.Module.__setattr__.__qualname__ == "Module.__setattr__"  # the patch is undone


def test_nothing_before_the_first_capture() -> None:
    model = Model()
    witness = CaptureWitness(model, {id(m): n for n, m in model.named_modules()})
    model.block.gain = torch.full((), 2.0)
    model.block.temperature = 3.0
    assert witness.finish() == []


class _StaticGrad(torch.autograd.Function):
    """Identity forward; backward writes the incoming gradient into one preallocated buffer and returns it,
    as a replayed graph returns its static gradient buffer."""

    buffer = torch.zeros(4)

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _StaticGrad.buffer.copy_(grad)
        return _StaticGrad.buffer


def _run_hooked(keep_copies: bool) -> list[Any]:
    model = Model()
    witness = _witness(model)
    kept: list[torch.Tensor] = []

    def keep(grad: torch.Tensor) -> None:
        kept.append(grad.clone() if keep_copies else grad)

    try:
        for micro in range(3):
            leaf = torch.ones(4, requires_grad=True)
            mid = leaf * 1.0
            mid.register_hook(keep)
            (_StaticGrad.apply(mid) * float(micro + 1)).sum().backward()
    finally:
        events = witness.finish()
    return events


def test_a_hook_keeping_references_to_a_static_buffer_is_graph_buffer_kept() -> None:
    events = _run_hooked(keep_copies=False)
    (kept,) = _by_rule(events, "GD520")
    assert kept.location is not None and kept.location.startswith("tests/unit/test_witness.py:")
    assert "call 2" in kept.message and "kept at call 1" in kept.message
    assert kept.also_at and kept.also_at[0].startswith("tests/unit/test_witness.py:")


def test_a_hook_keeping_copies_is_only_a_hook_site() -> None:
    events = _run_hooked(keep_copies=True)
    assert not _by_rule(events, "GD520")
    (site,) = _by_rule(events, "hook")
    assert "called 3 times" in site.message


def _this_line() -> int:
    import sys

    return sys._getframe(1).f_lineno
