"""Allocation sites: fold a block's stack to the first user frame (or keep the whole stack).

A frame is "library" when it comes from torch, megatron, transformer_engine, graphdoctor's own
package, site-packages, the Python stdlib, `<frozen ...>` modules, or is not a Python frame at all.
"""

from __future__ import annotations

import re

from graphdoctor.memory.model import Frame

NO_USER_FRAME = "<no user frame>"
"""Site label when a stack has frames but none of them is user code."""

NO_FRAMES = "<no stack recorded>"
"""Site label when the allocator recorded no frames (history off or context='state')."""

_LIBRARY_DIRS = ("torch", "megatron", "transformer_engine", "apex", "triton")
_GRAPHDOCTOR_SUBPACKAGES = frozenset(
    {"memory", "child", "parent", "protocol", "probes", "compare", "launches", "report", "rules", "cli",
     "checks"}
)
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?t?/")


def _is_graphdoctor_package(parts: list[str]) -> bool:
    # The repository root may itself be called graphdoctor (fixtures/, tests/ are user code), so
    # only the package directory counts: graphdoctor/<module>.py or graphdoctor/<subpackage>/.
    for i, part in enumerate(parts[:-1]):
        if part == "graphdoctor":
            nxt = parts[i + 1]
            if nxt in _GRAPHDOCTOR_SUBPACKAGES or (i + 2 == len(parts) and nxt.endswith(".py")):
                return True
    return False


def is_user_frame(frame: Frame) -> bool:
    """True when the frame is user code (see the module docstring for what counts as library)."""
    filename = frame.filename.replace("\\", "/")
    if not filename.endswith(".py") or filename.startswith("<frozen"):
        return False
    if "site-packages/" in filename or "dist-packages/" in filename:
        return False
    parts = filename.split("/")
    if any(part in _LIBRARY_DIRS for part in parts[:-1]):
        return False
    if _STDLIB.search(filename):
        return False
    return not _is_graphdoctor_package(parts)


def user_frames_first(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The same frames, user frames first (each group keeps its innermost-first order)."""
    user = [f for f in frames if is_user_frame(f)]
    return tuple(user) + tuple(f for f in frames if not is_user_frame(f))


class SiteNamer:
    """Names allocation sites; caches per frame object (torch shares frames between stacks)."""

    def __init__(self, *, all_frames: bool = False) -> None:
        self.all_frames = all_frames
        # id(frame) -> (frame, is_user, label); the frame is kept so its id cannot be reused.
        self._frames: dict[int, tuple[Frame, bool, str]] = {}

    def _info(self, frame: Frame) -> tuple[Frame, bool, str]:
        hit = self._frames.get(id(frame))
        if hit is None:
            hit = (frame, is_user_frame(frame), frame.label())
            self._frames[id(frame)] = hit
        return hit

    def site(self, frames: tuple[Frame, ...]) -> str:
        """Site label: first (innermost) user frame, or the whole Python stack with all_frames."""
        if not frames:
            return NO_FRAMES
        if self.all_frames:
            python = [f for f in frames if f.filename.endswith(".py")] or list(frames)
            return " <- ".join(self._info(f)[2] for f in python)
        for frame in frames:
            _, user, label = self._info(frame)
            if user:
                return label
        python = [f for f in frames if f.filename.endswith(".py")]
        # Fall back to the outermost Python frame: it says which entry point allocated.
        return f"{NO_USER_FRAME} {self._info(python[-1])[2]}" if python else NO_USER_FRAME


__all__ = ["NO_FRAMES", "NO_USER_FRAME", "SiteNamer", "is_user_frame", "user_frames_first"]
