"""Capture-time taps on the CPU: table rows, per-step history, output and gradient taps, call sites.

Capture itself needs a GPU (tests/gpu/test_forensics_gpu.py); here the same code runs eagerly.
"""

from __future__ import annotations

import json

import torch

from graphdoctor.compare.fingerprint import fingerprint
from graphdoctor.harness.taps import Taps, TapTable, call_site, tapped_modules


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer_number = 1
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _names(model: torch.nn.Module) -> dict[int, str]:
    return {id(m): n for n, m in model.named_modules()}


def test_tapped_modules_pick_layers_children_and_top_level_blocks() -> None:
    model = Net()
    chosen = [n for n, _ in tapped_modules(model, _names(model))]
    assert chosen == ["embed", "head", "layers.0", "layers.1", "layers.0.fc1", "layers.0.fc2",
                      "layers.1.fc1", "layers.1.fc2"]


def test_outputs_and_gradients_are_fingerprinted_per_step() -> None:
    torch.manual_seed(0)
    model = Net()
    taps = Taps(model, _names(model), num_steps=3)
    outputs = {}
    for step in range(3):
        taps.begin_step(step, "eager")
        x = torch.randn(5, 4)
        out = model(x)
        outputs[step] = model.embed(x).detach()
        out.sum().backward()
        taps.end_step(step)
    section = taps.close()
    json.dumps(section, allow_nan=False)
    sites = {s["slot"]: s for s in section["sites"]}
    kinds = sorted({(s["kind"], s["module"]) for s in sites.values()})
    assert ("output", "layers.0.fc1") in kinds and ("grad", "head") in kinds
    assert [s["step"] for s in section["steps"]] == [0, 1, 2]
    embed_slot = next(s for s, v in sites.items() if v == {**v, "kind": "output", "module": "embed"})
    for entry in section["steps"]:
        row = next(r for r in entry["rows"] if r[0] == embed_slot)
        expected = fingerprint(outputs[entry["step"]], "output").tolist()
        assert row[2:] == expected
    # forward outputs come before gradients, gradients in reverse layer order
    order = [sites[r[0]]["module"] + ":" + sites[r[0]]["kind"] for r in section["steps"][0]["rows"]]
    assert order.index("embed:output") < order.index("head:output") < order.index("head:grad")
    assert order.index("layers.1:grad") < order.index("layers.0:grad")


def test_hooks_and_capture_patch_are_removed_on_close() -> None:
    model = Net()
    original = torch.cuda.graphs.CUDAGraph.__dict__["capture_begin"]
    taps = Taps(model, _names(model), num_steps=1)
    assert torch.cuda.graphs.CUDAGraph.__dict__["capture_begin"] is not original
    taps.close()
    assert torch.cuda.graphs.CUDAGraph.__dict__["capture_begin"] is original
    assert all(not m._forward_hooks for m in model.modules())


def test_table_rows_only_for_the_step_that_wrote_them_and_capacity_truncates() -> None:
    table = TapTable(torch.device("cpu"), num_steps=2, capacity=2)
    table.begin_step(0, "eager")
    table.write("output", "a", "forward", torch.ones(3))
    table.write("output", "b", "forward", torch.ones(3))
    table.write("output", "c", "forward", torch.ones(3))
    table.end_step(0)
    table.begin_step(1, "replay")
    table.write("output", "a", "forward", torch.full((3,), 2.0))
    table.end_step(1)
    section = table.to_dict()
    assert section["truncated"] is True and section["num_slots"] == 2
    assert [len(s["rows"]) for s in section["steps"]] == [2, 1]
    assert section["steps"][1]["rows"][0][2] == 6.0
    assert section["num_bytes"] == (2 * 4 + 2 * 2 * 4 + 1) * 4


def test_call_site_names_module_and_first_frame_outside_torch() -> None:
    class Probe(torch.nn.Module):
        def forward(self) -> tuple[str | None, str | None]:
            return call_site({id(self): "probe"}, skip=1)

    module, location = Probe()()
    assert module == "probe"
    assert location is not None and location.startswith("tests/unit/test_taps.py:")
