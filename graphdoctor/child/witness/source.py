"""The lines of the user's forwards that the witness points at: where a forward reads `self.<attr>`, and where
it branches on the mode (`self.training`, `torch.is_grad_enabled()`), read from the source with ast."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Container

from graphdoctor.locations import format_location

_MODE_QUERIES = frozenset({"training"})
"""Attributes a forward reads to take a mode-dependent branch."""

_MODE_FUNCTIONS = frozenset({"is_grad_enabled", "is_inference_mode_enabled"})
"""torch functions a forward calls to take a grad-mode-dependent branch."""


@functools.lru_cache(maxsize=256)
def _user_forwards(cls: type) -> tuple[tuple[str, int, ast.AST], ...]:
    """(file, first line, parsed source) of each `forward` in the class's hierarchy that is the user's code."""
    from graphdoctor.child.probe.recorder import is_user_file

    out = []
    for klass in cls.__mro__:
        forward = klass.__dict__.get("forward")
        code = getattr(forward, "__code__", None)
        if forward is None or code is None or not is_user_file(code.co_filename):
            continue
        try:
            lines, first = inspect.getsourcelines(forward)
            out.append((code.co_filename, first, ast.parse(textwrap.dedent("".join(lines)))))
        except (OSError, TypeError, SyntaxError):
            continue
    return tuple(out)


def _lines(cls: type, hit: Callable[[ast.AST], bool]) -> list[str]:
    """`file:line` of every node of the user's forwards of `cls` that `hit` picks, in line order."""
    found = {format_location(filename, first + node.lineno - 1)
             for filename, first, tree in _user_forwards(cls) for node in ast.walk(tree)
             if isinstance(node, ast.expr) and hit(node)}
    return sorted(found, key=lambda loc: (loc.rsplit(":", 1)[0], int(loc.rsplit(":", 1)[1])))


def _reads_self(node: ast.AST, attrs: Container[str]) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in attrs \
        and isinstance(node.value, ast.Name) and node.value.id == "self"


def forward_read_line(cls: type, attr: str) -> str | None:
    """`file:line` of the first line of the user's forward of `cls` (or of an ancestor) that reads
    `self.<attr>`; None when none does."""
    lines = _lines(cls, lambda node: _reads_self(node, (attr,)))
    return lines[0] if lines else None


def mode_query_lines(cls: type) -> list[str]:
    """`file:line` of each mode-dependent test in the user's forward of `cls`: `self.training`,
    `torch.is_grad_enabled()`, `torch.is_inference_mode_enabled()`."""
    return _lines(cls, lambda node: _reads_self(node, _MODE_QUERIES) or (
        isinstance(node, ast.Attribute) and node.attr in _MODE_FUNCTIONS))


__all__ = ["forward_read_line", "mode_query_lines"]
