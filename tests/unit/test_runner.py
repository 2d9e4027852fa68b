"""Child isolation: real child processes, timeouts, torn event files, signals."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.harness.runner import child_env, read_events, record_from_events, run_child
from graphdoctor.harness.spec import ChildSpec, Placement, placement_for_child


def make_spec(tmp_path: Path, impl: str = "local", **config: object) -> ChildSpec:
    return ChildSpec(impl=impl, dropout=0.0, config=DiffConfig(**config).to_dict(),
                     events_path=str(tmp_path / "events.jsonl"), reference_dir=str(tmp_path),
                     placement=Placement(master_port=29999))


def test_spec_round_trip(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    assert ChildSpec.from_json(spec.to_json()) == spec


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps({"event": "env", "torch": "2.11"}) + "\n{\"event\": \"st",
                    encoding="utf-8")
    assert read_events(path) == [{"event": "env", "torch": "2.11"}]
    assert read_events(tmp_path / "missing.jsonl") == []


def test_killed_child_is_crashed_with_signal_name(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    step = {"event": "step", "step": 0, "phase": "capture", "loss": 7.0, "step_time_ms": 3.0,
            "grad_norm": None, "grads": None, "params": None}
    record = record_from_events(spec, [step], returncode=-signal.SIGSEGV, timed_out=False,
                                wall_s=1.0, stderr_tail="Segmentation fault\n")
    assert record.status == "crashed"
    assert record.diagnosis is not None and "SIGSEGV" in record.diagnosis.message
    assert record.diagnosis.step == 1
    assert len(record.steps) == 1


def test_unavailable_error_event(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, impl="transformer_engine")
    error = {"event": "error", "error_type": "MissingDependencyError", "message": "no TE",
             "frames": [], "module": None, "step": -1, "phase": "setup", "unavailable": True}
    record = record_from_events(spec, [error], returncode=3, timed_out=False, wall_s=1.0)
    assert record.status == "unavailable"


def test_real_child_without_cuda_reports_an_error_event(tmp_path: Path) -> None:
    """The real child process, started isolated: on a CPU machine it fails in setup, cleanly."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test checks the no-CUDA failure path")
    spec = make_spec(tmp_path)
    record = run_child(spec, tmp_path, timeout_s=120)
    assert record.status == "error"
    assert record.diagnosis is not None
    assert record.diagnosis.phase == "setup"
    assert record.wall_s > 0


def test_real_child_timeout_kills_the_group(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    record = run_child(spec, tmp_path, timeout_s=0.5)
    assert record.status == "timeout"
    assert record.diagnosis is not None and "killed" in record.diagnosis.message
    assert record.wall_s < 30


def test_child_env_layers_run_file_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    spec = make_spec(tmp_path, env={"NCCL_GRAPH_REGISTER": "0"})
    env = child_env(spec)
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
