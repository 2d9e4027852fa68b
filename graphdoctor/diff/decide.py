"""`diff(config) -> DiffReport` and its verdict tree: `VerdictTree` judges one implementation against the runs it
asks of a `Runs` (diff's ChildSchedule, or advise's runs shared across candidates); `DiffRun` ties the first
children, the tree per implementation and the report together."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Protocol

from graphdoctor.compare.causes import apply_causes
from graphdoctor.compare.forensics import analyze
from graphdoctor.compare.prints import family_diff
from graphdoctor.compare.rng_verdict import apply_forensics
from graphdoctor.compare.verdict import ImplResult, find_divergence, judge, reference_failed, stopped_row
from graphdoctor.compare.weights import weights_disagree
from graphdoctor.config import DiffConfig
from graphdoctor.diff.report import DiffReport
from graphdoctor.diff.schedule import ChildSchedule
from graphdoctor.parent.availability import TE_INSTALL_HINT, why_unavailable
from graphdoctor.parent.children import ChildRequest, ChildSession, never_started, work_directory
from graphdoctor.parent.gpus import plan_jobs, visible_gpus
from graphdoctor.parent.preflight import Preflight
from graphdoctor.parent.progress import ProgressBoard
from graphdoctor.parent.static import (
    moe_static_findings,
    predicted_setup_failure,
    refuse_at_once,
    refuse_before_gpu_work,
    with_static_findings,
)
from graphdoctor.parent.stopping import partial_report_on_stop
from graphdoctor.parent.timeline import timeline_of
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import EAGER, Role
from graphdoctor.rules import rule_fix
from graphdoctor.types import Diagnosis, Verdict

IMPL_NOTES = {
    "local": "Megatron's local implementation runs its warmups without restoring the RNG state "
             "(Transformer Engine restores it), so graphed dropout masks are shifted against eager",
}


class Runs(Protocol):
    """The children the verdict tree asks for beyond the first runs, named by what they are for."""

    def control_reference(self) -> RunRecord:
        """The dropout-free eager reference every control pair shares."""
        ...

    def control(self, impl: str) -> RunRecord:
        """`impl` graphed without dropout: the graphed half of its control pair."""
        ...

    def measure_requests(self, reference: RunRecord, graphed: RunRecord) -> list[ChildRequest]:
        """The (saving, comparing) re-run pair that measures where the fingerprints differ; [] where they do not."""
        ...

    def saved(self, request: ChildRequest) -> RunRecord:
        """The eager half of a measuring pair."""
        ...

    def compared(self, request: ChildRequest) -> RunRecord:
        """The graphed half of a measuring pair."""
        ...

    def eager_again(self, dropout: float) -> RunRecord:
        """Eager once more at `dropout` (the eager-noise run)."""
        ...

    def tapped_pair(self, impl: str) -> tuple[RunRecord, RunRecord]:
        """The tapped eager run and `impl`'s tapped run."""
        ...

    def hunt(self, impl: str) -> RunRecord:
        """`impl` re-run with sync errors raised at their call site during capture."""
        ...


def _unavailable(impl: str, why: str) -> ImplResult:
    fix = "run with --dtype bf16" if "bf16" in why else TE_INSTALL_HINT
    diag = Diagnosis(error_type="unavailable", message=why, fix=fix)
    return ImplResult(impl=impl, verdict=Verdict.UNAVAILABLE, diagnosis=diag)


def diff(config: DiffConfig, *, workdir: str | Path | None = None,
         progress: ProgressBoard | None = None, started_at: float | None = None) -> DiffReport:
    """Run eager and every requested graphed implementation; judge each.

    Args:
        config: the run.
        workdir: where children write specs, events and logs (default: a temporary directory,
            removed afterwards; docs/protocol.md lists the files).
        progress: where to show the running children (graphdoctor.parent.progress; the CLI shows
            one on stderr); None shows nothing.
        started_at: time.time() when the command started (the CLI: its process's start), for the report's
            timeline; default: now.

    Returns:
        The DiffReport (render it with graphdoctor.report).

    Raises:
        NoGPUError: no CUDA GPU is visible.
        MissingDependencyError: the TE layer spec without an importable Transformer Engine; sequence
            parallel with the local layer spec without Apex; selective recompute of layernorm, moe_act
            or gdn_norm_out without Transformer Engine (megatron-core 0.19.2).
    """
    started_at = time.time() if started_at is None else started_at
    gpus = visible_gpus()
    if gpus:
        refuse_at_once(config)
    else:  # no child will start: every refusal now, in the order diff --plan gives them
        refuse_before_gpu_work(config, "graphdoctor diff")
    started = time.perf_counter()
    with work_directory(workdir, "graphdoctor-") as base:
        plan = plan_jobs(config, gpus)
        session = ChildSession(config, base, progress, plan)
        session.note(plan.reason)
        preflight = Preflight(config, base)
        run = DiffRun(session, preflight)
        # stopped: the children are ended already; the partial report says how far they got
        with partial_report_on_stop(lambda signal_name: _finished(run.stopped_report(signal_name), started,
                                                                  started_at, preflight, session, stopped=True)):
            report = run.run_all()
    return _finished(report, started, started_at, preflight, session)


