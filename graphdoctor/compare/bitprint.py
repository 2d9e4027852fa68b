"""Bitwise fingerprints: two 64-bit hash lanes per tensor from the raw bits, computed on the tensor's device.

A run reduces every loss, main_grad and parameter tensor of a step to a [num_tensors, 2] int64 tensor;
two runs' tensors are bitwise equal (up to a documented collision probability) iff their lanes are.
Semantics, collision model and memory/host-work bounds: docs/fingerprints.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphdoctor.protocol.lanes import (
    NUM_LANES,
    BitprintError,
    decode_step,
    differing_tensors,
    encode_step,
    family_digest,
    to_unsigned64,
)

BLOCK_NUMEL = 1 << 14
"""Elements per block: element i's multiplier is R(i // BLOCK_NUMEL) * M(i % BLOCK_NUMEL)."""

BYTES_PER_CHUNK_ELEMENT = 24
"""Device bytes per element of one chunk: products (2 lanes x 8) and one gather/index/fold word (8)."""

CANONICAL_NAN_MASK_BYTES = 1
"""Device bytes per chunk element of canonical_nan's NaN mask (torch.bool), on top of BYTES_PER_CHUNK_ELEMENT."""

BYTES_PER_BLOCK = 16
"""Persistent device bytes per block: the block multipliers R (2 lanes x 8)."""

CALL_BYTES_PER_BLOCK = 32
"""Per-call device bytes per block: block sums and their running sums (2 lanes x 8 each)."""

FIXED_BYTES = 2 * BLOCK_NUMEL * 8
"""Device bytes of the in-block multipliers M (two lanes, kept for the fingerprinter's lifetime)."""

MAX_CHUNKS = 512
"""Documented bound on chunks over the whole model under the default budget (plus one per tensor)."""

MIN_BUDGET_BYTES = 64 << 20
"""Floor of the default device budget. Each chunk costs a few kernel launches, and launches, not bandwidth, bound
a call with small chunks: on an H100, 5.4e8 bf16 parameters took 64.6 ms at a 10 MiB budget (1500 chunks) and
24.2 ms at 64 MiB (300 chunks, one per tensor) (tests/benchmarks/bitprint_cost.py, docs/fingerprints.md)."""

DEFAULT_BUDGET_FRACTION = 0.04
"""Default device budget as a fraction of the model's bytes: about 300 chunks in bf16 at any parameter count."""

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_LANE_SEEDS = (0x243F6A8885A308D3, 0x13198A2E03707344)
"""Per-lane seeds of the in-block multipliers M (hex digits of pi)."""
_BLOCK_SEEDS = (0xA4093822299F31D0, 0x082EFA98EC4E6C89)
"""Per-lane seeds of the per-block multipliers R."""
_SALT_SEEDS = (0x452821E638D01377, 0xBE5466CF34E90C6C)
"""Per-lane seeds of the numel/dtype salt."""

_INT_VIEW: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 1), torch.float32: (torch.int32, 2), torch.bfloat16: (torch.int16, 3),
    torch.float16: (torch.int16, 4), torch.int64: (torch.int64, 5), torch.int32: (torch.int32, 6),
    torch.int16: (torch.int16, 7), torch.int8: (torch.int8, 8), torch.uint8: (torch.uint8, 9),
    torch.bool: (torch.uint8, 10),
}
"""dtype -> (integer dtype of the same width whose bits are hashed, dtype code folded into the salt)."""


