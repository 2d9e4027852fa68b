"""Line-oriented check output for editors and CI: `concise` (`path:line:col: GDxxx message`, as
ruff, flake8 and mypy print) and `github` (workflow commands that annotate the pull request).

Positions come from the findings' `path:line` locations; the column is where the key (run file)
or the flag (launch-line file) starts on that line.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphdoctor.rules.batch import BatchReport, CheckInput
    from graphdoctor.rules.finding import Finding

_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


@dataclass(frozen=True, slots=True)
class Position:
    """Where a finding is shown: a file (or `<megatron-args>`), 1-based line and column."""

    path: str
    line: int
    column: int
    in_file: bool
    """True when `path` is a file on disk (SARIF and annotations can point at it)."""


@lru_cache(maxsize=256)
def _lines(path: str) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):  # the location is not a readable file: column 1
        return ()


def _needles(finding: Finding) -> list[str]:
    """Texts whose first occurrence on the line is the column: the flag, then the bare key."""
    from graphdoctor.rules.megatron_args import FLAGS

    by_key = {f"{section}.{key}": flag for flag, (section, key, _) in FLAGS.items()}
    needles: list[str] = []
    for name in finding.fields:
        if name in by_key:
            needles.append(by_key[name])
        needles.append(name.partition(".")[2] or name)
    return needles


def _column(text: str, finding: Finding) -> int:
    for needle in _needles(finding):
        index = text.find(needle)
        if index >= 0:
            return index + 1
    stripped = len(text) - len(text.lstrip())
    return stripped + 1


def locate(check_input: CheckInput, finding: Finding) -> Position:
    """The position of a finding: its first `path:line` location, else line 1 of its input."""
    from graphdoctor.rules.batch import INLINE_LABEL
    from graphdoctor.rules.suppression import split_location

    for location in finding.locations:
        parsed = split_location(location)
        if parsed is None:
            continue
        path, line = parsed
        lines = _lines(path)
        column = _column(lines[line - 1], finding) if 0 < line <= len(lines) else 1
        return Position(path, line, column, True)
    label = check_input.label
    if label == INLINE_LABEL:
        text = check_input.megatron_args or ""
        return Position(label, 1, _column(text, finding) if finding.locations else 1, False)
    return Position(label, 1, 1, Path(label).is_file())


def _summary(report: BatchReport) -> str:
    counts = report.counts()
    total = sum(counts.values())
    text = (f"Found {total} finding(s) ({counts['error']} error, {counts['warning']} warning, {counts['info']} info) "
            f"in {len(report.results)} input(s)")
    if report.num_input_errors:
        text += f"; {report.num_input_errors} input(s) could not be checked"
    return text + "."


def render_concise(report: BatchReport) -> str:
    """One `path:line:col: GDxxx message` line per finding, then a summary line."""
    lines = []
    for check_input, finding in report.findings():
        pos = locate(check_input, finding)
        lines.append(f"{pos.path}:{pos.line}:{pos.column}: {finding.code} {finding.message}")
    for result in report.results:
        if result.error is not None:
            lines.append(f"{result.input.label}:1:1: error: {result.error}")
    lines.append(_summary(report))
    return "\n".join(lines) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: BatchReport) -> str:
    """GitHub Actions workflow commands: `::error file=...,line=...,col=...,title=...::message`."""
    lines = []
    for check_input, finding in report.findings():
        pos = locate(check_input, finding)
        props = [f"file={_escape_property(pos.path)}", f"line={pos.line}", f"col={pos.column}"] if pos.in_file else []
        props.append(f"title={_escape_property(f'{finding.code} {finding.name}')}")
        message = finding.message + (f"\nfix: {finding.fix}" if finding.fix else "")
        lines.append(f"::{_GITHUB_LEVEL[finding.severity.value]} {','.join(props)}::{_escape_data(message)}")
    for result in report.results:
        if result.error is not None:
            path = result.input.label
            prop_text = f"file={_escape_property(path)},title=graphdoctor input error" if Path(path).is_file() \
                else "title=graphdoctor input error"
            lines.append(f"::error {prop_text}::{_escape_data(result.error)}")
        line = result.report.not_checked_line() if result.report is not None else None
        if line:
            path = result.input.label
            where = f"file={_escape_property(path)}," if Path(path).is_file() else ""
            lines.append(f"::notice {where}title=graphdoctor not checked::{_escape_data(line)}")
    lines.append(_summary(report))
    return "\n".join(lines) + "\n"


__all__ = ["Position", "locate", "render_concise", "render_github"]