def _finished(report: DiffReport, started: float, started_at: float, preflight: Preflight, session: ChildSession,
              *, stopped: bool = False) -> DiffReport:
    """The report with its wall time, model facts and timeline (finished now); a stopped diff does not wait for
    the preflight thread's checks to get them."""
    report = dataclasses.replace(report, wall_s=time.perf_counter() - started,
                                 model=preflight.model(wait=not stopped))
    template = session.first_template
    span = None if template is None else (template.started_at, template.ready_at)
    return dataclasses.replace(report, timeline=timeline_of(report.runs(), started_at, time.time(), span,
                                                            session.retried, session.finished.values()))


class DiffRun:
    """One diff: the reference and every implementation (at once when the plan allows) on its ChildSchedule,
    then each implementation's row from the VerdictTree over that schedule."""

    def __init__(self, session: ChildSession, preflight: Preflight | None = None) -> None:
        self.session = session
        self.config = session.config
        self.preflight = preflight
        self.schedule = ChildSchedule(session)
        self.tree = VerdictTree(self.config, self.schedule, preflight)

    def run_all(self) -> DiffReport:
        """Reference and implementations, judged; scratch directories removed afterwards.

        The first children start at once, beside the plan-time checks (graphdoctor.parent.preflight), and with
        them every child the decision tree may need next (at dropout > 0 the control pair, and the tapped pair unless
        the first runs carry the taps): they take GPU slots as they free up, and those the first results rule out
        are cancelled."""
        schedule, cfg = self.schedule, self.config
        try:
            for folder in (cfg.trace_dir, cfg.snapshot_dir):
                if folder:
                    Path(folder).mkdir(parents=True, exist_ok=True)
            runnable = [impl for impl in cfg.impls if why_unavailable(impl, cfg, probe=False) is None
                        and predicted_setup_failure(cfg, impl) is None]
            taps = cfg.taps_in_first_runs
            schedule.first = ([schedule.request(EAGER, cfg.dropout, Role.REFERENCE, taps=taps)]
                              + [schedule.request(impl, cfg.dropout, Role.GRAPHED, taps=taps) for impl in runnable])
            if self.preflight is not None:
                self.session.gate = self.preflight.gate
            for request in [*schedule.first, *schedule.speculative(runnable)]:
                schedule.prefetch(request)
            import_torch_whole()
            if self.preflight is not None:
                self.preflight.start()
                try:
                    self.preflight.finish()
                except BaseException:
                    schedule.cancel_all()
                    raise
            first = [schedule.obtain(request) for request in schedule.first]
            reference, graphed = first[0], dict(zip(runnable, first[1:], strict=True))
            self.prune(runnable, reference, graphed)
            results = [self.tree.judge_impl(impl, reference, graphed.get(impl)) for impl in cfg.impls]
        finally:
            if self.preflight is not None:
                self.preflight.abandon()
            schedule.close()
        return DiffReport(config=cfg, results=tuple(results), reference=reference,
                          control_reference=self.tree.control_reference,
                          child_wall_s=self.session.child_wall_s, scratch_bytes=schedule.scratch_bytes,
                          jobs=self.session.jobs_line)

    def prune(self, runnable: list[str], reference: RunRecord, graphed: dict[str, RunRecord]) -> None:
        """After the first runs: start the re-runs that measure each divergence, and cancel the speculative
        children of every implementation that matched (or failed)."""
        diverged = []
        for impl in runnable:
            run = graphed[impl]
            if reference.status == "ok" and run.status == "ok" and self.tree.judge(reference, run).divergence is not None:
                diverged.append(impl)
                if self.config.dropout <= 0 or not self.config.bitwise:  # else the control pair decides (_dropout_row)
                    self.schedule.prefetch_measure(reference, run)
        self.schedule.prune(diverged)

    def stopped_report(self, signal_name: str) -> DiffReport:
        """The partial report of a diff stopped by `signal_name`: each implementation's row from the first
        children as the stop left them (compare.verdict.stopped_row), with its static findings."""
        cfg, first = self.config, self.schedule.first
        records = self.session.stopped_records(first, signal_name)
        reference = records.get(first[0]) if first else None
        if reference is None:
            reference = never_started(EAGER, cfg.dropout, signal_name)
        graphed = {request.impl: records.get(request) for request in first[1:]}
        rows = []
        for impl in cfg.impls:
            why_not = why_unavailable(impl, cfg)
            row = _unavailable(impl, why_not) if why_not is not None else stopped_row(
                reference, graphed.get(impl), impl, stopped_by=signal_name, warmup_steps=cfg.cuda_graph_warmup_steps,
                rtol=cfg.rtol, atol=cfg.atol)
            rows.append(with_static_findings(row, cfg))
        return DiffReport(config=cfg, results=tuple(rows), reference=reference,
                          control_reference=self.tree.control_reference, child_wall_s=self.session.child_wall_s,
                          scratch_bytes=self.schedule.scratch_bytes, jobs=self.session.jobs_line,
                          stopped=signal_name)


