"""Diff and count children from the parent's side: write the spec, run the child isolated (the one
runner), fold its events into a RunRecord. A ChildSession numbers the children of one diff or count,
names their files, and re-runs a child whose rendezvous port was taken.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from graphdoctor.config import DiffConfig
from graphdoctor.config.child_model import child_model
from graphdoctor.config.description import ModelDescription
from graphdoctor.config.entry_points import entry_point_modules
from graphdoctor.errors import GraphDoctorError
from graphdoctor.parent.environment import environment_cause, environment_failed
from graphdoctor.parent.fold import record_from_events
from graphdoctor.parent.gpus import JobPlan, child_bytes, cpu_slots
from graphdoctor.parent.launch import fold_launch, launch_env, multi_gpu_placement, run_launched
from graphdoctor.parent.progress import ProgressBoard
from graphdoctor.parent.resume import checkpoint_dir, clear_checkpoint, first_process, resumed_process, saves, stitched
from graphdoctor.parent.runner import (
    CANCELLED,
    STDERR_TAIL_BYTES,
    ProcessResult,
    child_env,
    python_command,
    read_stacks,
    run_isolated,
    with_port_retries,
)
from graphdoctor.parent.sizing import ChildMemory, SlotPool, kind_of, resize
from graphdoctor.parent.slots import HostTurn, physical_gpus
from graphdoctor.parent.template import ForkTemplate, adopt_early
from graphdoctor.parent.template import enabled as template_enabled
from graphdoctor.parent.torchrun import under_user_torchrun
from graphdoctor.parent.turns import Turns
from graphdoctor.protocol.events import (
    read_events,
)
from graphdoctor.protocol.gate import open_gate
from graphdoctor.protocol.processes import CHILD_MODULE
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import ChildSpec, Role, gpu_turn_path, placement_for_child, rank_path, run_name
from graphdoctor.types import Diagnosis


def _cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


ENVIRONMENT_ATTEMPT = 10
"""The attempt number (file names: `-attempt10`) of a child's run after an environment failure; its port retries
count on from there."""


def run_child(spec: ChildSpec, workdir: Path, *, env: dict[str, str] | None = None,
              cancel: threading.Event | None = None, clock: threading.Event | None = None,
              template: ForkTemplate | None = None) -> RunRecord:
    """Run one child isolated, with the diff's time limit (forked from `template` where it serves it,
    graphdoctor.parent.template); never raises for a failing child.

    Leaves `spec-<name>.json`, `events-<name>.jsonl`, `log-<name>.txt` and the stacks files
    `stacks-<name>.rank<R>.txt` in `workdir`.
    """
    spec_path = spec.write(workdir / f"spec-{spec.name}.json")
    if spec.placement.launcher:
        return run_launched(spec, spec_path, workdir / f"log-{spec.name}.txt",
                            env if env is not None else launch_env(spec.config.env, None))
    Path(spec.events_path).unlink(missing_ok=True)
    ended = run_isolated(python_command(CHILD_MODULE, str(spec_path)), timeout_s=spec.config.timeout_s,
                         log_path=workdir / f"log-{spec.name}.txt",
                         env=env if env is not None else child_env(spec.config.env),
                         stacks_prefix=workdir / f"stacks-{spec.name}", cancel=cancel, clock=clock,
                         template=template)
    return record_from_events(spec, read_events(spec.events_path), ended)


def fold_stopped(spec: ChildSpec, workdir: Path, signal_name: str) -> RunRecord:
    """The record of a child that the parent's stop ended before run_child returned: its events so far, its
    stacks (stop_running asked for them) and its log's tail, with status `stopped`."""
    log = workdir / f"log-{spec.name}.txt"
    tail = log.read_bytes()[-STDERR_TAIL_BYTES:].decode("utf-8", "replace") if log.is_file() else ""
    ended = ProcessResult(returncode=None, timed_out=False, wall_s=0.0, log_tail=tail,
                          stacks=read_stacks(workdir / f"stacks-{spec.name}"), stopped=signal_name)
    if spec.placement.launcher:
        return fold_launch(spec, ended)
    return record_from_events(spec, read_events(spec.events_path), ended)


