"""Bitwise fingerprints (graphdoctor.compare.bitprint) on real CPU tensors: bit semantics, layout
independence, chunk independence, the wrap-around torch must provide, and the memory/chunk plan."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphdoctor.compare.bitprint import (
    BLOCK_NUMEL,
    DEFAULT_BUDGET_FRACTION,
    MAX_CHUNKS,
    MIN_BUDGET_BYTES,
    BitFingerprinter,
    BitprintError,
    TensorSpec,
    canonical_nan_bytes,
    decode_step,
    differing_tensors,
    encode_step,
    family_digest,
    fill_multipliers,
    host_lanes,
    odd_multiplier,
    plan_chunks,
    reference_lanes,
    to_signed64,
)

INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}


def lanes(*tensors: torch.Tensor, chunk_numel: int | None = None) -> list[tuple[int, int]]:
    fp = BitFingerprinter([(f"t{i}", t.numel(), t.dtype) for i, t in enumerate(tensors)], "cpu",
                          chunk_numel=chunk_numel)
    out = fp.fingerprint(list(tensors))
    assert out.shape == (len(tensors), 2) and out.dtype == torch.int64
    return host_lanes(out)


def flip_bit(tensor: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    flipped = tensor.clone()
    words = flipped.view(INT_VIEW[tensor.dtype]).view(-1)
    words[index] ^= _bit(words.dtype, bit)
    return flipped


def _bit(dtype: torch.dtype, bit: int) -> int:
    width = torch.iinfo(dtype).bits
    value = 1 << bit
    return value - (1 << width) if bit == width - 1 else value


@pytest.fixture(scope="module")
def big() -> dict[torch.dtype, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(3 * BLOCK_NUMEL + 1234, generator=gen)
    return {torch.float32: base, torch.bfloat16: base.bfloat16()}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("which", ["lowest mantissa", "sign"])
@pytest.mark.parametrize("index", [0, BLOCK_NUMEL + 17, 3 * BLOCK_NUMEL + 1233])
def test_one_bit_flip_is_detected(big: dict[torch.dtype, torch.Tensor], dtype: torch.dtype, which: str,
                                  index: int) -> None:
    tensor = big[dtype]
    bit = 0 if which == "lowest mantissa" else torch.iinfo(INT_VIEW[dtype]).bits - 1
    flipped = flip_bit(tensor, index, bit)
    assert not torch.equal(tensor.view(INT_VIEW[dtype]), flipped.view(INT_VIEW[dtype]))
    first, second = lanes(tensor), lanes(flipped)
    assert first[0][0] != second[0][0] and first[0][1] != second[0][1]
    assert differing_tensors(first, second) == [0]


def test_every_single_element_difference_is_detected_in_both_lanes() -> None:
    # The guarantee: one differing element always changes both lanes (odd multiplier, |d| < 2^64).
    gen = torch.Generator().manual_seed(1)
    tensor = torch.randn(BLOCK_NUMEL + 100, generator=gen)
    base = lanes(tensor)[0]
    for index in (0, 1, 99, BLOCK_NUMEL - 1, BLOCK_NUMEL, BLOCK_NUMEL + 99):
        for bit in range(32):
            changed = lanes(flip_bit(tensor, index, bit))[0]
            assert changed[0] != base[0] and changed[1] != base[1], (index, bit)


def test_negative_zero_differs_from_zero() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        plus, minus = torch.zeros(8, dtype=dtype), torch.zeros(8, dtype=dtype)
        minus[3] = -0.0
        assert torch.equal(plus, minus)  # equal as floats, different bits
        assert differing_tensors(lanes(plus), lanes(minus)) == [0], dtype


def test_nan_payloads() -> None:
    quiet = torch.tensor([1.0, float("nan"), 2.0])
    other = quiet.clone()
    other.view(torch.int32)[1] = 0x7FC00001  # a NaN with another payload
    assert math.isnan(other[1].item())
    same = quiet.clone()
    assert differing_tensors(lanes(quiet), lanes(other)) == [0]
    assert differing_tensors(lanes(quiet), lanes(same)) == []
    negative = quiet.clone()
    negative.view(torch.int32)[1] = 0xFFC00000 - (1 << 32)  # the same NaN with the sign bit set
    assert differing_tensors(lanes(quiet), lanes(negative)) == [0]


def test_strides_and_views_do_not_matter() -> None:
    gen = torch.Generator().manual_seed(2)
    source = torch.randn(700, 300, generator=gen)
    view = source.t()  # non-contiguous view, logical shape [300, 700]
    copy = source.t().contiguous()
    assert not view.is_contiguous()
    assert lanes(view) == lanes(copy)
    sliced = source[:, 1::3]  # a strided slice against its contiguous copy
    assert lanes(sliced) == lanes(sliced.contiguous())
    padded = torch.randn(400, 260, generator=gen)[:, :250]  # rows with a stride larger than the width
    assert lanes(padded, chunk_numel=1) == lanes(padded.contiguous())


def test_chunk_size_does_not_change_lanes() -> None:
    gen = torch.Generator().manual_seed(3)
    tensors = [torch.randn(5 * BLOCK_NUMEL + 77, generator=gen).bfloat16(),
               torch.randn(3, BLOCK_NUMEL + 5, generator=gen).t(),  # non-contiguous, gathered per chunk
               torch.randn(9, generator=gen, dtype=torch.float64)]
    tiny = lanes(*tensors, chunk_numel=1)
    assert lanes(*tensors, chunk_numel=2 * BLOCK_NUMEL) == tiny
    assert lanes(*tensors, chunk_numel=10**9) == tiny
    assert lanes(*tensors) == tiny


def test_matches_the_python_reference_formula() -> None:
    gen = torch.Generator().manual_seed(4)
    tensors = [torch.randn(BLOCK_NUMEL + 3, generator=gen).half(), torch.tensor(2.5),
               torch.randn(4, 6, generator=gen, dtype=torch.float64).t(),
               torch.randint(-(2**62), 2**62, (7,), generator=gen), torch.randint(0, 255, (9,), dtype=torch.uint8),
               torch.empty(0), torch.tensor([True, False, True])]
    assert lanes(*tensors, chunk_numel=1) == [reference_lanes(t) for t in tensors]


def test_several_tensors_order_matters() -> None:
    gen = torch.Generator().manual_seed(5)
    first, second = torch.randn(100, generator=gen), torch.randn(100, generator=gen)
    forward, backward = lanes(first, second), lanes(second, first)
    assert forward == [lanes(first)[0], lanes(second)[0]]
    assert forward == backward[::-1]
    assert differing_tensors(forward, backward) == [0, 1]
    assert family_digest(forward) != family_digest(backward)
    assert family_digest(forward) == family_digest(lanes(first.clone(), second.clone()))


def test_same_values_in_other_dtype_differ() -> None:
    values = torch.tensor([0.0, 1.0, -2.0, 0.5])
    assert lanes(values)[0] != lanes(values.bfloat16())[0]
    assert lanes(torch.zeros(4))[0] != lanes(torch.zeros(4, dtype=torch.bfloat16))[0]
    assert lanes(torch.zeros(4))[0] != lanes(torch.zeros(5))[0]  # numel is folded in too


def test_float64_sign_flips_in_two_elements_are_detected() -> None:
    # Without the 64-bit fold, two sign flips give 2^63 * (odd + odd) = 0 mod 2^64 in every lane.
    values = torch.arange(1.0, 9.0, dtype=torch.float64)
    flipped = values.clone()
    flipped[2] = -flipped[2]
    flipped[5] = -flipped[5]
    assert differing_tensors(lanes(values), lanes(flipped)) == [0]


def test_int64_arithmetic_wraps_around() -> None:
    # The fingerprint is arithmetic mod 2^64; torch's int64 mul, add, sum and index_add must wrap.
    big = torch.tensor([2**62, 2**62, 2**62, 2**62], dtype=torch.int64)
    assert big.sum().item() == 0
    assert (big * 4).tolist() == [0, 0, 0, 0]
    assert (torch.tensor([2**63 - 1]) + 1).item() == -(2**63)
    assert (torch.tensor([3]) * to_signed64(0x9E3779B97F4A7C15)).item() == to_signed64(3 * 0x9E3779B97F4A7C15)
    gen = torch.Generator().manual_seed(6)
    a = torch.randint(-(2**63), 2**63 - 1, (1000,), generator=gen)
    b = torch.randint(-(2**63), 2**63 - 1, (1000,), generator=gen)
    exact = sum(x * y for x, y in zip(a.tolist(), b.tolist(), strict=True))
    assert (a * b).sum().item() == to_signed64(exact)
    target = torch.zeros(2, dtype=torch.int64).index_add_(0, torch.zeros(1000, dtype=torch.int64), a * b)
    assert target[0].item() == to_signed64(exact)


def test_device_multipliers_match_the_host_mix_and_are_odd() -> None:
    out = torch.empty(5000, dtype=torch.int64)
    fill_multipliers(out, 0x243F6A8885A308D3)
    host = [to_signed64(odd_multiplier(j, 0x243F6A8885A308D3)) for j in range(5000)]
    assert out.tolist() == host
    assert all(m & 1 for m in host)
    assert len(set(host)) == len(host)


def test_encoding_round_trips_through_json() -> None:
    step = lanes(torch.randn(10), torch.randn(3).bfloat16())
    encoded = json.loads(json.dumps(encode_step(step)))
    assert all(len(text) == 32 for text in encoded)
    assert decode_step(encoded) == step
    with pytest.raises(BitprintError):
        decode_step(["xyz"])
    with pytest.raises(BitprintError):
        differing_tensors(step, step[:1])


def test_an_empty_family_gives_an_empty_result() -> None:
    fp = BitFingerprinter([], "cpu")
    assert fp.fingerprint([]).shape == (0, 2)
    assert family_digest([]) == family_digest(host_lanes(fp.fingerprint([])))


def test_layout_mismatch_is_refused() -> None:
    fp = BitFingerprinter([("w", 4, torch.float32)], "cpu")
    with pytest.raises(BitprintError, match="'w'"):
        fp.fingerprint([torch.zeros(4, dtype=torch.bfloat16)])
    with pytest.raises(BitprintError):
        fp.fingerprint([torch.zeros(5)])
    with pytest.raises(BitprintError):
        BitFingerprinter([("c", 4, torch.complex64)], "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_plan_for_a_7b_layout_bounds_chunks_and_memory(dtype: torch.dtype) -> None:
    total = 7_000_000_000
    sizes = [total // 300] * 299 + [total - 299 * (total // 300)]
    specs = [TensorSpec(f"p{i}", n, dtype) for i, n in enumerate(sizes)]
    plan = plan_chunks(specs)
    model_bytes = total * torch.empty((), dtype=dtype).element_size()
    assert plan.model_bytes == model_bytes and plan.total_numel == total
    assert plan.num_chunks <= MAX_CHUNKS + len(specs)
    assert plan.extra_bytes <= model_bytes * DEFAULT_BUDGET_FRACTION
    assert plan.chunk_numel % BLOCK_NUMEL == 0
    assert plan.num_chunks == sum(math.ceil(n / plan.chunk_numel) for n in sizes)


def test_plan_bounds_hold_across_sizes() -> None:
    for total in (10**5, 10**7, 3 * 10**8, 1_300_000_000, 70_000_000_000):
        specs = [TensorSpec(f"p{i}", total // 100, torch.bfloat16) for i in range(100)]
        plan = plan_chunks(specs)
        assert plan.num_chunks <= MAX_CHUNKS + len(specs), total
        assert plan.extra_bytes <= max(plan.model_bytes * DEFAULT_BUDGET_FRACTION, MIN_BUDGET_BYTES), total


@pytest.mark.parametrize(("dtype", "per_element"), [(torch.float16, 29), (torch.float32, 33), (torch.float64, 41)])
@pytest.mark.parametrize("total", [50_000_000, 1_300_000_000, 7_000_000_000])
def test_canonical_nan_plan_keeps_the_budget(dtype: torch.dtype, per_element: int, total: int) -> None:
    # canonical_nan's temporaries (mask, replaced words, gathered values) are per chunk element: planned for, the
    # call fits a budget that cuts the tensors into chunks (here 1 % of the model's bytes, 4 MiB floor); planned
    # without, it did not.
    sizes = [total // 300] * 299 + [total - 299 * (total // 300)]
    specs = [TensorSpec(f"g{i}", n, dtype) for i, n in enumerate(sizes)]
    assert plan_chunks(specs, canonical_nan=True).budget_bytes == max(
        int(plan_chunks(specs).model_bytes * DEFAULT_BUDGET_FRACTION), MIN_BUDGET_BYTES)
    budget = max(plan_chunks(specs).model_bytes // 100, 4 << 20)
    plain, canonical = plan_chunks(specs, budget), plan_chunks(specs, budget, canonical_nan=True)
    assert canonical.bytes_per_chunk_element == per_element == 24 + canonical_nan_bytes(specs)
    assert canonical.budget_bytes == plain.budget_bytes == budget
    assert canonical.extra_bytes <= canonical.budget_bytes
    assert plain.extra_bytes + canonical_nan_bytes(specs) * plain.chunk_numel > plain.budget_bytes  # the old peak
    assert canonical.chunk_numel < plain.chunk_numel and canonical.chunk_numel % BLOCK_NUMEL == 0
    assert canonical.num_chunks <= MAX_CHUNKS * 4 + len(specs)  # a quarter of the default budget
    assert plan_chunks(specs, budget, canonical_nan=True, chunk_numel=plain.chunk_numel).extra_bytes == \
        plain.extra_bytes + canonical_nan_bytes(specs) * plain.chunk_numel  # an explicit chunk: counted, not fitted


def test_canonical_nan_bytes_are_those_of_the_widest_float() -> None:
    assert canonical_nan_bytes([TensorSpec("w", 8, torch.bfloat16), TensorSpec("b", 8, torch.float32)]) == 9
    assert canonical_nan_bytes([TensorSpec("i", 8, torch.int64), TensorSpec("m", 8, torch.bool)]) == 0
    ints = [TensorSpec("i", 10**9, torch.int64)]
    assert plan_chunks(ints, canonical_nan=True) == plan_chunks(ints)  # integer tensors are not touched


def test_canonical_nan_fingerprinter_fits_its_budget_with_the_same_lanes() -> None:
    gen = torch.Generator().manual_seed(11)
    bases = [torch.randn(7 * BLOCK_NUMEL + 5, generator=gen), torch.randn(3, 2 * BLOCK_NUMEL + 1, generator=gen),
             torch.randn(4 * BLOCK_NUMEL, generator=gen).half(), torch.randn(5, generator=gen, dtype=torch.float64)]
    for base in bases:
        base.view(-1)[::97] = float("nan")
    grads = [bases[0], bases[1].t(), bases[2], bases[3]]  # the second non-contiguous, gathered per chunk
    specs = [(f"g{i}", g.numel(), g.dtype) for i, g in enumerate(grads)]
    budget = 2 << 20  # small enough that the chunk is the budget's, not the largest tensor's
    plain = BitFingerprinter(specs, "cpu", budget_bytes=budget)
    canonical = BitFingerprinter(specs, "cpu", budget_bytes=budget, canonical_nan=True)
    assert canonical.plan.chunk_numel < plain.plan.chunk_numel < 8 * BLOCK_NUMEL
    assert canonical.peak_extra_bytes == canonical.plan.extra_bytes <= budget < \
        plain.plan.extra_bytes + canonical_nan_bytes(canonical.specs) * plain.plan.chunk_numel
    got = host_lanes(canonical.fingerprint(grads))
    assert got == [reference_lanes(g, canonical_nan=True) for g in grads]
    for chunk in (1, 2 * BLOCK_NUMEL, 10**9):  # the chunk size changes nothing
        fixed = BitFingerprinter(specs, "cpu", chunk_numel=chunk, canonical_nan=True)
        assert host_lanes(fixed.fingerprint(grads)) == got
    payloads = [g.clone() for g in grads]
    payloads[0].view(torch.int32).view(-1)[::97] = 0x7FC00001  # other NaN payloads, same places
    payloads[2].view(torch.int16).view(-1)[::97] = 0xFE01 - (1 << 16)  # fp16 NaNs with the sign bit, another payload
    assert payloads[0].view(-1)[::97].isnan().all() and payloads[2].view(-1)[::97].isnan().all()
    assert host_lanes(canonical.fingerprint(payloads)) == got
    assert differing_tensors(host_lanes(plain.fingerprint(payloads)), host_lanes(plain.fingerprint(grads))) == [0, 2]


def test_parameters_that_require_grad_are_read_without_autograd() -> None:
    gen = torch.Generator().manual_seed(9)
    weight = torch.nn.Parameter(torch.randn(64, 48, generator=gen).bfloat16())
    fp = BitFingerprinter([("weight", weight.numel(), weight.dtype), ("weight.T", weight.numel(), weight.dtype)],
                          "cpu")
    out = fp.fingerprint([weight, weight.t()])
    assert not out.requires_grad
    assert host_lanes(out) == [reference_lanes(weight), reference_lanes(weight.t())]


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), rows=st.integers(1, 40), cols=st.integers(1, 60),
       layout=st.sampled_from(["contiguous", "transposed", "strided", "offset"]),
       chunk=st.sampled_from([None, 1, 10**9]), seed=st.integers(0, 2**31))
def test_any_layout_matches_the_reference_and_its_contiguous_copy(
        dtype: torch.dtype, rows: int, cols: int, layout: str, chunk: int | None, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (rows * cols * 2 * torch.empty((), dtype=dtype).element_size() * 2,),
                        generator=gen, dtype=torch.uint8)
    base = raw.view(dtype)[: 2 * rows * 2 * cols].view(2 * rows, 2 * cols)  # arbitrary bit patterns
    tensor = {"contiguous": base[:rows].contiguous().view(-1)[: rows * cols].view(rows, cols),
              "transposed": base[:cols, :rows].t(), "strided": base[::2, ::2][:rows, :cols],
              "offset": base[1:, 1:][:rows, :cols]}[layout]
    got = lanes(tensor, chunk_numel=chunk)
    assert got == lanes(tensor.contiguous())
    assert got == [reference_lanes(tensor)]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), numel=st.integers(1, 3 * BLOCK_NUMEL), data=st.data())
def test_any_single_element_change_is_detected(dtype: torch.dtype, numel: int, data: st.DataObject) -> None:
    width = torch.empty((), dtype=dtype).element_size() * 8
    word_dtype = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    tensor = torch.zeros(numel, dtype=dtype)
    index = data.draw(st.integers(0, numel - 1))
    pattern = data.draw(st.integers(1, 2**width - 1))  # any non-zero xor pattern of the width
    changed = tensor.clone()
    signed = pattern - (1 << width) if word_dtype != torch.uint8 and pattern >= 1 << (width - 1) else pattern
    changed.view(word_dtype)[index] = signed
    first, second = lanes(tensor)[0], lanes(changed)[0]
    assert first[0] != second[0] and first[1] != second[1]


def test_the_default_budget_is_the_one_the_h100_measured_fastest() -> None:
    """tests/benchmarks/bitprint_cost.py on an H100 (fixtures/data/benchmarks/h100_bitprint_cost.txt): at 5.4e8
    parameters in 300 tensors, the earlier 1 % budget cut them into 1500 (bf16) and 900 (fp32) chunks and took about
    twice as long per call as one chunk per tensor; the default budget now plans one chunk per tensor there."""
    from pathlib import Path

    rows = {}
    path = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "benchmarks" / "h100_bitprint_cost.txt"
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        rows[(line.split()[0], fields["budget"])] = fields
    for dtype, torch_dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        old, new = rows[(dtype, "default")], rows[(dtype, "64MiB")]
        assert float(old["median_ms"]) > 1.9 * float(new["median_ms"])
        total, tensors = int(old["params"]), int(old["tensors"])
        size = total // tensors
        sizes = [size] * (tensors - 1) + [total - size * (tensors - 1)]
        plan = plan_chunks([TensorSpec(f"p{i}", n, torch_dtype) for i, n in enumerate(sizes)])
        assert int(old["chunks"]) > plan.num_chunks == int(new["chunks"]) == tensors
