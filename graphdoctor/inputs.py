"""The one input layer: every file graphdoctor reads goes through here, and every report it writes.

Reading: regular files only (FIFOs, devices and directories are refused by type, opened with
O_NONBLOCK so a FIFO swapped in cannot block), size caps, capped gzip decompression, strict JSON
(no NaN/Infinity), bounded nesting and reference expansion. Writing: atomic (temp file + rename),
never onto an input. See docs/inputs.md for the limits and the flags that raise them.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import reprlib
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from graphdoctor.errors import InputFileError, UsageError

MiB = 1 << 20
GiB = 1 << 30

MAX_TRACE_BYTES = 2 * GiB
"""Default cap on a profiler trace's (decompressed) size; `count --max-bytes` raises it."""
MAX_REPORT_BYTES = 256 * MiB
"""Default cap on a saved JSON report."""
MAX_TEXT_BYTES = 1 * MiB
"""Cap on a run file or a launch-line (@FILE) file: hand-written text, never larger."""
MAX_DEPTH = 64
"""Deepest nesting accepted in a snapshot or a run file (real ones nest fewer than 10 levels)."""
MAX_EXPANDED_NODES_PER_BYTE = 64
"""A loaded object may expand (shared references counted at every use) to at most this many values
per input byte (plus MIN_EXPANDED_NODES); real snapshots stay far below it."""
MIN_EXPANDED_NODES = 1 << 20
MAX_GZIP_RATIO = 64
"""While a size cap is at its default, gzip data may decompress to at most this many times its
compressed size (above GZIP_RATIO_FLOOR): real snapshots and traces compress 10-20x, a
decompression bomb about 1000x. Raising the cap (--max-bytes) lifts this check."""
GZIP_RATIO_FLOOR = 64 * MiB

_GZIP_MAGIC = b"\x1f\x8b"
_READ_CHUNK_BYTES = MiB
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlevel = 2
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4
_repr.maxlong = 40


def describe(value: Any) -> str:
    """A short, escaped repr of a value from a data file, for error messages (never the whole value)."""
    try:
        return _repr.repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"


def type_error(field: str, expected: str, value: Any) -> InputFileError:
    """The typed error of one field: `device_traces[3].size: expected an integer, got 'big'`."""
    return InputFileError(f"{field}: expected {expected}, got {describe(value)}")


def _kind(mode: int) -> str | None:
    for test, name in _KINDS:
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str], what: str) -> Iterator[BinaryIO]:
    """Open a regular file for reading; anything else is refused by its type before a byte is read.

    O_NONBLOCK makes opening a FIFO return at once (instead of waiting for a writer), and fstat on
    the opened descriptor checks the file actually opened, so a FIFO swapped in cannot block.

    Raises:
        InputFileError: missing, not a regular file, or unreadable (`what` names the input).
    """
    name = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:
        raise InputFileError(f"{what} {name}: no such file") from None
    except OSError as exc:
        raise InputFileError(f"{what} {name}: cannot open ({exc.strerror or exc})") from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise InputFileError(f"{what} {name}: not a regular file ({kind})")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def file_size(path: str | os.PathLike[str], what: str) -> int:
    """Size of a regular file in bytes (refused by type like open_regular).

    Raises:
        InputFileError: missing or not a regular file.
    """
    with open_regular(path, what) as handle:
        return os.fstat(handle.fileno()).st_size


def _too_big(what: str, name: str, size: int | str, cap: int, flag: str | None) -> InputFileError:
    hint = f" (raise it with {flag} if the file is trusted)" if flag else ""
    return InputFileError(f"{what} {name}: {size} bytes exceeds the cap of {cap} bytes{hint}")


def gzip_cap(compressed_bytes: int, max_bytes: int, max_ratio: float | None) -> int:
    """The decompressed-size cap for gzip data of compressed_bytes (see MAX_GZIP_RATIO)."""
    if max_ratio is None:
        return max_bytes
    return min(max_bytes, max(GZIP_RATIO_FLOOR, int(compressed_bytes * max_ratio)))


