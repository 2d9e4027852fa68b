"""Parent side of a child run: spawn it isolated with a timeout, read its events into a RunRecord.

A child that hangs is killed with its whole process group; one that dies leaves the steps it emitted.
Either way the parent gets a RunRecord and the report is still written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from graphdoctor.harness.diagnose import diagnose, is_capture_error
from graphdoctor.harness.spec import ChildSpec
from graphdoctor.types import Diagnosis, RunRecord, StepRecord

DETERMINISTIC_ENV = {
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}
"""Placed in every child's environment unless the user set them (what upstream bitwise tests set)."""

STDERR_TAIL_BYTES = 4000


def child_env(spec: ChildSpec) -> dict[str, str]:
    """The child's environment: ours, deterministic defaults, then the run file's `env:`."""
    env = dict(os.environ)
    for key, value in DETERMINISTIC_ENV.items():
        env.setdefault(key, value)
    env.update(spec.config.get("env", {}))
    env["PYTHONUNBUFFERED"] = "1"
    # The child imports the user's `pkg.mod:fn` from the directory diff was started in.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    return env


def read_events(path: Path) -> list[dict[str, Any]]:
    """Events of a child, tolerating a torn last line (the child may have been killed mid-write)."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def record_from_events(
    spec: ChildSpec,
    events: list[dict[str, Any]],
    *,
    returncode: int | None,
    timed_out: bool,
    wall_s: float,
    stderr_tail: str = "",
) -> RunRecord:
    """Fold a child's events and exit status into a RunRecord (pure; tested on CPU)."""
    steps = tuple(StepRecord.from_dict({k: v for k, v in e.items() if k != "event"})
                  for e in events if e.get("event") == "step")
    env = next(({k: v for k, v in e.items() if k != "event"} for e in events
                if e.get("event") == "env"), {})
    end = next((e for e in events if e.get("event") == "end"), None)
    for key in ("end_allocated_bytes", "peak_allocated_bytes", "end_reserved_bytes"):
        if end is not None and key in end:
            env[key] = end[key]
    error = next((e for e in events if e.get("event") == "error"), None)
    last_step = steps[-1].step if steps else -1
    status, diagnosis = "ok", None
    if timed_out:
        status = "timeout"
        diagnosis = Diagnosis(error_type="timeout",
                              message=f"no result within {spec.config['timeout_s']:.0f} s; killed",
                              step=last_step + 1, phase=None)
    elif error is not None:
        frames = [tuple(f) for f in error.get("frames", [])]
        status = "unavailable" if error.get("unavailable") else "error"
        diagnosis = diagnose(error["error_type"], error["message"], frames,  # type: ignore[arg-type]
                             module=error.get("module"), step=error.get("step"),
                             phase=error.get("phase"))
        if status == "error" and is_capture_error(error["error_type"], error["message"], frames):  # type: ignore[arg-type]
            diagnosis = _with_phase(diagnosis, "capture")
    elif end is None or returncode not in (0, None):
        status = "crashed"
        how = _describe_exit(returncode)
        diagnosis = Diagnosis(error_type="crashed", message=f"child {how}",
                              step=last_step + 1,
                              traceback_tail=stderr_tail.splitlines()[-8:])
    return RunRecord(
        impl=spec.impl, dropout=spec.dropout, status=status, steps=steps, diagnosis=diagnosis,
        wall_s=wall_s, train_s=float(end.get("train_s", 0.0)) if end else 0.0,
        compare_s=float(end.get("compare_s", 0.0)) if end else 0.0,
        memory=end.get("memory") if end else None,
        launches=end.get("launches") if end else None, env=env,
        forensics=end.get("forensics") if end else None,
        hazards=list(end.get("hazards", [])) if end else [],
    )


def _with_phase(diagnosis: Diagnosis, phase: str) -> Diagnosis:
    data = diagnosis.to_dict()
    data["phase"] = phase
    return Diagnosis.from_dict(data)


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode} without a result"


def run_child(spec: ChildSpec, workdir: Path, *, timeout_s: float) -> RunRecord:
    """Run one child isolated in its own process group; kill the group on timeout.

    Args:
        spec: what to run (its events_path is where the child reports).
        workdir: directory for the spec file and the child's stderr.
        timeout_s: wall-clock limit.

    Returns:
        The RunRecord; never raises for a failing child.
    """
    tag = f"{spec.impl}-{spec.role}-{spec.dropout}{'-taps' if spec.taps else ''}"
    spec_path = spec.write(workdir / f"spec-{tag}.json")
    stderr_path = workdir / f"stderr-{tag}.log"
    Path(spec.events_path).unlink(missing_ok=True)
    start = time.perf_counter()
    timed_out = False
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "graphdoctor.harness.child", str(spec_path)],
            stdout=err, stderr=subprocess.STDOUT, env=child_env(spec), start_new_session=True,
        )
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            returncode = proc.returncode
    wall_s = time.perf_counter() - start
    tail = stderr_path.read_bytes()[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
    return record_from_events(spec, read_events(Path(spec.events_path)), returncode=returncode,
                              timed_out=timed_out, wall_s=wall_s, stderr_tail=tail)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


__all__ = ["DETERMINISTIC_ENV", "child_env", "read_events", "record_from_events", "run_child"]
