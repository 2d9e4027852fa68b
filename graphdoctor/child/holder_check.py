"""The per-step check of the holder watch's tensor paths, in bulk.

A 24-layer model has about 600 watched tensor paths (each parameter and its `main_grad`), and most share all
their links but one key: `layer._parameters['weight']`, `layer._parameters['bias']`, or the same key under each
parameter (`...['weight'].main_grad`). Paths are grouped on that: (root, the links before the varying key, the
kind of that link, the links after it). A group is resolved with one walk of its common prefix and C-level maps
over its keys, then compared by object identity with what its paths led to last time (`id`; a weak reference's
callback marks a group whose object died). A group that matches proves every path in it unchanged. One that no
longer matches hands its watches to the exact check (graphdoctor.child.holders.Watch.changed), which compares
with the tensor captured and accepts a new tensor object over the same memory; a group the exact check finds
unchanged is refreshed, so such a new object costs one exact check of its group, not one every step after.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.child.holder_search import MISSING, Link, resolve


def _varying(links: tuple[Link, ...]) -> int:
    """Index of the link whose key differs between siblings: the last item look-up, else the last link."""
    for index in range(len(links) - 1, -1, -1):
        if links[index][0] == "item":
            return index
    return len(links) - 1


@dataclass(slots=True)
class _Group:
    root: Any
    prefix: tuple[Link, ...]
    kind: str
    suffix: tuple[Link, ...]
    keys: list[Any] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    watches: list[Any] = field(default_factory=list)
    refs: list[weakref.ref[Any]] = field(default_factory=list)
    getter: Callable[[Any], Any] | None = None
    dead: bool = False

    def values(self) -> list[Any]:
        """What each path in the group leads to now (MISSING or None where it leads nowhere)."""
        parent = resolve(self.root, self.prefix) if self.prefix else self.root
        if parent is MISSING:
            return [MISSING] * len(self.keys)
        if self.kind == "item" and type(parent) is dict:
            values = list(map(parent.get, self.keys))
        elif self.kind == "attr" and hasattr(parent, "__dict__"):
            values = list(map(vars(parent).get, self.keys))
        else:
            values = [resolve(parent, ((self.kind, key),)) for key in self.keys]
        if not self.suffix:
            return values
        if self.getter is not None:
            try:
                return list(map(self.getter, values))
            except AttributeError:
                pass
        return [resolve(value, self.suffix) for value in values]


class TensorChecks:
    """Unchanged tensor watches grouped for the per-step check.

    Each group remembers the tensors captured, or after a refresh what its paths led to when the exact check
    found them unchanged (a new tensor object over the same memory).

    Args:
        watches: tensor watches not changed yet.
    """

    def __init__(self, watches: Sequence[Any]) -> None:
        self.count = len(watches)
        groups: dict[tuple[Any, ...], _Group] = {}
        for watch in watches:
            at = _varying(watch.links) if watch.links else -1
            kind, key = watch.links[at] if watch.links else ("none", None)
            prefix, suffix = watch.links[:at], watch.links[at + 1:]
            group = groups.get((id(watch.root), prefix, kind, suffix))
            if group is None:
                getter = operator.attrgetter(suffix[0][1]) if (len(suffix) == 1 and suffix[0][0] in ("attr", "get")
                                                               and isinstance(suffix[0][1], str)) else None
                group = _Group(watch.root, prefix, kind, suffix, getter=getter)
                groups[(id(watch.root), prefix, kind, suffix)] = group
            group.keys.append(key)
            group.watches.append(watch)
        self.groups = list(groups.values())
        for group in self.groups:  # the tensors captured, which the paths may have left already
            marker = _marker(group)
            for watch in group.watches:
                held = watch.tensor() if watch.tensor is not None else None
                group.ids.append(id(held))
                if held is None:
                    group.dead = True
                else:
                    group.refs.append(weakref.ref(held, marker))

    def suspects(self) -> list[_Group]:
        """The groups that no longer lead to exactly the objects they remember (each watch of them then needs the
        exact check; `refresh` a group the exact check found unchanged)."""
        return [group for group in self.groups if group.dead or list(map(id, group.values())) != group.ids]


def refresh(group: _Group) -> None:
    """Remember what the group's paths lead to now."""
    values = group.values()
    group.ids = list(map(id, values))
    group.refs = []
    group.dead = False
    marker = _marker(group)
    for value in values:
        try:
            group.refs.append(weakref.ref(value, marker))
        except TypeError:  # MISSING, None: nothing to outlive; the exact check decides
            group.dead = True


def _marker(group: _Group) -> Callable[[Any], None]:
    def died(_ref: Any) -> None:
        group.dead = True

    return died


__all__ = ["TensorChecks", "refresh"]
