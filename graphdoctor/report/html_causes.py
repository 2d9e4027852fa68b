"""The causes table of an implementation card, and names that wrap only between their parts.

Causes of one line seen in several layers fold into one row with a count. Module names, paths and
holder paths get a line-break opportunity (<wbr>) after each "." or "/" so a narrow card wraps them
between parts, never inside one; the table stacks its rows when the card is narrow (html_page.CSS).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from graphdoctor.compare.cause import Cause

_LAYER_INDEX = re.compile(r"(?<=\blayers\.)\d+(?=\.|$)")
"""The layer index of a Megatron module name (decoder.layers.3.mlp -> 3)."""

_AFTER_SLASH = re.compile(r"(?<=[^\s/]/)(?=[^/])")
"""After a "/" that ends a path part (not a leading "/")."""

_AFTER_DOT = re.compile(r"(?<=\.)(?=[A-Za-z_\[])")
"""After a dot that starts a name part: not inside a number (0.122) or an ellipsis."""

_AFTER_UNDERSCORE = re.compile(r"(?<=[A-Za-z0-9]_)(?=[A-Za-z0-9])")
"""After an underscore between two word characters (only inside a part longer than MAX_PART_CHARS)."""

MAX_PART_CHARS = 24
"""A name part longer than this (a long snake_case file name) may also break after its underscores."""

MAX_PATH_PARTS = 3
"""An absolute path shows its last this many parts (the whole path is the cell's hover title)."""

_INSTALL_MARKERS = ("site-packages/", "dist-packages/")


def breakable(text: str, *, path: bool = False) -> str:
    """Escaped text with a line-break opportunity after each "/" and each "." that starts a name part.

    Prose keeps its spaces as break points; a word that is a dotted name or a path
    (optimizer.chained_optimizers[0].grad_scaler._scale) may break between its parts, and a part
    longer than MAX_PART_CHARS after an underscore. Numbers (0.122) are never split.

    Args:
        text: plain text (a name, a path or prose).
        path: a file path: break after "/" only, keeping `name.py:12` whole.

    Returns:
        HTML (escaped, with <wbr> elements).
    """
    out = []
    for token in re.split(r"(\s+)", text):
        parts = _AFTER_SLASH.split(token)
        if not path:
            parts = [piece for part in parts for piece in _AFTER_DOT.split(part)]
        parts = [piece for part in parts
                 for piece in (_AFTER_UNDERSCORE.split(part) if len(part) > MAX_PART_CHARS else (part,))]
        out.append("<wbr>".join(escape(p) for p in parts))
    return "".join(out)


def display_path(location: str) -> str:
    """A recorded file:line as shown in a card: package-relative for installed code, else an absolute
    path's last MAX_PATH_PARTS parts after ".../" (the full one goes in the hover title)."""
    for marker in _INSTALL_MARKERS:
        if marker in location:
            return location.split(marker, 1)[1]
    parts = location.split("/")
    if location.startswith("/") and len(parts) > MAX_PATH_PARTS + 1:
        return "\u2026/" + "/".join(parts[-MAX_PATH_PARTS:])
    return location


def name_html(text: str, *, path: bool = False, title: str | None = None) -> str:
    """A monospace name that wraps between its parts; `title` (the full name) shows on hover."""
    hover = f' title="{escape(title)}"' if title else ""
    return f'<span class="nm"{hover}>{breakable(text, path=path)}</span>'


def location_html(location: str) -> str:
    """A file:line, shortened for display (display_path) with the recorded one as its hover title."""
    return name_html(display_path(location), path=True, title=location)


@dataclass(frozen=True, slots=True)
class CauseRow:
    """One row of the causes table: one cause, or one line's cause folded over several layers."""

    rule: str
    name: str
    module: str
    """The module; with a layer index replaced by "*" when the row folds several layers."""

    location: str | None
    also_at: tuple[str, ...]
    message: str
    """The evidence of the explaining cause (else the first one) of the row."""

    fix: str
    explains: bool
    layers: tuple[int, ...]
    """The layer indexes folded into this row; empty for a single cause."""


def _layer(module: str) -> int | None:
    match = _LAYER_INDEX.search(module)
    return int(match.group()) if match else None


def fold_causes(causes: Sequence[Cause]) -> list[CauseRow]:
    """Causes of the same rule at the same file:line whose modules differ only by their layer index, as
    one row each (decoder.layers.*.mlp over 4 layers); every other cause is its own row.

    The explaining row comes first; the others keep the report's order.

    Args:
        causes: the implementation's causes, as reported.

    Returns:
        The table rows.
    """
    groups: dict[tuple[str, str, str] | int, list[Cause]] = {}
    for i, cause in enumerate(causes):
        layer = _layer(cause.module)
        key: tuple[str, str, str] | int = i if layer is None else (
            cause.rule, cause.location or "", _LAYER_INDEX.sub("*", cause.module, count=1))
        groups.setdefault(key, []).append(cause)
    rows = []
    for members in groups.values():
        layers = sorted({n for n in (_layer(c.module) for c in members) if n is not None})
        if len(members) > 1 and len(layers) == len(members):
            rows.append(_folded(members, tuple(layers)))
        else:
            # One layer seen twice (two subjects at one line) is two causes, not one folded row.
            rows += [_folded([c], ()) for c in members]
    return sorted(rows, key=lambda r: not r.explains)


def _folded(members: Sequence[Cause], layers: tuple[int, ...]) -> CauseRow:
    lead = next((c for c in members if c.explains), members[0])
    module = _LAYER_INDEX.sub("*", lead.module, count=1) if layers else lead.module
    also_at = tuple(dict.fromkeys(a for c in members for a in c.also_at if a != lead.location))
    return CauseRow(lead.rule, lead.name, module, lead.location, also_at, lead.message, lead.fix,
                    any(c.explains for c in members), layers)


def spans(numbers: Sequence[int]) -> str:
    """Sorted integers as ranges: 0-3, 5, 7-8."""
    out: list[str] = []
    start = prev = None
    for n in [*numbers, None]:
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ", ".join(out)


def _row(row: CauseRow) -> str:
    tag = '<span class="tag">explains</span> ' if row.explains else ""
    rule = f'{tag}<b>{escape(row.rule)}</b> <span class="muted rn">{escape(row.name)}</span>'
    module = name_html(row.module) if row.module else "-"
    if row.layers:
        ranges = ", ".join(f"<i>{r}</i>" for r in spans(row.layers).split(", "))
        module += f' <span class="fold"><b>\u00d7 {len(row.layers)} layers</b> ({ranges})</span>'
    where = location_html(row.location) if row.location else "-"
    if row.also_at:
        where += '<div class="also">also ' + ", ".join(location_html(a) for a in row.also_at) + "</div>"
    evidence = f'<div class="ev">{breakable(row.message)}</div>'
    if row.fix:
        evidence += f'<div class="fix"><b>fix:</b> {breakable(row.fix)}</div>'
    cells = (("rule", rule), ("module", module), ("at", where), ("evidence", evidence))
    # "none" cells ("-") are dropped when the narrow card stacks the row.
    return (f'<tr{" class=hl" if row.explains else ""}>'
            + "".join(f'<td class="c-{k}{" none" if v == "-" else ""}" data-label="{k}">{v}</td>' for k, v in cells)
            + "</tr>")


def causes_table(causes: Sequence[Cause]) -> str:
    """Every cause the run's evidence names (rule, module, the user's file:line, evidence and fix), the one
    that explains the difference first and marked; one line's causes across layers fold into one row.

    Returns:
        The <div class="causes"> block ("" when there is no cause).
    """
    if not causes:
        return ""
    rows = fold_causes(causes)
    head = "".join(f"<th>{h}</th>" for h in ("rule", "module", "at", "evidence and fix"))
    return (f'<div class="causes"><b>causes</b> <span class="muted small">({len(causes)} reported'
            f'{f", {len(rows)} rows" if len(rows) != len(causes) else ""})</span>'
            f'<table class="causes"><thead><tr>{head}</tr></thead><tbody>{"".join(_row(r) for r in rows)}'
            "</tbody></table></div>")


__all__ = ["MAX_PART_CHARS", "MAX_PATH_PARTS", "CauseRow", "breakable", "causes_table", "display_path",
           "fold_causes", "location_html", "name_html", "spans"]
