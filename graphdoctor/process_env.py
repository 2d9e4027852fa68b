"""This process's environment as its threads read it while Megatron-LM's parser borrows it.

Resolving a launch line (graphdoctor.config.megatron_line) sets the line's variables, WORLD_SIZE and RANK in
os.environ for the parse, clears it and restores it after; the parent resolves its children's models on worker
threads. A thread that copied os.environ meanwhile would give its child the parse's variables (and then a
child's environment no longer matches the template it could fork from) or, between the clear and the restore,
an empty environment. Both hold ENVIRON_LOCK."""

from __future__ import annotations

import os
import threading

ENVIRON_LOCK = threading.Lock()
"""Held while Megatron-LM's parser borrows os.environ, and while a copy of it is taken."""


def environ_copy() -> dict[str, str]:
    """os.environ as it is outside any parse."""
    with ENVIRON_LOCK:
        return dict(os.environ)


__all__ = ["ENVIRON_LOCK", "environ_copy"]
