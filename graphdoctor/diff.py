"""`diff`: run a Megatron-Core model eager and graphed side by side and judge each implementation.

The Python API behind `graphdoctor diff` (and the pytest plugin): `diff(config) -> DiffReport`. Every
child runs isolated with a timeout; the eager reference saves per-step tensors that each graphed child
compares against on its GPU. With dropout on, a dropout-free control pair tells RNG from numerics.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphdoctor.compare.verdict import ImplResult, judge
from graphdoctor.config import TE_LAYER_SPECS, DiffConfig
from graphdoctor.errors import MissingDependencyError, NoGPUError
from graphdoctor.harness.runner import run_child
from graphdoctor.harness.spec import ChildSpec, placement_for_child
from graphdoctor.types import Diagnosis, RunRecord, Verdict

SCHEMA_VERSION = 1
"""Version of the JSON report (docs/diff.md); bumped on any incompatible change."""

IMPL_NOTES = {
    "local": "Megatron's local implementation runs its warmups without restoring the RNG state "
             "(Transformer Engine restores it), so graphed dropout masks are shifted against eager",
}

TE_INSTALL_HINT = ("install Transformer Engine (pip install 'graphdoctor[transformer-engine]'); "
                   "graphdoctor drives the transformer_engine implementation only where "
                   "transformer_engine.pytorch imports")


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
    env: dict[str, Any] = field(default_factory=dict)

    def exit_code(self) -> int:
        """0 when every implementation passed (rng-divergence passes unless strict_rng), else 1."""
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
            "env": dict(self.env),
            "exit_code": self.exit_code(),
            "wall_s": self.wall_s,
            "child_wall_s": self.child_wall_s,
            "reference": self.reference.to_dict(),
            "control_reference": self.control_reference.to_dict() if self.control_reference else None,
            "impls": [r.to_dict() for r in self.results],
        }


def require_gpu(command: str = "graphdoctor diff") -> None:
    """Raise NoGPUError naming `command` and the commands that work without a GPU."""
    import torch

    if not torch.cuda.is_available():
        raise NoGPUError(
            f"{command} needs a CUDA GPU and none is visible; without a GPU use "
            "`graphdoctor check`, `graphdoctor rules`, `graphdoctor triage SNAPSHOT` or "
            "`graphdoctor count --trace FILE`")


TE_PROBE_TIMEOUT_S = 180.0
"""Limit for the child process that imports transformer_engine.pytorch to see whether it loads."""

_TE_STATUS: tuple[bool, str] | None = None


def te_available() -> tuple[bool, str]:
    """(True, "") when transformer_engine.pytorch imports here, else (False, one-line reason).

    The import runs in a child process with a timeout: loading TE's compiled library can crash or
    hang the process (a CUDA or torch mismatch), which must not take the command down.
    """
    global _TE_STATUS
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        return False, "transformer_engine is not installed"
    if _TE_STATUS is None:
        _TE_STATUS = _probe_te_import()
    return _TE_STATUS


def _probe_te_import() -> tuple[bool, str]:
    import subprocess
    import sys

    code = ("from graphdoctor.harness.build import have_transformer_engine as h; ok, why = h(); "
            "print('ok' if ok else 'no: ' + why)")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=TE_PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"importing transformer_engine.pytorch took over {TE_PROBE_TIMEOUT_S:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines and lines[-1] == "ok":
        return True, ""
    if lines and lines[-1].startswith("no: "):
        return False, lines[-1][4:]
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return False, f"importing transformer_engine.pytorch failed ({tail[:200]})"


class ChildSession:
    """One diff's working directory, child counter and reference directories."""

    def __init__(self, config: DiffConfig, workdir: Path,
                 progress: Callable[[str], None] | None) -> None:
        self.config = config
        self.workdir = workdir
        self.progress = progress or (lambda _msg: None)
        self.num_children = 0
        self.child_wall_s = 0.0
        self.eager_memory: dict[str, int] | None = None
        self._tapped_reference: RunRecord | None = None

    def tapped_reference(self, ref_dir: Path) -> RunRecord:
        """The eager run with taps (run once per diff, shared by every implementation)."""
        if self._tapped_reference is None:
            self._tapped_reference = self.run("none", self.config.dropout, "plain", ref_dir,
                                              taps=True)
        return self._tapped_reference

    def run(self, impl: str, dropout: float, role: str, ref_dir: Path, *,
            hunt: bool = False, taps: bool = False) -> RunRecord:
        place = placement_for_child(self.num_children)
        self.num_children += 1
        tag = f"{impl}-{role}-d{dropout}{'-hunt' if hunt else ''}{'-taps' if taps else ''}"
        config = self.config
        if taps and role == "plain":
            config = config.replace(memory=False, launches=False)
        spec = ChildSpec(impl=impl, dropout=dropout, config=config.to_dict(), taps=taps,
                         events_path=str(self.workdir / f"events-{tag}.jsonl"),
                         reference_dir=str(ref_dir), role=role, placement=place,
                         artifacts_dir=self.config.trace_dir or str(self.workdir),
                         hunt_culprit=hunt, eager_memory=self.eager_memory,
                         keep_snapshots=self.config.snapshot_dir is not None)
        what = "culprit hunt" if hunt else ("tapped " + role if taps else role)
        self.progress(f"running {impl} (dropout {dropout}, {what})")
        record = run_child(spec, self.workdir, timeout_s=self.config.timeout_s)
        for _ in range(PORT_RETRIES if spec.placement.world_size == 1 else 0):
            if not port_taken(record):
                break
            # The rendezvous port picked for this child was taken before the child bound it.
            self.child_wall_s += record.wall_s
            spec = dataclasses.replace(spec, placement=placement_for_child(self.num_children))
            self.num_children += 1
            record = run_child(spec, self.workdir, timeout_s=self.config.timeout_s)
        self.child_wall_s += record.wall_s
        self.progress(f"  {impl}: {record.status} in {record.wall_s:.1f} s")
        return record


