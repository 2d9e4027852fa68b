"""Draw and value fingerprints on the CPU: a dropout mask's counts are exact integers whatever its size,
layout and storage offset (the word view and the direct tail agree with counting element by element)."""

from __future__ import annotations

import pytest
import torch

from graphdoctor.compare.fingerprint import fingerprint, mask_counts


def _expected(mask: torch.Tensor) -> list[int]:
    flat = mask.reshape(-1).long()
    return [int(flat.sum()), int(flat[1::3].sum()), int(flat[2::7].sum())]


@pytest.mark.parametrize("numel", [0, 1, 7, 168, 42839, 42840, 42841, 3 * 42840 + 5, 2 * 16 * 256 * 256])
def test_mask_counts_are_the_element_by_element_counts(numel: int) -> None:
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) < 0.9
    assert mask_counts(mask).tolist() == _expected(mask)


def test_masks_off_a_word_boundary_and_not_contiguous_are_counted_too() -> None:
    mask = torch.rand(4, 42840, generator=torch.Generator().manual_seed(1)) < 0.5
    assert mask_counts(mask.reshape(-1)[3:]).tolist() == _expected(mask.reshape(-1)[3:])
    assert mask_counts(mask.t()).tolist() == _expected(mask.t())
    assert mask_counts(mask[:, 5:]).tolist() == _expected(mask[:, 5:])


def test_every_position_counts_towards_its_own_classes() -> None:
    """One set element per mask, at every position of a block and of the tail: each class sees it or not."""
    numel = 42840 + 200
    for index in [*range(0, 336), *range(42840 - 5, numel)]:
        mask = torch.zeros(numel, dtype=torch.bool)
        mask[index] = True
        assert mask_counts(mask).tolist() == [1, int(index % 3 == 1), int(index % 7 == 2)], index


def test_a_full_mask_does_not_carry_between_byte_lanes() -> None:
    mask = torch.ones(2 * 42840 + 3, dtype=torch.bool)
    assert mask_counts(mask).tolist() == _expected(mask)


def test_dropout_fingerprint_holds_the_counts_and_rejects_nothing_else() -> None:
    mask = torch.rand(2, 8, 64, 64, generator=torch.Generator().manual_seed(2)) < 0.9
    assert fingerprint(mask, "dropout").tolist() == [float(v) for v in _expected(mask)]
    draws = torch.rand(1000, generator=torch.Generator().manual_seed(3))
    flat = draws.double()
    got = fingerprint(draws, "random").tolist()
    assert got == pytest.approx([float(flat.sum()), float(flat[1::3].sum()), float(flat[2::7].sum())], rel=1e-5)
    with pytest.raises(ValueError, match="torch.bool"):
        mask_counts(draws)
