"""Child isolation and the child protocol: real child processes, timeouts, torn event files, signals,
and every event through the one encoder and decoder."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.launches.compare import LaunchSection
from graphdoctor.launches.counts import LaunchCount
from graphdoctor.memory.sections import MemorySection, MemoryStats
from graphdoctor.parent.children import run_child, user_import_dir
from graphdoctor.parent.fold import record_from_events
from graphdoctor.parent.runner import ProcessResult, child_env, python_command, run_isolated, with_port_retries
from graphdoctor.protocol import (
    EAGER,
    Capture,
    ChildSpec,
    End,
    Error,
    EventLog,
    EventWriter,
    Hazard,
    Launches,
    Memory,
    Placement,
    ProtocolError,
    Role,
    RunEnv,
    RunRecord,
    Started,
    Step,
    Taps,
    decode,
    encode,
    impl_name,
    placement_for_child,
    read_events,
    run_name,
)
from graphdoctor.protocol.events import Phase
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.protocol.taptable import TapTable
from graphdoctor.types import TensorDiff


def make_spec(tmp_path: Path, impl: str = "local", role: Role = Role.GRAPHED, **config: object) -> ChildSpec:
    return ChildSpec(impl=impl, dropout=0.0, config=DiffConfig(**config), role=role,  # type: ignore[arg-type]
                     name=run_name(impl, 0.0, role), events_path=str(tmp_path / "events.jsonl"),
                     reference_dir=str(tmp_path), placement=Placement(master_port=29999))


def ended(returncode: int | None = 0, *, timed_out: bool = False, tail: str = "") -> ProcessResult:
    return ProcessResult(returncode=returncode, timed_out=timed_out, wall_s=1.0, log_tail=tail)


def test_spec_round_trip_keeps_the_typed_config(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, env={"NCCL_GRAPH_REGISTER": "0"}, cuda_graph_modules=("attn",))
    back = ChildSpec.from_json(spec.to_json())
    assert back == spec
    assert isinstance(back.config, DiffConfig) and back.role is Role.GRAPHED
    with pytest.raises(ProtocolError):
        ChildSpec.from_json('{"impl": "local"}')


EVENTS = [
    Started(env=RunEnv(torch="2.11.0", pid=7, gpu="NVIDIA H200", capability=(9, 0), megatron_core="0.19.2")),
    Step(record=StepRecord(step=0, phase="capture", loss=6.5, step_time_ms=3.0,
                           grads=TensorDiff(num_tensors=3, num_unequal=1, max_abs=0.5, max_rel=0.1,
                                            first_tensor="decoder.layers.0.mlp.linear_fc1.weight"))),
    Capture(step=0, seconds=0.25),
    Memory(section=MemorySection(stats=MemoryStats(peak_allocated_bytes=10, peak_reserved_bytes=20))),
    Launches(section=LaunchSection(profiled_step=8, trace="t.json.gz",
                                   step=LaunchCount(label="x", num_kernel_launches=5))),
    Taps(table=TapTable.failed("installing taps: RuntimeError: no")),
    Hazard(rule="GD511", module="decoder.layers.0.self_attention.core_attention", message="m"),
    Error(error_type="RuntimeError", message="boom", frames=(("a.py", 3, "f"),), step=2, phase="replay"),
    End(train_s=1.5, compare_s=0.1, setup_s=2.0, peak_allocated_bytes=5, end_reserved_bytes=6,
        end_allocated_bytes=4),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.kind)
def test_every_event_round_trips_through_the_one_codec(event: object) -> None:
    line = encode(event)  # type: ignore[arg-type]
    assert json.loads(line)["event"] == event.kind  # type: ignore[attr-defined]
    assert decode(line) == event


def test_torn_last_line_is_listed_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    writer = EventWriter(path)
    writer.emit(EVENTS[0])
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"event": "st')
    writer.close()
    log = read_events(path)
    assert log.events == (EVENTS[0],)
    assert len(log.problems) == 1
    assert read_events(tmp_path / "missing.jsonl").events == ()


def test_fold_keeps_every_section_typed(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    record = record_from_events(spec, EventLog(events=tuple(e for e in EVENTS if not isinstance(e, Error))),
                                ended())
    assert record.status == "ok" and record.name == spec.name
    assert record.env is not None and record.env.gpu == "NVIDIA H200"
    assert record.memory is not None and record.memory.stats.peak_reserved_bytes == 20
    assert record.launches is not None and record.launches.step is not None
    assert record.forensics is not None and record.forensics.error
    assert record.hazards[0].rule == "GD511"
    assert (record.peak_allocated_bytes, record.end_allocated_bytes) == (5, 4)
    assert RunRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_schema1_record_reads_none_as_eager_and_memory_from_env() -> None:
    old = {"impl": "none", "dropout": 0.1, "status": "ok", "steps": [], "diagnosis": None,
           "env": {"torch": "2.11", "pid": 1, "peak_allocated_bytes": 9}}
    record = RunRecord.from_dict(old)
    assert record.impl == EAGER == impl_name("none")
    assert record.peak_allocated_bytes == 9


def test_killed_child_is_crashed_with_signal_name(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    log = EventLog(events=(Step(record=StepRecord(step=0, phase="capture", loss=7.0, step_time_ms=3.0)),))
    record = record_from_events(spec, log, ended(-signal.SIGSEGV, tail="Segmentation fault\n"))
    assert record.status == "crashed"
    assert record.diagnosis is not None and "SIGSEGV" in record.diagnosis.message
    assert record.diagnosis.step == 1
    assert len(record.steps) == 1


def test_unavailable_error_event(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, impl="transformer_engine")
    error = Error(error_type="MissingDependencyError", message="no TE", unavailable=True)
    record = record_from_events(spec, EventLog(events=(error,)), ended(3))
    assert record.status == "unavailable"


def test_capture_error_gets_the_catalogue_rule_and_fix(tmp_path: Path) -> None:
    from graphdoctor.rules import get_rule

    error = Error(error_type="RuntimeError", phase="replay", step=0,
                  message="CUDA error: operation not permitted when stream is capturing")
    record = record_from_events(make_spec(tmp_path), EventLog(events=(error,)), ended(3))
    assert record.diagnosis is not None
    assert record.diagnosis.phase == "capture" and record.diagnosis.rule == "GD501"
    assert record.diagnosis.fix == get_rule("GD501").fix_title()


def test_run_names_are_distinct_per_role_hunt_and_attempt() -> None:
    names = {run_name("local", 0.1, Role.GRAPHED), run_name("local", 0.1, Role.GRAPHED, hunt=True),
             run_name("local", 0.1, Role.GRAPHED, attempt=1), run_name("local", 0.1, Role.TAPPED, taps=True),
             run_name(EAGER, 0.1, Role.REFERENCE), run_name(EAGER, 0.0, Role.REFERENCE)}
    assert len(names) == 6


def test_real_child_without_cuda_reports_an_error_event(tmp_path: Path) -> None:
    """The real child process, started isolated: on a CPU machine it fails in setup, cleanly."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test checks the no-CUDA failure path")
    spec = make_spec(tmp_path, timeout_s=120)
    record = run_child(spec, tmp_path)
    assert record.status == "error"
    assert record.diagnosis is not None
    assert record.diagnosis.phase == "setup"
    assert record.env is not None and record.env.pid > 0
    assert record.wall_s > 0
    assert (tmp_path / f"log-{spec.name}.txt").exists() and (tmp_path / f"spec-{spec.name}.json").exists()
    # Its stack dump was registered at start (empty: nobody asked), and it said it was in setup.
    assert (tmp_path / f"stacks-{spec.name}.rank0.txt").exists()
    assert [e.phase for e in read_events(spec.events_path).of(Phase)] == ["setup"]


