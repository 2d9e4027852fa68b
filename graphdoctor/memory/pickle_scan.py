"""Opcode pre-scan of a snapshot pickle before the C unpickler sees it.

The no-globals unpickler cannot run code, but two opcodes still cost memory out of proportion to the
file: PUT / LONG_BINPUT with a huge memo index (the C unpickler sizes its memo table to twice the
index: 9 bytes of pickle, 4 GiB of memory). The scan walks the opcodes (skipping string and bytes
payloads) and refuses a memo index beyond the number of values memoized so far.
"""

from __future__ import annotations

from graphdoctor.errors import InputFileError

MEMO_INDEX_SLACK = 1024
"""A memo index may run ahead of the values memoized so far by this much (picklers number sequentially)."""

# Argument layout per opcode byte: >= 0 fixed argument bytes; the negative codes are handled below.
_LEN1, _LEN4, _LEN8, _LINE, _TWO_LINES, _MEMO, _MEMO4, _UNKNOWN = -1, -4, -8, -10, -11, -20, -21, -99
_ARGS = [_UNKNOWN] * 256
for _op in b"(.0123NRb}el]asutd)oQ":
    _ARGS[_op] = 0
for _op in (0x88, 0x89, 0x85, 0x86, 0x87, 0x81, 0x92, 0x93, 0x94, 0x8F, 0x90, 0x91, 0x97, 0x98):
    _ARGS[_op] = 0
for _op in b"Khq":
    _ARGS[_op] = 1
_ARGS[0x80] = _ARGS[0x82] = 1
_ARGS[ord("M")] = _ARGS[0x83] = 2
for _op in b"Jjr":
    _ARGS[_op] = 4
_ARGS[0x84] = 4
_ARGS[ord("G")] = _ARGS[0x95] = 8
for _op in (ord("U"), ord("C"), 0x8C, 0x8A):
    _ARGS[_op] = _LEN1
for _op in (ord("T"), ord("B"), ord("X"), 0x8B):
    _ARGS[_op] = _LEN4
for _op in (0x8E, 0x8D, 0x96):
    _ARGS[_op] = _LEN8
for _op in b"ILFSVpgP":
    _ARGS[_op] = _LINE
_ARGS[ord("c")] = _ARGS[ord("i")] = _TWO_LINES
_ARGS[0x94] = _ARGS[ord("q")] = _MEMO
_ARGS[ord("r")] = _MEMO4
_ARGS[ord(".")] = _UNKNOWN  # STOP ends the scan
_ARGS_TABLE = tuple(_ARGS)
_MEMOIZE, _PUT = 0x94, ord("p")


def scan_memo_indices(data: bytes, where: str) -> None:
    """Refuse a pickle whose PUT/LONG_BINPUT memo index runs ahead of the values memoized so far.

    Stops at STOP or at the first byte that is no opcode (the unpickler then reports the error).

    Raises:
        InputFileError: a memo index that would make the unpickler allocate a huge memo table.
    """
    args = _ARGS_TABLE
    end = len(data)
    i = 0
    num_memoized = 0
    while i < end:
        n = args[data[i]]
        if n >= 0:
            i += 1 + n
        elif n == _LEN1:
            i += 2 + (data[i + 1] if i + 1 < end else 0)
        elif n == _MEMO:
            num_memoized += 1
            i += 1 if data[i] == _MEMOIZE else 2
        elif n == _LEN4 or n == _LEN8:
            width = -n
            length = int.from_bytes(data[i + 1:i + 1 + width], "little")
            if i + 1 + width + length > end:
                # the C unpickler allocates the whole length before reading: 9 bytes could ask for exabytes
                raise InputFileError(f"{where}: a {length}-byte string or bytes value runs past the end of the data "
                                     "(truncated or corrupt pickle)")
            i += 1 + width + length
        elif n == _MEMO4:
            _check_index(int.from_bytes(data[i + 1:i + 5], "little"), num_memoized, where)
            num_memoized += 1
            i += 5
        elif n == _LINE or n == _TWO_LINES:
            op = data[i]
            i = _skip_lines(data, i, 1 if n == _LINE else 2, op, num_memoized, where)
            num_memoized += op == _PUT
        else:
            return


def _skip_lines(data: bytes, i: int, num_lines: int, op: int, num_memoized: int, where: str) -> int:
    start = i + 1
    for _ in range(num_lines):
        newline = data.find(b"\n", start)
        if newline < 0:
            return len(data)
        if op == _PUT:
            text = data[start:newline].strip()
            _check_index(int(text) if text.isdigit() and len(text) < 20 else 1 << 62, num_memoized, where)
        start = newline + 1
    return start


def _check_index(index: int, num_memoized: int, where: str) -> None:
    if index > num_memoized + MEMO_INDEX_SLACK:
        raise InputFileError(
            f"{where}: memo index {index} after {num_memoized} memoized values; not a pickle any "
            "pickler writes (it would make the unpickler allocate a memo table of that size)")


__all__ = ["MEMO_INDEX_SLACK", "scan_memo_indices"]
