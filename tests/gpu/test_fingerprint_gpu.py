"""Draw fingerprints of dropout masks on CUDA: exact counts equal to the CPU's, captured in a graph and
rewritten at every replay, for the mask shapes Megatron's dropouts draw."""

from __future__ import annotations

import pytest
import torch

from graphdoctor.compare.fingerprint import fingerprint, mask_counts

pytestmark = pytest.mark.gpu


def _expected(mask: torch.Tensor) -> list[int]:
    flat = mask.reshape(-1).cpu().long()
    return [int(flat.sum()), int(flat[1::3].sum()), int(flat[2::7].sum())]


@pytest.mark.parametrize("shape", [(2, 16, 2048, 2048), (2048, 2, 2048), (3, 5, 7), (42840 * 2 + 9,)])
def test_mask_counts_on_cuda_equal_the_exact_counts(shape: tuple[int, ...]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    mask = torch.rand(shape, device="cuda", generator=gen) < 0.9
    assert mask_counts(mask).tolist() == _expected(mask)
    assert mask_counts(mask[1:]).tolist() == _expected(mask[1:])  # storage offset not on a word boundary


def test_a_captured_mask_tap_is_rewritten_at_every_replay() -> None:
    hidden = torch.ones(4, 16, 512, 512, device="cuda", dtype=torch.bfloat16)
    row = torch.zeros(3, device="cuda")
    masks = []

    def step() -> torch.Tensor:
        _, mask = torch.ops.aten.native_dropout(hidden, 0.1, True)
        fingerprint(mask, "dropout", out=row)
        return mask

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        expected = _expected(captured)
        assert row.tolist() == [float(torch.tensor(v, dtype=torch.float32)) for v in expected]
        masks.append(expected)
    assert masks[0] != masks[1] != masks[2]  # the graph's draws advance, and the tap follows them