def to_signed64(value: int) -> int:
    """`value` mod 2^64 as a two's-complement int64 (what torch stores)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def splitmix64(value: int) -> int:
    """The splitmix64 finalizer of (value * golden gamma) on Python ints, mod 2^64 (host reference)."""
    z = (value * _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def odd_multiplier(index: int, seed: int) -> int:
    """The odd pseudo-random 64-bit multiplier of `index` under `seed` (host reference of the device mix)."""
    return splitmix64((index + seed) & _MASK64) | 1


def block_multiplier(block_index: int, lane: int) -> int:
    """R_lane(block_index): odd multiplier of the block_index-th block of BLOCK_NUMEL elements of a tensor."""
    return odd_multiplier(block_index, _BLOCK_SEEDS[lane])


def salt(numel: int, dtype: torch.dtype, lane: int) -> int:
    """What a tensor's lane starts from: a mix of its numel, dtype code and the lane."""
    code = _INT_VIEW[dtype][1]
    return splitmix64(splitmix64(numel ^ _SALT_SEEDS[lane]) ^ code)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of a fingerprinted family, in the fixed order of the family."""

    name: str
    """Name used in reports (for example the parameter's qualified name)."""
    numel: int
    """Number of elements."""
    dtype: torch.dtype
    """Element dtype; one of the keys of the integer-view table."""


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """How a family is cut into chunks, and what that costs on the device."""

    chunk_numel: int
    """Elements per chunk, a multiple of BLOCK_NUMEL (the last chunk of a tensor may be shorter)."""
    num_chunks: int
    """Chunks over the whole family: sum over tensors of ceil(numel / chunk_numel)."""
    num_blocks: int
    """Blocks over the whole family: sum over tensors of ceil(numel / BLOCK_NUMEL)."""
    num_tensors: int
    """Tensors in the family."""
    total_numel: int
    """Elements over the whole family."""
    model_bytes: int
    """Bytes of the family's tensors in their own dtypes."""
    budget_bytes: int
    """Device budget the chunk size was derived from."""
    bytes_per_chunk_element: int
    """Device bytes per chunk element the chunk size was derived from: BYTES_PER_CHUNK_ELEMENT, plus the
    canonical-NaN temporaries (canonical_nan_bytes) when the plan is for canonical_nan."""
    persistent_bytes: int
    """Device bytes the fingerprinter holds between calls (multipliers and tables)."""
    extra_bytes: int
    """Peak device bytes during a fingerprint() call: persistent_bytes plus the call's own buffers (the
    canonical-NaN temporaries included when the plan is for canonical_nan)."""


def _blocks(numel: int) -> int:
    return max(1, math.ceil(numel / BLOCK_NUMEL))


def canonical_nan_bytes(specs: Sequence[TensorSpec]) -> int:
    """Device bytes per chunk element that canonical_nan adds to a fingerprint() call, for the widest
    floating-point dtype of `specs` (0 without one: integer and bool tensors are not touched).

    At the peak, in torch.where: the NaN mask (1 byte) and the replaced words (the element size); the chunk's
    values gathered with torch.take for a non-contiguous tensor, or for a contiguous 64-bit one the folded copy
    of the replaced words, are one more element size. So 1 + 2 x element size: 17 for float64, 9 for float32,
    5 for float16 and bfloat16.
    """
    sizes = [_itemsize(s.dtype) for s in specs if s.dtype.is_floating_point]
    return CANONICAL_NAN_MASK_BYTES + 2 * max(sizes) if sizes else 0


def plan_chunks(specs: Sequence[TensorSpec], budget_bytes: int | None = None,
                chunk_numel: int | None = None, *, canonical_nan: bool = False) -> ChunkPlan:
    """Choose the chunk size: the largest multiple of BLOCK_NUMEL whose buffers fit the budget.

    The chunk count is at most total_numel * b / (budget - fixed costs) + num_tensors, b the bytes per
    chunk element (24; with canonical_nan 24 + canonical_nan_bytes: 29 for 16-bit, 33 for 32-bit floats);
    with the default budget (4% of the model's bytes) that is about 25 * b / element size + num_tensors
    (300 + num_tensors for bf16, 150 + num_tensors for fp32; with canonical_nan 363 and 207), whatever
    the parameter count.

    Args:
        specs: the family's tensors.
        budget_bytes: device budget; default max(4% of model bytes, 64 MiB).
        chunk_numel: explicit chunk size (tests); rounded up to a multiple of BLOCK_NUMEL.
        canonical_nan: plan for BitFingerprinter's canonical_nan, whose temporaries are per chunk element
            (canonical_nan_bytes): the chunk is smaller, so that the call still fits the budget.

    Returns:
        The plan, with its computed peak extra device bytes.

    Raises:
        BitprintError: an unsupported dtype, a non-positive budget or chunk size.
    """
    for spec in specs:
        if spec.dtype not in _INT_VIEW:
            raise BitprintError(f"tensor {spec.name!r}: dtype {spec.dtype} is not supported; "
                                f"expected one of {sorted(str(d) for d in _INT_VIEW)}")
    total = sum(s.numel for s in specs)
    model_bytes = sum(s.numel * _itemsize(s.dtype) for s in specs)
    if budget_bytes is None:
        budget_bytes = max(int(model_bytes * DEFAULT_BUDGET_FRACTION), MIN_BUDGET_BYTES)
    if budget_bytes <= 0 or (chunk_numel is not None and chunk_numel <= 0):
        raise BitprintError(f"budget_bytes/chunk_numel: got {budget_bytes}/{chunk_numel}, expected > 0")
    num_blocks = sum(_blocks(s.numel) for s in specs)
    # persistent: M, R, the salt [num_tensors, 2] and each tensor's first and end block [2, num_tensors].
    persistent = FIXED_BYTES + num_blocks * BYTES_PER_BLOCK + len(specs) * 32
    call_tables = num_blocks * CALL_BYTES_PER_BLOCK + len(specs) * 48
    per_element = BYTES_PER_CHUNK_ELEMENT + (canonical_nan_bytes(specs) if canonical_nan else 0)
    if chunk_numel is None:
        available = budget_bytes - persistent - call_tables
        chunk_blocks = max(1, available // (per_element * BLOCK_NUMEL))
    else:
        chunk_blocks = max(1, math.ceil(chunk_numel / BLOCK_NUMEL))
    chunk_blocks = min(chunk_blocks, max((_blocks(s.numel) for s in specs), default=1))
    chunk_numel = chunk_blocks * BLOCK_NUMEL
    num_chunks = sum(math.ceil(_blocks(s.numel) / chunk_blocks) for s in specs)
    # per call: block sums and running sums [2, num_blocks], per-tensor totals and result on top of the chunk buffers.
    extra = persistent + chunk_numel * per_element + call_tables
    return ChunkPlan(chunk_numel=chunk_numel, num_chunks=num_chunks, num_blocks=num_blocks,
                     num_tensors=len(specs), total_numel=total, model_bytes=model_bytes,
                     budget_bytes=budget_bytes, bytes_per_chunk_element=per_element, persistent_bytes=persistent,
                     extra_bytes=extra)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _xorshift_right(z: torch.Tensor, shift: int, scratch: torch.Tensor) -> None:
    # z ^= z >>> shift (logical): torch's >> on int64 is arithmetic, so mask off the sign copies.
    torch.bitwise_right_shift(z, shift, out=scratch)
    scratch.bitwise_and_((1 << (64 - shift)) - 1)
    z.bitwise_xor_(scratch)


def fill_multipliers(out: torch.Tensor, seed: int) -> None:
    """out[j] = odd_multiplier(j, seed) for j in range(len(out)), on out's device (wrapping int64)."""
    scratch = torch.empty_like(out)
    torch.arange(out.numel(), out=out)
    out.add_(to_signed64(seed))
    out.mul_(to_signed64(_GOLDEN))
    _xorshift_right(out, 30, scratch)
    out.mul_(to_signed64(_MIX1))
    _xorshift_right(out, 27, scratch)
    out.mul_(to_signed64(_MIX2))
    _xorshift_right(out, 31, scratch)
    out.bitwise_or_(1)


class BitFingerprinter:
    """Fingerprints a fixed family of tensors (same order, numel and dtype every call) on one device.

    Lane l of a tensor is salt(numel, dtype, l) + sum_i w_i * R_l(i // B) * M_l(i % B) mod 2^64: i runs
    over the tensor's logical (row-major) order, B = BLOCK_NUMEL, w_i is element i's raw bits read as a
    two's-complement integer of the dtype's width (64-bit dtypes folded as w ^ (w >>> 32)), and R_l, M_l
    are odd splitmix64 multipliers. The result depends on neither strides, device nor chunk size.
    """

    def __init__(self, specs: Sequence[TensorSpec | tuple[str, int, torch.dtype]],
                 device: torch.device | str, budget_bytes: int | None = None,
                 chunk_numel: int | None = None, *, canonical_nan: bool = False) -> None:
        """Plan the chunks and build the multipliers and block tables on `device`.

        Args:
            specs: (name, numel, dtype) of each tensor, in the order fingerprint() receives them.
            device: where the tensors live and the fingerprints are computed.
            budget_bytes: device budget; see plan_chunks.
            chunk_numel: explicit chunk size (tests).
            canonical_nan: hash every NaN of a floating-point tensor as its dtype's canonical quiet NaN (CANONICAL_NAN),
                so two tensors with NaNs in the same places and equal bits elsewhere fingerprint equal whatever the
                NaNs' payloads (fp16 steps the loss scaler skips: kernels leave different payloads). The chunk is
                planned with its temporaries (plan_chunks), so the call stays within the budget.
        """
        self.canonical_nan = canonical_nan
        self._canon: dict[torch.dtype, torch.Tensor] = {}
        self.specs = tuple(s if isinstance(s, TensorSpec) else TensorSpec(*s) for s in specs)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # "cuda" means the current device; tensors report it with its index (cuda:0).
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.plan = plan_chunks(self.specs, budget_bytes=budget_bytes, chunk_numel=chunk_numel,
                                canonical_nan=canonical_nan)
        ends = list(itertools.accumulate(_blocks(spec.numel) for spec in self.specs))
        block_mults = [[to_signed64(block_multiplier(b, lane)) for spec in self.specs
                        for b in range(_blocks(spec.numel))] for lane in range(NUM_LANES)]
        salts = [[to_signed64(salt(s.numel, s.dtype, lane)) for lane in range(NUM_LANES)] for s in self.specs]
        self._bounds = torch.tensor([[0, *ends][:-1], ends], dtype=torch.int64, device=self.device)
        self._block_mult = torch.tensor(block_mults, dtype=torch.int64, device=self.device)
        self._salt = torch.tensor(salts, dtype=torch.int64, device=self.device).view(-1, NUM_LANES)
        self._mults = torch.empty((NUM_LANES, BLOCK_NUMEL), dtype=torch.int64, device=self.device)
        for lane in range(NUM_LANES):
            fill_multipliers(self._mults[lane], _LANE_SEEDS[lane])

    @property
    def peak_extra_bytes(self) -> int:
        """Peak device bytes held by the fingerprinter during a call (computed, not measured): plan.extra_bytes,
        which counts the canonical-NaN temporaries where canonical_nan is on."""
        return self.plan.extra_bytes

    def _check(self, tensors: Sequence[torch.Tensor]) -> None:
        if len(tensors) != len(self.specs):
            raise BitprintError(f"tensors: got {len(tensors)}, expected {len(self.specs)} (the layout)")
        for spec, tensor in zip(self.specs, tensors, strict=True):
            if tensor.numel() != spec.numel or tensor.dtype != spec.dtype or tensor.device != self.device:
                raise BitprintError(f"tensor {spec.name!r}: got numel {tensor.numel()} {tensor.dtype} on "
                                    f"{tensor.device}, expected numel {spec.numel} {spec.dtype} on {self.device}")

    def fingerprint(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """[num_tensors, 2] int64 lanes of `tensors`, on the device; no host synchronisation.

        Args:
            tensors: one tensor per spec, same order; any strides (a non-contiguous tensor is gathered
                one chunk at a time with torch.take, never copied whole).

        Returns:
            Lanes 0 and 1 of each tensor, row i for tensor i; copy it to the host with host_lanes.

        Raises:
            BitprintError: a tensor's numel, dtype or device differs from the layout.
        """
        self._check(tensors)
        chunk_blocks = self.plan.chunk_numel // BLOCK_NUMEL
        prods = torch.empty((NUM_LANES, chunk_blocks, BLOCK_NUMEL), dtype=torch.int64, device=self.device)
        sums = torch.zeros((NUM_LANES, self.plan.num_blocks), dtype=torch.int64, device=self.device)
        row = 0
        with torch.no_grad():
            for tensor in tensors:
                row = self._reduce_tensor(tensor, prods, sums, row)
            sums.mul_(self._block_mult)
            # Per-tensor totals as differences of running sums: deterministic (no atomics) and exact
            # mod 2^64, since int64 cumsum and subtraction wrap like the rest.
            running = torch.zeros((NUM_LANES, self.plan.num_blocks + 1), dtype=torch.int64, device=self.device)
            torch.cumsum(sums, dim=1, out=running[:, 1:])
            totals = running.index_select(1, self._bounds[1]) - running.index_select(1, self._bounds[0])
            return (totals.t() + self._salt).contiguous()

    def _reduce_tensor(self, tensor: torch.Tensor, prods: torch.Tensor, sums: torch.Tensor, row: int) -> int:
        """Write the tensor's block sums into sums[:, row:], return the next free block row."""
        int_dtype = _INT_VIEW[tensor.dtype][0]
        bits = tensor.view(int_dtype)
        flat = bits.view(-1) if bits.is_contiguous() else None
        numel = tensor.numel()
        for start in range(0, numel, self.plan.chunk_numel):
            stop = min(start + self.plan.chunk_numel, numel)
            if flat is not None:
                words = flat[start:stop]
            else:
                index = prods[0].view(-1)[:stop - start]
                torch.arange(start, stop, out=index)
                words = torch.take(bits, index)
            if self.canonical_nan and tensor.is_floating_point():
                values = tensor.reshape(-1)[start:stop] if flat is not None else torch.take(tensor, index)
                words = torch.where(torch.isnan(values), self._canonical(tensor.dtype, int_dtype), words)
            if int_dtype == torch.int64:
                words = _fold64(words, prods[1].view(-1)[:stop - start], copy=flat is not None)
            row = self._reduce_chunk(words, prods, sums, row)
        return row + 1 if numel == 0 else row

    def _canonical(self, dtype: torch.dtype, int_dtype: torch.dtype) -> torch.Tensor:
        word = self._canon.get(dtype)
        if word is None:
            word = self._canon[dtype] = torch.tensor(_signed(CANONICAL_NAN[dtype], int_dtype), dtype=int_dtype,
                                                     device=self.device)
        return word

    def _reduce_chunk(self, words: torch.Tensor, prods: torch.Tensor, sums: torch.Tensor, row: int) -> int:
        num_full = words.numel() // BLOCK_NUMEL
        if num_full:
            full = words[:num_full * BLOCK_NUMEL].view(num_full, BLOCK_NUMEL)
            torch.mul(full.unsqueeze(0), self._mults.unsqueeze(1), out=prods[:, :num_full])
            torch.sum(prods[:, :num_full], dim=2, out=sums[:, row:row + num_full])
            row += num_full
        tail = words.numel() - num_full * BLOCK_NUMEL
        if tail:
            torch.mul(words[num_full * BLOCK_NUMEL:].unsqueeze(0), self._mults[:, :tail], out=prods[:, 0, :tail])
            torch.sum(prods[:, 0, :tail], dim=1, out=sums[:, row])
            row += 1
        return row


CANONICAL_NAN: dict[torch.dtype, int] = {torch.float64: 0x7FF8000000000000, torch.float32: 0x7FC00000,
                                         torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}
"""The raw bits every NaN hashes as with canonical_nan (the positive quiet NaN with an empty payload)."""


def _signed(bits: int, int_dtype: torch.dtype) -> int:
    width = torch.iinfo(int_dtype).bits
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def _fold64(words: torch.Tensor, scratch: torch.Tensor, copy: bool) -> torch.Tensor:
    # w ^ (w >>> 32) is a bijection that copies the high half into the low half, so a difference
    # confined to high bits (a float64 sign flip) still reaches the low bits (see docs/fingerprints.md).
    folded = words.clone() if copy else words
    torch.bitwise_right_shift(folded, 32, out=scratch)
    scratch.bitwise_and_(0xFFFFFFFF)
    folded.bitwise_xor_(scratch)
    return folded


def reference_lanes(tensor: torch.Tensor, *, canonical_nan: bool = False) -> tuple[int, int]:
    """The two unsigned lanes of one tensor by the defining formula on Python ints (slow; small tensors).

    This is the specification BitFingerprinter must match bit for bit on every device (canonical_nan: every NaN
    read as CANONICAL_NAN).
    """
    int_dtype = _INT_VIEW[tensor.dtype][0]
    flat = tensor.detach().cpu().contiguous()
    words = flat.view(int_dtype).reshape(-1).tolist()
    if canonical_nan and tensor.is_floating_point():
        canon = _signed(CANONICAL_NAN[tensor.dtype], int_dtype)
        words = [canon if nan else w for w, nan in zip(words, torch.isnan(flat).reshape(-1).tolist(), strict=True)]
    lanes = []
    for lane in range(NUM_LANES):
        total = salt(tensor.numel(), tensor.dtype, lane)
        for i, word in enumerate(words):
            if int_dtype == torch.int64:
                word = (word & _MASK64) ^ ((word & _MASK64) >> 32)
            mult = block_multiplier(i // BLOCK_NUMEL, lane) * odd_multiplier(i % BLOCK_NUMEL, _LANE_SEEDS[lane])
            total += word * mult
        lanes.append(total & _MASK64)
    return lanes[0], lanes[1]


def host_lanes(fingerprints: torch.Tensor) -> list[tuple[int, int]]:
    """Copy a [num_tensors, 2] fingerprint tensor to the host (one synchronisation) as unsigned ints."""
    return [(to_unsigned64(a), to_unsigned64(b)) for a, b in fingerprints.cpu().tolist()]


__all__ = [
    "BLOCK_NUMEL",
    "BYTES_PER_CHUNK_ELEMENT",
    "BitFingerprinter",
    "BitprintError",
    "CANONICAL_NAN",
    "CANONICAL_NAN_MASK_BYTES",
    "ChunkPlan",
    "MAX_CHUNKS",
    "NUM_LANES",
    "TensorSpec",
    "block_multiplier",
    "canonical_nan_bytes",
    "fill_multipliers",
    "decode_step",
    "differing_tensors",
    "encode_step",
    "family_digest",
    "host_lanes",
    "odd_multiplier",
    "plan_chunks",
    "reference_lanes",
    "salt",
    "splitmix64",
    "to_signed64",
    "to_unsigned64",
]
