"""Find the first culprit of a failed capture inside a child.

CUDA reports an unsupported operation during capture lazily: the user's `.item()` often raises
nothing, and the capture dies later with cudaErrorStreamCaptureInvalidated at capture_end, naming the
wrong line. In culprit-hunt mode the child turns torch's sync-debug mode to "error" for exactly the
span of each capture, so a synchronizing operation raises at its own call site, with its stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphdoctor.cuda_errors import match_known
from graphdoctor.errors import exception_chain


@contextmanager
def sync_errors_during_capture() -> Iterator[None]:
    """Within this block, every CUDAGraph capture runs under set_sync_debug_mode("error")."""
    import torch

    cls: Any = torch.cuda.CUDAGraph
    orig_begin, orig_end = cls.capture_begin, cls.capture_end

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig_begin(self, *args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        return result

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        torch.cuda.set_sync_debug_mode("default")
        return orig_end(self, *args, **kwargs)

    cls.capture_begin, cls.capture_end = capture_begin, capture_end
    try:
        yield
    finally:
        cls.capture_begin, cls.capture_end = orig_begin, orig_end
        torch.cuda.set_sync_debug_mode("default")


def root_exception(exc: BaseException) -> BaseException:
    """The oldest exception in the chain that names a recognised capture problem, else `exc`."""
    for candidate in reversed(exception_chain(exc)):
        if match_known(str(candidate)) is not None:
            return candidate
    return exc


__all__ = ["root_exception", "sync_errors_during_capture"]
