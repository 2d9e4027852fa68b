"""Environment failures (graphdoctor/parent/environment.py): the machine's failures before the first step are told
apart from the model's, retried once, alone (graphdoctor/parent/turns.py), and a second one makes the
run `environment-failed` with its own exit code; checked on a real report recorded on an H100 whose eager
reference failed NCCL's set-up while five diffs shared the GPU (fixtures/data/environment/)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.compare.verdict import judge, verdict_for_failure
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport, load_report
from graphdoctor.parent.children import ChildRequest, ChildSession
from graphdoctor.parent.environment import FIX, SHARED_OUT_OF_MEMORY, environment_cause, environment_failed
from graphdoctor.plugin_session import Verdicts, count_line
from graphdoctor.protocol.record import ENVIRONMENT_FAILED, RunRecord
from graphdoctor.protocol.spec import EAGER, Role
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.report.diff import render_text
from graphdoctor.types import Diagnosis, Verdict

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "environment" / \
    "nccl_unhandled_cuda_error_h100.json"


@pytest.fixture(scope="module")
def nccl() -> DiffReport:
    return load_report(RECORDED)


def test_the_recorded_nccl_failure_is_the_machines(nccl: DiffReport) -> None:
    reference = nccl.reference
    assert reference.status == "error" and reference.diagnosis is not None
    assert reference.diagnosis.error_type == "DistBackendError" and reference.diagnosis.phase == "setup"
    assert (environment_cause(reference) or "").startswith("NCCL could not")


def _failed(message: str, error_type: str = "RuntimeError", steps: int = 0, status: str = "error") -> RunRecord:
    return RunRecord(impl=EAGER, dropout=0.0, status=status,
                     steps=tuple(StepRecord(step=i, phase="eager", loss=1.0, step_time_ms=10.0) for i in range(steps)),
                     diagnosis=Diagnosis(error_type=error_type, message=message, phase="setup", step=-1))


@pytest.mark.parametrize(("message", "said"), [
    ("CUDA out of memory. Tried to allocate 2.00 GiB", "out of memory before the first step"),
    ("CUDA error: CUDA-capable device(s) is/are busy or unavailable", "the GPU is busy"),
    ("No CUDA GPUs are available", "the GPU was lost"),
    ("The server socket has failed to listen on any local network address. port: 29500, "
     "useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use", "a port"),
])
def test_each_kind_of_machine_failure_is_named(message: str, said: str) -> None:
    assert (environment_cause(_failed(message)) or "").startswith(said)


def test_the_models_own_failures_are_not_the_machines() -> None:
    assert environment_cause(_failed("zero_centered_gamma not supported by torch LayerNorm", "AssertionError")) is None
    assert environment_cause(_failed("CUDA out of memory", steps=3)) is None  # after its first step: the model's
    assert environment_cause(_failed("NCCL error: unhandled cuda error", status="timeout")) is None


SHARED_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 60.50 "
              "MiB is free. Including non-PyTorch memory, this process has 38.05 GiB memory in use. Process 3216 has "
              "41.05 GiB memory in use. Of the allocated memory 34.53 GiB is allocated by PyTorch, and 1.16 GiB is "
              "reserved by PyTorch but unallocated.")
"""The eager reference of a 1.08 B diff with the defaults on an H100 80GB (2026-12-07), at its step 1 beside
another child of the same diff that held 41 GiB: two children the first estimate let share the GPU."""


def test_out_of_memory_after_the_first_step_is_the_machines_only_beside_other_children() -> None:
    beside = _failed(SHARED_OOM, "OutOfMemoryError", steps=1)
    assert environment_cause(beside, shared=True) == SHARED_OUT_OF_MEMORY
    assert environment_cause(beside) is None  # alone on its GPU: the model's own
    model = _failed("zero_centered_gamma not supported by torch LayerNorm", "AssertionError", steps=1)
    assert environment_cause(model, shared=True) is None  # beside others, but not out of memory


def test_a_child_out_of_memory_beside_others_runs_again_alone(tmp_path: Path) -> None:
    beside = dataclasses.replace(_failed(SHARED_OOM, "OutOfMemoryError", steps=1), name="eager-reference-d0.1")
    ok = RunRecord(impl=EAGER, dropout=0.1, status="ok", name="eager-reference-d0.1")
    session = _Recorded([beside, ok], tmp_path)
    session.plan = dataclasses.replace(session.plan, shared=True, gpus=("0",))  # children share one GPU
    session.ran_beside.add("eager-reference-d0.1")
    assert session.memory_gated
    assert session.run_request(_request(tmp_path)) is ok and session.attempts == [0, 10]
    assert session.notes[0].startswith("eager reference: out of memory while other children of this run shared")
    assert session.retried == [("eager-reference-d0.1", SHARED_OUT_OF_MEMORY)]  # the report's timeline counts it
    alone_too = dataclasses.replace(beside, wall_s=2.0, name="eager-reference-d0.1-attempt10")
    session = _Recorded([beside, alone_too], tmp_path)
    session.plan = dataclasses.replace(session.plan, shared=True, gpus=("0",))
    session.ran_beside.add("eager-reference-d0.1")
    record = session.run_request(_request(tmp_path))
    assert record is alone_too and record.status == "error"  # out of memory alone: the model's, as it failed
    crowded_again = dataclasses.replace(beside, name="eager-reference-d0.1-attempt10")
    session = _Recorded([beside, crowded_again], tmp_path)
    session.plan = dataclasses.replace(session.plan, shared=True, gpus=("0",))
    session.ran_beside.update({"eager-reference-d0.1", "eager-reference-d0.1-attempt10"})  # a later child beside it
    record = session.run_request(_request(tmp_path))
    assert record.status == ENVIRONMENT_FAILED and record.diagnosis is not None
    assert (record.diagnosis.meaning or "").startswith(SHARED_OUT_OF_MEMORY)
    unshared = _Recorded([beside], tmp_path)
    assert unshared.run_request(_request(tmp_path)) is beside and unshared.attempts == [0]


def test_a_second_failure_is_environment_failed_with_its_cause_and_fix(nccl: DiffReport) -> None:
    first = nccl.reference
    again = dataclasses.replace(first, wall_s=3.0)
    record = environment_failed(again, environment_cause(again) or "", ["0"], first)
    assert record.status == ENVIRONMENT_FAILED and record.diagnosis is not None
    assert record.diagnosis.fix == FIX and "GRAPHDOCTOR_SLOTS_PER_GPU" in FIX
    meaning = record.diagnosis.meaning or ""
    assert meaning.startswith("NCCL could not set up its communicator") and "retried" in meaning
    assert record.wall_s == pytest.approx(3.0 + first.wall_s)
    assert verdict_for_failure(record) == Verdict.ENVIRONMENT_FAILED


def test_a_reference_the_machine_failed_makes_every_row_environment_failed_and_exit_2(nccl: DiffReport) -> None:
    reference = environment_failed(nccl.reference, "NCCL could not set up its communicator", ["0"], nccl.reference)
    graphed = dataclasses.replace(nccl.reference, impl="local", status="ok")
    rows = tuple(judge(reference, dataclasses.replace(graphed, impl=impl), warmup_steps=2)
                 for impl in ("local", "full_iteration"))
    assert [r.verdict for r in rows] == [Verdict.ENVIRONMENT_FAILED] * 2
    assert all("machine failed the eager reference" in r.notes[0] for r in rows)
    report = dataclasses.replace(nccl, reference=reference, results=rows)
    assert report.exit_code() == 2
    text = render_text(report)
    assert "environment-failed" in text and "retried" in text and "reference-failed" not in text
    diverged = dataclasses.replace(rows[1], verdict=Verdict.NUMERIC_DIVERGENCE)
    assert dataclasses.replace(report, results=(rows[0], diverged)).exit_code() == 1  # a finding wins


class _Recorded(ChildSession):
    """A session whose children are recorded records, returned in order (the orchestration under test is the
    retry; the children's own runs are GPU work)."""

    def __init__(self, records: list[RunRecord], tmp_path: Path) -> None:
        super().__init__(DiffConfig(timeout_s=30.0), tmp_path)
        self.records = records
        self.attempts: list[int] = []
        self.notes: list[str] = []

    def _run_once(self, request: ChildRequest, cancel: Any, attempt: int) -> RunRecord:
        self.attempts.append(attempt)
        return self.records.pop(0)

    def note(self, text: str) -> None:
        self.notes.append(text)


def _request(tmp_path: Path) -> ChildRequest:
    return ChildRequest(EAGER, 0.0, Role.REFERENCE, tmp_path)


def test_a_session_retries_a_machine_failure_once_then_calls_it_environment_failed(nccl: DiffReport,
                                                                                   tmp_path: Path) -> None:
    session = _Recorded([nccl.reference, nccl.reference], tmp_path)
    record = session.run_request(_request(tmp_path))
    assert session.attempts == [0, 10] and record.status == ENVIRONMENT_FAILED
    assert session.notes == ["eager reference: NCCL could not set up its communicator (on one GPU this is most often "
                             "too many processes on it at once, or its memory exhausted); it runs again alone, once "
                             "this run's children started before it have finished"]


def test_a_retry_that_runs_is_the_record(nccl: DiffReport, tmp_path: Path) -> None:
    ok = RunRecord(impl=EAGER, dropout=0.0, status="ok")
    session = _Recorded([nccl.reference, ok], tmp_path)
    assert session.run_request(_request(tmp_path)) is ok
    assert session.retried == []  # the retry's record has no name: it never started (a cancelled one)
    model = _failed("zero_centered_gamma not supported by torch LayerNorm", "AssertionError")
    session = _Recorded([model], tmp_path)
    assert session.run_request(_request(tmp_path)) is model and session.attempts == [0]  # the model's: no retry


def test_the_retry_waits_until_the_sessions_other_children_have_finished(nccl: DiffReport, tmp_path: Path) -> None:
    ok = RunRecord(impl=EAGER, dropout=0.0, status="ok")
    session = _Recorded([nccl.reference, ok], tmp_path)
    other = threading.Event()
    ended = threading.Event()

    def other_child() -> None:  # another child of the session, started first, runs for 0.5 s
        with session.turns.turn():
            other.set()
            time.sleep(0.5)
        ended.set()

    threading.Thread(target=other_child).start()
    assert other.wait(5.0)
    began = time.monotonic()
    assert session.run_request(_request(tmp_path)) is ok and session.attempts == [0, 10]
    assert ended.is_set() and time.monotonic() - began >= 0.4


def test_the_plugin_counts_environment_failures_apart_from_divergences() -> None:
    lines = [Verdicts("t::a", (("local", "match"),), 0).line(),
             Verdicts("t::b", (("local", "numeric-divergence"),), 1).line(),
             Verdicts("t::c", (("local", "environment-failed"),), 2).line()]
    assert lines[2] == "t::c: local environment-failed [ENVIRONMENT]"
    assert count_line(lines) == "3 diffs: 1 ok, 1 failed, 1 environment failure (the machine, not the model)"


H100_054B = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"
"""`diff --impl local,full_iteration` at tests/benchmarks/diff_cost.py's 0.54 B size with the defaults on an H100 80GB
(2026-12-07, tests/gpu/test_concurrency_gpu.py): planned from the true first estimate
(h100_054b_true_estimate.json.gz), and with graphdoctor's estimate forced to 1 GiB (h100_054b_estimate_1gib.json.gz),
so eight children started together and every one the machine failed ran again alone."""


def test_children_the_machine_failed_together_ran_again_alone_and_gave_the_true_plans_verdicts() -> None:
    true_plan = load_report(H100_054B / "h100_054b_true_estimate.json.gz")
    forced = load_report(H100_054B / "h100_054b_estimate_1gib.json.gz")
    assert forced.jobs.startswith("8 children at a time on one GPU (about 1 GiB each")
    assert [(r.impl, r.verdict, r.passed) for r in forced.results] == [
        (r.impl, r.verdict, r.passed) for r in true_plan.results]
    assert forced.exit_code() == true_plan.exit_code() == 0
    assert forced.timeline is not None and true_plan.timeline is not None and not true_plan.timeline.retried
    retried = dict(forced.timeline.retried)
    assert len(retried) == 8 and set(retried.values()) <= {environment_cause(_failed(m)) for m in (
        "CUDA out of memory. Tried to allocate 2.00 GiB", "NCCL error: unhandled cuda error")}
    again = [run.name for run in forced.runs() if run.name.endswith("-attempt10")]
    assert again and {name.removesuffix("-attempt10") for name in again} <= set(retried)
    assert not set(retried) & {run.name for run in forced.runs()}  # the rows hold the retries, not first attempts
    text = render_text(forced)
    assert "8 ran again alone after the machine failed them (out of memory before the first step: 7, NCCL could not " \
           "set up its communicator: 1)" in text
    assert forced.timeline.before_first_child_s is not None and forced.timeline.before_first_child_s < 1.0
