"""CPU tests of graphdoctor.child.probe.recorder on real tensors and planted torch modules."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from graphdoctor.child.probe.modules import (
    changed_attributes,
    scan_hooks,
    tensor_attribute_ptrs,
    track_hook_registrations,
)
from graphdoctor.child.probe.recorder import Recorder, is_user_file, pick_location

THIS_FILE = os.path.relpath(os.path.realpath(__file__), os.path.realpath(os.getcwd()))


def marked_line(code: str) -> str:
    """`path:line` of the line in this file carrying `# [code]` (the planted offence)."""
    lines = inspect.getsource(inspect.getmodule(marked_line)).splitlines()
    numbers = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# [{code}]")]
    assert len(numbers) == 1, f"expected one {code} marker, got {numbers}"
    return f"{THIS_FILE}:{numbers[0]}"


class ItemInner(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 1e9:  # [GD501]
            return x * 2
        return x + 1


class NonzeroInner(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.nonzero(x > 0)  # [GD502]
        return x + rows.shape[0]


class MaskIndexInner(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        picked = x[x > 0.5]  # [GD502-mask]
        return x + picked.numel()


class PrivateGenInner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rand(x.shape, generator=self.gen)  # [GD505]


class ReassignInner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.ones(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * self.scale
        self.scale = self.scale * 0.5  # [GD509]
        return out


class InPlaceInner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        return x + self.steps


class Block(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.norm(x))


def record(inner: torch.nn.Module, x: torch.Tensor, *, device_type: str = "cpu", runs: int = 1):
    model = torch.nn.Sequential(Block(inner)).to(x.device)
    names = {id(m): n for n, m in model.named_modules()}
    with Recorder(device_type=device_type, module_names=names) as recorder:
        for _ in range(runs):
            model(x)
    return recorder.observations


def codes_at(observations, code: str) -> list[tuple[str, str]]:
    return [(o.module, o.location) for o in observations if o.code == code]


def test_item_is_host_sync_with_module_and_user_line():
    observations = record(ItemInner(), torch.randn(3, 4))
    found = [o for o in observations if o.code == "GD501"]
    assert found, observations
    assert {o.module for o in found} == {"0.inner"}
    assert {o.location for o in found} == {marked_line("GD501")}
    assert found[0].operator == "Tensor.item()"
    assert found[0].user_code


def test_nonzero_is_data_dependent_shape():
    observations = record(NonzeroInner(), torch.randn(3, 4))
    assert codes_at(observations, "GD502") == [("0.inner", marked_line("GD502"))]


def test_boolean_mask_indexing_is_data_dependent_shape():
    observations = record(MaskIndexInner(), torch.randn(3, 4))
    assert ("0.inner", marked_line("GD502-mask")) in codes_at(observations, "GD502")


def test_private_generator_is_unregistered():
    observations = record(PrivateGenInner(), torch.randn(3, 4))
    assert codes_at(observations, "GD505") == [("0.inner", marked_line("GD505"))]


def test_registered_generator_is_not_reported():
    inner = PrivateGenInner()
    model = torch.nn.Sequential(Block(inner))
    with Recorder(device_type="cpu", registered_generators=[inner.gen]) as recorder:
        model(torch.randn(3, 4))
    assert not codes_at(recorder.observations, "GD505")


def test_default_generator_dropout_is_clean():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    observations = record(model, torch.randn(3, 4))
    assert not observations


def test_reassigned_tensor_attribute_is_seen_by_setattr_and_by_address():
    inner = ReassignInner()
    model = torch.nn.Sequential(Block(inner))
    names = {id(m): n for n, m in model.named_modules()}
    x = torch.randn(3, 4)
    with Recorder(device_type="cpu", module_names=names) as recorder:
        model(x)
        before = tensor_attribute_ptrs(model, "")
        model(x)
        after = tensor_attribute_ptrs(model, "")
    assert ("0.inner", marked_line("GD509")) in codes_at(recorder.observations, "GD509")
    assert ("0.inner", "scale") in changed_attributes(before, after)


def test_in_place_buffer_update_is_clean():
    inner = InPlaceInner()
    model = torch.nn.Sequential(Block(inner))
    x = torch.randn(3, 4)
    with Recorder(device_type="cpu") as recorder:
        model(x)
        before = tensor_attribute_ptrs(model, "")
        model(x)
        after = tensor_attribute_ptrs(model, "")
    assert not recorder.observations
    assert changed_attributes(before, after) == []


def test_pageable_copy_to_device_and_host_compute():
    # `meta` stands in for the accelerator: CPU tensors are then host tensors.
    class Copier(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            host = torch.arange(4.0) * 2  # [GD507]
            return x + host.to(x.device)  # [GD504]

    observations = record(Copier(), torch.randn(3, 4, device="meta"), device_type="meta")
    assert ("0.inner", marked_line("GD504")) in codes_at(observations, "GD504")
    assert ("0.inner", marked_line("GD507")) in codes_at(observations, "GD507")


def test_host_drawn_mask_reports_the_draw_not_the_copy():
    class HostMask(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gen = torch.Generator().manual_seed(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            keep = torch.rand(x.shape, generator=self.gen) > 0.1  # [GD506]
            keep = keep.to(torch.float32)
            return x * keep.to(x.device)

    observations = record(HostMask(), torch.randn(3, 4, device="meta"), device_type="meta")
    found = [o for o in observations if o.code == "GD506"]
    assert [(o.module, o.location) for o in found] == [("0.inner", marked_line("GD506"))]
    assert "copied in at" in found[0].detail
    # the host-side mask arithmetic belongs to GD506, not to cpu-tensor-in-capture
    assert not codes_at(observations, "GD507")


def test_cuda_synchronize_is_recorded_before_it_runs():
    class Syncer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch.cuda.synchronize()  # [GD501-sync]
            return x

    model = torch.nn.Sequential(Block(Syncer()))
    names = {id(m): n for n, m in model.named_modules()}
    recorder = Recorder(device_type="cpu", module_names=names)
    with recorder:
        if torch.cuda.is_available():
            model(torch.randn(3, 4))
        else:
            with pytest.raises((RuntimeError, AssertionError)):
                model(torch.randn(3, 4))
    assert codes_at(recorder.observations, "GD501") == [("0.inner", marked_line("GD501-sync"))]
    assert recorder.observations[0].operator == "torch.cuda.synchronize()"


def test_recorder_restores_patches():
    sync, setattr_ = torch.cuda.synchronize, torch.nn.Module.__setattr__
    with Recorder(device_type="cpu"):
        assert torch.cuda.synchronize is not sync
    assert torch.cuda.synchronize is sync
    assert torch.nn.Module.__setattr__ is setattr_


def test_hooks_are_found_at_their_registration_line():
    calls: list[int] = []

    def count(module: torch.nn.Module, args: object, output: object) -> None:
        calls.append(1)

    with track_hook_registrations() as registrations:
        model = torch.nn.Sequential(Block(ItemInner()))
        model[0].inner.register_forward_hook(count)  # [GD508]
    found = scan_hooks(model[0], "decoder.layers.0", registrations)
    assert [(o.code, o.module, o.location) for o in found] == [
        ("GD508", "decoder.layers.0.inner", marked_line("GD508"))
    ]


def test_hook_without_registration_points_at_its_definition():
    model = Block(ItemInner())

    def noisy(module: torch.nn.Module, args: object) -> None:
        return None

    model.norm.register_forward_pre_hook(noisy)
    found = scan_hooks(model, "blk")
    assert len(found) == 1 and found[0].module == "blk.norm"
    assert found[0].location == f"{THIS_FILE}:{noisy.__code__.co_firstlineno}"


def test_library_frames_are_not_user_code():
    assert not is_user_file(torch.__file__)
    assert not is_user_file(os.__file__)
    assert is_user_file(__file__)
    where, user = pick_location([(torch.__file__, 10), (__file__, 42)])
    assert (where, user) == (f"{THIS_FILE}:42", True)
    assert pick_location([(torch.__file__, 10)]) == ("<unknown>", False)
