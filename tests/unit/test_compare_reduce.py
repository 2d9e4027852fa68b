"""The GPU reduction math, run on real CPU tensors."""

from __future__ import annotations

import pytest
import torch

from graphdoctor.compare.reduce import FlatLayout, SegmentIndex, compare_flat, flatten


def pack(tensors: list[tuple[str, torch.Tensor]]) -> tuple[SegmentIndex, torch.Tensor]:
    layout, flat = flatten(tensors)
    return SegmentIndex(layout, flat.device), flat


def named(seed: int = 0, dtype: torch.dtype = torch.float32) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [("a.weight", torch.randn(4, 8, generator=gen).to(dtype)),
            ("a.bias", torch.randn(8, generator=gen).to(dtype)),
            ("b.weight", torch.randn(3, 3, generator=gen).to(dtype))]


def test_identical_is_bitwise_equal() -> None:
    index, flat = pack(named())
    result = compare_flat(flat.clone(), flat, index)
    assert result.equal and result.num_tensors == 3
    assert result.max_abs == 0.0 and result.max_rel == 0.0 and result.first_tensor is None


def test_one_ulp_is_caught_bitwise_and_passes_tolerance() -> None:
    tensors = named()
    index, ref = pack(tensors)
    changed = [(n, t.clone()) for n, t in tensors]
    changed[1][1][3] = torch.nextafter(changed[1][1][3], torch.tensor(float("inf")))
    _, act = pack(changed)
    bitwise = compare_flat(act, ref, index)
    assert bitwise.num_unequal == 1
    assert bitwise.first_tensor == "a.bias"
    assert 0 < bitwise.first_tensor_max_abs < 1e-6
    assert compare_flat(act, ref, index, rtol=1e-6).equal


def test_first_tensor_follows_layout_order() -> None:
    tensors = named()
    index, ref = pack(tensors)
    changed = [(n, t.clone()) for n, t in tensors]
    changed[2][1][0, 0] += 1.0
    changed[0][1][1, 1] += 0.5
    result = compare_flat(pack(changed)[1], ref, index)
    assert result.num_unequal == 2
    assert result.first_tensor == "a.weight"
    assert result.max_abs == pytest.approx(1.0)


def test_relative_difference_ignores_zero_reference() -> None:
    index, ref = pack([("z", torch.zeros(4)), ("x", torch.full((2,), 2.0))])
    act = torch.tensor([0.0, 0.0, 1e-3, 0.0, 2.0, 3.0])
    result = compare_flat(act, ref, index)
    assert result.max_abs == pytest.approx(1.0)
    assert result.max_rel == pytest.approx(0.5)
    assert result.num_unequal == 2


def test_nan_on_one_side_is_infinite_difference() -> None:
    index, ref = pack([("x", torch.ones(3))])
    act = torch.tensor([1.0, float("nan"), 1.0])
    result = compare_flat(act, ref, index, atol=1.0)
    assert result.num_unequal == 1
    assert result.max_abs == float("inf")


def test_same_nan_bits_compare_equal() -> None:
    ref = torch.tensor([1.0, float("nan")])
    index, flat = pack([("x", ref)])
    assert compare_flat(flat.clone(), flat, index).equal


def test_bf16_compared_by_bits() -> None:
    tensors = named(dtype=torch.bfloat16)
    index, ref = pack(tensors)
    act = ref.clone()
    act[5] = -act[5] if act[5] != 0 else 1
    result = compare_flat(act, ref, index)
    assert result.num_unequal == 1 and result.first_tensor == "a.weight"


def test_shape_or_dtype_mismatch_is_an_error() -> None:
    index, ref = pack(named())
    with pytest.raises(ValueError, match="expected equal shapes and dtypes"):
        compare_flat(ref.double(), ref, index)


def test_flatten_rejects_mixed_dtypes_and_empty() -> None:
    with pytest.raises(ValueError, match="one dtype"):
        flatten([("a", torch.ones(2)), ("b", torch.ones(2, dtype=torch.float64))])
    with pytest.raises(ValueError, match="at least one"):
        flatten([])


def test_layout_total() -> None:
    assert FlatLayout(("a", "b"), (3, 4)).total == 7