@contextlib.contextmanager
def work_directory(workdir: str | os.PathLike[str] | None, prefix: str) -> Iterator[Path]:
    """The directory a command's children write their specs, events and logs into: `workdir` (made if
    missing, kept), or a new temporary one named `prefix...`, removed when the command ends."""
    own = workdir is None
    base = Path(tempfile.mkdtemp(prefix=prefix)) if workdir is None else Path(workdir)
    base.mkdir(parents=True, exist_ok=True)
    try:
        yield base
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)


def never_started(impl: str, dropout: float, signal_name: str) -> RunRecord:
    """The record of a child that a stop (graphdoctor.parent.stopping) kept from starting: status `stopped`."""
    return RunRecord(impl=impl, dropout=dropout, status="stopped", diagnosis=Diagnosis(
        error_type="stopped", message=f"stopped by {signal_name} with graphdoctor before it started"))


def progress_events(spec: ChildSpec) -> str:
    """The events file the progress board follows: rank 0's of a multi-GPU child."""
    return rank_path(spec.events_path, 0, spec.placement.world_size) if spec.placement.launcher else spec.events_path


def total_steps(spec: ChildSpec) -> int:
    """How many steps the child will run (the profiled extra step included)."""
    if spec.stop_after is not None:
        return spec.stop_after + 1
    return spec.config.steps + (1 if spec.config.launches and spec.role is not Role.TAPPED else 0)


def port_taken(record: RunRecord) -> bool:
    """True when a child failed in setup because its rendezvous port was already in use."""
    diag = record.diagnosis
    return (record.status == "error" and diag is not None and diag.phase == "setup"
            and "EADDRINUSE" in diag.message)


def user_import_dir(config: DiffConfig) -> str | None:
    """The working directory, when a `pkg.mod:fn` the run names is importable from there (children
    then append it to their import path, last); None otherwise."""
    cwd = os.getcwd()
    for module in entry_point_modules(config):
        top = module.split(".")[0]
        if os.path.isdir(os.path.join(cwd, top)) or os.path.isfile(os.path.join(cwd, f"{top}.py")):
            return cwd
    return None


class MemoryGrant:
    """One child's share of its GPU's memory (its claim on the machine-wide budget, graphdoctor.parent.slots, then a
    slot of the session's queue), taken on a thread of its own while the child starts and imports, then given by
    opening the child's memory gate (graphdoctor.protocol.gate).

    The memory comes first: a child whose need does not fit now waits without holding one of the session's slots, so
    a smaller child asked for after it (an eager run of the control pair beside a graphed first run) may take the
    memory it leaves and start in the same round."""

    def __init__(self, slots: SlotPool, gate: Path, host: HostTurn | None = None) -> None:
        self.gate = gate
        self.granted = threading.Event()
        """Set once the slot is held and the gate open (the child's time limit counts from here)."""
        self._slots = slots
        self._host = host
        self._lock = threading.Lock()
        self._held = False
        self._device: str | None = None
        self._released = False
        threading.Thread(target=self._take, name="graphdoctor-grant", daemon=True).start()

    def _take(self) -> None:
        if self._host is not None:
            taken = self._host.take(lambda: self._released)
            with self._lock:
                if not taken or self._released:  # the child ended while it waited for the machine's budget
                    self._host.release()
                    return
        device = self._slots.get()
        with self._lock:
            if self._released:  # the child ended (or was cancelled) before its turn
                self._slots.put(device)
                return
            self._held, self._device = True, device
        open_gate(self.gate)
        self.granted.set()

    def release(self) -> None:
        """The child ended: its slots go back (or, not granted yet, are never taken)."""
        with self._lock:
            self._released = True
            if self._held:
                self._held = False
                self._slots.put(self._device)
        if self._host is not None:
            self._host.release()


