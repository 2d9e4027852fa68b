"""Allocation sites: fold a block's stack to the frame that owns the allocation (or keep the stack).

Frames are of four kinds. User code is everything not listed below. Library code is a package the
user's model is built from (megatron, transformer_engine, apex, other site-packages). graphdoctor's
own frames (the tool driving the run) are never a site while a user or library frame exists, and a
site made only of them sorts after every other site. Runtime frames (torch, triton, the stdlib,
`<frozen ...>`, non-Python frames) only say how memory was allocated, not who asked for it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from graphdoctor.memory.model import Frame

NO_USER_FRAME = "<no user frame>"
"""Site label when a stack has frames but no user or library frame."""

NO_FRAMES = "<no stack recorded>"
"""Site label when the allocator recorded no frames (history off or context='state')."""

GRAPHDOCTOR_SITE = f"{NO_USER_FRAME} <graphdoctor>"
"""Label prefix of a site whose stack holds graphdoctor's frames and no user or library frame."""

_LIBRARY_DIRS = ("megatron", "transformer_engine", "apex")
_RUNTIME_DIRS = ("torch", "triton", "_pytest", "pluggy", "click")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Subpackages by name, for stacks recorded on another machine: the installed ones plus those of
# earlier layouts (harness/ held the child before child/ and parent/ did).
_GRAPHDOCTOR_SUBPACKAGES = frozenset(
    {p.name for p in _PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file()} | {"harness", "checks"}
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


def frame_kind(frame: Frame) -> str:
    """`user`, `library`, `graphdoctor` or `runtime` (see the module docstring)."""
    filename = frame.filename.replace("\\", "/")
    if not filename.endswith(".py") or filename.startswith("<frozen"):
        return "runtime"
    parts = filename.split("/")
    if filename.startswith(str(_PACKAGE_DIR).replace(os.sep, "/") + "/") or _is_graphdoctor_package(parts):
        return "graphdoctor"
    if any(part in _RUNTIME_DIRS for part in parts[:-1]):
        return "runtime"
    if any(part in _LIBRARY_DIRS for part in parts[:-1]):
        return "library"
    if "site-packages/" in filename or "dist-packages/" in filename:
        return "library"
    if _STDLIB.search(filename):
        return "runtime"
    return "user"


def is_user_frame(frame: Frame) -> bool:
    """True when the frame is user code (see the module docstring for what counts as library)."""
    return frame_kind(frame) == "user"


def is_graphdoctor_site(site: str) -> bool:
    """True for a site label made only of graphdoctor's own frames (it never leads a report)."""
    return site.startswith(GRAPHDOCTOR_SITE)


def user_frames_first(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The same frames, user frames first (each group keeps its innermost-first order)."""
    user = [f for f in frames if is_user_frame(f)]
    return tuple(user) + tuple(f for f in frames if not is_user_frame(f))


class SiteNamer:
    """Names allocation sites; caches per frame object (torch shares frames between stacks)."""

    def __init__(self, *, all_frames: bool = False) -> None:
        self.all_frames = all_frames
        # id(frame) -> (frame, kind, label); the frame is kept so its id cannot be reused.
        self._frames: dict[int, tuple[Frame, str, str]] = {}

    def _info(self, frame: Frame) -> tuple[Frame, str, str]:
        hit = self._frames.get(id(frame))
        if hit is None:
            hit = (frame, frame_kind(frame), frame.label())
            self._frames[id(frame)] = hit
        return hit

    def site(self, frames: tuple[Frame, ...]) -> str:
        """Site label: the innermost user frame, else the innermost library frame (Megatron's own
        allocation), else `<no user frame>` with graphdoctor's innermost frame or the outermost
        Python frame; the whole Python stack with all_frames."""
        if not frames:
            return NO_FRAMES
        if self.all_frames:
            python = [f for f in frames if f.filename.endswith(".py")] or list(frames)
            return " <- ".join(self._info(f)[2] for f in python)
        infos = [self._info(f) for f in frames]
        for wanted in ("user", "library"):
            label = next((lab for _, kind, lab in infos if kind == wanted), None)
            if label is not None:
                return label
        own = next((lab for _, kind, lab in infos if kind == "graphdoctor"), None)
        if own is not None:
            return f"{GRAPHDOCTOR_SITE} {own}"
        outer = [lab for f, _, lab in infos if f.filename.endswith(".py")]
        # Fall back to the outermost Python frame: it says which entry point allocated.
        return f"{NO_USER_FRAME} {outer[-1]}" if outer else NO_USER_FRAME


__all__ = ["GRAPHDOCTOR_SITE", "NO_FRAMES", "NO_USER_FRAME", "SiteNamer", "frame_kind", "is_graphdoctor_site",
           "is_user_frame", "user_frames_first"]
