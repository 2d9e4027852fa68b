"""The holder watch's bulk check (graphdoctor.child.holder_check) on real modules and tensors: a group that
still holds exactly the captured tensors proves its paths unchanged, and any rebinding, a removed key or a freed
tensor hands the group's watches to the exact check."""

from __future__ import annotations

import weakref

import torch

from graphdoctor.child.holder_check import TensorChecks, refresh
from graphdoctor.child.holder_search import Parameters, Search, storage_of
from graphdoctor.child.holders import Watch


def _watched(layers: int = 3) -> tuple[list[torch.nn.Linear], list[Watch]]:
    linears = [torch.nn.Linear(4, 4) for _ in range(layers)]
    model = torch.nn.Sequential(*linears)
    for parameter in model.parameters():
        parameter.main_grad = torch.zeros_like(parameter)  # type: ignore[attr-defined]
    targets = {storage_of(t) for p in model.parameters() for t in (p, p.main_grad)}  # type: ignore[attr-defined]
    search = Search(targets, {id(m): n for n, m in model.named_modules()}, "cpu")
    for name, module in model.named_modules():
        search.run(name or "model", Parameters(module), (), name)
    watches = [Watch(path=f.path, root=f.root, links=f.links, kind="tensor", storage=storage_of(f.value),
                     data_ptr=f.value.data_ptr(), tensor=weakref.ref(f.value)) for f in search.found]
    return linears, watches


def test_paths_sharing_all_but_one_key_are_one_group_and_unchanged_ones_are_not_suspects() -> None:
    model, watches = _watched()
    checks = TensorChecks(watches)
    assert len(watches) == 12 and len(checks.groups) == 6  # per layer: the parameters, their main_grads
    with torch.no_grad():
        for parameter in (p for layer in model for p in layer.parameters()):
            parameter.add_(1.0)  # in place: the graph still reads these
            parameter.main_grad.mul_(2.0)  # type: ignore[attr-defined]
    assert checks.suspects() == []


def test_a_rebound_parameter_or_main_grad_makes_only_its_layers_groups_suspect() -> None:
    model, watches = _watched()
    checks = TensorChecks(watches)
    model[1].bias = torch.nn.Parameter(torch.zeros(4))
    suspects = [w for group in checks.suspects() for w in group.watches]
    assert {w.path for w in suspects} == {"1.weight", "1.bias", "1.weight.main_grad", "1.bias.main_grad"}
    assert {w.path for w in suspects if w.changed()} == {"1.bias", "1.bias.main_grad"}  # the new one has none
    model[2].weight.main_grad = torch.ones(4, 4)  # type: ignore[attr-defined]
    assert {w.path for group in checks.suspects() for w in group.watches} >= {"2.weight.main_grad",
                                                                               "2.bias.main_grad"}


def test_a_new_view_of_the_same_memory_is_suspect_once_not_changed_and_then_remembered() -> None:
    model, watches = _watched(1)
    checks = TensorChecks(watches)
    grad = model[0].weight.main_grad  # type: ignore[attr-defined]
    model[0].weight.main_grad = grad.view(4, 4)  # type: ignore[attr-defined]
    (group,) = checks.suspects()
    assert "0.weight.main_grad" in {w.path for w in group.watches}
    assert not any(w.changed() for w in group.watches)
    refresh(group)
    assert checks.suspects() == []


def test_a_removed_key_or_a_freed_captured_tensor_is_suspect() -> None:
    model, watches = _watched(2)
    checks = TensorChecks(watches)
    del model[0].weight.main_grad  # type: ignore[attr-defined]
    assert "0.weight.main_grad" in {w.path for group in checks.suspects() for w in group.watches}
    model2, watches2 = _watched(1)
    checks2 = TensorChecks(watches2)
    model2[0].bias.main_grad = torch.ones(4)  # type: ignore[attr-defined]  # the captured one is freed
    assert all(g.dead for g in checks2.groups if "main_grad" in str(g.suffix))
    assert {w.path for group in checks2.suspects() for w in group.watches if w.changed()} == {"0.bias.main_grad"}
