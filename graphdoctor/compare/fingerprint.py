"""Tensor fingerprints: three float32 statistics per tensor, computed on the tensor's device.

A fingerprint is what a capture-time tap writes into graphdoctor's table at every replay, so it must be
a handful of fixed-shape reductions (no host sync, no data-dependent shape). Masks and random draws get
positional counts (a changed mask changes them with overwhelming probability); module outputs and
gradients get sum and L2 norm (the third statistic is 0), which also give the size of a difference.
Every statistic is one reduction kernel: inside a graph each is one more node per replay.
"""

from __future__ import annotations

import torch

NUM_STATS = 3
"""Statistics per fingerprint."""

DRAW_KINDS: tuple[str, ...] = ("dropout", "random", "host-random")
"""Kinds whose fingerprint is [sum, sum over elements 1::3, sum over elements 2::7]."""

VALUE_KINDS: tuple[str, ...] = ("output", "grad")
"""Kinds whose fingerprint is [sum, L2 norm, max abs]."""

STAT_NAMES: dict[str, tuple[str, str, str]] = {
    **{k: ("sum", "sum[1::3]", "sum[2::7]") for k in DRAW_KINDS},
    **{k: ("sum", "l2", "unused") for k in VALUE_KINDS},
}
"""What each of the three statistics means, per kind."""


def fingerprint(tensor: torch.Tensor, kind: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fingerprint of `tensor` as a float32 tensor of NUM_STATS elements on its device.

    Args:
        tensor: any tensor (bool masks included); non-contiguous tensors are reshaped (copied).
        kind: one of DRAW_KINDS or VALUE_KINDS.
        out: optional float32 row of NUM_STATS elements to write into (a capture-time tap writes
            into graphdoctor's own table so that every replay updates it).

    Returns:
        `out` (or a new tensor) holding the statistics.

    Raises:
        ValueError: unknown kind.
    """
    stats = fingerprint_stats(tensor, kind)
    if len(stats) < NUM_STATS:
        stats.append(torch.zeros((), dtype=torch.float32, device=tensor.device))
    if out is None:
        return torch.stack(stats)
    torch.stack(stats, out=out)
    return out


def fingerprint_stats(tensor: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """The non-constant statistics of `tensor` as 0-d float32 tensors (3 for draws, 2 for values).

    Raises:
        ValueError: unknown kind.
    """
    flat = tensor.detach().reshape(-1)
    f32 = torch.float32
    if kind in DRAW_KINDS:
        return [flat.sum(dtype=f32), flat[1::3].sum(dtype=f32), flat[2::7].sum(dtype=f32)]
    if kind in VALUE_KINDS:
        if not flat.is_floating_point():
            flat = flat.to(f32)
        return [flat.sum(dtype=f32), torch.linalg.vector_norm(flat, 2, dtype=f32)]
    raise ValueError(f"kind: got {kind!r}, expected one of {DRAW_KINDS + VALUE_KINDS}")


__all__ = ["DRAW_KINDS", "NUM_STATS", "STAT_NAMES", "VALUE_KINDS", "fingerprint",
           "fingerprint_stats"]
