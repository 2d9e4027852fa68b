"""Live launch profiling: one steady-state eager step and one graphed step under torch.profiler.

Exports one Chrome trace per implementation (opens in Perfetto / chrome://tracing) and runs the
same offline accounting on it, so live and `graphdoctor count --trace` numbers are identical.
Needs torch with CUDA at call time; importing this module does not touch CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.errors import NoGPUError, UsageError
from graphdoctor.launches.accounting import account_trace
from graphdoctor.launches.counts import LaunchTable, TraceAccounting, classify_host_call
from graphdoctor.launches.phases import phase

StepFn = Callable[[], object]
"""One training step (forward, backward, optimizer) with no arguments."""


@dataclass(frozen=True, slots=True)
class ProfiledRun:
    """Where the trace went and what the accounting found in it."""

    impl: str
    """Implementation name used in the phase annotations."""
    trace_path: Path
    """The exported Chrome trace."""
    accounting: TraceAccounting
    """Offline accounting of trace_path (the same code `graphdoctor count` runs)."""
    live_launch_calls: dict[str, int]
    """Launch API call counts from the live profiler's key_averages(), an independent check."""

    @property
    def table(self) -> LaunchTable | None:
        """Eager-vs-graphed table of this implementation, if the trace has its phases."""
        return next((t for t in self.accounting.tables if t.impl == self.impl), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: impl, trace path and the full accounting document."""
        return {
            "impl": self.impl,
            "trace": str(self.trace_path),
            "live_launch_calls": dict(sorted(self.live_launch_calls.items())),
            "accounting": self.accounting.to_dict(),
        }


def prepare_profiler_for_graphs() -> None:
    """Call before capturing any graph that will be replayed under torch.profiler.

    Profiling a graph captured before the profiler's first use could crash with illegal memory
    accesses (pytorch/pytorch#75504); torch's own workaround `_init_for_cuda_graphs()` runs an
    empty profile once. Feature-detected: a no-op where torch no longer has it.
    """
    from torch.profiler import _utils

    init = getattr(_utils, "_init_for_cuda_graphs", None)
    if init is not None:
        init()


def _run_phase(fn: StepFn, impl: str, name: str, step: int) -> None:
    import torch

    # Sync outside the range so the range measures host enqueue time, not waiting on the GPU.
    torch.cuda.synchronize()
    with phase(impl, name, step):
        fn()
    torch.cuda.synchronize()


def profile_steps(
    *,
    impl: str,
    trace_path: str | os.PathLike[str],
    eager_step: StepFn | None = None,
    graphed_step: StepFn | None = None,
    step: int = 0,
    num_warmup_steps: int = 1,
) -> ProfiledRun:
    """Profile one eager step and/or one graphed (replay) step and account their launches.

    Both callables must already be in steady state (graphs captured and replayed at least
    once, optimizer state allocated); num_warmup_steps more of each run unrecorded under the
    profiler's warmup so profiler start-up cost stays out of the trace.

    Args:
        impl: Implementation name for the phase annotations, e.g. "local".
        trace_path: Output Chrome trace; a `.json.gz` suffix writes gzip. Parent dirs are made.
        eager_step: One eager training step, recorded in phase "eager" (ProfilerStep#1).
        graphed_step: One graphed training step, recorded in phase "replay" (next ProfilerStep).
        step: Step index written into the phase labels.
        num_warmup_steps: Unrecorded runs of each callable before recording.

    Returns:
        ProfiledRun with the trace path and its accounting.

    Raises:
        UsageError: Neither callable given, or num_warmup_steps < 0.
        NoGPUError: No CUDA device is visible.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    plan = [(name, fn) for name, fn in (("eager", eager_step), ("replay", graphed_step)) if fn is not None]
    if not plan:
        raise UsageError("profile_steps: got neither eager_step nor graphed_step, expected at least one")
    if num_warmup_steps < 0:
        raise UsageError(f"profile_steps: num_warmup_steps got {num_warmup_steps}, expected >= 0")
    if not torch.cuda.is_available():
        raise NoGPUError("profile_steps needs a CUDA GPU and none is visible")
    path = Path(trace_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One unrecorded warmup profiler step, then one active step (ProfilerStep#N) per callable.
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=0, warmup=1, active=len(plan), repeat=1),
        record_shapes=False,
        with_stack=False,
    ) as prof:
        for _ in range(num_warmup_steps):
            for _, fn in plan:
                fn()
        torch.cuda.synchronize()
        prof.step()
        for name, fn in plan:
            _run_phase(fn, impl, name, step)
            prof.step()
    prof.export_chrome_trace(str(path))
    live = {e.key: int(e.count) for e in prof.key_averages() if classify_host_call(e.key)}
    return ProfiledRun(impl=impl, trace_path=path, accounting=account_trace(path), live_launch_calls=live)


__all__ = ["ProfiledRun", "StepFn", "prepare_profiler_for_graphs", "profile_steps"]
