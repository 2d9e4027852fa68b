"""Tables that fit the terminal: prose columns wrap at word boundaries, token columns (paths,
keys, `file:line`) put one token per line and are never broken, whatever the width.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping, Sequence

from tabulate import tabulate

MIN_PROSE_WIDTH = 20
_GAP = 2  # tabulate "simple" puts two spaces between columns


def terminal_width(default: int = 200) -> int:
    """Columns of the terminal ($COLUMNS first); `default` when output is not a terminal (pipes, CI logs)."""
    return shutil.get_terminal_size(fallback=(default, 24)).columns


def _wrap(text: str, width: int) -> str:
    out: list[str] = []
    for paragraph in text.splitlines() or [""]:
        out.extend(textwrap.wrap(paragraph, width, break_long_words=False, break_on_hyphens=False) or [""])
    return "\n".join(out)


def _cell_width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def fit_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, prose: Sequence[int],
              width: int | None = None) -> str:
    """A `simple` table at most `width` columns wide where it can be.

    Args:
        headers: column titles.
        rows: cells; in non-prose columns a newline separates tokens that must stay whole.
        prose: indexes of the columns that may wrap between words (they share the width left).
        width: the target width (default: the terminal's).

    Returns:
        The table text (wider than `width` only when the unbreakable columns alone are wider).
    """
    width = width or terminal_width()
    fixed = [i for i in range(len(headers)) if i not in prose]
    fixed_width = sum(max([len(headers[i]), *(_cell_width(r[i]) for r in rows)]) for i in fixed)
    left = width - fixed_width - _GAP * (len(headers) - 1)
    natural = {i: max([len(headers[i]), *(_cell_width(r[i]) for r in rows)]) for i in prose}
    longest_word = {i: max([len(w) for r in rows for w in r[i].split()] or [0]) for i in prose}
    share = max(MIN_PROSE_WIDTH, left // max(len(prose), 1))
    widths = {i: min(natural[i], max(share, longest_word[i])) for i in prose}
    spare = left - sum(widths.values())
    for i in prose:  # give what short columns leave to the long ones
        extra = min(max(spare, 0), natural[i] - widths[i])
        widths[i] += extra
        spare -= extra
    cells = [[_wrap(c, widths[i]) if i in prose else c for i, c in enumerate(row)] for row in rows]
    return tabulate(cells, list(headers), tablefmt="simple", disable_numparse=True)


def markdown_cell(value: object) -> str:
    """One Markdown table cell: `-` for None, two decimals for a float, else str()."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """A Markdown table as docs/ carries the benchmark scripts' tables (docs/moe.md, docs/multi-gpu.md):
    `| a | b |`, `|---|---|`, then one line per row (row[column] for each column, markdown_cell)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(markdown_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


__all__ = ["MIN_PROSE_WIDTH", "fit_table", "markdown_cell", "markdown_table", "terminal_width"]
