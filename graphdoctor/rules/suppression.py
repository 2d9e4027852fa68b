"""Inline suppression: `# graphdoctor: ignore[GD201]` on a run-file or launch-line line, and
`# noqa: GD501` (or the graphdoctor comment) on a Python line that a probe finding points at.

A finding is suppressed when one of its `path:line` locations carries a comment naming its code
(or a prefix of it); a bare `# graphdoctor: ignore` suppresses every code on that line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from graphdoctor.rules.finding import Finding

_IGNORE = re.compile(r"#\s*graphdoctor:\s*ignore(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)
_NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.IGNORECASE)
ALL_CODES = "*"


@lru_cache(maxsize=256)
def _file_lines(path: str) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):  # not a readable text file: nothing is suppressed there
        return ()


def suppressed_codes(line: str) -> set[str]:
    """Codes (or prefixes) a line's comment suppresses; {"*"} for a bare `# graphdoctor: ignore`."""
    out: set[str] = set()
    match = _IGNORE.search(line)
    if match is not None:
        codes = match.group("codes")
        if codes is None:
            out.add(ALL_CODES)
        else:
            out.update(c.strip().upper() for c in codes.split(",") if c.strip())
    noqa = _NOQA.search(line)
    if noqa is not None:
        out.update(c.upper() for c in re.split(r"[\s,]+", noqa.group("codes")) if c.upper().startswith("GD"))
    return out


def split_location(location: str) -> tuple[str, int] | None:
    """`path:line` -> (path, line); None for anything else (`--flag`)."""
    path, _, line = location.rpartition(":")
    return (path, int(line)) if path and line.isdigit() else None


def is_suppressed(finding: Finding) -> bool:
    """True when a location of the finding has a comment that suppresses its code."""
    for location in finding.locations:
        parsed = split_location(location)
        if parsed is None:
            continue
        lines = _file_lines(parsed[0])
        if not 0 < parsed[1] <= len(lines):
            continue
        codes = suppressed_codes(lines[parsed[1] - 1])
        if ALL_CODES in codes or any(finding.code.startswith(c) for c in codes):
            return True
    return False


def partition(findings: Iterable[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(kept, suppressed) findings."""
    kept: list[Finding] = []
    dropped: list[Finding] = []
    for finding in findings:
        (dropped if is_suppressed(finding) else kept).append(finding)
    return kept, dropped


__all__ = ["ALL_CODES", "is_suppressed", "partition", "split_location", "suppressed_codes"]
