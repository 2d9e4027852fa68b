"""Who issued a call the witness sees: the frames outside torch, graphdoctor and generated code, and the user's
`file:line` among them."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from graphdoctor.locations import format_location

_GRAPHDOCTOR_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SKIPPED_ROOTS = (os.path.realpath(os.path.dirname(torch.__file__)) + os.sep,
                  os.path.realpath(_GRAPHDOCTOR_ROOT) + os.sep)
"""torch and graphdoctor: the frames between the user's call and the witness."""

_real = functools.lru_cache(maxsize=4096)(os.path.realpath)


def issuing_frames(frame: Any) -> Iterator[Any]:
    """The frames from `frame` outwards that are outside torch, graphdoctor and generated code (`<...>`),
    innermost first: the first is the code that issued the current call."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not _real(filename).startswith(_SKIPPED_ROOTS):
            yield frame
        frame = frame.f_back


def _issuing_frame(skip: int) -> Any:
    """The innermost frame outside torch, graphdoctor and generated code (`<...>`), above the caller's
    `skip` frames: the code that issued the current call; None when the stack holds none."""
    return next(issuing_frames(sys._getframe(skip + 2)), None)


def user_issuer(skip: int = 1) -> str | None:
    """`file:line` of the code that issued the current call when that code is the user's: the issuing frame
    is a user file. None when it is library code (Megatron, Transformer Engine, the standard library) or when
    the stack holds no issuing frame (a callback from autograd's device thread)."""
    from graphdoctor.child.probe.recorder import is_user_file

    frame = _issuing_frame(skip)
    if frame is None or not is_user_file(frame.f_code.co_filename):
        return None
    return format_location(frame.f_code.co_filename, frame.f_lineno)


def innermost_outside_torch(skip: int) -> str:
    """`file:line` of the issuing frame, library code included."""
    frame = _issuing_frame(skip)
    return "<unknown>" if frame is None else format_location(frame.f_code.co_filename, frame.f_lineno)


__all__ = ["innermost_outside_torch", "issuing_frames", "user_issuer"]
