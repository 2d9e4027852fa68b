"""Property: no hostile input makes a command crash, hang, run away with memory or touch a file.

Each example writes one generated input into a fresh directory and runs the command on it in a
forked, resource-limited child (harness.run_case): it must end in a clean error (exit 2, one line
on stderr) or be accepted (exit 0/1), within 10 s and 1 GiB, creating nothing but its output and
changing no input. An accepted report written with --json must be strict JSON.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from conftest import examples
from harness import run_case
from hostile import launch_line, run_file_text, snapshot_bytes, trace_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from graphdoctor.config import load_run_file
from graphdoctor.errors import GraphDoctorError


def _strict_json(path: Path) -> None:
    def refuse(name: str) -> None:
        raise AssertionError(f"{path.name}: bare {name} in a report")

    json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def _run(command: str, label: str, data: bytes, name: str, argv: list[str], outputs: tuple[str, ...] = ()) -> None:
    with tempfile.TemporaryDirectory(prefix="gd-fuzz-") as tmp:
        cwd = Path(tmp)
        path = cwd / name
        path.write_bytes(data)
        outcome = run_case(command, label, argv, cwd=cwd, inputs=[path], outputs=outputs)
        assert not outcome.problems, outcome
        if outcome.kind == "accepted":
            for output in outputs:
                if output.endswith(".json") and (cwd / output).exists():
                    _strict_json(cwd / output)


@settings(settings.get_profile("fuzz"), max_examples=examples(120))
@given(case=snapshot_bytes(), with_trace=st.booleans())
def test_triage_survives_hostile_snapshots(case: tuple[str, bytes], with_trace: bool) -> None:
    label, data = case
    argv = ["triage", "snap.pickle", "--json", "out.json", *(["--trace"] if with_trace else [])]
    _run("triage", label, data, "snap.pickle", argv, outputs=("out.json",))


@settings(settings.get_profile("fuzz"), max_examples=examples(120))
@given(case=trace_bytes())
def test_count_survives_hostile_traces(case: tuple[str, bytes]) -> None:
    label, data = case
    _run("count", label, data, "trace.json", ["count", "--trace", "trace.json", "--json", "out.json"],
         outputs=("out.json",))


@settings(settings.get_profile("fuzz"), max_examples=examples(100))
@given(case=run_file_text())
def test_check_survives_hostile_run_files(case: tuple[str, bytes]) -> None:
    label, data = case
    _run("check", label, data, "run.yaml", ["check", "--config", "run.yaml", "--format", "json"])


@settings(settings.get_profile("fuzz"), max_examples=examples(80))
@given(case=launch_line(), as_file=st.booleans())
def test_check_survives_hostile_launch_lines(case: tuple[str, str], as_file: bool) -> None:
    label, text = case
    if as_file:
        _run("check", f"{label}/@file", text.encode(), "launch.txt", ["check", "--megatron-args", "@launch.txt"])
    else:
        _run("check", label, b"", "unused", ["check", "--megatron-args", text])


@settings(settings.get_profile("fuzz"), max_examples=examples(60))
@given(case=run_file_text())
def test_diff_config_refused_before_any_gpu_check(case: tuple[str, bytes]) -> None:
    label, data = case
    with tempfile.TemporaryDirectory(prefix="gd-fuzz-") as tmp:
        cwd = Path(tmp)
        path = cwd / "run.yaml"
        path.write_bytes(data)
        try:
            load_run_file(path)
            bad = False
        except GraphDoctorError:
            bad = True
        outcome = run_case("diff", label, ["diff", "--config", "run.yaml"], cwd=cwd, inputs=[path])
    assert not outcome.problems, outcome
    if bad:
        assert outcome.kind == "clean error" and "CUDA GPU" not in outcome.stderr, outcome


@pytest.mark.parametrize("command", ["triage", "count"])
def test_output_onto_input_is_refused(tmp_path: Path, command: str) -> None:
    source = {"triage": "fixtures/data/memory/eager.pickle.gz",
              "count": "fixtures/data/launches/synthetic_kineto_trace.json"}[command]
    from hostile import REPO

    data = (REPO / source).read_bytes()
    path = tmp_path / "input"
    path.write_bytes(data)
    argv = ["triage", "input", "--json", "input"] if command == "triage" else ["count", "--trace", "input", "--json", "input"]
    outcome = run_case(command, "output-is-input", argv, cwd=tmp_path, inputs=[path])
    assert outcome.kind == "clean error" and "refusing to overwrite" in outcome.stderr, outcome
    assert path.read_bytes() == data
