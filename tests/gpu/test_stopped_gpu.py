"""A real `graphdoctor diff` on the GPU, stopped by SIGTERM part-way: it still writes its JSON report (every
row `stopped` or a finished verdict, the eager reference with the steps it finished and its stacks), exits
143, and leaves no process running (docs/diff.md, Hangs)."""

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


def _steps_done(workdir: Path) -> int:
    """The last training step the eager reference has finished so far (from its events file)."""
    done = -1
    for events in workdir.glob("events-eager-reference-*.jsonl"):
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


def test_sigterm_mid_run_writes_the_partial_report_and_leaves_nothing(tmp_path: Path) -> None:
    workdir, out = tmp_path / "work", tmp_path / "stopped.json"
    cmd = [sys.executable, "-m", "graphdoctor.cli", "diff", "--impl", "local,full_iteration", "--dropout", "0",
           "--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
           "--vocab-size", "512", "--steps", "400", "--no-launches", "--timeout", "300", "-q",
           "--workdir", str(workdir), "--json", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while _steps_done(workdir) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0]
        assert _steps_done(workdir) >= 5, "the eager reference did not reach step 5 in 240 s"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        stopped_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"stopped in {stopped_s:.1f} s\n{output[-3000:]}")  # noqa: T201 - for the closing note
    assert proc.returncode == 143, output
    assert "stopped by SIGTERM: every child process was ended" in output
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
    report_dir = os.environ.get("GD_REPORT_DIR")
    if report_dir:
        shutil.copy(out, Path(report_dir) / "stopped_sigterm.json")