def read_bytes(
    path: str | os.PathLike[str], what: str, *, max_bytes: int, flag: str | None = None, gunzip: bool = True,
    max_ratio: float | None = None,
) -> bytes:
    """Read a whole regular file, gunzipping it (by magic bytes) when `gunzip`; both sizes capped.

    Args:
        path: the file.
        what: the input's name in messages (`trace`, `snapshot`, `run file`...).
        max_bytes: cap on the file size and on the decompressed size.
        flag: the option that raises the cap, named in the message.
        gunzip: decompress gzip data (detected from the magic bytes, not the name).
        max_ratio: also cap gzip output at this multiple of the file size (gzip_cap); None: off.

    Raises:
        InputFileError: as open_regular, too large, or a corrupt gzip stream.
    """
    name = os.fspath(path)
    with open_regular(path, what) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            raise _too_big(what, name, size, max_bytes, flag)
        # read(n) allocates n up front: ask for the size fstat gave, then chunks if the file grew
        parts = [handle.read(size + 1)]
        total = len(parts[0])
        while total > size and total <= max_bytes and (chunk := handle.read(min(_READ_CHUNK_BYTES, max_bytes + 1 - total))):
            parts.append(chunk)
            total += len(chunk)
        raw = b"".join(parts) if len(parts) > 1 else parts[0]
    if len(raw) > max_bytes:
        raise _too_big(what, name, f"more than {max_bytes}", max_bytes, flag)
    if gunzip and raw[:2] == _GZIP_MAGIC:
        return gunzip_capped(raw, f"{what} {name}", max_bytes=gzip_cap(len(raw), max_bytes, max_ratio), flag=flag)
    return raw


