"""Hangs are diagnosed, not waited out: real processes (a 2-rank gloo group under torch.distributed.run,
a plain blocking call, blocked exits) are stopped with their real stacks, phases and last steps, and
nothing of them is left running."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from graphdoctor.child.stacks import launcher_command
from graphdoctor.compare.verdict import verdict_for_failure
from graphdoctor.config import DiffConfig
from graphdoctor.parent.children import record_from_events
from graphdoctor.parent.hangs import TEARDOWN_FIX, parse_dump, teardown_note, timeout_outcome
from graphdoctor.parent.runner import ProcessResult, run_isolated
from graphdoctor.protocol import ChildSpec, Placement, Role, RunRecord, read_events, run_name
from graphdoctor.protocol.events import Phase, Teardown, decode, encode
from graphdoctor.types import Verdict

RANKS = Path(__file__).resolve().parents[2] / "fixtures" / "hangs" / "ranks.py"


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


def test_unmatched_gloo_collective_is_a_hang_with_every_ranks_stack(tmp_path: Path) -> None:
    timeout_s = 12.0
    result, prefix = _run(tmp_path, "collective", timeout_s, ranks=2)
    assert result.timed_out and result.wall_s < timeout_s + 30
    assert result.group_gone is True and result.left_running == ()
    _nothing_left(prefix)
    logs = {r: read_events(f"{prefix}.rank{r}.jsonl") for r in (0, 1)}
    status, diag = timeout_outcome(timeout_s, logs, result.stacks, result.group_gone, result.left_running)
    assert status == "hang" and diag.error_type == "hang" and diag.fix
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
    assert note is not None and note.startswith("teardown-hang: rank 0") and TEARDOWN_FIX in note
    assert "pytorch#115388" in note
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
    for event in (Phase(phase="replay", step=2), Teardown(rank=1, seconds=20.0, since_last_step_s=21.5, hung=True)):
        assert decode(encode(event)) == event


def test_hang_is_a_failing_verdict() -> None:
    assert Verdict("hang") is Verdict.HANG and not Verdict.HANG.passed
    assert verdict_for_failure(RunRecord(impl="local", dropout=0.0, status="hang")) is Verdict.HANG
