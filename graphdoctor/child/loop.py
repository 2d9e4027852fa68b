"""The training loop of one child run: warmup, capture and replay as Megatron steps, a phase per step,
CUDA-event timing, and the per-step save (reference) or comparison (graphed) of main_grads and
parameters, reduced on the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from graphdoctor.child.megatron_setup import Setup, step_batches
from graphdoctor.compare.reduce import FlatLayout, SegmentIndex, compare_flat, flatten
from graphdoctor.protocol.events import Capture, Event, Step
from graphdoctor.protocol.spec import EAGER, ChildSpec, Role
from graphdoctor.types import StepRecord, TensorDiff


class StepObserver(Protocol):
    """Something that watches phases (memory recorder, launch profiler)."""

    def begin_step(self, step: int, phase: str) -> None:
        """Called before a step's forward_backward."""

    def end_step(self, step: int, phase: str) -> None:
        """Called after a step's optimizer step (and its CUDA-event timing)."""


def phase_of(impl: str, step: int, warmup_steps: int) -> str:
    """What a step is for an implementation in megatron-core 0.19.2.

    local: step 0 runs eagerly, records, and captures at the end of its forward_backward; later steps
    replay. full_iteration: `warmup_steps` eager steps, then capture (and replay) at that call.
    transformer_engine: graphs are created before step `warmup_steps`.
    """
    if impl == EAGER:
        return "eager"
    if impl == "local":
        return "capture" if step == 0 else "replay"
    if step < warmup_steps:
        return "warmup"
    return "capture" if step == warmup_steps else "replay"


def strip_wrappers(name: str) -> str:
    """A module or parameter name without the DDP/Float16Module `module.` prefixes ("" for them)."""
    while name.startswith("module."):
        name = name[len("module."):]
    return "" if name == "module" else name


@dataclass(slots=True)
class TensorFamilies:
    """The model's parameters and their main_grads, in a fixed order with a reusable segment index."""

    params: list[tuple[str, torch.nn.Parameter]]
    layout: FlatLayout
    index: SegmentIndex

    @classmethod
    def of(cls, model: torch.nn.Module) -> TensorFamilies:
        params = [(strip_wrappers(n), p) for n, p in model.named_parameters() if p.requires_grad]
        layout = FlatLayout(tuple(n for n, _ in params), tuple(p.numel() for _, p in params))
        device = params[0][1].device
        return cls(params=params, layout=layout, index=SegmentIndex(layout, device))

    def grads(self) -> torch.Tensor:
        return flatten([(n, _main_grad(p)) for n, p in self.params])[1]

    def values(self) -> torch.Tensor:
        by_dtype = {p.dtype for _, p in self.params}
        if len(by_dtype) == 1:
            return flatten([(n, p) for n, p in self.params])[1]
        return flatten([(n, p.float()) for n, p in self.params])[1]


def _main_grad(param: torch.nn.Parameter) -> torch.Tensor:
    grad = getattr(param, "main_grad", None)
    if grad is None:
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
    return grad


@dataclass(slots=True)
class ReferenceIO:
    """Saves (reference role) or loads and compares (graphed role) per-step tensors."""

    spec: ChildSpec
    families: TensorFamilies
    compare_s: float = 0.0

    def _path(self, step: int) -> Path:
        rank = self.spec.placement.rank
        return Path(self.spec.reference_dir) / f"step{step:05d}.rank{rank}.pt"

    def process(self, step: int, stage: str) -> TensorDiff | None:
        """Save or compare one family ('grads' or 'params') at `step`."""
        if not self.spec.role.reference_io:
            return None
        start = time.perf_counter()
        flat = self.families.grads() if stage == "grads" else self.families.values()
        path = self._path(step).with_suffix(f".{stage}.pt")
        result = None
        if self.spec.role is Role.REFERENCE:
            torch.save({"names": self.families.layout.names, "flat": flat.cpu()}, path)
        else:
            ref = torch.load(path, map_location=flat.device, weights_only=True)
            if tuple(ref["names"]) != self.families.layout.names:
                raise RuntimeError(f"graphed run has different {stage} than the reference")
            cfg = self.spec.config
            result = compare_flat(flat, ref["flat"], self.families.index, rtol=cfg.rtol, atol=cfg.atol)
        self.compare_s += time.perf_counter() - start
        return result


@dataclass(slots=True)
class LoopState:
    """Where the loop is, for error reports."""

    step: int = -1
    phase: str = "setup"
    records: list[StepRecord] = field(default_factory=list)


