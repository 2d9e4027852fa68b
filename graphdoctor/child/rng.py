"""RNG alignment: restore every generator's state around an implementation's warmup and capture, so a
graphed run consumes the same random streams as eager (Transformer Engine does this by itself;
Megatron's local implementation does not, so its replays start from a shifted Philox offset).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from graphdoctor.config.impl import Impl


def _tracker_states() -> dict[str, Any]:
    try:
        from megatron.core.tensor_parallel.random import get_all_rng_states

        return dict(get_all_rng_states())
    except (AssertionError, ImportError):
        return {}


def save_rng_states() -> dict[str, Any]:
    """CPU, every CUDA default generator, and every Megatron/TE tracker state (by value)."""
    saved: dict[str, Any] = {"cpu": torch.get_rng_state(), "cuda": [], "tracker": {}}
    for gen in torch.cuda.default_generators:
        saved["cuda"].append(gen.get_state())
    for name, state in _tracker_states().items():
        if isinstance(state, torch.Generator):
            saved["tracker"][name] = state.get_state()
        elif isinstance(state, torch.Tensor):
            saved["tracker"][name] = state.clone()
    return saved


def restore_rng_states(saved: dict[str, Any]) -> None:
    """Put back what save_rng_states() took, in place (graphs registered the generator objects)."""
    torch.set_rng_state(saved["cpu"])
    for gen, state in zip(torch.cuda.default_generators, saved["cuda"], strict=False):
        gen.set_state(state)
    live = _tracker_states()
    for name, value in saved["tracker"].items():
        state = live.get(name)
        if isinstance(state, torch.Generator):
            state.set_state(value)
        elif isinstance(state, torch.Tensor):
            state.copy_(value)


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Run the block, then restore every generator to its state before the block."""
    saved = save_rng_states()
    try:
        yield
    finally:
        restore_rng_states(saved)


def _wrap(owner: Any, attr: str, undo: list[Callable[[], None]]) -> None:
    original = owner.__dict__[attr]
    func = original.__func__ if isinstance(original, classmethod) else original

    @functools.wraps(func)
    def aligned(*args: Any, **kwargs: Any) -> Any:
        with rng_preserved():
            return func(*args, **kwargs)

    setattr(owner, attr, classmethod(aligned) if isinstance(original, classmethod) else aligned)
    undo.append(lambda: setattr(owner, attr, original))


def align_rng(impl: str) -> Callable[[], None]:
    """Make `impl`'s graph creation leave the generators as it found them; returns an undo.

    local: `_CudagraphGlobalRecord.create_cudagraphs` (its warmups and captures at the end of the
    first step). transformer_engine: `TECudaGraphHelper.create_cudagraphs` (TE restores by itself;
    wrapping it is harmless). full_iteration warms up with real training steps and captures without
    extra passes, so there is nothing to restore.
    """
    undo: list[Callable[[], None]] = []
    from megatron.core.transformer import cuda_graphs

    if impl == Impl.LOCAL:
        _wrap(cuda_graphs._CudagraphGlobalRecord, "create_cudagraphs", undo)
    elif impl == Impl.TRANSFORMER_ENGINE:
        _wrap(cuda_graphs.TECudaGraphHelper, "create_cudagraphs", undo)

    def restore() -> None:
        for step in reversed(undo):
            step()

    return restore


__all__ = ["align_rng", "restore_rng_states", "rng_preserved", "save_rng_states"]
