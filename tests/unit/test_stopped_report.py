"""graphdoctor stopped (SIGTERM, SIGHUP) still writes its report: a running child is asked for its stacks
and its record says `stopped` with the steps it finished (real processes: fixtures/hangs/ranks.py); each
row of the partial report comes from real H200 records cut where a stop would have left them; the JSON
round-trips, renders, and exits as the process does (128 + the signal)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.compare.verdict import stopped_row, verdict_for_failure
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.errors import Stopped
from graphdoctor.parent.children import fold_stopped
from graphdoctor.parent.fold import record_from_events
from graphdoctor.parent.launch import fold_launch
from graphdoctor.parent.runner import ProcessResult, allow_starts, run_isolated, stop_running
from graphdoctor.protocol import ChildSpec, Placement, Role, RunRecord, read_events, run_name
from graphdoctor.protocol.processes import launcher_command
from graphdoctor.protocol.spec import rank_path
from graphdoctor.report.diff import render_text
from graphdoctor.report.html import render_payload
from graphdoctor.types import Verdict

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc are Linux's")

REPO = Path(__file__).resolve().parents[2]
RANKS = REPO / "fixtures" / "hangs" / "ranks.py"
DATA = REPO / "fixtures" / "data" / "diff"


def _report(name: str) -> DiffReport:
    return DiffReport.from_dict(json.loads((DATA / name).read_text()))


def _cut(record: RunRecord, last_step: int) -> RunRecord:
    """`record` as a stop after `last_step` leaves it: the steps up to it, status stopped."""
    return dataclasses.replace(record, status="stopped", steps=tuple(s for s in record.steps if s.step <= last_step))


def _spec(tmp_path: Path, *, launched: bool = False) -> ChildSpec:
    name = run_name("local", 0.0, Role.GRAPHED)
    placement = Placement(world_size=2, launcher=True) if launched else Placement(master_port=29999)
    return ChildSpec(impl="local", dropout=0.0, config=DiffConfig(timeout_s=120.0), role=Role.GRAPHED, name=name,
                     events_path=str(tmp_path / f"events-{name}.jsonl"), reference_dir=str(tmp_path),
                     placement=placement)


def _stop_while_running(tmp_path: Path, spec: ChildSpec, mode: str, ranks: int = 1) -> ProcessResult:
    """Run ranks.py as `spec`'s child in a worker thread (as a diff's session does), stop the parent once every
    rank finished its first step, and return how the child ended."""
    prefix = spec.events_path.removesuffix(".jsonl")
    script = [str(RANKS), prefix, mode]
    argv = launcher_command("--standalone", f"--nproc-per-node={ranks}", "--monitor-interval=0.2",
                            *script) if ranks > 1 else [sys.executable, *script]
    ended: list[ProcessResult] = []
    worker = threading.Thread(target=lambda: ended.append(run_isolated(
        argv, timeout_s=120.0, log_path=tmp_path / f"log-{spec.name}.txt",
        stacks_prefix=tmp_path / f"stacks-{spec.name}")))
    worker.start()
    events = [Path(f"{prefix}.rank{r}.jsonl") for r in range(ranks)]
    last = '"event": "step", "profiled": false, "step": ' + ("1" if mode == "collective" else "0")
    deadline = time.monotonic() + 60
    while not all(e.is_file() and last in e.read_text() for e in events) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # into the blocking call
    try:
        stop_running("SIGTERM")
        worker.join(timeout=60)
    finally:
        allow_starts()
    assert ended, "the worker's run_isolated did not return"
    return ended[0]


def _nothing_left(marker: str) -> None:
    leftover = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                leftover += [] if state == "Z" else [cmdline.parent.name]
        except OSError:
            continue
    assert not leftover, leftover


def test_a_stopped_child_is_asked_for_its_stacks_and_its_record_says_stopped(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    ended = _stop_while_running(tmp_path, spec, "sleep")
    assert ended.stopped == "SIGTERM" and not ended.timed_out
    assert ended.stacks, "no stacks dumped before the kill"
    events = f"{spec.events_path.removesuffix('.jsonl')}.rank0.jsonl"
    record = record_from_events(dataclasses.replace(spec, events_path=events), read_events(events), ended)
    assert record.status == "stopped" and verdict_for_failure(record) is Verdict.STOPPED
    diag = record.diagnosis
    assert diag is not None and diag.error_type == "stopped" and "stopped by SIGTERM" in diag.message
    (stack,) = diag.stacks
    assert (stack.label, stack.phase, stack.last_step) == ("rank0", "warmup", 0)
    assert stack.user_frame is not None and "wait_for_peer_forever" in stack.user_frame
    assert [s.step for s in record.steps] == [0]
    _nothing_left(str(tmp_path))


def test_the_child_the_stop_interrupted_in_the_main_thread_is_folded_from_its_files(tmp_path: Path) -> None:
    """fold_stopped: the same record from the events, stacks and log the child left (no ProcessResult)."""
    spec = _spec(tmp_path)
    _stop_while_running(tmp_path, spec, "sleep")
    spec = dataclasses.replace(spec, events_path=f"{spec.events_path.removesuffix('.jsonl')}.rank0.jsonl")
    record = fold_stopped(spec, tmp_path, "SIGHUP")
    assert record.status == "stopped" and record.diagnosis is not None
    assert "stopped by SIGHUP" in record.diagnosis.message
    assert record.diagnosis.stacks and record.diagnosis.stacks[0].last_step == 0


def test_a_stopped_multi_rank_child_keeps_every_ranks_stack(tmp_path: Path) -> None:
    """Two real gloo ranks under torch.distributed.run, stopped while rank 0 waits in an all_reduce."""
    spec = _spec(tmp_path, launched=True)
    ended = _stop_while_running(tmp_path, spec, "collective", ranks=2)
    assert ended.stopped == "SIGTERM"
    prefix = spec.events_path.removesuffix(".jsonl")
    for rank in (0, 1):  # ranks.py names its files as test_hangs reads them; the fold reads a run's names
        shutil.copy(f"{prefix}.rank{rank}.jsonl", rank_path(spec.events_path, rank, 2))
    record = fold_launch(spec, ended)
    assert record.status == "stopped" and record.diagnosis is not None
    labels = [s.label for s in record.diagnosis.stacks]
    assert "rank0" in labels and "rank1" in labels, labels
    by_label = {s.label: s for s in record.diagnosis.stacks}
    assert (by_label["rank0"].phase, by_label["rank0"].last_step) == ("replay", 1)
    assert by_label["rank0"].waiting_in is not None and by_label["rank0"].waiting_in.startswith("all_reduce")
    assert [s.step for s in record.steps] == [0, 1]
    _nothing_left(str(tmp_path))


def test_finished_comparisons_keep_their_verdict_and_say_what_did_not_run() -> None:
    report = _report("h200_small_dropout0_fingerprints_schema2.json")
    (graphed,) = report.results[0].runs
    row = stopped_row(report.reference, graphed, "local", stopped_by="SIGTERM", warmup_steps=2)
    assert row.verdict is Verdict.MATCH
    assert any("stopped by SIGTERM after this comparison" in n for n in row.notes), row.notes
    failed = _report("h200_item_mlp_schema2.json")
    (capture,) = failed.results[0].runs
    row = stopped_row(failed.reference, capture, "local", stopped_by="SIGTERM", warmup_steps=2)
    assert row.verdict is Verdict.CAPTURE_FAILED and row.diagnosis == capture.diagnosis


def test_runs_cut_by_the_stop_compare_the_steps_both_reached() -> None:
    report = _report("h200_small_dropout0_fingerprints_schema2.json")
    (graphed,) = report.results[0].runs
    row = stopped_row(_cut(report.reference, 5), _cut(graphed, 3), "local", stopped_by="SIGTERM", warmup_steps=2)
    assert row.verdict is Verdict.STOPPED and row.divergence is None
    assert row.notes == ("stopped by SIGTERM: eager finished step 5, local finished step 3; equal through step 3",)
    # a difference already seen is kept: the dropout-0.1 local run differs from eager at step 1 (rng)
    rng = _report("h200_default_dropout0.1_schema2.json")
    local = rng.results[0].runs[0]
    row = stopped_row(_cut(rng.reference, 4), _cut(local, 4), "local", stopped_by="SIGTERM", warmup_steps=2)
    assert row.verdict is Verdict.STOPPED and row.divergence is not None
    assert f"first difference at step {row.divergence.step}" in row.notes[0]
    assert row.divergence.step == rng.results[0].divergence.step
    # both finished, but a dropout > 0 difference needs the control pair that never ran
    row = stopped_row(rng.reference, local, "local", stopped_by="SIGTERM", warmup_steps=2)
    assert row.verdict is Verdict.STOPPED and "control pair" in row.notes[-1]
    row = stopped_row(rng.reference, None, "local", stopped_by="SIGTERM", warmup_steps=2)
    assert row.verdict is Verdict.STOPPED and row.notes == ("stopped by SIGTERM before it started",)


def test_the_partial_report_round_trips_renders_and_exits_as_the_process() -> None:
    base = _report("h200_small_dropout0_fingerprints_schema2.json")
    rows = tuple(stopped_row(_cut(base.reference, 4), _cut(r.runs[0], 2), r.impl, stopped_by="SIGTERM",
                             warmup_steps=2) for r in base.results)
    report = dataclasses.replace(base, results=rows, reference=_cut(base.reference, 4), stopped="SIGTERM")
    assert report.exit_code() == 143
    data = json.loads(json.dumps(report.to_dict()))
    assert data["stopped"] == "SIGTERM" and data["exit_code"] == 143
    assert [r["verdict"] for r in data["impls"]] == ["stopped", "stopped"]
    back = DiffReport.from_dict(data)
    assert back.stopped == "SIGTERM" and back.results == report.results
    text = render_text(back)
    assert "STOPPED by SIGTERM before the diff finished" in text and "exit code 143" in text
    assert "equal through step 2" in text
    page = render_payload(data)
    assert "stopped" in page
    assert DiffReport.from_dict(base.to_dict()).stopped is None and base.to_dict()["stopped"] is None


def test_the_cli_writes_the_partial_report_and_exits_128_plus_the_signal(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's wiring only: `diff` itself needs a GPU (tests/gpu/test_stopped_gpu.py stops a real one), so
    here it raises Stopped carrying a partial report built from real H200 records."""
    base = _report("h200_small_dropout0_fingerprints_schema2.json")
    rows = tuple(stopped_row(_cut(base.reference, 3), _cut(r.runs[0], 3), r.impl, stopped_by="SIGTERM",
                             warmup_steps=2) for r in base.results)
    partial = dataclasses.replace(base, results=rows, reference=_cut(base.reference, 3), stopped="SIGTERM")

    def stopped_diff(config: DiffConfig, **_: object) -> DiffReport:
        stop = Stopped(15)
        stop.report = partial
        raise stop

    monkeypatch.setattr("graphdoctor.diff.decide.diff", stopped_diff)
    out, page = tmp_path / "partial.json", tmp_path / "partial.html"
    result = CliRunner().invoke(main, ["diff", "--impl", "local", "--json", str(out), "--html", str(page)])
    assert result.exit_code == 143, result.output
    data = json.loads(out.read_text())
    assert data["stopped"] == "SIGTERM" and {r["verdict"] for r in data["impls"]} == {"stopped"}
    assert page.is_file() and "STOPPED by SIGTERM" in result.output
    assert "stopped by SIGTERM: every child process was ended" in result.output


