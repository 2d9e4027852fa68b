"""The pytest plugin's `graphdoctor_diff` on a real GPU, stopped by Ctrl-C (SIGINT) part-way: pytest stops as on
its own Ctrl-C, at once rather than after the children's timeout, and no child process is left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
TEST = """\
import pytest

@pytest.mark.gpu
def test_long_diff(graphdoctor_diff):
    graphdoctor_diff(impls=("local",), dropout=0.0, steps=400, num_layers=2, hidden_size=128,
                     num_attention_heads=4, seq_length=64, vocab_size=512, launches=False, timeout_s=300.0)
"""


def test_ctrl_c_stops_the_plugins_diff_and_its_children(tmp_path: Path) -> None:
    (tmp_path / "test_long.py").write_text(TEST)
    # SIGINT at its default: a shell's background job would otherwise start with it ignored
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(tmp_path / "test_long.py")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    workdir: Path | None = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            workdir = workdir or _eager_workdir(proc.pid)
            if workdir is not None and _last_step(workdir) >= 3:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)  # the children's limit is 300 s
    finally:
        if proc.poll() is None:
            proc.kill()
    print(output[-2000:])  # noqa: T201 - for the closing note
    assert proc.returncode == 2, output  # pytest's exit code for an interrupted session
    assert "stopped by SIGINT: every child process was ended" in output
    assert workdir is not None
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(workdir).encode() in _read(p)]
    assert not left, [_read(p) for p in left]


def _eager_workdir(pytest_pid: int) -> Path | None:
    """The temporary work directory of the plugin's diff: where its eager child's spec lies (from the child's
    command line, `python -P -m graphdoctor.child <workdir>/spec-eager-reference-d0.json`). Only a child of the
    pytest run started here counts: another diff on the same machine (the GPU suite runs in groups at once) has
    eager children too, and once one of those was taken for this one's."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        args = _read(cmdline).split(b"\0")
        spec = next((a for a in args if b"spec-eager-reference" in a), None)
        if b"graphdoctor.child" in args and spec is not None and _descends_from(int(cmdline.parent.name), pytest_pid):
            return Path(spec.decode()).parent
    return None


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is on pid's chain of parents (children run in sessions of their own, but keep their
    parent)."""
    while pid > 1:
        if pid == ancestor:
            return True
        stat = _read(Path(f"/proc/{pid}/stat"))
        if not stat:
            return False
        pid = int(stat.rsplit(b")", 1)[1].split()[1])  # `pid (comm) state ppid ...`: comm may hold spaces
    return False


def _last_step(workdir: Path) -> int:
    steps = [json.loads(line)["step"] for events in workdir.glob("events-eager-reference-*.jsonl")
             for line in events.read_text(errors="replace").splitlines() if line.startswith('{"event": "step"')]
    return max(steps, default=-1)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