def gunzip_capped(data: bytes, where: str, *, max_bytes: int, flag: str | None = None) -> bytes:
    """Decompress gzip data, refusing output beyond max_bytes (decompression bombs).

    Raises:
        InputFileError: corrupt or truncated data, or more than max_bytes decompressed.
    """
    chunks: list[bytes] = []
    total = 0
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as stream:
            # chunked, so a bomb is refused holding at most max_bytes
            while chunk := stream.read(min(16 * MiB, max_bytes + 1 - total)):
                total += len(chunk)
                if total > max_bytes:
                    hint = f" (raise it with {flag} if the file is trusted)" if flag else ""
                    raise InputFileError(f"{where}: decompressed size exceeds the cap of {max_bytes} bytes{hint}")
                chunks.append(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputFileError(f"{where}: not a valid gzip file ({exc or 'unexpected end of data'})") from None
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """Read a small UTF-8 text file (run file, launch line) with the regular-file and size checks.

    Raises:
        InputFileError: as read_bytes, or not UTF-8.
    """
    data = read_bytes(path, what, max_bytes=max_bytes, gunzip=False)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {os.fspath(path)}: not UTF-8 text (byte {exc.start})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (strict JSON has no NaN or Infinity)")


def loads_json(data: bytes | str, where: str) -> Any:
    """Strict JSON: NaN, Infinity and -Infinity are refused; nesting is bounded by the decoder.

    Raises:
        InputFileError: not JSON, non-finite constants, or nested too deeply.
    """
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise InputFileError(f"{where}: nested too deeply to be a graphdoctor input") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{where}: not valid JSON ({describe_error(exc)})") from None


def read_json(path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_REPORT_BYTES,
              flag: str | None = None) -> Any:
    """Read a JSON file (plain or gzip) through read_bytes and loads_json.

    Raises:
        InputFileError: as read_bytes and loads_json.
    """
    return loads_json(read_bytes(path, what, max_bytes=max_bytes, flag=flag), f"{what} {os.fspath(path)}")


def describe_error(exc: BaseException) -> str:
    """One short line for a parser's exception (bounded; the CLI escapes control characters)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def check_tree(root: Any, where: str, *, max_nodes: int, max_depth: int = MAX_DEPTH) -> int:
    """Refuse a loaded document that nests too deeply, refers to itself, or expands past max_nodes.

    Shared references (one list referenced from many places, as pickles and YAML aliases allow)
    are counted at every use, since the analysis visits them at every use; each container is
    measured once, so a billion-laughs document is refused in time linear in its size.

    Returns:
        The expanded number of values.

    Raises:
        InputFileError: too deep, cyclic, or too large once expanded.
    """
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[Any, list[Any] | None]] = [(root, None)]
    while stack:
        obj, kids = stack.pop()
        oid = id(obj)
        if kids is not None:
            in_progress.discard(oid)
            _measured(sizes, depths, obj, kids, where, max_nodes, max_depth)
            continue
        if oid in sizes or type(obj) not in _CONTAINERS:
            continue
        if oid in in_progress:
            raise InputFileError(f"{where}: a container contains itself (a reference cycle)")
        # Most containers of a snapshot (frame dicts) hold only leaves: measured without a push.
        kids = [c for c in (obj.values() if type(obj) is dict else obj) if type(c) in _CONTAINERS]
        if not kids:
            _measured(sizes, depths, obj, kids, where, max_nodes, max_depth)
            continue
        in_progress.add(oid)
        if len(in_progress) > max_depth:
            raise InputFileError(f"{where}: nested deeper than {max_depth} levels")
        stack.append((obj, kids))
        stack.extend((c, None) for c in kids)
    return sizes.get(id(root), 1)


_CONTAINERS = frozenset({list, dict, tuple})


def _measured(sizes: dict[int, int], depths: dict[int, int], obj: Any, kids: list[Any], where: str,
              max_nodes: int, max_depth: int) -> None:
    """Record the expanded size and depth of obj once its container children are measured."""
    total = 1 + len(obj) * (2 if type(obj) is dict else 1) - len(kids)
    depth = 1
    for kid in kids:
        total += sizes[id(kid)]
        depth = max(depth, depths[id(kid)] + 1)
    if total > max_nodes:
        raise InputFileError(f"{where}: expands to more than {max_nodes} values (shared references counted at every use)")
    if depth > max_depth:
        raise InputFileError(f"{where}: nested deeper than {max_depth} levels")
    sizes[id(obj)], depths[id(obj)] = total, depth


def expansion_budget(num_bytes: int) -> int:
    """The max_nodes check_tree allows for an input of num_bytes."""
    return MIN_EXPANDED_NODES + MAX_EXPANDED_NODES_PER_BYTE * num_bytes


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output_path(path: str | os.PathLike[str], flag: str, inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """Refuse an output path that is one of the inputs (it would be destroyed before it is read again).

    Raises:
        UsageError: the output is an input.
    """
    name = os.fspath(path)
    if name == "-":
        return
    for source in inputs:
        if source is not None and os.fspath(source) != "-" and _same_file(name, os.fspath(source)):
            raise UsageError(f"{flag}: {name} is an input of this command; refusing to overwrite it")


def write_output(path: str | os.PathLike[str], text: str, *, flag: str = "output",
                 inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Write a report: '-' is stdout; otherwise atomically (a temp file in the same directory, then
    os.replace), never onto one of `inputs`. An existing non-regular target (/dev/null, a terminal)
    is written in place, since replacing it would replace the device node.

    Raises:
        UsageError: the target is an input, or cannot be written.
    """
    name = os.fspath(path)
    if name == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    check_output_path(name, flag, inputs)
    try:
        existing = os.stat(name)
    except OSError:
        existing = None
    try:
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            if stat.S_ISDIR(existing.st_mode):
                raise UsageError(f"{flag}: {name} is a directory, expected a file path")
            _write_in_place(name, text)
            return
        _write_atomic(Path(name), text, existing)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write {name} ({exc.strerror or exc})") from None


def _write_in_place(name: str, text: str) -> None:
    # O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of blocking forever.
    fd = os.open(name, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    os.set_blocking(fd, True)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _write_atomic(target: Path, text: str, existing: os.stat_result | None) -> None:
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, stat.S_IMODE(existing.st_mode) if existing is not None else 0o666 & ~_umask())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


__all__ = [
    "MAX_DEPTH",
    "MAX_GZIP_RATIO",
    "MAX_REPORT_BYTES",
    "MAX_TEXT_BYTES",
    "MAX_TRACE_BYTES",
    "check_output_path",
    "check_tree",
    "describe",
    "describe_error",
    "expansion_budget",
    "file_size",
    "gunzip_capped",
    "gzip_cap",
    "loads_json",
    "open_regular",
    "read_bytes",
    "read_json",
    "read_text",
    "type_error",
]
