"""Hangs are diagnosed, not waited out: real processes (a 2-rank gloo group under torch.distributed.run,
a plain blocking call, blocked exits) are stopped with their real stacks, phases and last steps, and
nothing of them is left running."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from graphdoctor.compare.phases import teardown_note
from graphdoctor.compare.verdict import judge, verdict_for_failure
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.parent.fold import record_from_events
from graphdoctor.parent.hangs import parse_dump, timeout_outcome
from graphdoctor.parent.runner import ProcessResult, read_stacks, run_isolated
from graphdoctor.protocol import ChildSpec, Placement, Role, RunRecord, read_events, run_name
from graphdoctor.protocol.events import Phase, Teardown, decode, encode
from graphdoctor.protocol.processes import launcher_command
from graphdoctor.report.diff import render_text, write_json
from graphdoctor.rules import get_rule, rule_fix
from graphdoctor.types import MAX_STACK_FRAMES, Diagnosis, RankExit, RankStack, Verdict

RANKS = Path(__file__).resolve().parents[2] / "fixtures" / "hangs" / "ranks.py"


DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"
COLLECTIVE_TIMEOUT_S = 12.0


def _run(tmp_path: Path, mode: str, timeout_s: float, *, ranks: int = 1) -> tuple[ProcessResult, Path]:
    prefix = tmp_path / "events"
    script = [str(RANKS), str(prefix), mode]
    argv = launcher_command("--standalone", f"--nproc-per-node={ranks}", "--monitor-interval=0.2",
                            *script) if ranks > 1 else [sys.executable, *script]
    result = run_isolated(argv, timeout_s=timeout_s, log_path=tmp_path / "log.txt",
                          stacks_prefix=tmp_path / "stacks")
    return result, prefix


def _nothing_left(prefix: Path) -> None:
    """No running process has `prefix` on its command line (what `ps` would show)."""
    leftover = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(prefix).encode() in cmdline.read_bytes():
                state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                leftover += [] if state == "Z" else [cmdline.parent.name]
        except OSError:
            continue
    assert not leftover, leftover


def _spec(tmp_path: Path, timeout_s: float) -> ChildSpec:
    return ChildSpec(impl="local", dropout=0.0, config=DiffConfig(timeout_s=timeout_s), role=Role.GRAPHED,
                     name=run_name("local", 0.0, Role.GRAPHED), events_path=str(tmp_path / "events.rank0.jsonl"),
                     reference_dir=str(tmp_path), placement=Placement(master_port=29999))


@pytest.fixture(scope="module")
def collective(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProcessResult, Path, Diagnosis]:
    """A real 2-rank gloo job under torch.distributed.run (launched as graphdoctor launches it) in
    which rank 0 enters an all_reduce rank 1 never joins, stopped at its timeout."""
    tmp_path = tmp_path_factory.mktemp("collective")
    result, prefix = _run(tmp_path, "collective", COLLECTIVE_TIMEOUT_S, ranks=2)
    logs = {r: read_events(f"{prefix}.rank{r}.jsonl") for r in (0, 1)}
    status, diag = timeout_outcome(COLLECTIVE_TIMEOUT_S, logs, result.stacks, result.group_gone,
                                   result.left_running)
    assert status == diag.error_type
    return result, prefix, diag


def test_unmatched_gloo_collective_is_a_hang_with_every_ranks_stack(
        collective: tuple[ProcessResult, Path, Diagnosis]) -> None:
    result, prefix, diag = collective
    assert result.timed_out and result.wall_s < COLLECTIVE_TIMEOUT_S + 30
    assert result.group_gone is True and result.left_running == ()
    _nothing_left(prefix)
    status = diag.error_type
    assert status == "hang" and diag.error_type == "hang"
    assert diag.rule == "GD517" and diag.fix == rule_fix("GD517")
    by_label = {s.label: s for s in diag.stacks}
    assert list(by_label) == ["rank0", "rank1", "launcher"]
    for label, waits in (("rank0", "all_reduce"), ("rank1", "recv")):
        stack = by_label[label]
        assert (stack.phase, stack.last_step) == ("replay", 1)
        assert stack.waiting_in is not None and stack.waiting_in.startswith(waits), stack
        assert stack.user_frame is not None and "ranks.py" in stack.user_frame
        assert "enter_unmatched_collective" in stack.user_frame
    assert by_label["launcher"].waiting_in is None
    assert any("torch/distributed/run.py" in f for f in by_label["launcher"].frames)
    assert diag.phase == "replay" and diag.step == 2 and "no process left" in diag.message
    assert diag.location is not None and "ranks.py:" in diag.location


def test_plain_blocking_call_is_a_timeout_with_its_real_stack(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 4.0)
    result, prefix = _run(tmp_path, "sleep", spec.config.timeout_s)
    record = record_from_events(spec, read_events(f"{prefix}.rank0.jsonl"), result)
    assert record.status == "timeout" and verdict_for_failure(record) is Verdict.TIMEOUT
    assert record.diagnosis is not None and len(record.diagnosis.stacks) == 1
    stack = record.diagnosis.stacks[0]
    assert (stack.label, stack.phase, stack.last_step, stack.waiting_in) == ("rank0", "warmup", 0, None)
    assert stack.user_frame is not None and "wait_for_peer_forever" in stack.user_frame
    assert "killed" in record.diagnosis.message and "no process left" in record.diagnosis.message
    assert result.wall_s < spec.config.timeout_s + 30
    _nothing_left(prefix)
    back = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert back.diagnosis == record.diagnosis


@pytest.mark.parametrize(("mode", "returncode", "fn"), [("teardown", 0, "wait_for_peer_forever"),
                                                        ("teardown-gil", 1, "hold_the_gil")])
def test_teardown_watchdog_ends_a_blocked_exit_and_the_results_stand(tmp_path: Path, mode: str, returncode: int,
                                                                     fn: str) -> None:
    spec = _spec(tmp_path, 30.0)
    result, prefix = _run(tmp_path, mode, spec.config.timeout_s)
    assert not result.timed_out and result.returncode == returncode and result.wall_s < 15
    record = record_from_events(spec, read_events(f"{prefix}.rank0.jsonl"), result)
    assert record.status == "ok" and record.diagnosis is None
    (exit_,) = record.teardown
    assert exit_.rank == 0 and exit_.hung
    assert exit_.stack is not None and exit_.stack.phase == "teardown"
    assert exit_.stack.user_frame is not None and fn in exit_.stack.user_frame
    if mode == "teardown":
        assert 1.0 <= exit_.teardown_s < 5 and exit_.since_last_step_s >= exit_.teardown_s
    note = teardown_note(record.teardown)
    assert note is not None and note.startswith("GD516 teardown-hang: phase exit: rank 0") and rule_fix("GD516") in note
    assert "pytorch#115388" in get_rule("GD516").doc()
    _nothing_left(prefix)
    assert RunRecord.from_dict(json.loads(json.dumps(record.to_dict()))).teardown == record.teardown


def test_a_file_with_two_dumps_is_read_as_its_last() -> None:
    one = ('Current thread 0x0001 (most recent call first):\n  File "/a/x.py", line 3 in first\n\n'
           'Thread 0x0002 (most recent call first):\n  File "/usr/lib/python3.12/threading.py", line 9 in _bootstrap\n')
    two = one.replace("line 3 in first", "line 4 in second")
    threads = parse_dump(one + "# again\n" + two)
    assert [t.ident for t in threads] == ["0x0001", "0x0002"]
    assert threads[0].frames == (("/a/x.py", 4, "second"),)


def test_phase_and_teardown_events_round_trip() -> None:
    for event in (Phase(phase="replay", step=2), Teardown(rank=1, seconds=20.0, since_last_step_s=21.5, hung=True),
                  Teardown(rank=0, seconds=0.3, since_last_step_s=0.4, graphs_released=8, graphs_alive=1)):
        assert decode(encode(event)) == event


def test_hang_is_a_failing_verdict() -> None:
    assert Verdict("hang") is Verdict.HANG and not Verdict.HANG.passed
    assert verdict_for_failure(RunRecord(impl="local", dropout=0.0, status="hang")) is Verdict.HANG


def _report(graphed: RunRecord) -> DiffReport:
    data = json.loads((DATA / "h200_default_dropout0.1.json").read_text(encoding="utf-8"))
    reference = RunRecord.from_dict(data["reference"])
    result = judge(reference, graphed, warmup_steps=2)
    return DiffReport(config=DiffConfig(), results=(result,), reference=reference, control_reference=None,
                      wall_s=1.0, child_wall_s=1.0)


def test_report_shows_each_ranks_first_frames_and_the_json_keeps_the_stacks(
        collective: tuple[ProcessResult, Path, Diagnosis], tmp_path: Path) -> None:
    diag = collective[2]
    report = _report(RunRecord(impl="local", dropout=0.1, status="hang", diagnosis=diag))
    assert report.results[0].verdict is Verdict.HANG and report.exit_code() == 1
    lines = render_text(report).splitlines()
    assert any(line.startswith("local ") and "hang FAIL" in line for line in lines)
    heads = [line for line in lines if line.startswith(("  rank", "  launcher"))]
    assert [h.split()[0] for h in heads] == ["rank0", "rank1", "launcher"]
    assert "waiting in all_reduce" in heads[0] and "(replay, last step 1)" in heads[0]
    assert sum(line.startswith("      ") for line in lines) <= 3 * 2 + 1
    doc = json.loads(write_json(report, tmp_path / "r.json").read_text(encoding="utf-8"))
    stacks = doc["impls"][0]["diagnosis"]["stacks"]
    assert [s["label"] for s in stacks] == ["rank0", "rank1", "launcher"]
    assert all(0 < len(s["frames"]) <= MAX_STACK_FRAMES for s in stacks)


def test_a_hung_teardown_is_a_finding_that_keeps_the_verdict_and_exits_1() -> None:
    data = json.loads((DATA / "h200_default_dropout0.1.json").read_text(encoding="utf-8"))
    graphed = RunRecord.from_dict(data["impls"][1]["runs"][0])
    stack = RankStack(label="rank1", frames=("torch/distributed/distributed_c10d.py:2300 in destroy_process_group",),
                      phase="teardown", last_step=7, waiting_in="destroy_process_group (torch/...)")
    hung = dataclasses.replace(graphed, teardown=(RankExit(rank=0, teardown_s=0.1, since_last_step_s=0.2),
                                                  RankExit(rank=1, teardown_s=20.0, since_last_step_s=20.3,
                                                           hung=True, stack=stack, graphs_released=8,
                                                           graphs_alive=1)))
    report = _report(hung)
    clean = _report(graphed)
    assert report.results[0].verdict is clean.results[0].verdict
    assert clean.exit_code() == 0 and report.exit_code() == 1
    text = render_text(report)
    assert "full_iteration: GD516 teardown-hang: phase exit: rank 1 (in destroy_process_group" in text
    assert "rank 0" not in text.split("teardown-hang:")[1].split(";")[0]
    assert "1 CUDA graph still alive at destroy_process_group" in text
    back = RunRecord.from_dict(json.loads(json.dumps(hung.to_dict())))
    assert back.teardown == hung.teardown and back.teardown[1].graphs_alive == 1


def test_stacks_files_of_a_run_are_not_confused_with_a_longer_named_run(tmp_path: Path) -> None:
    for name in ("stacks-eager-reference-d0.rank0.txt", "stacks-eager-reference-d0.launcher.txt",
                 "stacks-eager-reference-d0.1.rank0.txt", "stacks-eager-reference-d0-attempt1.rank0.txt"):
        (tmp_path / name).write_text("Current thread 0x1 (most recent call first):\n", encoding="utf-8")
    assert [label for label, _ in read_stacks(tmp_path / "stacks-eager-reference-d0")] == ["launcher", "rank0"]


def test_a_process_in_a_session_of_its_own_is_killed_too(tmp_path: Path) -> None:
    """As torchrun starts its ranks: the grandchild leaves the child's process group (killpg does not
    reach it); the runner still finds it by its inherited token, and nothing is left."""
    marker = tmp_path / "pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
            f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    result = run_isolated([sys.executable, "-c", code], timeout_s=2.0)
    assert result.timed_out and result.group_gone is True and result.left_running == ()
    status = Path(f"/proc/{int(marker.read_text())}/status")
    assert not status.exists() or "State:\tZ" in status.read_text()
