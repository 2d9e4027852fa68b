"""Entry point of one isolated diff or count child run: `python -P -m graphdoctor.child SPEC.json`.

Megatron keeps process-global graph state (graph records, mempools, RNG tracker, FullCudaGraphWrapper
class state), so every implementation trains in its own process. Events go to a JSON-lines file as
they happen (graphdoctor.protocol.events), so a crash, CUDA error or hang still leaves the steps done
so far for the parent.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from graphdoctor.protocol.events import Error, EventWriter, Phase, RunEnv, Started, Taps, Teardown
from graphdoctor.protocol.processes import spawned_at
from graphdoctor.protocol.seconds import StageClock
from graphdoctor.protocol.spec import ChildSpec

EXIT_OK = 0
EXIT_ERROR = 3

FORKED = False
"""True in a child forked from the template process (graphdoctor.child.template sets it before main): its wait from
the parent's request to its entry is the `template` stage, not the `interpreter` one."""


def _frames(tb: TracebackType | None) -> tuple[tuple[str, int, str], ...]:
    return tuple((f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb))


def _message(exc: BaseException) -> str:
    """The exception's message; for one raised without any (a bare `assert`), the source line that raised
    it, read from the innermost frame's file where it exists."""
    text = str(exc)
    if text.strip():
        return text[:4000]
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return text
    import linecache

    line = linecache.getline(frames[-1].filename, frames[-1].lineno or 0).strip()
    return f"{line} (the source line: raised without a message)" if line else text


def _module_on_stack(tb: TracebackType | None, names: dict[int, str]) -> str | None:
    """Qualified name of the innermost nn.Module whose method is on the failing stack."""
    found = None
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if obj is not None and id(obj) in names:
            found = names[id(obj)]
        tb = tb.tb_next
    return found


def run_env(spec: ChildSpec) -> RunEnv:
    """Versions and device of this child."""
    import torch

    try:
        import megatron.core

        megatron_version: str | None = megatron.core.__version__
    except ImportError:
        megatron_version = None
    gpu, capability = None, None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(spec.placement.local_rank)
        major, minor = torch.cuda.get_device_capability(spec.placement.local_rank)
        capability = (major, minor)
    return RunEnv(torch=torch.__version__, pid=os.getpid(), rank=spec.placement.rank,
                  world_size=spec.placement.world_size, megatron_core=megatron_version, gpu=gpu,
                  capability=capability)


