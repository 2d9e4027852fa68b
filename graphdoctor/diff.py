"""`diff`: run a Megatron-Core model eager and graphed side by side and judge each implementation.

The Python API behind `graphdoctor diff` (and the pytest plugin): `diff(config) -> DiffReport`. Every
child runs isolated with a timeout (graphdoctor.parent); the eager reference saves per-step tensors
that each graphed child compares against on its GPU. With dropout on, a dropout-free control pair
tells RNG from numerics; after a divergence a tapped pair localizes it.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.availability import TE_INSTALL_HINT, why_unavailable
from graphdoctor.compare.forensics import analyze
from graphdoctor.compare.prints import differing_steps, family_diff
from graphdoctor.compare.rng_verdict import apply_forensics
from graphdoctor.compare.verdict import ImplResult, find_divergence, judge, reference_failed, stopped_row
from graphdoctor.config import DiffConfig
from graphdoctor.config.child_model import run_model
from graphdoctor.config.description import model_facts
from graphdoctor.errors import stopped_exit_code
from graphdoctor.parent.children import ChildRequest, ChildSession, never_started, work_directory
from graphdoctor.parent.gpus import plan_jobs
from graphdoctor.parent.progress import ProgressBoard
from graphdoctor.parent.static import (
    moe_static_findings,
    predicted_setup_failure,
    refuse_before_gpu_work,
    with_static_findings,
)
from graphdoctor.parent.stopping import partial_report_on_stop
from graphdoctor.protocol.events import RunEnv
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import EAGER, Role
from graphdoctor.rules import get_rule, rule_fix
from graphdoctor.types import Diagnosis, Verdict

SCHEMA_VERSION = 2
"""Version of the JSON report (docs/diff.md). 2: the eager implementation is `eager` (was `none`),
runs carry `name` and their end-of-run memory figures at the top level; schema 1 reports still load."""

IMPL_NOTES = {
    "local": "Megatron's local implementation runs its warmups without restoring the RNG state "
             "(Transformer Engine restores it), so graphed dropout masks are shifted against eager",
}



@dataclass(frozen=True, slots=True)
class DiffReport:
    """Result of one `diff`: one ImplResult per implementation, plus the eager reference."""

    config: DiffConfig
    results: tuple[ImplResult, ...]
    reference: RunRecord
    control_reference: RunRecord | None = None
    wall_s: float = 0.0
    """Wall time of the whole diff."""
    child_wall_s: float = 0.0
    """Sum of the children's wall times."""
    scratch_bytes: int = 0
    """Most bytes the diff held on disk for reference tensors at once (targeted re-runs only)."""
    jobs: str = ""
    """How the children were scheduled (one line)."""
    stopped: str | None = None
    """The signal that stopped graphdoctor before the diff finished (`SIGTERM`, ...): a partial report."""
    model: dict[str, Any] | None = None
    """The model as built (graphdoctor.config.description.model_facts); None in reports written before it."""

    @property
    def env(self) -> RunEnv | None:
        """Versions and device, as the eager reference reported them."""
        return self.reference.env

    def exit_code(self) -> int:
        """0: all passed (rng-divergence unless strict_rng) and every process exited within its bound;
        2: the reference hit a usage error; else 1 (a teardown-hang is a finding even when the results
        match); 128 + the signal's number when a signal stopped the diff (as the process exits)."""
        if self.stopped is not None:
            return stopped_exit_code(self.stopped)
        if self.reference.status == "error" and getattr(self.reference.diagnosis, "error_type", "") == "UsageError":
            return 2
        if any(e.hung for run in (self.reference, *(r for res in self.results for r in res.runs))
               for e in run.teardown):
            return 1
        for result in self.results:
            if result.verdict == Verdict.UNAVAILABLE:
                continue
            if not result.verdict.passed:
                return 1
            if result.verdict == Verdict.RNG_DIVERGENCE and self.config.strict_rng:
                return 1
        return 0

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON report (schema in docs/diff.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "graphdoctor diff",
            "config": self.config.to_dict(),
            "env": self.env.to_dict() if self.env else {},
            "exit_code": self.exit_code(),
            "wall_s": self.wall_s,
            "child_wall_s": self.child_wall_s,
            "scratch_bytes": self.scratch_bytes,
            "jobs": self.jobs,
            "reference": self.reference.to_dict(),
            "control_reference": self.control_reference.to_dict() if self.control_reference else None,
            "impls": [r.to_dict() for r in self.results],
            "stopped": self.stopped,
            "model": self.model,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiffReport:
        """A saved report (schema 1 or 2) as a DiffReport.

        Raises:
            ValueError: a schema this version cannot read.
        """
        version = data.get("schema_version")
        if version not in (1, SCHEMA_VERSION):
            raise ValueError(f"schema_version: got {version!r}, expected 1 or {SCHEMA_VERSION}")
        control = data.get("control_reference")
        return cls(config=DiffConfig.from_dict(data["config"]),
                   results=tuple(ImplResult.from_dict(r) for r in data.get("impls", ())),
                   reference=RunRecord.from_dict(data["reference"]),
                   control_reference=RunRecord.from_dict(control) if control else None,
                   wall_s=float(data.get("wall_s", 0.0)), child_wall_s=float(data.get("child_wall_s", 0.0)),
                   scratch_bytes=int(data.get("scratch_bytes", 0)), jobs=str(data.get("jobs", "")),
                   stopped=str(data["stopped"]) if data.get("stopped") else None,
                   model=data["model"] if isinstance(data.get("model"), dict) else None)


def _unavailable(impl: str, why: str) -> ImplResult:
    fix = "run with --dtype bf16" if "bf16" in why else TE_INSTALL_HINT
    diag = Diagnosis(error_type="unavailable", message=why, fix=fix)
    return ImplResult(impl=impl, verdict=Verdict.UNAVAILABLE, diagnosis=diag)


def diff(config: DiffConfig, *, workdir: str | Path | None = None,
         progress: ProgressBoard | None = None) -> DiffReport:
    """Run eager and every requested graphed implementation; judge each.

    Args:
        config: the run.
        workdir: where children write specs, events and logs (default: a temporary directory,
            removed afterwards; docs/protocol.md lists the files).
        progress: where to show the running children (graphdoctor.parent.progress; the CLI shows
            one on stderr); None shows nothing.

    Returns:
        The DiffReport (render it with graphdoctor.report).

    Raises:
        NoGPUError: no CUDA GPU is visible.
        MissingDependencyError: the TE layer spec without an importable Transformer Engine; sequence
            parallel with the local layer spec without Apex; selective recompute of layernorm, moe_act
            or gdn_norm_out without Transformer Engine (megatron-core 0.19.2).
    """
    refuse_before_gpu_work(config, "graphdoctor diff")
    started = time.perf_counter()
    with work_directory(workdir, "graphdoctor-") as base:
        plan = plan_jobs(config)
        session = ChildSession(config, base, progress, plan)
        session.note(plan.reason)
        run = DiffRun(session)
        # stopped: the children are ended already; the partial report says how far they got
        with partial_report_on_stop(lambda signal_name: dataclasses.replace(
                run.stopped_report(signal_name), wall_s=time.perf_counter() - started,
                model=model_facts(run_model(config)))):
            report = run.run_all()
    return dataclasses.replace(report, wall_s=time.perf_counter() - started, model=model_facts(run_model(config)))


def _scratch_dir(workdir: Path, name: str) -> Path:
    """A directory for reference tensors: /dev/shm when it has room, else the work directory."""
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and shutil.disk_usage(shm).free > (2 << 30) else workdir
    return Path(tempfile.mkdtemp(prefix=f"graphdoctor-{name}-", dir=root))


class DiffRun:
    """One diff's decision tree, as named steps: the reference and every implementation (at once when
    the plan allows), then per implementation the culprit hunt, the control pair, the targeted
    re-runs that measure a divergence, the eager noise floor, forensics and hazards."""

    def __init__(self, session: ChildSession) -> None:
        self.session = session
        self.config = session.config
        self.ref_dir = _scratch_dir(session.workdir, "ref")
        self.control_reference: RunRecord | None = None
        self._tapped_reference: RunRecord | None = None
        self._saved: dict[tuple[float, tuple[int, ...]], RunRecord] = {}
        self.scratch_bytes = 0
        self.first: list[ChildRequest] = []
        """The first children: the eager reference, then each runnable implementation (stopped_report)."""

    def run_all(self) -> DiffReport:
        """Reference and implementations, judged; scratch directories removed afterwards."""
        try:
            for folder in (self.config.trace_dir, self.config.snapshot_dir):
                if folder:
                    Path(folder).mkdir(parents=True, exist_ok=True)
            runnable = [impl for impl in self.config.impls if why_unavailable(impl, self.config) is None
                        and predicted_setup_failure(self.config, impl) is None]
            self.first = ([self.request(EAGER, self.config.dropout, Role.REFERENCE, taps=self.config.localize is True)]
                          + [self.request(impl, self.config.dropout, Role.GRAPHED, taps=self.config.localize is True)
                             for impl in runnable])
            first = self.session.run_many(self.first)
            reference, graphed = first[0], dict(zip(runnable, first[1:], strict=True))
            results = [self.judge_impl(impl, reference, graphed.get(impl)) for impl in self.config.impls]
        finally:
            shutil.rmtree(self.ref_dir, ignore_errors=True)
        return DiffReport(config=self.config, results=tuple(results), reference=reference,
                          control_reference=self.control_reference,
                          child_wall_s=self.session.child_wall_s, scratch_bytes=self.scratch_bytes,
                          jobs=self.session.plan.reason)

    def stopped_report(self, signal_name: str) -> DiffReport:
        """The partial report of a diff stopped by `signal_name`: each implementation's row from the first
        children as the stop left them (compare.verdict.stopped_row), with its static findings."""
        cfg = self.config
        records = self.session.stopped_records(self.first, signal_name)
        reference = records.get(self.first[0]) if self.first else None
        if reference is None:
            reference = never_started(EAGER, cfg.dropout, signal_name)
        graphed = {request.impl: records.get(request) for request in self.first[1:]}
        rows = []
        for impl in cfg.impls:
            why_not = why_unavailable(impl, cfg)
            row = _unavailable(impl, why_not) if why_not is not None else stopped_row(
                reference, graphed.get(impl), impl, stopped_by=signal_name, warmup_steps=cfg.cuda_graph_warmup_steps,
                rtol=cfg.rtol, atol=cfg.atol)
            rows.append(with_static_findings(row, cfg))
        return DiffReport(config=cfg, results=tuple(rows), reference=reference,
                          control_reference=self.control_reference, child_wall_s=self.session.child_wall_s,
                          scratch_bytes=self.scratch_bytes, jobs=self.session.plan.reason, stopped=signal_name)

    def request(self, impl: str, dropout: float, role: Role, **kwargs: Any) -> ChildRequest:
        """A child request against this diff's scratch directory."""
        return ChildRequest(impl, dropout, role, self.ref_dir, **kwargs)

    def judge(self, reference: RunRecord, graphed: RunRecord, **kwargs: Any) -> ImplResult:
        """judge() with this diff's warmup and tolerances."""
        cfg = self.config
        return judge(reference, graphed, warmup_steps=cfg.cuda_graph_warmup_steps, rtol=cfg.rtol,
                     atol=cfg.atol, **kwargs)

    def judge_impl(self, impl: str, reference: RunRecord, graphed: RunRecord | None) -> ImplResult:
        """The row of one implementation, with its static findings (GD217 names a MoE capture failure):
        the same row in diff and in each advise candidate."""
        return with_static_findings(self._row(impl, reference, graphed), self.config)

    def _row(self, impl: str, reference: RunRecord, graphed: RunRecord | None) -> ImplResult:
        cfg = self.config
        why_not = why_unavailable(impl, cfg)
        predicted = predicted_setup_failure(cfg, impl) if why_not is None else None
        if predicted is not None:
            return predicted
        if why_not is not None or graphed is None:
            return _unavailable(impl, why_not or "not run")
        if reference.status != "ok":
            return reference_failed(impl)
        graphed = _with_print_diffs(reference, self.measure(reference, graphed))
        result = _with_eager_memory(self.judge(reference, graphed), reference)
        if result.verdict == Verdict.CAPTURE_FAILED:
            return self.hunt_culprit(result, impl)
        if result.divergence is not None and cfg.dropout > 0:
            result = self.control_pair(impl, reference, graphed)
        if result.verdict == Verdict.NUMERIC_DIVERGENCE:
            result = self.eager_noise(result, reference)
        result = self.forensics(result, reference, graphed)
        return _hazards(result, graphed)

    def measure(self, reference: RunRecord, graphed: RunRecord) -> RunRecord:
        """Where the fingerprints differ, measure by how much: a re-run pair that saves (eager) and
        compares element by element (graphed) only those steps, and ends there. Bitwise: the first
        differing step; with --rtol/--atol: every differing step (the tolerance decides there)."""
        if reference.status != "ok" or graphed.status != "ok":
            return graphed
        names = graphed.tensor_names or reference.tensor_names
        steps = differing_steps(names, reference.steps, graphed.steps)
        if not steps:
            return graphed
        io_steps = steps if not self.config.bitwise else steps[:1]
        dropout = graphed.dropout
        # One scratch directory per dropout: the eager tensors saved for one implementation serve
        # every other implementation that differs at the same steps (the eager re-run runs once).
        scratch = self.ref_dir / f"d{dropout:g}"
        scratch.mkdir(exist_ok=True)
        last = max(io_steps)
        key = (dropout, io_steps)
        if key not in self._saved:
            self._saved[key] = self.session.run_request(
                ChildRequest(EAGER, dropout, Role.REFERENCE, scratch, io_steps=io_steps, stop_after=last))
            self.scratch_bytes = max(self.scratch_bytes, _tree_bytes(self.ref_dir))
        if self._saved[key].status != "ok":
            return graphed
        compared = self.session.run_request(
            ChildRequest(graphed.impl, dropout, Role.GRAPHED, scratch, io_steps=io_steps, stop_after=last))
        measured = {s.step: s for s in compared.steps if s.step in io_steps}
        if compared.status != "ok" or len(measured) != len(io_steps):
            return graphed
        steps_out = tuple(dataclasses.replace(s, grads=measured[s.step].grads, params=measured[s.step].params)
                          if s.step in measured else s for s in graphed.steps)
        return dataclasses.replace(graphed, steps=steps_out)

    def control_pair(self, impl: str, reference: RunRecord, graphed: RunRecord) -> ImplResult:
        """Judge again with a dropout-free control pair (the control reference runs once per diff,
        alongside the first control run when the plan allows)."""
        if self.control_reference is None:
            self.control_reference, control = self.session.run_many([
                self.request(EAGER, 0.0, Role.REFERENCE), self.request(impl, 0.0, Role.GRAPHED)])
        else:
            control = self.session.run_request(self.request(impl, 0.0, Role.GRAPHED))
        # Without its reference the control run has nothing to compare against.
        control_graphed = (self.measure(self.control_reference, control)
                           if self.control_reference.status == "ok" else None)
        result = _with_eager_memory(self.judge(reference, graphed, control_reference=self.control_reference,
                                               control_graphed=control_graphed), reference)
        if result.verdict == Verdict.RNG_DIVERGENCE and impl in IMPL_NOTES:
            result = _add_note(result, IMPL_NOTES[impl])
        return result

    def eager_noise(self, result: ImplResult, reference: RunRecord) -> ImplResult:
        """Run eager again: is eager itself bitwise reproducible here (fingerprints against the
        reference, or the control reference when dropout is on)?"""
        cfg = self.config
        base = self.control_reference if cfg.dropout > 0 and self.control_reference is not None else reference
        again = self.session.run_request(self.request(EAGER, base.dropout, Role.GRAPHED))
        if again.status != "ok":
            return result
        noise = find_divergence(base, again, rtol=cfg.rtol, atol=cfg.atol)
        if noise is None:
            return _add_note(result, "eager repeated against eager is bitwise reproducible here, so "
                                     "the difference comes from the graphed run")
        return dataclasses.replace(result, runs=(*result.runs, again), notes=(
            *result.notes, f"eager is not reproducible run to run here (eager vs eager first differs "
                           f"at step {noise.step} {noise.label}{', max abs ' + format(noise.max_abs, '.3g') if noise.measured else ''}); "
                           f"compare with --atol at or above that noise floor"))

    def tapped_pair(self, impl: str) -> tuple[RunRecord, RunRecord]:
        """The eager run with taps (once per diff, shared by every implementation) and `impl`'s."""
        cfg = self.config
        if self._tapped_reference is None:
            self._tapped_reference, tapped = self.session.run_many([
                self.request(EAGER, cfg.dropout, Role.TAPPED, taps=True),
                self.request(impl, cfg.dropout, Role.TAPPED, taps=True)])
            return self._tapped_reference, tapped
        return self._tapped_reference, self.session.run_request(
            self.request(impl, cfg.dropout, Role.TAPPED, taps=True))

    def forensics(self, result: ImplResult, reference: RunRecord, graphed: RunRecord) -> ImplResult:
        """Tap analysis: from the runs themselves (--localize) or, after a divergence, from an extra
        tapped pair (auto)."""
        cfg = self.config
        diverged = result.verdict in (Verdict.RNG_DIVERGENCE, Verdict.NUMERIC_DIVERGENCE)
        if cfg.localize is False or (cfg.localize is None and not diverged):
            return result
        if cfg.localize is True:
            tapped_ref, tapped = reference, graphed
        else:
            tapped_ref, tapped = self.tapped_pair(graphed.impl)
            result = dataclasses.replace(result, runs=(*result.runs, tapped_ref, tapped))
        problem = _tap_problem(tapped_ref, tapped)
        if problem is not None:
            return _add_note(result, f"forensics unavailable: {problem}")
        try:
            found = analyze(tapped_ref.forensics, tapped.forensics, dropout=cfg.dropout, rtol=cfg.rtol,
                            atol=cfg.atol)
        except ValueError as exc:
            return _add_note(result, f"forensics unavailable: {exc}")
        result = apply_forensics(result, found, aligned_requested=cfg.align_rng)
        for note in tapped.forensics.notes if tapped.forensics else ():
            result = _add_note(result, str(note))
        return result

    def hunt_culprit(self, result: ImplResult, impl: str) -> ImplResult:
        """Re-run a failed capture with sync errors raised at their call site and the failing
        operation classified (host sync, nonzero, legacy stream, ...); keep what it finds. A located
        GD501 is hunted too: its text says only that *some* unsupported operation ran."""
        diag = result.diagnosis
        if diag is None or (diag.location is not None and diag.rule != "GD501" and diag.cuda_error
                            != "cudaErrorStreamCaptureInvalidated"):
            return result
        if any(f.code == "GD217" for f in moe_static_findings(self.config, impl)):
            return result  # the token dispatcher's host copy: with_static_findings names it (no re-run)
        hunt = self.session.run_request(self.request(impl, self.config.dropout, Role.GRAPHED, hunt=True))
        found = hunt.diagnosis
        if hunt.status != "error" or found is None or found.location is None:
            return _add_note(result, "culprit hunt (sync errors raised during capture) found no "
                                     "synchronizing operation; run `graphdoctor check --probe`")
        reported = f"{diag.cuda_error or diag.error_type}: {diag.message}"
        if diag.traceback_tail:
            reported += f" at {diag.traceback_tail[-1]}"
        merged = dataclasses.replace(
            found, cuda_error=found.cuda_error or "cudaErrorStreamCaptureUnsupported",
            step=diag.step if diag.step is not None else found.step, phase="capture",
            reported_as=reported)
        if merged.cuda_error == "cudaErrorStreamCaptureUnsupported" and merged.rule is None:
            merged = dataclasses.replace(merged, rule="GD501", fix=rule_fix("GD501"))
        return dataclasses.replace(result, diagnosis=merged, runs=(*result.runs, hunt), notes=(
            *result.notes, "the failing operation was located by re-running the capture with "
                           "torch.cuda.set_sync_debug_mode('error')"))


def _with_print_diffs(reference: RunRecord, graphed: RunRecord) -> RunRecord:
    """The graphed run with every step's grads/params comparison filled in from the fingerprints
    where no element-by-element one was made (measured=False), so the report shows per step which
    tensors differ."""
    if reference.status != "ok" or graphed.status != "ok":
        return graphed
    names = graphed.tensor_names or reference.tensor_names
    ref_steps = {s.step: s for s in reference.steps}
    steps = []
    for step in graphed.steps:
        ref = ref_steps.get(step.step)
        if ref is not None:
            step = dataclasses.replace(step, grads=family_diff(names, ref, step, "grads"),
                                       params=family_diff(names, ref, step, "params"))
        steps.append(step)
    return dataclasses.replace(graphed, steps=tuple(steps))


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _with_eager_memory(result: ImplResult, reference: RunRecord) -> ImplResult:
    """The row's memory section measured against the eager reference's peaks."""
    if result.memory is None or reference.memory is None:
        return result
    return dataclasses.replace(result, memory=result.memory.against_eager(reference.memory.stats))


def _hazards(result: ImplResult, graphed: RunRecord) -> ImplResult:
    """Run-time hazards the child saw: the diagnosis of a divergence they explain, else a note."""
    for hazard in graphed.hazards:
        if result.verdict == Verdict.NUMERIC_DIVERGENCE and hazard.rule == "GD511":
            step = result.divergence.step if result.divergence is not None else None
            diag = Diagnosis(error_type="hazard", message=hazard.message, rule=hazard.rule,
                             module=hazard.module, step=step, phase="replay",
                             fix=get_rule(hazard.rule).fix_title())
            result = dataclasses.replace(result, diagnosis=diag)
        else:
            result = _add_note(result, f"{hazard.rule}: {hazard.message} (at {hazard.module})")
    return result


def _tap_problem(reference: RunRecord, graphed: RunRecord) -> str | None:
    for name, run in (("eager", reference), (graphed.impl, graphed)):
        if run.status != "ok":
            return f"the tapped {name} run ended with status {run.status}"
        if run.forensics is None:
            return f"the tapped {name} run reported no taps"
        if run.forensics.error:
            return f"taps failed in the {name} run: {run.forensics.error}"
    return None


def _add_note(result: ImplResult, note: str) -> ImplResult:
    return dataclasses.replace(result, notes=(*result.notes, note))


def load_report(path: str | Path) -> DiffReport:
    """Read a saved diff report (schema 1 or 2).

    Raises:
        InputFileError: unreadable, not JSON, or not a diff report.
    """
    from graphdoctor.errors import InputFileError
    from graphdoctor.inputs import read_json

    data = read_json(path, "diff report")
    try:
        return DiffReport.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputFileError(f"{path}: not a graphdoctor diff report ({type(exc).__name__}: {exc})") from None


__all__ = ["SCHEMA_VERSION", "DiffReport", "DiffRun", "diff", "load_report"]
