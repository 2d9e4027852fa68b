"""Tensor comparison reduced on the device that holds the tensors: per-tensor statistics, not tensors.

A family of tensors (every main_grad, or every parameter) is flattened into one buffer with an offset
table; one comparison pass yields, per tensor, a bitwise-equal flag (or a tolerance verdict), the max
absolute and the max relative difference. Only a [3, num_tensors] statistics tensor leaves the device,
once per call. Works on CPU tensors too (the unit tests use real CPU tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphdoctor.types import TensorDiff

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, slots=True)
class FlatLayout:
    """Names and extents of the tensors packed into one flat buffer."""

    names: tuple[str, ...]
    """Tensor names in packing order."""

    numels: tuple[int, ...]
    """Element count of each tensor."""

    @property
    def total(self) -> int:
        """Total element count."""
        return sum(self.numels)


def flatten(tensors: list[tuple[str, torch.Tensor]]) -> tuple[FlatLayout, torch.Tensor]:
    """Pack named tensors (one dtype, one device) into a fresh contiguous 1-D buffer.

    Args:
        tensors: (name, tensor) pairs; all of one dtype and device.

    Returns:
        The layout and the flat copy.

    Raises:
        ValueError: on an empty list or mixed dtypes.
    """
    if not tensors:
        raise ValueError("flatten: got no tensors, expected at least one")
    dtypes = {t.dtype for _, t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"flatten: got dtypes {sorted(map(str, dtypes))}, expected one dtype")
    layout = FlatLayout(tuple(n for n, _ in tensors), tuple(t.numel() for _, t in tensors))
    flat = torch.cat([t.detach().reshape(-1) for _, t in tensors])
    return layout, flat


class SegmentIndex:
    """Per-element segment ids for a layout, built once per device and reused every step."""

    def __init__(self, layout: FlatLayout, device: torch.device) -> None:
        counts = torch.tensor(layout.numels, dtype=torch.int64, device=device)
        self.layout = layout
        self.ids = torch.repeat_interleave(
            torch.arange(len(layout.numels), device=device), counts, output_size=layout.total
        )


def compare_flat(
    actual: torch.Tensor,
    expected: torch.Tensor,
    index: SegmentIndex,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    canonical_nan: bool = False,
) -> TensorDiff:
    """Compare two flat buffers with the same layout; one device-to-host copy.

    Args:
        actual: the graphed side.
        expected: the eager reference (same dtype, shape and device).
        index: segment ids of the shared layout.
        rtol: relative tolerance; with atol 0 as well the test is bitwise.
        atol: absolute tolerance.
        canonical_nan: NaNs at the same places compare as equal whatever their bits (fp16 main_grads, as their
            fingerprints do: graphdoctor.compare.bitprint); a NaN on one side only still differs.

    Returns:
        The reduced comparison: number of unequal tensors, max abs/rel difference, first tensor that
        differs (in layout order) and its max abs difference.

    Raises:
        ValueError: when shapes or dtypes differ.
    """
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise ValueError(
            f"compare_flat: got {tuple(actual.shape)}/{actual.dtype} against "
            f"{tuple(expected.shape)}/{expected.dtype}, expected equal shapes and dtypes"
        )
    n = len(index.layout.numels)
    a = actual.float()
    e = expected.float()
    diff = torch.where(a == e, 0.0, (a - e).abs())  # equal infinities differ by nothing, not by inf - inf
    # NaN on one side only is a difference of +inf; NaN on both sides compares by bits below (any NaN alike
    # with canonical_nan).
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    both_nan = nan_a & nan_e
    diff = torch.where(nan_a | nan_e, torch.where(both_nan, 0.0, float("inf")), diff)
    denom = e.abs()
    # Relative difference is defined where the reference is non-zero; elsewhere max_abs speaks.
    rel = torch.where(denom > 0, diff / denom.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    if rtol == 0.0 and atol == 0.0:
        view = _INT_VIEW[actual.element_size()]
        bad = actual.view(view) != expected.view(view)
        if canonical_nan:
            bad &= ~both_nan
    else:
        bad = diff > (atol + rtol * denom)
    stats = torch.zeros(3, n, dtype=torch.float32, device=actual.device)
    stats[0].scatter_add_(0, index.ids, bad.float())
    stats[1].scatter_reduce_(0, index.ids, diff, reduce="amax", include_self=True)
    stats[2].scatter_reduce_(0, index.ids, rel, reduce="amax", include_self=True)
    host = stats.cpu()
    num_bad = host[0]
    unequal = torch.nonzero(num_bad > 0).flatten().tolist()
    first = unequal[0] if unequal else None
    return TensorDiff(
        num_tensors=n,
        num_unequal=len(unequal),
        max_abs=float(host[1].max()) if n else 0.0,
        max_rel=float(host[2].max()) if n else 0.0,
        first_tensor=index.layout.names[first] if first is not None else None,
        first_tensor_max_abs=float(host[1][first]) if first is not None else 0.0,
        last_tensor=index.layout.names[unequal[-1]] if unequal else None,
    )


__all__ = ["FlatLayout", "SegmentIndex", "compare_flat", "flatten"]
