"""The base of the dispatch modes of diff's children (the holders watch, the taps): they watch operators and never
change which kernels a run launches."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class WatchingMode(TorchDispatchMode):
    """A TorchDispatchMode under which torch.compile'd code stays compiled.

    With a plain dispatch mode on the stack, torch.compile skips every compiled frame and runs its Python operator
    by operator. Megatron-LM's default fusions (bias-SwiGLU, bias-GeLU, bias-dropout-add) are torch.compile'd
    (megatron.core.jit.jit_fuser), so a graph captured under such a mode would hold the unfused kernels where the
    user's run holds the fused ones, and graphed would differ from eager in the last bits because of graphdoctor.
    Ignoring compile internals keeps the compiled artifact: the mode sees the operators the artifact dispatches
    (its extern kernels, its random seeds), not the ones fused inside it.
    """

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


__all__ = ["WatchingMode"]