def deterministic_algorithms() -> None:
    """Atomics-based kernels (embedding backward, index_add) make eager differ from eager;
    graphdoctor must not blame graphs for that. Uninitialised memory stays unfilled so graphs are not
    given extra fill kernels."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


@dataclass(slots=True)
class ChildRun:
    """One child's run, step by step: set up, attach observers and taps, train, report, release."""

    spec: ChildSpec
    events: EventWriter
    names: dict[int, str]
    hunt: Any = None
    """The CulpritHunt of a culprit-hunt run (graphdoctor.child.culprit)."""
    steps_done_at: float = 0.0
    """perf_counter() when the last step finished (teardown times count from it)."""
    setup: Any = None
    """The MegatronSetup once built (teardown releases its graphs)."""
    entered_at: float = 0.0
    """time.time() when run() began (the interpreter's start-up ends there)."""
    clock: StageClock | None = None
    """The seconds of each start-up and set-up stage (the end event carries them)."""

    def train(self, state: Any) -> None:
        """Everything from the model build to the end event."""
        from graphdoctor.child.culprit import CulpritHunt
        from graphdoctor.child.loop import run_steps
        from graphdoctor.child.megatron_setup import build_setup
        from graphdoctor.child.names import strip_wrappers
        from graphdoctor.child.observers import make_observers

        waited_s = 0.0
        clock = self.clock = self.clock or StageClock()
        preload()
        spawned = spawned_at()
        count_start(clock, self.entered_at, spawned)
        if self.spec.memory_gate:
            from graphdoctor.protocol.gate import wait_at_gate

            waited_s += wait_at_gate(self.spec.memory_gate, self.spec.config.timeout_s)
        started = time.perf_counter()
        startup_s = max(0.0, time.time() - spawned - waited_s) if spawned is not None else 0.0
        if self.spec.config.deterministic:
            deterministic_algorithms()
        setup = self.setup = build_setup(self.spec, clock)
        if setup.weights is not None:
            self.events.emit(setup.weights)
        if self.spec.resumed:
            from graphdoctor.child.checkpoint import resume_run

            resume_run(self.spec, setup, state, self.events.emit)
        self.names.update({id(m): strip_wrappers(n) for n, m in setup.model.named_modules()})
        with clock.stage("observers"):
            observers = make_observers(self.spec, setup.model, self.names, setup=setup)
        observers_at, attach_s = time.perf_counter(), sum(o.seconds for o in observers)
        with clock.stage("taps"):
            taps = self._install_taps(setup)
        if self.spec.gate:
            from graphdoctor.protocol.gate import wait_at_gate

            waited_s += wait_at_gate(self.spec.gate, self.spec.config.timeout_s)
        undo_align = _align(self.spec)
        t0 = time.perf_counter()
        if self.spec.hunt_culprit:
            self.hunt = CulpritHunt(self.names)
        with self.hunt.during_captures() if self.hunt else contextlib.nullcontext():
            compare_s = run_steps(self.spec, setup, state, self.events.emit, observers, taps)
        self.steps_done_at = time.perf_counter()
        train_s = (time.perf_counter() - t0 - compare_s - state.fingerprint_s - state.profiled_s
                   - sum(o.step_s for o in observers))
        for observer in observers:
            for event in observer.finish():
                self.events.emit(event)
        if taps is not None:
            self.events.emit(Taps(table=_close_taps(taps)))
        undo_align()
        seconds = {o.name: o.seconds + (state.profiled_s if o.name == "launches" else 0.0) for o in observers}
        self.events.emit(_end_event(setup, train_s=max(0.0, train_s), compare_s=compare_s + state.fingerprint_s,
                                    setup_s=observers_at - started - attach_s, waited_s=waited_s,
                                    startup_s=startup_s, observers=seconds,
                                    hooks={o.name: o.hooks_s for o in observers},
                                    watched={o.name: o.watched for o in observers if o.watched},
                                    stages=dict(clock.seconds)))

    def _install_taps(self, setup: Any) -> Any:
        if not self.spec.taps:
            return None
        from graphdoctor.child.taps import Taps as TapsInstaller
        from graphdoctor.protocol.taptable import TapTable

        try:
            return TapsInstaller(setup.model, self.names, num_steps=self.spec.config.steps + 1)
        except Exception as exc:  # noqa: BLE001 - training still runs; the report says why no taps
            self.events.emit(Taps(table=TapTable.failed(f"installing taps: {type(exc).__name__}: {exc}")))
            return None

    def fail(self, exc: BaseException, state: Any) -> None:
        """The error event for whatever ended the run (its root cause, when the chain names one)."""
        from graphdoctor.child.culprit import root_exception
        from graphdoctor.errors import MissingDependencyError

        root = root_exception(exc)
        tb = root.__traceback__
        culprit = self.hunt.found(str(root)) if self.hunt is not None else None
        self.events.emit(Error(
            error_type=type(root).__name__, message=_message(root),
            final_error=None if root is exc else f"{type(exc).__name__}: {exc}"[:1000],
            frames=_frames(tb), module=_module_on_stack(tb, self.names), step=state.step,
            phase=state.phase, unavailable=isinstance(exc, MissingDependencyError),
            culprit_rule=culprit.code if culprit else None,
            culprit_operator=f"{culprit.operator} at {culprit.location}" if culprit else None,
            culprit_location=culprit.location if culprit and culprit.user_code else None,
            culprit_module=culprit.module if culprit and culprit.module else None))


    def teardown(self) -> None:
        """After the end event, under the watchdog: release Megatron's graphs, then destroy the process
        group (a hung exit is dumped, reported and ended; the results already written stand)."""
        from graphdoctor.child.distributed import has_peers, release_graphs, teardown_distributed
        from graphdoctor.child.stacks import TEARDOWN_BOUND_S, exit_within

        self.events.emit(Phase(phase="teardown", step=-1))
        rank = int(os.environ.get("RANK", self.spec.placement.rank))
        graphs = [0, 0]  # released, still alive

        def release_then_destroy() -> None:
            if has_peers():  # a one-process child has no communicator to release: it just exits
                graphs[:] = release_graphs(getattr(self.setup, "model", None), getattr(self.setup, "te_helper", None))
            teardown_distributed()

        def done(seconds: float, hung: bool) -> None:
            self.events.emit(Teardown(rank=rank, seconds=seconds, hung=hung,
                                      since_last_step_s=time.perf_counter() - self.steps_done_at,
                                      graphs_released=graphs[0], graphs_alive=graphs[1]))

        exit_within(TEARDOWN_BOUND_S, release_then_destroy, done)