@dataclass(frozen=True, slots=True)
class ChildRequest:
    """One child a session should run."""

    impl: str
    dropout: float
    role: Role
    ref_dir: Path
    hunt: bool = False
    taps: bool = False
    io_steps: tuple[int, ...] = ()
    """Steps whose tensors are saved (reference) or compared element by element (graphed)."""
    stop_after: int | None = None
    """Last step to run (targeted re-runs); None: every step."""
    fingerprints: bool = True
    """Fingerprint every step (off only for baseline timings: tests/benchmarks/diff_scale.py)."""

    @property
    def targeted(self) -> bool:
        """A re-run that exists to save or compare some steps' tensors."""
        return bool(self.io_steps)

    def describe(self) -> str:
        """`graphed`, `culprit hunt`, `tapped reference`, `re-run of step 3`, ..."""
        if self.hunt:
            return "culprit hunt"
        if self.taps:  # a tapped pair's children are `tapped`; a reference that also taps, `tapped reference`
            return "tapped" if self.role is Role.TAPPED else "tapped " + self.role.value
        if self.targeted:
            return f"{self.role.value} re-run of step{'s' if len(self.io_steps) > 1 else ''} " + \
                ",".join(map(str, self.io_steps))
        return self.role.value


class ChildSession:
    """One diff's (or count's) working directory, the children it ran, and where they run."""

    def __init__(self, config: DiffConfig, workdir: Path, board: ProgressBoard | None = None,
                 plan: JobPlan | None = None) -> None:
        self.config = config
        self.workdir = workdir
        self.board = board
        self.plan = plan or JobPlan(jobs=1, gpus=(), shared=False, reason="children run in series")
        self.num_children = 0
        self.child_wall_s = 0.0
        self.import_dir = user_import_dir(config)
        self._lock = threading.Lock()
        self.started: list[tuple[ChildRequest, ChildSpec]] = []
        """Every child started, in order, with the request it serves (stopped_records reads them)."""
        self.finished: dict[str, RunRecord] = {}
        """The record of every child that ended (failing, timed out or stopped too), by name."""
        self._slots = SlotPool(list(self.plan.gpus) or [None], self.plan.jobs)
        self.memory = ChildMemory(child_bytes(config), config.nproc_per_node, child_bytes(config, graphed=False))
        """Each child's memory need: the first estimate, then what the children that ended measured."""
        self.resized: str | None = None
        """What the last measured figure made of the memory slots (the report's jobs line ends with it)."""
        self.gate: str | None = None
        """The gate every child started from now on waits at before its first step (graphdoctor.parent.preflight)."""
        self._pool: ThreadPoolExecutor | None = None
        self._cancels: dict[Future[RunRecord], threading.Event] = {}
        self.starts = max(self.plan.most, cpu_slots()) if self.memory_gated else max(self.plan.jobs, 1)
        """Children alive at once: with memory gates, more than hold GPU memory (the others import meanwhile)."""
        self._starts = threading.Semaphore(self.starts)
        self.num_gates = 0
        self.turns = Turns(2 * config.timeout_s + 60.0)
        """Admission of the children: a retry of the machine's failure runs alone (graphdoctor.parent.turns)."""
        self._live: set[str] = set()
        """Children of this session whose processes run now, by name."""
        self.ran_beside: set[str] = set()
        """Children that ran while another child of this session ran (on a shared GPU: beside its memory)."""
        self.retried: list[tuple[str, str]] = []
        """(first attempt's name, cause) of each child the machine failed and that ran again (run_request)."""
        self._models: dict[tuple[str, float], ModelDescription | None] = {}
        """Each (impl, dropout)'s model, resolved once (_child_model)."""
        self._no_template = False
        self.template: ForkTemplate | None = None
        """The process this session's one-process children are forked from (graphdoctor.parent.template),
        started with the first of them (_template)."""
        self.first_template: ForkTemplate | None = None
        """The first template this session used, kept after close() for the report's timeline."""

    @property
    def memory_gated(self) -> bool:
        """Children share one GPU: each starts when a process slot is free and builds its model once a memory
        slot is (MemoryGrant); several GPUs, or one child at a time, need no gate."""
        return self.plan.shared and len(self.plan.gpus) <= 1 and self.config.nproc_per_node == 1

    def spec(self, request: ChildRequest, *, attempt: int = 0, gpu_turn: str | None = None,
             resumed: bool = False) -> ChildSpec:
        """The spec of the next child (each gets its own rendezvous port and file names; `resumed`:
        the second process of a --resume run, graphdoctor.parent.resume)."""
        config = self.config
        if request.role is Role.TAPPED or request.targeted:
            config = config.replace(memory=False, launches=False)
        name = run_name(request.impl, request.dropout, request.role, attempt=attempt, hunt=request.hunt,
                        taps=request.taps, io_steps=request.io_steps, resumed=resumed)
        with self._lock:
            index = self.num_children
            self.num_children += 1
        # One placement, not one computed (binding a free port) and then replaced.
        placement = (multi_gpu_placement(config.nproc_per_node, config.tensor_model_parallel_size,
                                         config.pipeline_model_parallel_size)
                     if config.nproc_per_node > 1 else placement_for_child(index))
        return ChildSpec(impl=request.impl, dropout=request.dropout, config=config, role=request.role,
                         name=name, events_path=str(self.workdir / f"events-{name}.jsonl"),
                         reference_dir=str(request.ref_dir), placement=placement,
                         artifacts_dir=self.config.trace_dir or str(self.workdir),
                         hunt_culprit=request.hunt,
                         keep_snapshots=self.config.snapshot_dir is not None, taps=request.taps,
                         import_dir=self.import_dir, io_steps=request.io_steps,
                         stop_after=request.stop_after, gpu_turn=gpu_turn,
                         fingerprints=request.fingerprints, resumed=resumed, gate=self.gate,
                         model=self._child_model(request.impl, request.dropout))

    def _child_model(self, impl: str, dropout: float) -> ModelDescription | None:
        """The model a child of `impl` and `dropout` builds, resolved once per pair here so that the child builds
        from it without resolving again (a launch line: Megatron-LM's parse and validate_args); None where Megatron
        refuses it or it needs what this process lacks: the child then resolves it itself and fails as it would."""
        key = (impl, dropout)
        with self._lock:
            if key in self._models:
                return self._models[key]
        try:
            model: ModelDescription | None = child_model(self.config, impl, dropout)
        except GraphDoctorError:
            model = None
        with self._lock:
            self._models[key] = model
        return model

    def submit(self, request: ChildRequest) -> Future[RunRecord]:
        """Run `request` on a worker thread as soon as a GPU slot is free (requests start in the order they were
        submitted); cancel() ends it early."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.starts, thread_name_prefix="graphdoctor-child")
        event = threading.Event()
        future = self._pool.submit(self.run_request, request, event)
        with self._lock:
            self._cancels[future] = event
        return future

    def cancel(self, futures: list[Future[RunRecord]], *, wait: bool = True) -> None:
        """These children are no longer needed: those not started never start, those running are killed (their
        records say `stopped` runner.CANCELLED); with `wait`, returns once every one has ended."""
        for future in futures:
            with self._lock:
                event = self._cancels.get(future)
            if event is not None:
                event.set()
            future.cancel()
        for future in futures if wait else ():
            if not future.cancelled():
                future.exception()  # waits; run_request never raises for a failing child

    def _template(self) -> ForkTemplate | None:
        """The template process this session's one-process children are forked from: the command's early one
        (graphdoctor.parent.template.start_early) where it was started with the session's environment, else one
        started with the first of them (None under a launcher, with GRAPHDOCTOR_FORK_TEMPLATE=0, or where it could
        not start). It is started from a thread of its own, which lives until close() (graphdoctor.parent.template)."""
        if self.config.nproc_per_node != 1 or not template_enabled() or self._no_template:
            return None
        with self._lock:
            if self.template is None:
                self.template = adopt_early(self.config.env, self.workdir / "log-template.txt")
            if self.template is None:
                try:
                    self.template = ForkTemplate(child_env(self.config.env), self.workdir / "log-template.txt")
                except OSError as exc:  # the children start as their own interpreters instead
                    self._no_template = True
                    self.note(f"children start as their own interpreters: the template process did not start ({exc})")
            if self.first_template is None:
                self.first_template = self.template
            return self.template

    def close(self) -> None:
        """End the session's worker threads, cancelling what they have not started, then its template."""
        if self._pool is not None:
            self.cancel(list(self._cancels))
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.template is not None:
            self.template.close()
            self.template = None

    def run_request(self, request: ChildRequest, cancel: threading.Event | None = None) -> RunRecord:
        """Run one request on the next free GPU slot (again, on a new port, when its port was taken) and
        account its time; `cancel` set ends it (graphdoctor.parent.runner.run_isolated). A child the machine
        failed (graphdoctor.parent.environment: before its first step, or out of memory beside the session's other
        children on a shared GPU) runs once more, alone (graphdoctor.parent.turns); failed so again, its record is
        `environment-failed`. A retry that ran alone and ran out of memory after its first step keeps its own
        record: the model does not fit."""
        with self.turns.turn(cancel):
            first = self._run_once(request, cancel, 0)
        cause = self._machine_cause(first)
        if cause is None or _cancelled(cancel):
            return first
        self.note(f"{request.impl} {request.describe()}: {cause}; it runs again alone, once this run's children "
                  "started before it have finished")
        with self.turns.turn(cancel, alone=True):
            retry = self._run_once(request, cancel, ENVIRONMENT_ATTEMPT)
        if retry.name:  # it started (a retry cancelled before it started has no name)
            with self._lock:
                self.retried.append((first.name or f"{request.impl} {request.describe()}", cause))
        again = self._machine_cause(retry)
        if again is None or _cancelled(cancel):
            return retry
        return environment_failed(retry, again, physical_gpus(",".join(self.plan.gpus) or None), first)

    def _machine_cause(self, record: RunRecord) -> str | None:
        """Why the machine, not the model, failed `record` (graphdoctor.parent.environment), counting an out-of-memory
        error at any step where the child shared its GPU's memory with another child of this session."""
        return environment_cause(record, shared=self.memory_gated and record.name in self.ran_beside)

    def _run_once(self, request: ChildRequest, cancel: threading.Event | None, attempt: int) -> RunRecord:
        if self.memory_gated:
            return self._run_gated(request, cancel, attempt)
        device = self._slots.get()
        host = self.host_turn(request, device)
        try:
            if _cancelled(cancel) or not host.take(lambda: _cancelled(cancel)):
                return never_started(request.impl, request.dropout, CANCELLED)
            return self._run_on(request, device, cancel, attempt=attempt)
        finally:
            host.release()
            self._slots.put(device)

    def host_turn(self, request: ChildRequest, device: str | None) -> HostTurn:
        """The child's claim on the machine-wide budget of its GPUs (graphdoctor.parent.slots): its kind's memory
        need per GPU (the estimate, or what the children of its kind that ended measured), told as the child it is."""
        need = self.memory.need(kind_of(request.impl))
        return HostTurn.on(physical_gpus(device), need.bytes, f"{request.impl} {request.describe()}", self.note,
                           need.headroom)

    def measured(self, record: RunRecord) -> None:
        """An ended child's memory figures: a raised need re-sizes a shared GPU's memory slots (sizing.resize)."""
        need = self.memory.observe(record)
        if need is not None and self.memory_gated and self.plan.total_bytes:
            self.resized = resize(self._slots, self.memory, self.plan)
            self.note(f"children: {self.resized}")

    @property
    def jobs_line(self) -> str:
        """The plan's reason, and what measurement made of it."""
        return self.plan.reason + (f"; {self.resized}" if self.resized else "")

    def _run_gated(self, request: ChildRequest, cancel: threading.Event | None, attempt: int = 0) -> RunRecord:
        """run_request with a memory gate: the child starts once a process slot is free; its memory slot is
        taken beside it (MemoryGrant) and its time limit counts from the grant."""
        with self._starts:
            if cancel is not None and cancel.is_set():
                return never_started(request.impl, request.dropout, CANCELLED)
            with self._lock:
                self.num_gates += 1
                index = self.num_gates
            device = self.plan.gpus[0] if self.plan.gpus else None
            grant = MemoryGrant(self._slots, self.workdir / f"memory-{index}", self.host_turn(request, device))
            try:
                return self._run_on(request, device, cancel, grant, attempt=attempt)
            finally:
                grant.release()

    def _run_on(self, request: ChildRequest, device: str | None, cancel: threading.Event | None,
                grant: MemoryGrant | None = None, *, attempt: int = 0) -> RunRecord:
        """Run one request on `device` (with its memory grant, when gated) and account its time; its files are
        named from attempt number `attempt` on (port retries count up from it)."""
        first_attempt = attempt
        turn = gpu_turn_path(device if device is not None else "0") if self.plan.shared else None
        env = child_env(self.config.env)
        if self.config.nproc_per_node > 1:
            env = launch_env(self.config.env, device)
        elif device is not None and len(self.plan.gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = device

        def process(spec: ChildSpec) -> RunRecord:
            if grant is not None:
                spec = dataclasses.replace(spec, memory_gate=str(grant.gate))
            if self.board is not None:
                self.board.child_started(spec.name, request.impl, request.describe(), progress_events(spec),
                                         total_steps(spec))
            with self._lock:
                self.started.append((request, spec))
                self._live.add(spec.name)
                if len(self._live) > 1:
                    self.ran_beside.update(self._live)
            try:
                record = run_child(spec, self.workdir, env=env, cancel=cancel,
                                   clock=grant.granted if grant is not None else None,
                                   template=None if spec.placement.launcher else self._template())
            finally:
                with self._lock:
                    self._live.discard(spec.name)
            with self._lock:
                self.finished[spec.name] = record
            self.measured(record)
            if self.board is not None:
                self.board.child_finished(spec.name, record.status, record.wall_s)
            return record

        def run_attempt(port_retry: int) -> RunRecord:
            number = first_attempt + port_retry
            spec = self.spec(request, attempt=number, gpu_turn=turn)
            if not saves(spec.config, request.role, request.stop_after):
                return process(spec)
            return self._with_checkpoint(spec, process, lambda: self.spec(request, attempt=number,
                                                                          gpu_turn=turn, resumed=True))

        # Under torchrun every rank derives the same port; a retry on one rank alone would split them.
        record, failed = with_port_retries(run_attempt, port_taken, 0 if under_user_torchrun() is not None else 2)
        with self._lock:
            self.child_wall_s += record.wall_s + sum(r.wall_s for r in failed)
        return record

    def stopped_records(self, requests: list[ChildRequest], signal_name: str) -> dict[ChildRequest, RunRecord]:
        """After a stop (graphdoctor.parent.stopping): the record of each request's last started child, as it
        ended (a worker thread's child was folded as `stopped` when the stop ended it) or, for the child the
        stop interrupted in this thread, folded here from its events and stacks. Requests whose child never
        started are left out."""
        records: dict[ChildRequest, RunRecord] = {}
        for request, spec in self.started:
            if request in requests:
                records[request] = self.finished.get(spec.name) or fold_stopped(spec, self.workdir, signal_name)
        return records

    def _with_checkpoint(self, spec: ChildSpec, process: Callable[[ChildSpec], RunRecord],
                         resumed_spec: Callable[[], ChildSpec]) -> RunRecord:
        """A run that saves its checkpoint (--save-at); with --resume, its first process ends there and
        a second one loads it and trains on: one record of both. The checkpoint is removed after."""
        directory = checkpoint_dir(self.workdir, spec.name)
        clear_checkpoint(directory)
        try:
            first = process(first_process(spec, directory))
            if not spec.config.resume or first.status != "ok":
                return first
            return stitched(first, process(resumed_process(resumed_spec(), directory)))
        finally:
            clear_checkpoint(directory)

    def note(self, text: str) -> None:
        """One line of the parent's own on the progress board."""
        if self.board is not None:
            self.board.note(text)

    def run_many(self, requests: list[ChildRequest]) -> list[RunRecord]:
        """Run independent requests, plan.jobs at a time (more once memory is measured); results in request order."""
        if self.plan.most <= 1 or len(requests) <= 1:
            return [self.run_request(r) for r in requests]
        return [future.result() for future in [self.submit(r) for r in requests]]


__all__ = ["CHILD_MODULE", "ChildRequest", "ChildSession", "MemoryGrant", "fold_stopped", "never_started", "port_taken", "run_child",
           "user_import_dir", "work_directory"]
