"""Run one graphdoctor command on one hostile input in a forked child, bounded, and classify it.

The child inherits the already-imported CLI (so a case costs milliseconds, not an interpreter
start), gets an address-space limit of its size at fork plus MEMORY_LIMIT_BYTES, and is killed
after TIME_LIMIT_S. The outcome is one of OUTCOMES; the fuzz tests assert on it and tally.py
counts them. When GD_FUZZ_TALLY names a file, every outcome is appended to it as a JSON line.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

TIME_LIMIT_S = 10.0
MEMORY_LIMIT_BYTES = 1 << 30
OUTCOMES = ("clean error", "accepted", "traceback", "hang", "memory")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_ESCAPED = 99


@dataclass(frozen=True)
class Outcome:
    """What one command did with one input."""

    command: str
    case: str
    kind: str
    """One of OUTCOMES."""
    exit_code: int | None
    stderr: str
    stdout_bytes: int
    wall_s: float
    peak_rss_growth_bytes: int
    stray_files: tuple[str, ...]
    """Files that appeared in the working directory other than the declared outputs."""
    inputs_changed: tuple[str, ...]
    """Input files whose bytes changed."""

    @property
    def problems(self) -> list[str]:
        """Everything that breaks the contract (empty when the run was fine)."""
        out = []
        if self.kind in ("traceback", "hang", "memory"):
            out.append(f"{self.kind}: exit {self.exit_code}, stderr {self.stderr[-400:]!r}")
        if self.kind == "clean error" and len(self.stderr.strip().splitlines()) != 1:
            out.append(f"stderr is not one line: {self.stderr!r}")
        if self.stray_files:
            out.append(f"files created outside the output path: {self.stray_files}")
        if self.inputs_changed:
            out.append(f"inputs changed: {self.inputs_changed}")
        return out


def _statm() -> tuple[int, int]:
    size, resident = Path("/proc/self/statm").read_text().split()[:2]
    return int(size) * _PAGE, int(resident) * _PAGE


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"
    except OSError:
        return "?"


def _child(argv: list[str], cwd: Path, out: Path, err: Path, vm_bytes: int) -> None:
    code = _ESCAPED
    try:
        # the child's own resident size at start: a forked child maps the parent's file-backed
        # pages (libtorch) lazily, so the parent's RSS is no baseline for the child's ru_maxrss
        (out.parent / "base").write_text(str(_statm()[1]))
        resource.setrlimit(resource.RLIMIT_AS, (vm_bytes + MEMORY_LIMIT_BYTES, resource.RLIM_INFINITY))
        os.chdir(cwd)
        for fd, path in ((1, out), (2, err)):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(handle, fd)
            os.close(handle)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        from graphdoctor.cli import main

        main.main(args=argv, prog_name="graphdoctor", standalone_mode=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - an escape from the CLI's own handling is what we look for
        traceback.print_exc()
        code = _ESCAPED
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_case(command: str, case: str, argv: list[str], *, cwd: Path, inputs: list[Path],
             outputs: tuple[str, ...] = ()) -> Outcome:
    """Run `graphdoctor argv` in a forked child inside cwd and classify what happened.

    Args:
        command: The command name for the tally (triage, count, check, diff, report).
        case: A short label of the input.
        argv: Arguments after `graphdoctor`.
        cwd: A directory holding only the inputs; anything new in it but `outputs` is a stray file.
        inputs: Files that must keep their bytes.
        outputs: Names in cwd the command may create.
    """
    before = {p.name for p in cwd.iterdir()}
    digests = {p: _digest(p) for p in inputs}
    with tempfile.TemporaryDirectory(prefix="gd-fuzz-io-") as io_dir:
        out, err = Path(io_dir) / "out", Path(io_dir) / "err"
        sys.stdout.flush()
        sys.stderr.flush()
        vm_bytes, _ = _statm()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(argv, cwd, out, err, vm_bytes)
        status, usage, hung = _wait(pid, start)
        wall_s = time.monotonic() - start
        stderr = err.read_text(encoding="utf-8", errors="replace") if err.exists() else ""
        stdout_bytes = out.stat().st_size if out.exists() else 0
        base = Path(io_dir) / "base"
        rss_bytes = int(base.read_text()) if base.exists() else 0
    exit_code = os.waitstatus_to_exitcode(status) if not hung else None
    growth = max(0, usage.ru_maxrss * 1024 - rss_bytes)
    kind = _classify(exit_code, stderr, hung, growth)
    stray = tuple(sorted({p.name for p in cwd.iterdir()} - before - set(outputs)))
    changed = tuple(str(p.name) for p in inputs if _digest(p) != digests[p])
    outcome = Outcome(command, case, kind, exit_code, stderr, stdout_bytes, round(wall_s, 3), growth, stray, changed)
    _record(outcome)
    return outcome


def _wait(pid: int, start: float) -> tuple[int, resource.struct_rusage, bool]:
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage, False
        if time.monotonic() - start > TIME_LIMIT_S:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return status, usage, True
        time.sleep(0.002)


def _classify(exit_code: int | None, stderr: str, hung: bool, growth: int) -> str:
    if hung:
        return "hang"
    if growth > MEMORY_LIMIT_BYTES or "out of memory" in stderr or exit_code in (-signal.SIGKILL, -signal.SIGSEGV):
        return "memory"
    if exit_code not in (0, 1, 2) or "Traceback" in stderr:
        return "traceback"
    if exit_code == 2:
        return "clean error"
    return "accepted"


def _record(outcome: Outcome) -> None:
    target = os.environ.get("GD_FUZZ_TALLY")
    if target:
        row = asdict(outcome)
        row["stderr"] = row["stderr"][-300:]
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")


def record_in_process(command: str, case: str, kind: str, wall_s: float, detail: str = "") -> None:
    """Tally an in-process case (report loading runs the library, not a command)."""
    _record(Outcome(command, case, kind, None, detail, 0, round(wall_s, 3), 0, (), ()))


__all__ = ["MEMORY_LIMIT_BYTES", "OUTCOMES", "TIME_LIMIT_S", "Outcome", "record_in_process", "run_case"]