PORT_RETRIES = 2
"""Re-runs of a child whose rendezvous port was taken between picking and binding it."""


def port_taken(record: RunRecord) -> bool:
    """True when a child failed in setup because its rendezvous port was already in use."""
    diag = record.diagnosis
    return (record.status == "error" and diag is not None and diag.phase == "setup"
            and "EADDRINUSE" in diag.message)


def _unavailable(impl: str, why: str) -> ImplResult:
    fix = "run with --dtype bf16" if "bf16" in why else TE_INSTALL_HINT
    diag = Diagnosis(error_type="unavailable", message=why, fix=fix)
    return ImplResult(impl=impl, verdict=Verdict.UNAVAILABLE, diagnosis=diag)


def diff(config: DiffConfig, *, workdir: str | Path | None = None,
         progress: Callable[[str], None] | None = None) -> DiffReport:
    """Run eager and every requested graphed implementation; judge each.

    Args:
        config: the run.
        workdir: where children write specs, events and logs (default: a temporary directory,
            removed afterwards).
        progress: called with one line per child start and end (the CLI prints them to stderr).

    Returns:
        The DiffReport (render it with graphdoctor.report).

    Raises:
        NoGPUError: no CUDA GPU is visible.
    """
    require_gpu()
    if config.layer_spec in TE_LAYER_SPECS:
        ok, why = te_available()
        if not ok:
            raise MissingDependencyError(f"--layer-spec {config.layer_spec} needs Transformer Engine "
                                         f"({why}); {TE_INSTALL_HINT}")
    started = time.perf_counter()
    own_dir = workdir is None
    base = Path(tempfile.mkdtemp(prefix="graphdoctor-")) if own_dir else Path(workdir)  # type: ignore[arg-type]
    base.mkdir(parents=True, exist_ok=True)
    try:
        session = ChildSession(config, base, progress)
        results, reference, control_ref = _run_all(session)
    finally:
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)
    return DiffReport(config=config, results=tuple(results), reference=reference,
                      control_reference=control_ref, wall_s=time.perf_counter() - started,
                      child_wall_s=session.child_wall_s, env=dict(reference.env))


def _ref_dir(session: ChildSession, name: str) -> Path:
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and shutil.disk_usage(shm).free > (2 << 30) else session.workdir
    path = Path(tempfile.mkdtemp(prefix=f"graphdoctor-{name}-", dir=root))
    return path


