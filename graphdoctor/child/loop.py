"""The training loop of one child run: warmup, capture and replay as Megatron steps, a phase per step,
CUDA-event timing, and the per-step save (reference) or comparison (graphed) of main_grads and
parameters, reduced on the GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from graphdoctor.child.batches import forward_step_name, step_batches
from graphdoctor.child.checkpoint import save_run
from graphdoctor.child.gpu_turn import GpuTurn
from graphdoctor.child.megatron_setup import Setup, clear_moe_metrics
from graphdoctor.child.names import expert_shards, strip_wrappers
from graphdoctor.child.reported import reduce_step
from graphdoctor.child.schedule import EvalPoint, eval_plan, run_eval, with_tracker_values
from graphdoctor.compare.reduce import FlatLayout, SegmentIndex, compare_flat, flatten
from graphdoctor.config.impl import Impl
from graphdoctor.protocol.events import Capture, Eval, Event, Phase, Step, Tensors
from graphdoctor.protocol.spec import EAGER, ChildSpec, Role
from graphdoctor.protocol.steps import StepPrints, StepRecord
from graphdoctor.strict_json import nullable
from graphdoctor.types import TensorDiff


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
    if impl == Impl.LOCAL:
        return "capture" if step == 0 else "replay"
    if step < warmup_steps:
        return "warmup"
    return "capture" if step == warmup_steps else "replay"


@dataclass(slots=True)
class TensorFamilies:
    """The model's parameters and their main_grads, in a fixed order; the flat copies and the segment
    index that an element-by-element comparison needs are made only at the steps that need them."""

    params: list[tuple[str, torch.nn.Parameter]]
    layout: FlatLayout
    _index: SegmentIndex | None = None

    @classmethod
    def of(cls, model: torch.nn.Module) -> TensorFamilies:
        params = [(strip_wrappers(n), p) for n, p in model.named_parameters() if p.requires_grad]
        layout = FlatLayout(tuple(n for n, _ in params), tuple(p.numel() for _, p in params))
        return cls(params=params, layout=layout)

    @property
    def index(self) -> SegmentIndex:
        """Per-element segment ids (8 bytes per parameter: built on first use, at a measured step)."""
        if self._index is None:
            self._index = SegmentIndex(self.layout, self.params[0][1].device)
        return self._index

    def main_grads(self) -> list[torch.Tensor]:
        """Every main_grad (or grad), in layout order, without copying."""
        return [_main_grad(p) for _, p in self.params]

    def values(self) -> torch.Tensor:
        by_dtype = {p.dtype for _, p in self.params}
        if len(by_dtype) == 1:
            return flatten([(n, p) for n, p in self.params])[1]
        return flatten([(n, p.float()) for n, p in self.params])[1]

    def grads(self) -> torch.Tensor:
        return flatten([(n, _main_grad(p)) for n, p in self.params])[1]


class StepPrinter:
    """Bitwise fingerprints of every main_grad and parameter (an FP8 primary weight's FP8 bytes), on the device,
    every step (graphdoctor.compare.bitprint); only [num_tensors, 2] lanes per family reach the host. With
    `canonical_nan` (fp16 runs) every NaN of a main_grad hashes alike: the steps the loss scaler skips compare by
    where their non-finite values are, not by NaN payloads."""

    def __init__(self, families: TensorFamilies, *, canonical_nan: bool = False) -> None:
        from graphdoctor.child.fp8_state import raw_data
        from graphdoctor.compare.bitprint import BitFingerprinter

        params = [raw_data(p) for _, p in families.params]
        grads = families.main_grads()
        device = params[0].device
        self.families = families
        self._raw = raw_data
        self._grads = BitFingerprinter([(n, g.numel(), g.dtype) for (n, _), g in zip(families.params, grads,
                                                                                      strict=True)], device,
                                       canonical_nan=canonical_nan)
        self._params = BitFingerprinter([(n, p.numel(), p.dtype) for (n, _), p in zip(families.params, params,
                                                                                       strict=True)], device)

    @property
    def extra_bytes(self) -> int:
        """Peak device bytes the fingerprints use during a call."""
        return max(self._grads.peak_extra_bytes, self._params.peak_extra_bytes)

    def grads(self) -> torch.Tensor:
        """Lanes of the main_grads (asynchronous)."""
        return self._grads.fingerprint(self.families.main_grads())

    def params(self) -> torch.Tensor:
        """Lanes of the parameters (asynchronous); an FP8 primary weight's raw FP8 bytes."""
        return self._params.fingerprint([self._raw(p) for _, p in self.families.params])


def _lanes(fingerprints: torch.Tensor) -> tuple[int, ...]:
    """The lanes on the host (one copy), stored flat as StepPrints keeps them."""
    from graphdoctor.compare.bitprint import host_lanes

    return tuple(v for pair in host_lanes(fingerprints) for v in pair)


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
        """Save or compare one family ('grads' or 'params') at `step`, when `step` is one of the
        spec's io_steps (a targeted re-run); every other step is only fingerprinted."""
        if not self.spec.role.reference_io or step not in self.spec.io_steps:
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
            result = compare_flat(flat, ref["flat"], self.families.index, rtol=cfg.rtol, atol=cfg.atol,
                                  canonical_nan=cfg.dtype == "fp16")
        self.compare_s += time.perf_counter() - start
        return result


@dataclass(slots=True)
class LoopState:
    """Where the loop is, for error reports."""

    step: int = -1
    phase: str = "setup"
    records: list[StepRecord] = field(default_factory=list)
    profiled_s: float = 0.0
    """Wall seconds of the extra profiled step (the launches observer's)."""
    fingerprint_s: float = 0.0
    """Wall seconds of the steps' fingerprints (comparison)."""


@dataclass(slots=True)
class StepRunner:
    """One training step as Megatron-LM's trainer runs it, timed with CUDA events, with the per-step
    save or comparison of main_grads and parameters."""

    spec: ChildSpec
    setup: Setup
    io: ReferenceIO
    printer: StepPrinter | None
    taps: Any = None
    fp8: Any = None
    """The FP8 state watch (graphdoctor.child.fp8_state.Fp8Watch) of an FP8 run, else None."""
    fingerprint_s: float = 0.0
    """Wall seconds spent in the fingerprints (taken and read back)."""

    def create_te_graphs(self, step: int) -> Event:
        """transformer_engine: TECudaGraphHelper.create_cudagraphs() before step `step` (taps'
        module hooks detached while make_graphed_callables captures)."""
        start = time.perf_counter()
        helper = self.setup.te_helper
        if self.taps is not None:
            self.taps.detach_module_hooks(for_te_capture=True)
        helper.create_cudagraphs()
        if self.taps is not None:
            self.taps.attach_module_hooks()
        if getattr(self.setup.model, "use_forward_hook", False):
            # DDP forward pre-hooks (overlap_param_gather) do not fire on graph replay.
            helper.cuda_graph_set_manual_hooks()
        return Capture(step=step, seconds=time.perf_counter() - start)

    def begin_step(self, step: int, phase: str, *, profiled: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        """The step's batch, then the taps' step stamp (the batch's tokens come from a CPU generator
        and are not the model's random draws, so they are built before the taps start). The profiled step
        runs without the taps' module hooks and operator interception: its launch census counts the model's
        kernels (taps captured inside graphs still replay with them)."""
        data = step_batches(self.spec.config, step)
        if self.taps is not None and profiled:
            self.taps.detach_module_hooks()
        elif self.taps is not None:
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
        values = reduce_step(losses, per_token_loss=bool(getattr(setup.config, "calculate_per_token_loss", False)),
                             where=forward_step_name(cfg.forward_step))
        values = with_tracker_values(values)  # read before clear_moe_metrics below
        end_fb.record()
        printing = time.perf_counter()
        grad_prints = None if profiled or self.printer is None else self.printer.grads()
        self.fingerprint_s += time.perf_counter() - printing
        grads = None if profiled else self.io.process(step, "grads")
        resume.record()
        updated, grad_norm, _ = setup.optimizer.step()
        end_ev.record()
        end_ev.synchronize()
        clear_moe_metrics()
        loss_scale = float(setup.optimizer.get_loss_scale().item()) if cfg.dtype == "fp16" else None
        step_ms = start_ev.elapsed_time(end_fb) + resume.elapsed_time(end_ev)
        prints = None
        if grad_prints is not None and self.printer is not None:
            printing = time.perf_counter()
            fp8 = self.fp8.prints(step, phase) if self.fp8 is not None else None
            prints = StepPrints(grads=_lanes(grad_prints), params=_lanes(self.printer.params()),
                                fp8=fp8[0] if fp8 else (), fp8_layout=fp8[1] if fp8 else -1)
            self.fingerprint_s += time.perf_counter() - printing
        params = None if profiled else self.io.process(step, "params")
        loss, reported = values.host()
        return StepRecord(step=step, phase=phase, loss=loss, step_time_ms=step_ms,
                          grad_norm=nullable(float, grad_norm),
                          grads=grads, params=params, profiled=profiled, prints=prints, reported=reported,
                          skipped=updated is False, loss_scale=loss_scale)


def times_its_steps(spec: ChildSpec) -> bool:
    """Whether a report reads this child's step times: the eager reference and each graphed run at the run's
    dropout (diff's first runs, advise's candidates and probes). A control, tapped, re-run, culprit-hunt or
    eager-again child is judged on what it computes, not on how fast, so it need not take a shared GPU alone."""
    first_run = spec.role is Role.REFERENCE or (spec.role is Role.GRAPHED and spec.impl != EAGER)
    return first_run and spec.dropout == spec.config.dropout and not spec.io_steps and not spec.hunt_culprit


def timed_steps(spec: ChildSpec) -> range:
    """The steps whose time counts (steady state: from warmup + 1 + SETTLE_STEPS to the last compared
    step; none where no report reads them: times_its_steps); a child sharing its GPU runs them alone
    (graphdoctor.child.gpu_turn)."""
    from graphdoctor.compare.verdict import SETTLE_STEPS

    if not times_its_steps(spec):
        return range(0)
    return range(spec.config.cuda_graph_warmup_steps + 1 + SETTLE_STEPS, spec.config.steps)


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
    families = TensorFamilies.of(setup.model)
    printer = StepPrinter(families, canonical_nan=cfg.dtype == "fp16") if spec.fingerprints else None
    fp8 = None
    if printer is not None and (getattr(setup.config, "fp8", None) or getattr(setup.config, "fp4", None)):
        from graphdoctor.child.fp8_state import Fp8Watch

        fp8 = Fp8Watch(setup.model, emit, graphed=spec.impl != EAGER)
    runner = StepRunner(spec=spec, setup=setup, io=ReferenceIO(spec=spec, families=families),
                        printer=printer, taps=taps, fp8=fp8)
    emit(Tensors(names=families.layout.names, num_parameters=families.layout.total,
                 parameter_bytes=sum(p.numel() * p.element_size() for _, p in families.params),
                 fingerprint_bytes=printer.extra_bytes if printer is not None else 0,
                 experts=expert_shards(setup.model)))
    profile_last = cfg.launches and spec.role is not Role.TAPPED and spec.stop_after is None
    last = cfg.steps + (1 if profile_last else 0) - 1 if spec.stop_after is None else spec.stop_after
    first = cfg.save_at if spec.resumed else 0  # a resumed process warms up and captures again
    te_capture_step = first + cfg.cuda_graph_warmup_steps if setup.te_helper is not None else None
    turn = GpuTurn(spec.gpu_turn) if spec.gpu_turn else None
    timed = timed_steps(spec)
    evals = {p.after_step: p for p in eval_plan(cfg.steps, cfg.eval_interval)}
    save_after = cfg.save_at - 1 if spec.checkpoint_dir is not None and not spec.resumed else None
    for step in range(first, last + 1):
        phase = phase_of(spec.impl, step - first, cfg.cuda_graph_warmup_steps)
        if phase != state.phase:
            emit(Phase(phase=phase, step=step))
        state.step, state.phase = step, phase
        quiet = turn is None or step in timed
        use = contextlib.nullcontext() if turn is None else (turn.exclusive() if step in timed else turn.shared())
        with use:
            for obs in observers:
                obs.begin_step(step, state.phase)
            profiled = profile_last and step == cfg.steps
            data = runner.begin_step(step, state.phase, profiled=profiled)
            if step == te_capture_step:
                emit(runner.create_te_graphs(step))
            step_began = time.perf_counter()
            record = runner.train_step(step, state.phase, data, profiled=profiled)
            if profiled:
                state.profiled_s += time.perf_counter() - step_began
            for obs in reversed(observers):
                obs.end_step(step, state.phase)
        record = dataclasses.replace(record, quiet=quiet, resumed=spec.resumed)
        state.records.append(record)
        emit(Step(record=record))
        if record.phase == "capture" and te_capture_step is None:
            emit(Capture(step=step, seconds=record.step_time_ms / 1000.0))
        if step in evals and not record.profiled:
            _evaluate(spec, setup, state, emit, evals[step], taps)
        if step == save_after:
            save_run(spec, setup, state, emit)
    state.phase = "done"
    state.fingerprint_s += runner.fingerprint_s
    return runner.io.compare_s


def _evaluate(spec: ChildSpec, setup: Setup, state: LoopState, emit: Callable[[Event], None], point: EvalPoint,
              taps: Any) -> None:
    """The evaluation after a step (before the checkpoint there, in Megatron-LM's order)."""
    state.phase = "eval"
    emit(Phase(phase="eval", step=point.after_step))
    emit(Eval(record=run_eval(spec.config, setup, point, where=forward_step_name(spec.config.forward_step),
                              taps=taps)))


__all__ = ["LoopState", "StepObserver", "StepRunner", "phase_of", "run_steps", "timed_steps", "times_its_steps"]
