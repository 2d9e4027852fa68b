"""Fingerprint lanes on the host: comparing, encoding and digesting them. Pure Python, no torch, so
the parent compares two runs' fingerprints without importing torch (graphdoctor.compare.bitprint
computes them on the device and re-exports these helpers)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from graphdoctor.errors import GraphDoctorError

NUM_LANES = 2
"""64-bit hash lanes per tensor."""

_MASK64 = (1 << 64) - 1


class BitprintError(GraphDoctorError, ValueError):
    """Tensors handed to a fingerprinter do not match its layout, or fingerprints cannot be compared."""


def to_unsigned64(value: int) -> int:
    """An int64 lane read back from torch, as its unsigned 64-bit value."""
    return value & _MASK64


def differing_tensors(first: Sequence[Sequence[int]], second: Sequence[Sequence[int]]) -> list[int]:
    """Indices of the tensors whose lanes differ (lanes compared mod 2^64, signed or unsigned alike).

    Raises:
        BitprintError: the two steps have different numbers of tensors or lanes.
    """
    if len(first) != len(second):
        raise BitprintError(f"fingerprints: got {len(first)} and {len(second)} tensors, expected equal counts")
    out: list[int] = []
    for index, (a, b) in enumerate(zip(first, second, strict=True)):
        if len(a) != NUM_LANES or len(b) != NUM_LANES:
            raise BitprintError(f"fingerprint {index}: got {len(a)} and {len(b)} lanes, expected {NUM_LANES}")
        if any(to_unsigned64(x) != to_unsigned64(y) for x, y in zip(a, b, strict=True)):
            out.append(index)
    return out


def encode_step(lanes: Sequence[Sequence[int]]) -> list[str]:
    """JSON-friendly form of one step's fingerprints: one 32-hex-digit string (lane 0, lane 1) per tensor."""
    return [f"{to_unsigned64(a):016x}{to_unsigned64(b):016x}" for a, b in lanes]


def decode_step(encoded: Sequence[str]) -> list[tuple[int, int]]:
    """Inverse of encode_step.

    Raises:
        BitprintError: an entry is not 32 hexadecimal digits.
    """
    out: list[tuple[int, int]] = []
    for index, text in enumerate(encoded):
        try:
            if len(text) != 32:
                raise ValueError(text)
            out.append((int(text[:16], 16), int(text[16:], 16)))
        except ValueError:
            raise BitprintError(f"fingerprint {index}: got {text!r}, expected 32 hexadecimal digits") from None
    return out


def family_digest(lanes: Sequence[Sequence[int]]) -> int:
    """One unsigned 64-bit value for a whole family and step (blake2b of the ordered lanes), for reports."""
    packed = b"".join(struct.pack("<QQ", to_unsigned64(a), to_unsigned64(b)) for a, b in lanes)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little")


def pairs(flat: Sequence[int]) -> list[tuple[int, int]]:
    """(lane 0, lane 1) per tensor from lanes stored flat (tensor 0 lane 0, tensor 0 lane 1, ...)."""
    if len(flat) % NUM_LANES:
        raise BitprintError(f"fingerprints: got {len(flat)} lanes, expected a multiple of {NUM_LANES}")
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), NUM_LANES)]


__all__ = ["NUM_LANES", "BitprintError", "decode_step", "differing_tensors", "encode_step", "family_digest",
           "pairs", "to_unsigned64"]
