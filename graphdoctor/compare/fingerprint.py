"""Tensor fingerprints: three float32 statistics per tensor, computed on the tensor's device.

A fingerprint is what a capture-time tap writes into graphdoctor's table at every replay, so it must be
a handful of fixed-shape reductions (no host sync, no data-dependent shape). Masks and random draws get
positional counts (a changed mask changes them with overwhelming probability); module outputs and
gradients get sum and L2 norm (the third statistic is 0), which also give the size of a difference.

A value statistic is one reduction kernel that writes straight into its table cell (`out=`), so inside a
graph a value tap is two nodes per replay. A boolean mask (dropout) is counted exactly in integers in one
read of its bytes (`mask_counts`): a cast to any wider type first would write and read the mask again at
twice its size or more, and at [batch, heads, seq, seq] the attention masks are most of what taps cost.
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

_LANES = 8
"""Mask bytes per int64 word."""

_PERIOD = 168
"""8 * 21, a multiple of 3 and of 7: elements after which an element's classes mod 3 and mod 7 repeat."""

_DEPTH_WORDS = 255
"""Words summed per byte lane before a lane's count could carry into the next byte (each byte is 0 or 1)."""

_BLOCK = _PERIOD * _DEPTH_WORDS
"""Mask elements per block of the word view (42,840); the tail beyond the last whole block is counted directly."""


def mask_counts(mask: torch.Tensor) -> torch.Tensor:
    """[count, count over elements 1::3, count over elements 2::7] of a boolean tensor, as int64 on its device.

    The mask's whole blocks are read once, as int64 words of eight 0/1 bytes: summing 255 words keeps every
    byte lane's count below 256, so no lane carries into the next, and summing a [blocks, 255, 21] word view
    over its middle dimension leaves, per block, 168 byte counts whose positions repeat the classes mod 3 and
    mod 7 of the elements they count. The tail beyond the last whole block (fewer than 42,840 elements), and
    a mask whose bytes cannot be viewed as words (not 8-byte aligned), are counted directly. Integer sums:
    exact at any size and independent of the reduction order. About a dozen small kernels, capturable.
    """
    flat = mask.detach().reshape(-1)
    if flat.dtype != torch.bool:
        raise ValueError(f"mask: got dtype {flat.dtype}, expected torch.bool")
    whole = flat.numel() // _BLOCK * _BLOCK if flat.storage_offset() % _LANES == 0 else 0
    counts = _class_sums(flat[whole:].long(), torch.empty(NUM_STATS, dtype=torch.int64, device=flat.device))
    if whole:
        words = flat[:whole].view(torch.int64).view(-1, _DEPTH_WORDS, _PERIOD // _LANES)
        per_position = words.sum(dim=1).view(torch.uint8).view(-1, _PERIOD).sum(dim=0)
        counts += _class_sums(per_position, torch.empty_like(counts))
    return counts


def _class_sums(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[:] = [sum, sum over 1::3, sum over 2::7] of the 1-D int64 `values` (which start at a class boundary)."""
    torch.sum(values, dim=None, out=out[0])
    torch.sum(values[1::3], dim=None, out=out[1])
    torch.sum(values[2::7], dim=None, out=out[2])
    return out


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
        if data.dtype == torch.bool:
            out.copy_(mask_counts(data))
            return out
        flat = data.reshape(-1)
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


__all__ = ["DRAW_KINDS", "NUM_STATS", "STAT_NAMES", "VALUE_KINDS", "fingerprint", "mask_counts"]