def test_real_child_timeout_kills_the_group(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, timeout_s=0.5)
    record = run_child(spec, tmp_path)
    assert record.status == "timeout"
    assert record.diagnosis is not None and "killed" in record.diagnosis.message
    assert record.wall_s < 30


def test_run_isolated_kills_grandchildren_too(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    code = ("import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    result = run_isolated([sys.executable, "-c", code], timeout_s=3.0)
    assert result.timed_out and result.wall_s < 30
    grandchild = int(marker.read_text())
    time.sleep(0.2)
    # Gone, or a zombie waiting for its (new) parent to reap it: either way no longer running.
    status = Path(f"/proc/{grandchild}/status")
    assert not status.exists() or "State:\tZ" in status.read_text()


def test_children_do_not_import_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "torch.py").write_text("raise SystemExit('stray module imported')\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = python_command("graphdoctor.child.te_check")
    result = run_isolated(code, timeout_s=120, capture_stdout=True, env=child_env())
    assert "stray module imported" not in result.log_tail
    assert result.stdout.strip().splitlines()[-1].startswith(("ok", "no: "))


def test_user_import_dir_only_when_the_named_module_is_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = DiffConfig(layer_spec="mymodels.spec:layer_spec")
    assert user_import_dir(config) is None
    (tmp_path / "mymodels").mkdir()
    assert user_import_dir(config) == str(tmp_path)
    assert user_import_dir(DiffConfig(layer_spec="local")) is None


def test_port_retries_stop_at_the_first_good_attempt() -> None:
    attempts: list[int] = []

    def run(attempt: int) -> str:
        attempts.append(attempt)
        return "taken" if attempt == 0 else "ok"

    result, failed = with_port_retries(run, lambda r: r == "taken")
    assert (result, failed, attempts) == ("ok", ["taken"], [0, 1])


def test_child_env_layers_run_file_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    env = child_env({"NCCL_GRAPH_REGISTER": "0"})
    assert env["NCCL_GRAPH_REGISTER"] == "0"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's own setting wins
    assert env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0"


def test_torchrun_placement_gives_each_child_its_own_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_PORT", "29400")
    first, second = placement_for_child(0), placement_for_child(1)
    assert (first.rank, first.world_size, first.local_rank) == (1, 2, 1)
    assert (first.master_port, second.master_port) == (29401, 29402)
