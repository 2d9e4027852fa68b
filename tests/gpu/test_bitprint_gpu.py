"""Bitwise fingerprints on CUDA: equal to the CPU lanes bit for bit, no host synchronisation inside a
call, int64 wrap-around on the device, and measured extra memory within the computed plan."""

from __future__ import annotations

import pytest
import torch

from graphdoctor.compare.bitprint import (
    BLOCK_NUMEL,
    BitFingerprinter,
    differing_tensors,
    host_lanes,
    reference_lanes,
    to_signed64,
)

pytestmark = pytest.mark.gpu


def _family() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(3 * BLOCK_NUMEL + 11, generator=gen)
    return [base.bfloat16(), base, base[: BLOCK_NUMEL + 5].half(), base[:17].double(),
            torch.randn(300, 700, generator=gen).t(),  # non-contiguous
            torch.randint(-(2**62), 2**62, (1000,), generator=gen), torch.tensor(-0.0),
            torch.tensor([float("nan")])]


def _lanes(tensors: list[torch.Tensor], device: str, chunk_numel: int | None = None) -> list[tuple[int, int]]:
    fp = BitFingerprinter([(f"t{i}", t.numel(), t.dtype) for i, t in enumerate(tensors)], device,
                          chunk_numel=chunk_numel)
    return host_lanes(fp.fingerprint([t.to(device) if device == "cpu" else _to_cuda(t) for t in tensors]))


def _to_cuda(tensor: torch.Tensor) -> torch.Tensor:
    # Keep a non-contiguous CPU view non-contiguous on the device too.
    if tensor.dim() == 2 and not tensor.is_contiguous():
        return tensor.t().cuda().t()
    return tensor.cuda()


def test_cuda_lanes_equal_cpu_lanes() -> None:
    family = _family()
    cpu = _lanes(family, "cpu")
    assert _lanes(family, "cuda") == cpu
    assert _lanes(family, "cuda", chunk_numel=1) == cpu
    assert cpu[4] == reference_lanes(family[4])


def test_cuda_detects_one_bit_flips() -> None:
    family = _family()
    for index, bit in ((0, 0), (0, 15), (1, 0), (1, 31)):
        flipped = [t.clone() for t in family]
        words = flipped[index].view(torch.int16 if index == 0 else torch.int32).view(-1)
        width = 16 if index == 0 else 32
        words[BLOCK_NUMEL + 3] ^= (1 << bit) - ((1 << width) if bit == width - 1 else 0)
        assert differing_tensors(_lanes(family, "cuda"), _lanes(flipped, "cuda")) == [index]


def test_cuda_int64_wraps_around() -> None:
    big = torch.full((4096,), 2**62, dtype=torch.int64, device="cuda")
    assert big.sum().item() == 0
    assert (torch.tensor([2**63 - 1], device="cuda") + 1).item() == -(2**63)
    gen = torch.Generator().manual_seed(8)
    a = torch.randint(-(2**63), 2**63 - 1, (100_000,), generator=gen)
    b = torch.randint(-(2**63), 2**63 - 1, (100_000,), generator=gen)
    exact = sum(x * y for x, y in zip(a.tolist(), b.tolist(), strict=True))
    assert (a.cuda() * b.cuda()).sum().item() == to_signed64(exact)
    assert (a.cuda() * b.cuda()).cumsum(0)[-1].item() == to_signed64(exact)


def test_no_host_sync_and_memory_within_plan() -> None:
    tensors = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for n in (50_000_000, 30_000_000, 4096)]
    tensors.append(torch.randn(2000, 3000, device="cuda").t())
    fp = BitFingerprinter([(f"t{i}", t.numel(), t.dtype) for i, t in enumerate(tensors)], "cuda")
    fp.fingerprint(tensors)  # warm the allocator and kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fp.fingerprint(tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - before
    persistent_in_before = fp.plan.persistent_bytes
    # The persistent tables are already in `before`; the call's own peak must fit the rest of the plan.
    assert measured <= fp.plan.extra_bytes - persistent_in_before + (1 << 20), (measured, fp.plan)
    assert out.shape == (4, 2) and out.device.type == "cuda"
