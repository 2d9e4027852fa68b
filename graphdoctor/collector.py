"""The garbage collector paused while a process builds many long-lived objects: imports (then frozen out of its
reach) and the loads of large acyclic files (memory snapshots, profiler traces), where each full pass would walk
everything built so far and could free nothing.

Importing torch and Megatron leaves some 400,000 objects that live as long as the process. With the collector on,
each of its full passes walks all of them: six passes during the imports, a sixth of their seconds on our machines
(counted with gc.callbacks). Frozen (gc.freeze), they stay out of every later collection, a forked child's too,
whose collections then neither scan nor write to its parent's pages. Only objects made before the freeze are
frozen: the CUDA graphs and graph managers graphdoctor finds with gc.get_objects are made later.

Freezing also keeps whatever cyclic garbage exists at that moment for the rest of the process, so only processes
graphdoctor starts for themselves freeze (the template and its children). The parent may run inside someone
else's long-lived process (click's CliRunner, a pytest session): it only pauses the collector while it imports,
and the first collection after that finds the garbage as usual.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the collector off; then turn it back on, unless an outer block turned it off."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Run the block with the collector paused; then freeze what exists before it is turned back on (nested blocks
    freeze once more, which costs nothing)."""
    with collector_paused():
        try:
            yield
        finally:
            gc.freeze()


__all__ = ["collector_paused", "imports_frozen"]