def _run_all(session: ChildSession) -> tuple[list[ImplResult], RunRecord, RunRecord | None]:
    cfg = session.config
    ref_dir = _ref_dir(session, "ref")
    ctl_dir: Path | None = None
    try:
        for folder in (cfg.trace_dir, cfg.snapshot_dir):
            if folder:
                Path(folder).mkdir(parents=True, exist_ok=True)
        reference = session.run("none", cfg.dropout, "reference", ref_dir,
                                taps=cfg.localize is True)
        stats = (reference.memory or {}).get("stats")
        if stats:
            session.eager_memory = {k: int(v) for k, v in stats.items()}
        control_ref: RunRecord | None = None
        results: list[ImplResult] = []
        for impl in cfg.impls:
            why_not = why_unavailable(impl, cfg)
            if why_not is not None:
                results.append(_unavailable(impl, why_not))
                continue
            if reference.status != "ok":
                results.append(judge(reference, reference, warmup_steps=cfg.cuda_graph_warmup_steps))
                continue
            graphed = session.run(impl, cfg.dropout, "graphed", ref_dir, taps=cfg.localize is True)
            result = judge(reference, graphed, warmup_steps=cfg.cuda_graph_warmup_steps,
                           rtol=cfg.rtol, atol=cfg.atol)
            if result.verdict == Verdict.CAPTURE_FAILED:
                results.append(_hunt(session, result, impl, ref_dir))
                continue
            if result.divergence is not None and cfg.dropout > 0:
                if control_ref is None:
                    ctl_dir = _ref_dir(session, "control")
                    control_ref = session.run("none", 0.0, "reference", ctl_dir)
                assert ctl_dir is not None
                # Without its reference the control run has nothing to compare against.
                control = (session.run(impl, 0.0, "graphed", ctl_dir)
                           if control_ref.status == "ok" else None)
                result = judge(reference, graphed, warmup_steps=cfg.cuda_graph_warmup_steps,
                               rtol=cfg.rtol, atol=cfg.atol, control_reference=control_ref,
                               control_graphed=control)
                if result.verdict == Verdict.RNG_DIVERGENCE and impl in IMPL_NOTES:
                    result = _add_note(result, IMPL_NOTES[impl])
            if result.verdict == Verdict.NUMERIC_DIVERGENCE:
                noise_dir = ref_dir if cfg.dropout == 0 or ctl_dir is None else ctl_dir
                result = _eager_noise(session, result, 0.0 if noise_dir == ctl_dir else cfg.dropout,
                                      noise_dir, reference if noise_dir == ref_dir else control_ref)
            result = _forensics(session, result, reference, graphed, ref_dir)
            result = _hazards(result, graphed)
            results.append(with_launch_table(result, reference, graphed))
        return results, reference, control_ref
    finally:
        shutil.rmtree(ref_dir, ignore_errors=True)
        if ctl_dir is not None:
            shutil.rmtree(ctl_dir, ignore_errors=True)


def why_unavailable(impl: str, cfg: DiffConfig) -> str | None:
    """Why `impl` cannot run here (None: it can)."""
    if impl != "transformer_engine":
        return None
    ok, why = te_available()
    if not ok:
        return why
    if cfg.dtype != "bf16":
        return (f"Megatron's TECudaGraphHelper captures with bf16 sample inputs "
                f"(megatron/core/transformer/module.py:259), so dtype {cfg.dtype} cannot be graphed "
                f"by transformer_engine; run with --dtype bf16")
    return None


def _forensics(session: ChildSession, result: ImplResult, reference: RunRecord,
               graphed: RunRecord, ref_dir: Path) -> ImplResult:
    """Tap analysis: from the runs themselves (--localize) or, after a divergence, from an extra
    tapped pair (auto)."""
    from graphdoctor.compare.forensics import analyze
    from graphdoctor.compare.rng_verdict import apply_forensics

    cfg = session.config
    diverged = result.verdict in (Verdict.RNG_DIVERGENCE, Verdict.NUMERIC_DIVERGENCE)
    if cfg.localize is False or (cfg.localize is None and not diverged):
        return result
    if cfg.localize is True:
        tapped_ref, tapped = reference, graphed
    else:
        tapped_ref = session.tapped_reference(ref_dir)
        tapped = session.run(graphed.impl, cfg.dropout, "plain", ref_dir, taps=True)
        result = dataclasses.replace(result, runs=(*result.runs, tapped_ref, tapped))
    problem = _tap_problem(tapped_ref, tapped)
    if problem is not None:
        return _add_note(result, f"forensics unavailable: {problem}")
    try:
        found = analyze(tapped_ref.forensics, tapped.forensics,  # type: ignore[arg-type]
                        dropout=cfg.dropout, rtol=cfg.rtol, atol=cfg.atol)
    except ValueError as exc:
        return _add_note(result, f"forensics unavailable: {exc}")
    result = apply_forensics(result, found, aligned_requested=cfg.align_rng)
    for note in (tapped.forensics or {}).get("notes", []):
        result = _add_note(result, str(note))
    return result


