"""A real `graphdoctor diff`, live `count` and `advise` on the GPU, each stopped by SIGTERM part-way: each still
writes its JSON report (every row `stopped` or a finished verdict, the eager run with the steps it finished),
exits 143, and leaves no process running (docs/diff.md, Hangs; docs/launches.md; docs/advise.md)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


def _steps_done(workdir: Path, pattern: str = "events-eager-reference-*.jsonl") -> int:
    """The last training step the eager run has finished so far (from its events file)."""
    done = -1
    for events in workdir.glob(pattern):
        for line in events.read_text(errors="replace").splitlines():
            if line.startswith('{"event": "step"'):
                done = max(done, int(json.loads(line)["step"]))
    return done


def _ours(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes()
            if marker.encode() in command and (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(command.replace(b"\0", b" ").decode()[:160])
        except OSError:
            continue
    return found


MODEL = ["--impl", "local,full_iteration", "--dropout", "0", "--num-layers", "2", "--hidden-size", "128",
         "--num-attention-heads", "4", "--seq-length", "64", "--vocab-size", "512", "--steps", "400",
         "--timeout", "300"]
"""A small model and a run long enough (400 steps) to be stopped part-way."""


def _stop_after_step_5(cmd: list[str], workdir: Path, pattern: str, env: dict[str, str] | None = None) -> str:
    """Run `cmd`, SIGTERM it once its eager run (events `pattern` under `workdir`) finished step 5; its
    output. Asserts it exited 143 and said it stopped every child."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while _steps_done(workdir, pattern) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0]
        assert _steps_done(workdir, pattern) >= 5, "the eager run did not reach step 5 in 240 s"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        stopped_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"{cmd[3]} stopped in {stopped_s:.1f} s\n{output[-3000:]}")  # noqa: T201 - for the closing note
    assert proc.returncode == 143, output
    assert "stopped by SIGTERM: every child process was ended" in output
    return output


def _keep(path: Path, name: str) -> None:
    report_dir = os.environ.get("GD_REPORT_DIR")
    if report_dir:
        shutil.copy(path, Path(report_dir) / name)


def test_sigterm_mid_run_writes_the_partial_report_and_leaves_nothing(tmp_path: Path) -> None:
    workdir, out = tmp_path / "work", tmp_path / "stopped.json"
    cmd = [sys.executable, "-m", "graphdoctor.cli", "diff", *MODEL, "--no-launches", "-q",
           "--workdir", str(workdir), "--json", str(out)]
    _stop_after_step_5(cmd, workdir, "events-eager-reference-*.jsonl")
    data = json.loads(out.read_text())
    assert data["stopped"] == "SIGTERM" and data["exit_code"] == 143
    reference = data["reference"]
    assert reference["status"] in ("stopped", "ok"), reference["status"]
    assert len(reference["steps"]) >= 5
    if reference["status"] == "stopped":
        assert reference["diagnosis"]["stacks"], "the stopped eager run kept no stack"
    for row in data["impls"]:
        assert row["verdict"] in ("stopped", "match"), row
        assert any("SIGTERM" in note for note in row["notes"]), row["notes"]
    assert not _ours(str(workdir)), _ours(str(workdir))
    _keep(out, "stopped_sigterm.json")


def test_live_count_stopped_writes_its_partial_report(tmp_path: Path) -> None:
    scratch, out = tmp_path / "tmp", tmp_path / "count.json"
    scratch.mkdir()
    cmd = [sys.executable, "-m", "graphdoctor.cli", "count", *MODEL, "--json", str(out)]
    # count keeps its children's files in a temporary directory: TMPDIR puts it where this test can watch it
    output = _stop_after_step_5(cmd, scratch, "graphdoctor-count-*/events-eager-count-*.jsonl",
                                env={**os.environ, "TMPDIR": str(scratch)})
    assert "stopped by SIGTERM: a partial count, the runs as the stop left them" in output
    data = json.loads(out.read_text())
    assert data["stopped"] == "SIGTERM" and data["exit_code"] == 143 and data["command"] == "count"
    assert data["eager"]["status"] == "stopped" and data["eager"]["steps_done"] >= 5
    assert [e["status"] for e in data["impls"]] == ["stopped", "stopped"]  # count runs its children in series
    assert not _ours(str(scratch)), _ours(str(scratch))
    assert not list(scratch.glob("graphdoctor-count-*")), "count left its temporary directory"
    _keep(out, "stopped_count.json")


def test_advise_stopped_writes_its_partial_report_without_a_recommendation(tmp_path: Path) -> None:
    workdir, out = tmp_path / "work", tmp_path / "advise.json"
    cmd = [sys.executable, "-m", "graphdoctor.cli", "advise", *MODEL, "-q", "--workdir", str(workdir),
           "--json", str(out)]
    output = _stop_after_step_5(cmd, workdir, "events-eager-reference-*.jsonl")
    assert "recommendation: none: stopped by SIGTERM after 0 of " in output
    data = json.loads(out.read_text())
    assert data["stopped"] == "SIGTERM" and data["exit_code"] == 143 and data["command"] == "advise"
    assert data["recommendation"]["candidate"] is None
    assert data["reference"]["status"] in ("stopped", "ok") and len(data["reference"]["steps"]) >= 5
    ran = [c for c in data["candidates"] if c["status"] not in ("rejected", "unavailable")]
    assert ran and all(c["status"] == "not-run" and "stopped by SIGTERM" in c["reason"] for c in ran), ran
    assert not _ours(str(workdir)), _ours(str(workdir))
    _keep(out, "stopped_advise.json")
