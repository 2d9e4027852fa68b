"""The child's StepPrinter on real CPU tensors: one fingerprint row per parameter, equal for equal
models, different where one bit of one main_grad or parameter differs."""

from __future__ import annotations

import torch

from graphdoctor.child.loop import StepPrinter, TensorFamilies, _lanes


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for p in net.parameters():
        p.main_grad = torch.full_like(p, 0.5, dtype=torch.float32)  # type: ignore[attr-defined]
    return net


def test_equal_models_print_equal_and_one_bit_differs() -> None:
    a, b = model(0), model(0)
    pa, pb = StepPrinter(TensorFamilies.of(a)), StepPrinter(TensorFamilies.of(b))
    assert pa.grads().shape == (4, 2) and pa.params().shape == (4, 2)
    assert _lanes(pa.grads()) == _lanes(pb.grads()) and _lanes(pa.params()) == _lanes(pb.params())
    weight = next(b.parameters())
    with torch.no_grad():
        bits = weight.view(torch.int32)
        bits[3, 5] ^= 1  # lowest mantissa bit of one element
    params_a, params_b = _lanes(pa.params()), _lanes(pb.params())
    assert params_a[:2] != params_b[:2] and params_a[2:] == params_b[2:]
    weight.main_grad[0, 0] = -0.0 if weight.main_grad[0, 0] == 0.0 else 0.0  # type: ignore[attr-defined]
    assert _lanes(pa.grads())[:2] != _lanes(pb.grads())[:2]
    assert pa.extra_bytes > 0


def test_constant_batch_inputs_are_allocated_once() -> None:
    # Captured tensors stay alive at a stable address and every step allocates the same (see
    # megatron_setup._CONSTANT_INPUTS for what was seen on the H200).
    from graphdoctor.child.batches import constant_inputs
    from graphdoctor.config import DiffConfig

    config = DiffConfig(seq_length=16, micro_batch_size=2)
    first, again = constant_inputs(config, torch.device("cpu")), constant_inputs(config, torch.device("cpu"))
    assert all(first[k] is again[k] for k in ("attention_mask", "position_ids", "loss_mask"))
    assert first["attention_mask"].shape == (1, 1, 16, 16) and bool(first["attention_mask"][0, 0, 0, 1])
    # every micro-batch its own tensors, as Megatron-LM's dataloader gives them (one shared mask failed
    # P=2 local capture on two H200s, cuda_graphs.py:617)
    second = constant_inputs(config, torch.device("cpu"), 1)
    assert all(second[k] is not first[k] and torch.equal(second[k], first[k]) for k in first)
    assert constant_inputs(config, torch.device("cpu"), 1)["attention_mask"] is second["attention_mask"]