def import_torch_whole() -> None:
    """Import torch on this thread, whole, before any thread beside it may import part of it.

    A thread that imports a torch submodule (`torch.profiler`, `torch.distributed.run`) holds that submodule's
    import lock while it waits for torch; a thread importing torch itself needs the same submodule's lock, and
    Python breaks that cycle by handing one of them torch half made (`partially initialized module 'torch' has
    no attribute 'dtype'`). `graphdoctor diff` imports it so before any thread of its own starts
    (graphdoctor.cli.diff.start_template_early); a diff called from Python starts its first children without
    torch and then imports it here, while they start, before the plan-time checks' thread (which imports Megatron)
    and before any child's events reach the threads that read them."""
    import torch  # noqa: F401


class VerdictTree:
    """One implementation's row, as named steps over its first runs: the culprit hunt, the control pair, the
    targeted re-runs that measure a divergence, the eager noise floor, forensics and hazards. The same tree
    judges diff's implementations and advise's candidates."""

    def __init__(self, config: DiffConfig, runs: Runs, preflight: Preflight | None = None) -> None:
        self.config = config
        self.runs = runs
        self.preflight = preflight
        self.control_reference: RunRecord | None = None
        """The dropout-free eager reference, once a control pair asked for it."""

    def judge(self, reference: RunRecord, graphed: RunRecord, **kwargs: Any) -> ImplResult:
        """judge() with this diff's warmup and tolerances."""
        cfg = self.config
        return judge(reference, graphed, warmup_steps=cfg.cuda_graph_warmup_steps, rtol=cfg.rtol,
                     atol=cfg.atol, **kwargs)

    def judge_impl(self, impl: str, reference: RunRecord, graphed: RunRecord | None) -> ImplResult:
        """The row of one implementation, with its static findings (GD217 names a MoE capture failure):
        the same row in diff and in each advise candidate."""
        findings = self.preflight.findings(impl) if self.preflight is not None else None
        return with_static_findings(self._row(impl, reference, graphed), self.config, findings)

    def _row(self, impl: str, reference: RunRecord, graphed: RunRecord | None) -> ImplResult:
        cfg = self.config
        why_not = why_unavailable(impl, cfg)
        predicted = predicted_setup_failure(cfg, impl) if why_not is None else None
        if predicted is not None:
            return predicted
        if why_not is not None or graphed is None:
            return _unavailable(impl, why_not or "not run")
        if reference.status != "ok":
            return reference_failed(impl, reference)
        if cfg.dropout > 0 and cfg.bitwise:
            result, graphed = self._dropout_row(impl, reference, graphed)
        else:
            graphed = _with_print_diffs(reference, self.measure(reference, graphed))
            result = _with_eager_memory(self.judge(reference, graphed), reference)
            if result.divergence is not None and cfg.dropout > 0 and result.verdict != Verdict.CAPTURE_FAILED:
                result = self.control_pair(impl, reference, graphed)
        if result.verdict == Verdict.CAPTURE_FAILED:
            return self.hunt_culprit(result, impl)
        if result.verdict == Verdict.NUMERIC_DIVERGENCE:
            result = self.eager_noise(result, reference)
        result = self.forensics(result, reference, graphed)
        return apply_causes(_with_weights_check(result, reference, graphed), graphed)

    def _dropout_row(self, impl: str, reference: RunRecord, graphed: RunRecord) -> tuple[ImplResult, RunRecord]:
        """A bitwise row at dropout > 0: the fingerprints decide whether it diverged, and a divergence goes to the
        control pair first. When the control pair says the dropout masks made the difference (rng-divergence), the
        re-run pair that would measure it is not run: a measure of different masks says nothing of the graphs'
        numerics. Otherwise it is measured, as a row without dropout is. Returns (the row, the graphed run judged)."""
        unmeasured = _with_print_diffs(reference, graphed)
        result = _with_eager_memory(self.judge(reference, unmeasured), reference)
        if result.divergence is None or result.verdict == Verdict.CAPTURE_FAILED:
            return result, unmeasured
        controlled = self.control_pair(impl, reference, unmeasured)
        if controlled.verdict == Verdict.RNG_DIVERGENCE:
            note = (f"the dropout-{self.config.dropout:g} difference is the dropout masks' (the control pair matches), "
                    "so it was not measured element by element; its first divergence is where the fingerprints first "
                    "differ")
            return _add_note(controlled, note), unmeasured
        graphed = _with_print_diffs(reference, self.measure(reference, graphed))
        return self.control_pair(impl, reference, graphed), graphed

    def measure(self, reference: RunRecord, graphed: RunRecord) -> RunRecord:
        """Where the fingerprints differ, measure by how much: a re-run pair that saves (eager) and
        compares element by element (graphed) only those steps, and ends there. Bitwise: the first
        differing step; with --rtol/--atol: every differing step (the tolerance decides there). The eager
        tensors saved for one implementation serve every other one that differs at the same steps (one
        scratch directory per dropout: the eager re-run runs once)."""
        if reference.status != "ok" or graphed.status != "ok":
            return graphed
        pair = self.runs.measure_requests(reference, graphed)
        if not pair:
            return graphed
        saving, comparing = pair
        saved = self.runs.saved(saving)  # one child per (dropout, steps): the same record for every caller
        if saved.status != "ok":
            return graphed
        compared = self.runs.compared(comparing)
        measured = {s.step: s for s in compared.steps if s.step in saving.io_steps}
        if compared.status != "ok" or len(measured) != len(saving.io_steps):
            return graphed
        steps_out = tuple(dataclasses.replace(s, grads=measured[s.step].grads, params=measured[s.step].params)
                          if s.step in measured else s for s in graphed.steps)
        return dataclasses.replace(graphed, steps=steps_out)

    def control_pair(self, impl: str, reference: RunRecord, graphed: RunRecord) -> ImplResult:
        """Judge again with a dropout-free control pair (the control reference runs once per diff)."""
        if self.control_reference is None:
            self.control_reference = self.runs.control_reference()
        control = self.runs.control(impl)
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
        again = self.runs.eager_again(base.dropout)
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

    def forensics(self, result: ImplResult, reference: RunRecord, graphed: RunRecord) -> ImplResult:
        """Tap analysis: from the runs themselves where they carry the taps (DiffConfig.taps_in_first_runs), else,
        after a divergence, from an extra tapped pair. By default only a divergent row is analysed."""
        cfg = self.config
        diverged = result.verdict in (Verdict.RNG_DIVERGENCE, Verdict.NUMERIC_DIVERGENCE)
        if cfg.localize is False or (cfg.localize is None and not diverged):
            return result
        if cfg.taps_in_first_runs:
            tapped_ref, tapped = reference, graphed
        else:
            tapped_ref, tapped = self.runs.tapped_pair(graphed.impl)
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
        hunt = self.runs.hunt(impl)
        found = hunt.diagnosis
        if hunt.status != "error" or found is None or found.location is None:
            note = (f"culprit hunt (sync errors raised during capture) found no synchronizing operation: "
                    f"{_hunt_outcome(hunt)}; run `graphdoctor check --probe`")
            return dataclasses.replace(_add_note(result, note), runs=(*result.runs, hunt))
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


