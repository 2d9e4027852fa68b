"""The default `check` text: one block per finding, as ruff's full format writes them.

    error[GD131] megatron-refuses-line: Megatron-LM's validate_args refuses the line: ...
      --> launch.sh:12
       |
    12 |   --enable-cuda-graph \\
       |
      = settings: cuda_graph_impl, enable_cuda_graph
      = fix: Change the settings Megatron-LM's message names

The source line is read from the input file the location names (inputs are at most a few MiB; a line is cut at
MAX_SOURCE_CHARS). Long messages wrap at the terminal width with the block's indent; paths are never split.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from graphdoctor.report.table import terminal_width

if TYPE_CHECKING:
    from graphdoctor.rules.engine import CheckReport
    from graphdoctor.rules.finding import Finding

MAX_SOURCE_CHARS = 160
MAX_SOURCE_BYTES = 4 << 20
INTERNAL_FIELDS = ("megatron_line", "flag.")
"""Hit fields that name no setting (Megatron's reading of the whole line, one flag): not listed as settings."""


@lru_cache(maxsize=64)
def _source_lines(path: str) -> tuple[str, ...]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError:
        return ()
    if len(data) > MAX_SOURCE_BYTES:
        return ()
    return tuple(data.decode("utf-8", "replace").splitlines())


def _split(location: str) -> tuple[str, int | None]:
    path, _, line = location.rpartition(":")
    if path and line.isdigit():
        head, _, inner = path.rpartition(":")
        if head and inner.isdigit():  # path:line:col
            return head, int(inner)
        return path, int(line)
    return location, None


def _wrapped(prefix: str, text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(text, width=max(40, width), initial_indent=prefix, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [prefix.rstrip()]


def _settings(fields: Sequence[str]) -> list[str]:
    return [f.removeprefix("transformer.") for f in fields if not f.startswith(INTERNAL_FIELDS)]


def finding_block(finding: Finding, width: int | None = None) -> list[str]:
    """The lines of one finding."""
    width = width or terminal_width()
    lines = _wrapped(f"{finding.severity.value}[{finding.code}] {finding.name}: ", finding.message, width, "    ")
    if finding.locations:
        first, *rest = finding.locations
        path, number = _split(first)
        lines.append(f"  --> {first}")
        source = _source_lines(path) if number is not None else ()
        if number is not None and 0 < number <= len(source):
            text = source[number - 1].rstrip()
            text = text if len(text) <= MAX_SOURCE_CHARS else text[:MAX_SOURCE_CHARS - 3] + "..."
            gutter = " " * len(str(number))
            lines.extend([f"{gutter} |", f"{number} | {text}", f"{gutter} |"])
        if rest:
            lines.extend(_wrapped("  = also at: ", ", ".join(rest), width, "      "))
    settings = _settings(finding.fields)
    if settings:
        lines.extend(_wrapped("  = settings: ", ", ".join(settings), width, "      "))
    if finding.fix:
        lines.extend(_wrapped("  = fix: ", finding.fix, width, "      "))
    return lines


def report_blocks(report: CheckReport, width: int | None = None) -> list[str]:
    """Every finding's block, a blank line after each (`No findings.` without any)."""
    if not report.findings:
        return ["No findings."]
    lines: list[str] = []
    for finding in report.findings:
        lines.extend(finding_block(finding, width))
        lines.append("")
    return lines


def note_lines(notes: Sequence[str], width: int | None = None, prefix: str = "note: ") -> list[str]:
    """Notes wrapped at the terminal width, each under its `note:`."""
    width = width or terminal_width()
    return [line for note in notes for line in _wrapped(prefix, note, width, " " * len(prefix))]


__all__ = ["MAX_SOURCE_CHARS", "finding_block", "note_lines", "report_blocks"]