PRELOADED: tuple[str, ...] = (
    "megatron.core.models.gpt", "megatron.core.distributed", "megatron.core.optimizer",
    "megatron.core.pipeline_parallel", "megatron.core.full_cuda_graph", "megatron.core.transformer.cuda_graphs",
    "megatron.core.tensor_parallel.random", "megatron.core.transformer.module", "megatron.training.models.gpt",
    "megatron.core.process_groups_config", "graphdoctor.config.build",
    "graphdoctor.child.megatron_setup", "graphdoctor.child.observers", "graphdoctor.child.taps",
)
"""What a child imports before its set-up (the `imports` stage), and so before it waits at its memory gate: the
seconds of Megatron's imports are spent while other children hold the GPU memory (graphdoctor.parent.children)."""


def count_start(clock: StageClock, entered_at: float, spawned: float | None) -> None:
    """The start-up stages up to now: `imports` since the entry, and before it `template` (forked) or
    `interpreter` (started) since the parent asked for the process (graphdoctor.protocol.seconds.STAGE_NAMES)."""
    if not entered_at:
        return
    clock.add("imports", time.time() - entered_at)
    if spawned is not None:
        clock.add("template" if FORKED else "interpreter", entered_at - spawned)


def preload() -> None:
    """Import PRELOADED (a module that does not import here is left to fail where set-up needs it), with the garbage
    collector off, then frozen out of its reach (graphdoctor.collector)."""
    import importlib

    from graphdoctor.collector import imports_frozen

    with imports_frozen():
        for name in PRELOADED:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - set-up imports it again and reports what fails
                continue


def _close_taps(taps: Any) -> Any:
    from graphdoctor.protocol.taptable import TapTable

    try:
        return TapTable.from_dict(taps.close(), "taps")
    except Exception as exc:  # noqa: BLE001 - the run's other results still count
        return TapTable.failed(f"{type(exc).__name__}: {exc}")


def _end_event(setup: Any, *, train_s: float, compare_s: float, setup_s: float, startup_s: float,
               observers: dict[str, float], waited_s: float, hooks: dict[str, float],
               watched: dict[str, dict[str, int]], stages: dict[str, float]) -> Any:
    """Peak and reserved while the graphs (and their pools) are alive; allocated once they are not."""
    import torch

    from graphdoctor.child.distributed import delete_te_graphs
    from graphdoctor.protocol.events import End

    peak = int(torch.cuda.max_memory_allocated())
    reserved = int(torch.cuda.memory_reserved())
    delete_te_graphs(setup.te_helper)
    return End(train_s=train_s, compare_s=compare_s, setup_s=setup_s, startup_s=startup_s, observers=observers,
               hooks=hooks, watched=watched, stages=stages,
               waited_s=waited_s,
               peak_allocated_bytes=peak,
               end_reserved_bytes=reserved, end_allocated_bytes=int(torch.cuda.memory_allocated()))


def _align(spec: ChildSpec) -> Callable[[], None]:
    if not spec.graphed or not spec.config.align_rng:
        return lambda: None
    from graphdoctor.child.rng import align_rng

    return align_rng(spec.impl)


def run(spec_path: str) -> int:
    """Run one child; always leaves an `end` or `error` event behind (unless killed)."""
    entered_at = time.time()
    from graphdoctor.child.distributed import die_with_launcher, rank_spec

    with open(spec_path, encoding="utf-8") as fh:
        spec = rank_spec(ChildSpec.from_json(fh.read()))
    from graphdoctor.child.stacks import die_with_parent, register

    if spec.placement.launcher:
        die_with_launcher()
    else:
        die_with_parent()

    register(default_rank=spec.placement.rank)
    if spec.import_dir:
        sys.path.append(spec.import_dir)
    events = EventWriter(spec.events_path)
    # The parent already placed the run file's env: and the deterministic settings in our
    # environment (before CUDA could start); nothing to set here.
    import warnings

    warnings.filterwarnings("ignore")  # megatron and torch warn at every import and step
    from graphdoctor.child.loop import LoopState

    events.emit(Started(env=run_env(spec)))
    events.emit(Phase(phase="setup"))
    child = ChildRun(spec=spec, events=events, names={}, entered_at=entered_at)
    state = LoopState()
    try:
        child.train(state)
    except BaseException as exc:  # noqa: BLE001 - every failure must become an event
        child.fail(exc, state)
        return EXIT_ERROR
    child.teardown()
    return EXIT_OK


def main() -> None:
    """CLI entry: exit without running atexit/NCCL teardown, which can hang after a CUDA error."""
    if len(sys.argv) != 2:
        print("usage: python -m graphdoctor.child SPEC.json", file=sys.stderr)
        os._exit(2)
    code = run(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # A successful run already tore its process group down under the watchdog (ChildRun.teardown);
    # after a failure the process exits at once: the launcher's timeout and kill bound the rest.
    os._exit(code)


if __name__ == "__main__":
    main()