def test_a_stopped_diff_run_builds_its_report_from_the_children_it_started(tmp_path: Path) -> None:
    """DiffRun.stopped_report over a real session's files: the eager reference and one implementation, each
    a real process stopped after its first step (the main-thread path: folded from events, stacks, log)."""
    from graphdoctor.diff import DiffRun
    from graphdoctor.parent.children import ChildSession
    from graphdoctor.protocol.spec import EAGER

    config = DiffConfig(impls=("local",), dropout=0.0, timeout_s=120.0)
    session = ChildSession(config, tmp_path)
    run = DiffRun(session)
    run.schedule.first = [run.schedule.request(EAGER, 0.0, Role.REFERENCE),
                          run.schedule.request("local", 0.0, Role.GRAPHED)]
    for request in run.schedule.first:
        spec = session.spec(request)
        _stop_while_running(tmp_path, dataclasses.replace(spec, events_path=str(tmp_path / f"run-{spec.name}.jsonl")),
                            "sleep")
        shutil.copy(tmp_path / f"run-{spec.name}.rank0.jsonl", spec.events_path)
        session.started.append((request, spec))
    report = run.stopped_report("SIGTERM")
    assert report.stopped == "SIGTERM" and report.exit_code() == 143
    assert report.reference.status == "stopped" and report.reference.diagnosis is not None
    assert report.reference.diagnosis.stacks and [s.step for s in report.reference.steps] == [0]
    (local,) = report.results
    assert local.verdict is Verdict.STOPPED
    assert local.notes == ("stopped by SIGTERM: eager finished step 0, local finished step 0; equal through step 0",)
    assert "STOPPED by SIGTERM" in render_text(report)
    _nothing_left(str(tmp_path))
