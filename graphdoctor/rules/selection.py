"""Which rules a check reports: `--select`, `--ignore`, `--extend-select` (code prefixes such as
GD4 or GD30) and the `[tool.graphdoctor]` table of the project's pyproject.toml.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphdoctor.errors import InputFileError, UsageError

PROJECT_KEYS: tuple[str, ...] = ("select", "ignore", "extend-select", "target", "output-format")
"""Keys `[tool.graphdoctor]` may hold."""


def split_codes(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """`"GD4, GD301"` or `["GD4", "GD301"]` -> `("GD4", "GD301")` (upper-cased, empties dropped)."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else [str(t) for t in text]
    return tuple(item.strip().upper() for item in items if item.strip())


def expand(prefixes: Iterable[str], codes: Sequence[str], option: str) -> set[str]:
    """Codes matching any prefix (`GD4` -> every GD4xx; `ALL` -> every code).

    Raises:
        UsageError: a prefix that matches no code (with the closest code).
    """
    out: set[str] = set()
    for prefix in prefixes:
        if prefix == "ALL":
            out.update(codes)
            continue
        matched = [c for c in codes if c.startswith(prefix)]
        if not matched:
            from graphdoctor.suggest import did_you_mean

            raise UsageError(f"{option}: got {prefix!r}{did_you_mean(prefix, codes)}, expected a rule code "
                             "or prefix such as GD4 or GD301 (see `graphdoctor rules`)")
        out.update(matched)
    return out


@dataclass(frozen=True, slots=True)
class Selection:
    """Rule selection as ruff words it: select (default all), then extend-select adds, ignore removes."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()

    def codes(self, all_codes: Sequence[str]) -> set[str] | None:
        """The selected codes; None when everything is selected (no option given).

        Raises:
            UsageError: a prefix matching no code.
        """
        if not (self.select or self.ignore or self.extend_select):
            return None
        chosen = expand(self.select, all_codes, "--select") if self.select else set(all_codes)
        chosen |= expand(self.extend_select, all_codes, "--extend-select")
        return chosen - expand(self.ignore, all_codes, "--ignore")

    def over(self, base: Selection) -> Selection:
        """This (command-line) selection on top of `base` (pyproject): a given select replaces
        base's select; ignore and extend-select add up."""
        return Selection(select=self.select or base.select, ignore=(*base.ignore, *self.ignore),
                         extend_select=(*base.extend_select, *self.extend_select))


@dataclass(frozen=True, slots=True)
class ProjectSettings:
    """`[tool.graphdoctor]` of the nearest pyproject.toml."""

    path: Path | None = None
    selection: Selection = field(default_factory=Selection)
    target: str | None = None
    output_format: str | None = None


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start`."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_project_settings(start: Path | None = None) -> ProjectSettings:
    """Read `[tool.graphdoctor]` from the nearest pyproject.toml (none: empty settings).

    Raises:
        InputFileError: pyproject.toml is not valid TOML.
        UsageError: an unknown key (with the closest one) or a value of the wrong type.
    """
    path = find_pyproject((start or Path.cwd()).resolve())
    if path is None:
        return ProjectSettings()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputFileError(f"{path}: cannot read [tool.graphdoctor] ({exc})") from None
    table: Any = data.get("tool", {}).get("graphdoctor", {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.graphdoctor] must be a table, got {type(table).__name__}")
    for key in table:
        if key not in PROJECT_KEYS:
            from graphdoctor.suggest import did_you_mean

            raise UsageError(f"{path}: [tool.graphdoctor] {key!r} is not a setting{did_you_mean(key, PROJECT_KEYS)}, "
                             f"expected one of {', '.join(PROJECT_KEYS)}")
    lists = {}
    for key in ("select", "ignore", "extend-select"):
        value = table.get(key, [])
        if not isinstance(value, list | str):
            raise UsageError(f"{path}: [tool.graphdoctor] {key}: got {value!r}, expected a list of codes")
        lists[key] = split_codes(value)
    for key in ("target", "output-format"):
        if key in table and not isinstance(table[key], str):
            raise UsageError(f"{path}: [tool.graphdoctor] {key}: got {table[key]!r}, expected a string")
    selection = Selection(select=lists["select"], ignore=lists["ignore"], extend_select=lists["extend-select"])
    return ProjectSettings(path=path, selection=selection, target=table.get("target"),
                           output_format=table.get("output-format"))


__all__ = ["PROJECT_KEYS", "ProjectSettings", "Selection", "expand", "find_pyproject", "load_project_settings",
           "split_codes"]