def _hazards(result: ImplResult, graphed: RunRecord) -> ImplResult:
    """Run-time hazards the child saw: the diagnosis of a divergence they explain, else a note."""
    for hazard in graphed.hazards:
        text = f"{hazard.get('rule')}: {hazard.get('message')} (at {hazard.get('module')})"
        if result.verdict == Verdict.NUMERIC_DIVERGENCE and hazard.get("rule") == "GD511":
            step = result.divergence.step if result.divergence is not None else None
            diag = Diagnosis(
                error_type="hazard", message=str(hazard.get("message")), rule="GD511",
                module=hazard.get("module"), step=step, phase="replay",
                fix="pass an explicit causal attention_mask, or use the Transformer Engine layer "
                    "spec (--layer-spec te)")
            result = dataclasses.replace(result, diagnosis=diag)
        else:
            result = _add_note(result, text)
    return result


def _tap_problem(reference: RunRecord, graphed: RunRecord) -> str | None:
    for name, run in (("eager", reference), (graphed.impl, graphed)):
        if run.status != "ok":
            return f"the tapped {name} run ended with status {run.status}"
        if not run.forensics:
            return f"the tapped {name} run reported no taps"
        if run.forensics.get("error"):
            return f"taps failed in the {name} run: {run.forensics['error']}"
    return None


def _hunt(session: ChildSession, result: ImplResult, impl: str, ref_dir: Path) -> ImplResult:
    """Re-run a failed capture with sync errors raised at their call site; keep what it finds."""
    diag = result.diagnosis
    if diag is None or (diag.location is not None and diag.cuda_error !=
                        "cudaErrorStreamCaptureInvalidated"):
        return result
    hunt = session.run(impl, session.config.dropout, "graphed", ref_dir, hunt=True)
    found = hunt.diagnosis
    if hunt.status != "error" or found is None or found.location is None:
        return _add_note(result, "culprit hunt (sync errors raised during capture) found no "
                                 "synchronizing operation; run `graphdoctor check --probe`")
    reported = f"{diag.cuda_error or diag.error_type}: {diag.message}"
    if diag.traceback_tail:
        reported += f" at {diag.traceback_tail[-1]}"
    merged = dataclasses.replace(
        found, cuda_error=found.cuda_error or "cudaErrorStreamCaptureUnsupported",
        meaning=found.meaning, step=diag.step if diag.step is not None else found.step,
        phase="capture", reported_as=reported)
    if merged.cuda_error == "cudaErrorStreamCaptureUnsupported" and merged.rule is None:
        merged = dataclasses.replace(merged, rule="GD501")
    return dataclasses.replace(result, diagnosis=merged, runs=(*result.runs, hunt), notes=(
        *result.notes, "the failing operation was located by re-running the capture with "
                       "torch.cuda.set_sync_debug_mode('error')"))


def _eager_noise(session: ChildSession, result: ImplResult, dropout: float, ref_dir: Path,
                 reference: RunRecord | None) -> ImplResult:
    """Run eager again against the same reference: is eager itself bitwise reproducible here?"""
    if reference is None:
        return result
    again = session.run("none", dropout, "graphed", ref_dir)
    if again.status != "ok":
        return result
    from graphdoctor.compare.verdict import find_divergence

    noise = find_divergence(reference, again, rtol=session.config.rtol, atol=session.config.atol)
    if noise is None:
        return _add_note(result, "eager repeated against eager is bitwise reproducible here, so "
                                 "the difference comes from the graphed run")
    return dataclasses.replace(result, runs=(*result.runs, again), notes=(
        *result.notes, f"eager is not reproducible run to run here (eager vs eager first differs "
                       f"at step {noise.step} {noise.what}, max abs {noise.max_abs:.3g}); compare "
                       f"with --atol at or above that noise floor"))


def with_launch_table(result: ImplResult, reference: RunRecord, graphed: RunRecord) -> ImplResult:
    """Put the eager step's and the graphed step's launch counts side by side in result.launches."""
    eager = (reference.launches or {}).get("step")
    mine = graphed.launches or {}
    if eager is None and not mine:
        return result
    from graphdoctor.launches.compare import launch_section

    return dataclasses.replace(result, launches=launch_section(eager, mine))


def _add_note(result: ImplResult, note: str) -> ImplResult:
    return dataclasses.replace(result, notes=(*result.notes, note))


__all__ = ["SCHEMA_VERSION", "DiffReport", "diff", "te_available", "why_unavailable"]
