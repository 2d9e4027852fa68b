"""Capture-time taps on the CPU: table rows, per-step history, output and gradient taps, call sites.

Capture itself needs a GPU (tests/gpu/test_forensics_gpu.py); here the same code runs eagerly.
"""

from __future__ import annotations

import json

import torch

from graphdoctor.child.taps import TapBuffer, Taps, call_site, tapped_modules
from graphdoctor.compare.fingerprint import fingerprint


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
    table = TapBuffer(torch.device("cpu"), num_steps=2, capacity=2)
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
    assert section["num_bytes"] == (2 * 3 + 2 * 2 * 3 + 1024 + 2 * 1024 + 1) * 4


def test_call_site_names_module_and_first_frame_outside_torch() -> None:
    class Probe(torch.nn.Module):
        def forward(self) -> tuple[str | None, str | None]:
            return call_site({id(self): "probe"}, skip=1)

    module, location = Probe()()
    assert module == "probe"
    assert location is not None and location.startswith("tests/unit/test_taps.py:")


class Attention(torch.nn.Module):
    """Megatron numbers attention modules inside a layer too."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_number = 1
        self.proj = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(x))


class AttnBlock(Block):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.attn(x))


class AttnNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([AttnBlock()])


def test_numbered_modules_inside_a_layer_are_not_descended_into() -> None:
    model = AttnNet()
    chosen = [n for n, _ in tapped_modules(model, _names(model))]
    assert "layers.0.attn" in chosen
    assert "layers.0.attn.proj" not in chosen


def test_operators_are_intercepted_inside_the_forward_only() -> None:
    # (On the CPU a draw is a host draw, tapped only when copied to the device; what is checked
    # here is where the dispatch mode is on.)
    model = AttnNet()
    seen: list[tuple[str, int]] = []
    model.layers[0].attn.register_forward_hook(
        lambda *_: seen.append(("forward", torch._C._len_torch_dispatch_stack())))
    taps = Taps(model, _names(model), num_steps=2)
    for step in range(2):
        taps.begin_step(step, "eager")
        seen.append(("step", torch._C._len_torch_dispatch_stack()))
        model(torch.randn(3, 4)).sum().backward()
        seen.append(("after forward", torch._C._len_torch_dispatch_stack()))
        taps.end_step(step)
    model(torch.randn(3, 4))  # outside a step
    taps.close()
    assert seen == [("step", 0), ("forward", 1), ("after forward", 0)] * 2 + [("forward", 0)]


def test_captured_rows_count_only_in_steps_whose_replay_stamped_their_graph(monkeypatch) -> None:
    # Capture needs a GPU; this drives the bookkeeping on the CPU by declaring the stream
    # capturing, and plays each replay's first node (the stamp copy) by hand.
    table = TapBuffer(torch.device("cpu"), num_steps=4, capacity=4, max_graphs=2)
    table.begin_step(0, "warmup")
    table.write("output", "eager", "forward", torch.ones(2))
    table.end_step(0)
    table.begin_step(1, "capture")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    table.new_capture()
    table.write("output", "graphed", "forward", torch.ones(2))
    monkeypatch.undo()
    table.stamps.fill_(-1.0)  # at capture the stamp node does not run
    table.end_step(1)
    table.begin_step(2, "replay")
    table.stamps[0].copy_(table.step_value)  # replay: the graph's first node
    table.write("output", "eager", "forward", torch.full((2,), 3.0))
    table.end_step(2)
    table.begin_step(3, "replay")  # the graph is not replayed this step
    table.end_step(3)
    section = table.to_dict()
    sites = {s["slot"]: (s["module"], s["captured"]) for s in section["sites"]}
    assert sites == {0: ("eager", False), 1: ("graphed", True)}
    written = {e["step"]: sorted(r[0] for r in e["rows"]) for e in section["steps"]}
    assert written == {0: [0], 1: [], 2: [0, 1], 3: []}
    assert section["num_graph_nodes"] is None  # a capture whose graph this machine cannot read


def test_eager_taps_add_no_graph_nodes() -> None:
    table = TapBuffer(torch.device("cpu"), num_steps=1, capacity=4)
    table.begin_step(0, "warmup")
    table.write("output", "eager", "forward", torch.ones(2))
    table.write("dropout", "eager", "aten.native_dropout", torch.ones(300, dtype=torch.bool))
    table.end_step(0)
    assert table.to_dict()["num_graph_nodes"] == 0