def _reported_loss(losses: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    reports = torch.stack([d["lm loss"].float() for d in losses])
    return reports[:, 0].sum() / reports[:, 1].sum().clamp_min(1)


@dataclass(slots=True)
class StepRunner:
    """One training step as Megatron-LM's trainer runs it, timed with CUDA events, with the per-step
    save or comparison of main_grads and parameters."""

    spec: ChildSpec
    setup: Setup
    io: ReferenceIO
    taps: Any = None

    def create_te_graphs(self, step: int) -> Event:
        """transformer_engine: TECudaGraphHelper.create_cudagraphs() before step `step` (taps'
        module hooks detached while make_graphed_callables captures)."""
        start = time.perf_counter()
        helper = self.setup.te_helper
        if self.taps is not None:
            self.taps.detach_module_hooks()
        helper.create_cudagraphs()
        if self.taps is not None:
            self.taps.attach_module_hooks()
        if getattr(self.setup.model, "use_forward_hook", False):
            # DDP forward pre-hooks (overlap_param_gather) do not fire on graph replay.
            helper.cuda_graph_set_manual_hooks()
        return Capture(step=step, seconds=time.perf_counter() - start)

    def begin_step(self, step: int, phase: str) -> Iterator[dict[str, torch.Tensor]]:
        """The step's batch, then the taps' step stamp (the batch's tokens come from a CPU generator
        and are not the model's random draws, so they are built before the taps start)."""
        data = step_batches(self.spec.config, step)
        if self.taps is not None:
            self.taps.begin_step(step, phase)
        return data

    def train_step(self, step: int, phase: str, data: Iterator[dict[str, torch.Tensor]], *,
                   profiled: bool) -> StepRecord:
        """forward_backward and the optimizer step; grads compared before, params after the step."""
        setup, cfg = self.setup, self.spec.config
        start_ev, end_fb, resume, end_ev = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        try:
            setup.model.zero_grad_buffer()
            setup.optimizer.zero_grad()
            start_ev.record()
            losses = setup.forward_backward(
                forward_step_func=setup.forward_step, data_iterator=data, model=[setup.model],
                num_microbatches=cfg.num_microbatches, seq_length=cfg.seq_length,
                micro_batch_size=cfg.micro_batch_size, forward_only=False)
        finally:
            if self.taps is not None:
                self.taps.end_step(step)
        loss = _reported_loss(losses).clone()
        end_fb.record()
        grads = None if profiled else self.io.process(step, "grads")
        resume.record()
        _, grad_norm, _ = setup.optimizer.step()
        end_ev.record()
        end_ev.synchronize()
        step_ms = start_ev.elapsed_time(end_fb) + resume.elapsed_time(end_ev)
        params = None if profiled else self.io.process(step, "params")
        return StepRecord(step=step, phase=phase, loss=float(loss.item()), step_time_ms=step_ms,
                          grad_norm=None if grad_norm is None else float(grad_norm),
                          grads=grads, params=params, profiled=profiled)


def run_steps(
    spec: ChildSpec,
    setup: Setup,
    state: LoopState,
    emit: Callable[[Event], None],
    observers: tuple[StepObserver, ...] = (),
    taps: Any = None,
) -> float:
    """Warm up, capture and replay `steps` steps (plus one profiled step when launches are on);
    emit one Step event per step and a Capture event where graphs were made. Returns the
    compare/save seconds spent."""
    cfg = spec.config
    runner = StepRunner(spec=spec, setup=setup, io=ReferenceIO(spec=spec, families=TensorFamilies.of(setup.model)),
                        taps=taps)
    profile_last = cfg.launches and spec.role is not Role.TAPPED
    te_capture_step = cfg.cuda_graph_warmup_steps if setup.te_helper is not None else None
    for step in range(cfg.steps + (1 if profile_last else 0)):
        state.step, state.phase = step, phase_of(spec.impl, step, cfg.cuda_graph_warmup_steps)
        for obs in observers:
            obs.begin_step(step, state.phase)
        data = runner.begin_step(step, state.phase)
        if step == te_capture_step:
            emit(runner.create_te_graphs(step))
        record = runner.train_step(step, state.phase, data, profiled=profile_last and step == cfg.steps)
        for obs in reversed(observers):
            obs.end_step(step, state.phase)
        state.records.append(record)
        emit(Step(record=record))
        if record.phase == "capture" and te_capture_step is None:
            emit(Capture(step=step, seconds=record.step_time_ms / 1000.0))
    state.phase = "done"
    return runner.io.compare_s


__all__ = ["LoopState", "StepObserver", "StepRunner", "phase_of", "run_steps", "strip_wrappers"]