def _hunt_outcome(hunt: RunRecord) -> str:
    """How a culprit hunt that located nothing ended, in a few words."""
    found = hunt.diagnosis
    if hunt.status == "ok":
        return "its re-run trained to the end without an error"
    if found is None:
        return f"its re-run ended {hunt.status} without a diagnosis"
    where = f" at {found.traceback_tail[-1]}" if found.traceback_tail else ""
    return f"its re-run ended {hunt.status} with {found.cuda_error or found.error_type}{where}, at no user line"


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


def _with_eager_memory(result: ImplResult, reference: RunRecord) -> ImplResult:
    """The row's memory section measured against the eager reference's peaks."""
    if result.memory is None or reference.memory is None:
        return result
    return dataclasses.replace(result, memory=result.memory.against_eager(reference.memory.stats))


def _with_weights_check(result: ImplResult, reference: RunRecord, graphed: RunRecord) -> ImplResult:
    """The row with a note where its runs did not start from the same weights (their digests,
    graphdoctor.compare.weights): no comparison of such runs says anything about the graphs."""
    disagree = weights_disagree([reference, graphed, *result.runs])
    if disagree is None:
        return result
    return _add_note(result, f"weights: {disagree}; runs that start from different weights differ whatever the "
                             "graphs do, so this row's comparison does not hold")


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


__all__ = ["DiffRun", "Runs", "VerdictTree", "diff"]
