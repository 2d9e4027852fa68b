"""Isolated capture attempts: warm a unit up on a side stream, capture it alone, translate the failure.

Each attempt uses its own streams and graph; after a failure the device gets a health check so that a
sticky error (a poisoned context) is noticed and the caller can move the remaining units elsewhere.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from graphdoctor.child.probe.recorder import traceback_location
from graphdoctor.cuda_errors import cuda_error_number, exception_chain, rule_of_text
from graphdoctor.probes.types import CaptureResult


def translate_error(unit: str, phase: str, exc: BaseException, seconds: float) -> CaptureResult:
    """Turn a capture exception (possibly a 900 -> 901 chain) into a CaptureResult about its root.

    The root is the earliest exception in the chain; its traceback gives the user frame. The CUDA
    error number and any rule code are taken from the first message in the chain that names one,
    earliest first, so the 901 raised by capture_end does not hide the 900 raised at the culprit.
    """
    chain = exception_chain(exc)
    root = chain[-1]
    cuda_error: int | None = None
    code: str | None = None
    location: str | None = None
    for item in reversed(chain):
        text = str(item)
        if cuda_error is None:
            cuda_error = cuda_error_number(text)
        if code is None:
            code = rule_of_text(text)
        if location is None:
            location = traceback_location(item)
    first_line = (str(root).strip().splitlines() or [""])[0][:300]
    return CaptureResult(
        unit=unit, ok=False, phase=phase, error_type=type(root).__name__, error_message=first_line,
        cuda_error=cuda_error, code=code, location=location, seconds=seconds,
    )


def device_healthy() -> bool:
    """False when the CUDA context carries a sticky error or a capture is still open."""
    try:
        if torch.cuda.is_current_stream_capturing():
            return False
        torch.cuda.synchronize()
        probe = torch.ones(4, device="cuda")
        ok = bool((probe + 1).sum().item() == 8.0)
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return ok


def capture_unit(
    unit: str,
    fn: Callable[[], Any],
    *,
    warmup_iters: int = 2,
    generators: Iterable[torch.Generator] = (),
) -> CaptureResult:
    """Warm `fn` up on a side stream, then capture one call of it into a fresh CUDAGraph.

    Args:
        unit: qualified name for the result.
        fn: zero-argument callable running the unit on its sample inputs.
        warmup_iters: eager calls on the side stream before capture.
        generators: generators to register with the graph besides the default CUDA generator.

    Returns:
        The CaptureResult; on failure `poisoned` says whether the device still works.
    """
    start = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(warmup_iters):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    except Exception as exc:  # any failure of user code is a finding, not a probe crash
        result = translate_error(unit, "warmup", exc, time.perf_counter() - start)
        return _with_health(result)
    graph = torch.cuda.CUDAGraph()
    for gen in generators:
        try:
            graph.register_generator_state(gen)
        except (RuntimeError, TypeError):
            # Already registered (the default generator) or not a CUDA generator: nothing to add.
            continue
    capture_stream = torch.cuda.Stream()
    previous = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, stream=capture_stream):
            fn()
    except Exception as exc:  # any failure of user code is a finding, not a probe crash
        # torch.cuda.graph.__exit__ skips restoring the stream when capture_end raises.
        torch.cuda.set_stream(previous)
        result = translate_error(unit, "capture", exc, time.perf_counter() - start)
        del graph
        gc.collect()
        return _with_health(result)
    del graph
    return CaptureResult(unit=unit, ok=True, seconds=time.perf_counter() - start)


def _with_health(result: CaptureResult) -> CaptureResult:
    if device_healthy():
        return result
    return CaptureResult(**{**result.to_dict(), "poisoned": True})


__all__ = ["capture_unit", "device_healthy", "translate_error"]
