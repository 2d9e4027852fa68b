"""A tiny PNG decoder (8-bit RGB/RGBA/grey, non-interlaced) for checking screenshots: zlib plus the
five scanline filters, nothing else.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


@dataclass(frozen=True, slots=True)
class Image:
    """Decoded pixels, one bytes row per scanline."""

    width: int
    height: int
    channels: int
    rows: tuple[bytes, ...]

    def pixel(self, x: int, y: int) -> tuple[int, ...]:
        """The channel values of one pixel."""
        start = x * self.channels
        return tuple(self.rows[y][start:start + self.channels])

    def colours(self, step: int = 1) -> set[bytes]:
        """Distinct pixel values (every step-th pixel of every step-th row)."""
        c = self.channels
        return {row[i:i + c] for row in self.rows[::step] for i in range(0, len(row), c * step)}


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def decode(data: bytes) -> Image:
    """Decode a PNG; raises ValueError on anything but 8-bit non-interlaced RGB(A)/grey."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or interlace or colour_type not in _CHANNELS:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour_type}, interlace {interlace}")
    channels = _CHANNELS[colour_type]
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + _paeth(a, b, c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return Image(width, height, channels, tuple(rows))
