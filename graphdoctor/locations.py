"""Source locations as users recognise them: `path:line`, with short paths.

One helper for every place that names a line of code (capture-safety probes, forensics taps), so a
module and line read the same in every report.
"""

from __future__ import annotations

import os

_PACKAGE_ROOTS = ("/megatron/", "/transformer_engine/", "/torch/", "/apex/")


def short_path(path: str) -> str:
    """Package-relative for installed packages (`megatron/core/...`), relative to the working
    directory for files under it, else from a known package root, else `path` unchanged."""
    if path.startswith("<"):
        return path
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    real = os.path.realpath(path)
    cwd = os.path.realpath(os.getcwd()) + os.sep
    if real.startswith(cwd):
        return real[len(cwd):]
    for root in _PACKAGE_ROOTS:
        if root in path:
            return path[path.rindex(root) + 1:]
    return path


def format_location(filename: str, lineno: int) -> str:
    """`short_path(filename):lineno`."""
    return f"{short_path(filename)}:{lineno}"


__all__ = ["format_location", "short_path"]
