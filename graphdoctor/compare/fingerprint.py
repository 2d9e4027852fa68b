"""Tensor fingerprints: three float32 statistics per tensor, computed on the tensor's device.

A fingerprint is what a capture-time tap writes into graphdoctor's table at every replay, so it must be
a handful of fixed-shape reductions (no host sync, no data-dependent shape). Masks and random draws get
positional counts (a changed mask changes them with overwhelming probability); module outputs and
gradients get sum and L2 norm (the third statistic is 0), which also give the size of a difference.

Each statistic is one reduction kernel that writes straight into its table cell (`out=`), so inside a
graph a value tap is two nodes per replay and a draw tap four (a boolean mask is first cast once to
bfloat16, which holds 0 and 1 exactly and which CUDA sums in float32 without another copy).
"""

from __future__ import annotations

import torch

NUM_STATS = 3
"""Statistics per fingerprint."""

DRAW_KINDS: tuple[str, ...] = ("dropout", "random", "host-random")
"""Kinds whose fingerprint is [sum, sum over elements 1::3, sum over elements 2::7]."""

VALUE_KINDS: tuple[str, ...] = ("output", "grad", "input-grad")
"""Kinds whose fingerprint is [sum, L2 norm, 0]."""

STAT_NAMES: dict[str, tuple[str, str, str]] = {
    **{k: ("sum", "sum[1::3]", "sum[2::7]") for k in DRAW_KINDS},
    **{k: ("sum", "l2", "unused") for k in VALUE_KINDS},
}
"""What each of the three statistics means, per kind."""


def fingerprint(tensor: torch.Tensor, kind: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fingerprint of `tensor` as a float32 tensor of NUM_STATS elements on its device.

    Args:
        tensor: any tensor (bool masks included).
        kind: one of DRAW_KINDS or VALUE_KINDS.
        out: optional float32 row of NUM_STATS elements to write into (a capture-time tap writes
            into graphdoctor's own table so that every replay updates it). Statistics a kind does not
            use are left as they are (zero in a fresh table).

    Returns:
        `out` (or a new tensor) holding the statistics.

    Raises:
        ValueError: unknown kind.
    """
    if out is None:
        out = torch.zeros(NUM_STATS, dtype=torch.float32, device=tensor.device)
    f32 = torch.float32
    data = tensor.detach()
    if kind in DRAW_KINDS:
        flat = data.reshape(-1)
        if flat.dtype == torch.bool:
            flat = flat.to(torch.bfloat16)
        torch.sum(flat, dim=None, dtype=f32, out=out[0])
        torch.sum(flat[1::3], dim=None, dtype=f32, out=out[1])
        torch.sum(flat[2::7], dim=None, dtype=f32, out=out[2])
        return out
    if kind in VALUE_KINDS:
        # Reductions take any strides: no reshape copy of a non-contiguous output.
        if not data.is_floating_point():
            data = data.to(f32)
        torch.sum(data, dim=None, dtype=f32, out=out[0])
        torch.linalg.vector_norm(data, 2, dtype=f32, out=out[1])
        return out
    raise ValueError(f"kind: got {kind!r}, expected one of {DRAW_KINDS + VALUE_KINDS}")


__all__ = ["DRAW_KINDS", "NUM_STATS", "STAT_NAMES", "VALUE_KINDS", "fingerprint"]
