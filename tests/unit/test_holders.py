"""The holder watch (graphdoctor.child.holders) on the CPU: a "capture" of real torch operations, its external
inputs traced to their holders by path, and each rebinding named with its kind, rule and line; the same schedule
done in place gives nothing."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from graphdoctor.child.holders import HolderWatcher, resolve
from tests.unit import holder_toy

TOY = Path(holder_toy.__file__)


def _line(marker: str) -> str:
    lines = TOY.read_text(encoding="utf-8").splitlines()
    (number,) = [i for i, text in enumerate(lines, 1) if f"# [{marker}]" in text]
    return f"tests/unit/holder_toy.py:{number}"


def _captured(impl: str = "full_iteration") -> tuple[HolderWatcher, holder_toy.Optimizer, object, object]:
    model, optimizer = holder_toy.Linear(), holder_toy.Optimizer()
    forward_step, rebind = holder_toy.make_forward_step()
    config = types.SimpleNamespace(grad_scale_func=optimizer.scale_loss)
    setup = types.SimpleNamespace(model=model, optimizer=optimizer, config=config, forward_step=forward_step)
    watcher = HolderWatcher(setup, {id(model): ""}, impl, device_type="cpu")
    watcher.begin_step(0, "capture")
    watcher.begin_capture()
    output, _ = setup.forward_step(torch.ones(3), model)
    config.grad_scale_func(output.sum()) * optimizer.param_groups[0]["aux"]
    watcher.end_capture()
    return watcher, optimizer, rebind, model


@pytest.fixture(autouse=True)
def _fresh_toy() -> None:
    holder_toy.WEIGHT, holder_toy.ALPHA, holder_toy.Linear.beta = torch.ones(3), 0.5, 2.0


def test_every_external_input_is_named_by_its_holder() -> None:
    watcher, optimizer, *_ = _captured()
    optimizer.step()  # the first step after the capture traces its inputs
    paths = {w.path: w.kind for w in watcher.watches}
    assert paths == {
        "model.weight": "tensor", "model.gain": "tensor", "optimizer.grad_scaler._scale": "tensor",
        "optimizer.param_groups[0]['aux']": "tensor", "forward_step.<closure>.loss_weight": "tensor",
        "tests.unit.holder_toy.WEIGHT": "tensor", "tests.unit.holder_toy.ALPHA": "number",
        "Linear.beta": "number"}, paths
    assert watcher.watched == {"tensor": 6, "number": 2, "generator": 0}  # what the child's seconds report
    for watch in watcher.watches:
        held = resolve(watch.root, watch.links)
        if watch.path != "optimizer.grad_scaler._scale":  # rebound by that step
            assert (held is watch.tensor()) if watch.kind == "tensor" else (held == watch.value), watch.path
    watcher.close()


def test_each_rebinding_is_named_with_its_rule_and_line() -> None:
    watcher, optimizer, rebind, _ = _captured()
    watcher.begin_step(1, "replay")
    holder_toy.Optimizer.post_hooks = [lambda opt: rebind(), holder_toy.schedule]
    try:
        optimizer.step()  # the holders are rebound before the step's end: traced when the step began
    finally:
        holder_toy.Optimizer.post_hooks = []
    watcher.end_step(1, "replay")
    found = {h.subject: h for h in watcher.finish()}
    assert set(found) == {"optimizer.grad_scaler._scale", "forward_step.<closure>.loss_weight",
                          "tests.unit.holder_toy.WEIGHT", "optimizer.param_groups[0]['aux']",
                          "tests.unit.holder_toy.ALPHA", "Linear.beta"}, found
    scale = found["optimizer.grad_scaler._scale"]
    assert (scale.rule, scale.location, scale.step) == ("GD522", _line("scaler"), 1), scale
    assert "freed" in scale.message, scale.message
    assert found["forward_step.<closure>.loss_weight"].location == _line("closure")
    assert found["tests.unit.holder_toy.WEIGHT"].location == _line("global")
    assert found["optimizer.param_groups[0]['aux']"].location == _line("item")
    number = found["tests.unit.holder_toy.ALPHA"]
    assert (number.rule, number.location, number.also_at) == ("GD518", _line("read"), (_line("number"),)), number
    assert found["Linear.beta"].rule == "GD518" and found["Linear.beta"].location == _line("read")


def test_in_place_updates_and_a_local_row_that_never_read_the_loss_give_nothing() -> None:
    watcher, optimizer, _, _ = _captured()
    watcher.begin_step(1, "replay")
    holder_toy.schedule_in_place(optimizer)
    watcher.end_step(1, "replay")
    assert watcher.finish() == []
    assert "step" not in vars(optimizer)  # the optimizer step's wrapper is gone


def test_numbers_are_watched_only_where_captured_code_reads_them() -> None:
    watcher, *_ = _captured("local")  # under local the forward_step is not captured: its closure is not read
    watcher.end_step(0, "capture")
    numbers = {w.path for w in watcher.watches if w.kind == "number"}
    assert numbers == {"tests.unit.holder_toy.ALPHA", "Linear.beta"}, numbers
    watcher.close()


def test_the_patches_are_undone() -> None:
    original = holder_toy.Scaler.__dict__.get("__setattr__")
    watcher, *_ = _captured()
    watcher.end_step(0, "capture")
    assert holder_toy.Scaler.__dict__.get("__setattr__") is not original
    watcher.finish()
    assert holder_toy.Scaler.__dict__.get("__setattr__") is original
