"""Source lines for the holder watch (graphdoctor.child.holders): where captured code reads a name, where the
user's loaded files assign a holder, and which frame made an assignment seen while it ran."""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

from graphdoctor.locations import format_location


def read_line(fn: Any, name: str, owner: str | None = None) -> str | None:
    """`file:line` of the first load of `name` (or `owner.name`) in the source of `fn`."""
    tree, filename, first = _parsed(fn)
    if tree is None:
        return None
    lines = []
    for node in ast.walk(tree):
        if owner is None and isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
        elif owner is not None and isinstance(node, ast.Attribute) and node.attr == name and \
                isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name) and node.value.id == owner:
            lines.append(node.lineno)
    return format_location(filename, first + min(lines) - 1) if lines else None


def _parsed(fn: Any) -> tuple[ast.AST | None, str, int]:
    fn = getattr(fn, "__func__", fn)
    try:
        source, first = inspect.getsourcelines(fn)
        import textwrap

        return ast.parse(textwrap.dedent("".join(source))), fn.__code__.co_filename, first
    except (OSError, TypeError, SyntaxError, AttributeError):
        return None, "", 0


def source_assignments(root: Any, links: tuple[tuple[str, Any], ...]) -> list[str]:
    """`file:line` of each assignment in the user's loaded source files that stores to the holder's last link: a
    global or closure name, a dictionary key, a class attribute."""
    from graphdoctor.child.probe.recorder import is_user_file

    kind, key = links[-1] if links else ("", None)
    name: str | None = None
    if kind == "cell" and isinstance(root, types.FunctionType):
        freevars = root.__code__.co_freevars
        name = freevars[key] if isinstance(key, int) and key < len(freevars) else None
    elif kind in ("item", "attr", "get", "cattr", "global") and isinstance(key, str):
        name = key
    if name is None:
        return []
    owner = root.__name__ if kind == "cattr" and isinstance(root, type) else None
    found: list[str] = []
    for filename in _user_files():
        if not is_user_file(filename):
            continue
        for line in _stores(filename, kind, name, owner):
            found.append(format_location(filename, line))
    return found


def _user_files() -> list[str]:
    from graphdoctor.child.probe.recorder import is_user_file

    out = []
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        if isinstance(filename, str) and filename.endswith(".py") and is_user_file(filename):
            out.append(filename)
    return sorted(set(out))


@functools.lru_cache(maxsize=256)
def _tree(filename: str) -> ast.AST | None:
    try:
        with open(filename, encoding="utf-8") as fh:
            return ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _stores(filename: str, kind: str, name: str, owner: str | None) -> list[int]:
    """Lines of `filename` that assign to the holder: `global NAME` / `nonlocal NAME` then `NAME = ...` (a global
    or a cell), `x["name"] = ...` (a dictionary entry), `Owner.name = ...` / `x.name = ...` (an attribute)."""
    tree = _tree(filename)
    if tree is None:
        return []
    lines: list[int] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in targets:
            if kind in ("cell", "item", "global") and isinstance(target, ast.Name) and target.id == name:
                if _declares(tree, node, name, ast.Nonlocal if kind == "cell" else ast.Global):
                    lines.append(node.lineno)
            elif kind == "item" and isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
                    and target.slice.value == name:
                lines.append(node.lineno)
            elif kind in ("attr", "get", "cattr") and isinstance(target, ast.Attribute) and target.attr == name and (
                    owner is None or (isinstance(target.value, ast.Name) and target.value.id == owner)):
                lines.append(node.lineno)
    return sorted(set(lines))


def _declares(tree: ast.AST, node: ast.AST, name: str, declaration: type[ast.Global] | type[ast.Nonlocal]) -> bool:
    """Whether `name = ...` at `node` stores to a global or an enclosing function's variable: the function whose
    own body holds it declares `global name` (`nonlocal name`)."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own = list(_own_nodes(fn))
            if any(n is node for n in own):
                return any(isinstance(n, declaration) and name in n.names for n in own)  # type: ignore[attr-defined]
    return False


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of the functions and classes defined in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


# -- frames --------------------------------------------------------------------------------------------

def issuer(skip: int) -> str | None:
    """`file:line` of the innermost frame outside torch and graphdoctor: the assignment (library code included)."""
    from graphdoctor.child.witness import issuing_frames

    frame = next(issuing_frames(sys._getframe(skip + 1)), None)
    return None if frame is None else format_location(frame.f_code.co_filename, frame.f_lineno)


def user_issuer(skip: int) -> str | None:
    """`file:line` of the innermost user frame on the stack (the user's call behind a library's assignment)."""
    from graphdoctor.child.probe.recorder import is_user_file
    from graphdoctor.child.witness import issuing_frames

    for frame in issuing_frames(sys._getframe(skip + 1)):
        if is_user_file(frame.f_code.co_filename):
            return format_location(frame.f_code.co_filename, frame.f_lineno)
    return None


__all__ = ["issuer", "read_line", "source_assignments", "user_issuer"]
