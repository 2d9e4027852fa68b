"""The probe entry point the CLI calls: run workers, restart after a poisoned context, analyze.

Importing this module imports neither torch nor megatron; the work happens in child processes.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphdoctor.config import DiffConfig, diff_config_from
from graphdoctor.errors import NoGPUError
from graphdoctor.parent.children import user_import_dir
from graphdoctor.parent.gpus import child_bytes
from graphdoctor.parent.runner import child_env, python_command, run_isolated
from graphdoctor.parent.slots import HostTurn, physical_gpus
from graphdoctor.probes.analyze import analyze, hide_library_findings
from graphdoctor.probes.types import CaptureResult, Observation, ProbeReport
from graphdoctor.protocol.spec import ProbeJob
from graphdoctor.rules.finding import Finding

MAX_WORKER_RUNS = 8
"""Upper bound on fresh worker processes per probe (one more after each poisoned context)."""

WORKER_MODULE = "graphdoctor.child.probe.worker"


def probe_config(config: DiffConfig | Mapping[str, Any], **overrides: Any) -> DiffConfig:
    """The DiffConfig to probe: `config` itself, or one built from a mapping of DiffConfig fields
    (as `graphdoctor diff` would build it), with `overrides` (None values ignored) applied.

    Raises:
        UsageError: a field of the wrong name or value.
    """
    if isinstance(config, DiffConfig):
        values = {k: v for k, v in overrides.items() if v is not None}
        return config.replace(**values) if values else config
    return diff_config_from(None, **{**dict(config), **overrides})


def probe(
    config: DiffConfig | Mapping[str, Any],
    *,
    layers: list[int] | None = None,
    timeout_s: float | None = None,
    warmup_iters: int = 2,
    show_library_findings: bool = False,
    **overrides: Any,
) -> ProbeReport:
    """Probe every layer of the configured model for operations that are unsafe to capture.

    The model is the one `graphdoctor diff` builds for the same configuration (layer spec, model
    provider, run-file `transformer:` fields), built by the same set-up path in a child process.

    Args:
        config: a DiffConfig, or a mapping of DiffConfig fields.
        layers: decoder layer indices to probe; all when None.
        timeout_s: wall-clock limit of each worker process; default the config's timeout_s.
        warmup_iters: eager calls on a side stream before each capture.
        show_library_findings: keep library-internal findings (a GD507 with no user frame on its
            stack) in `findings`; by default they go to `hidden_findings`.
        **overrides: DiffConfig fields that replace the config's (None values are ignored).

    Returns:
        The ProbeReport; `exit_code` follows the CLI convention (0 clean, 1 findings, 2 tool error).

    Raises:
        NoGPUError: no CUDA device is visible.
        UsageError: a bad field in `config` or `overrides`.
    """
    import torch

    diff_config = probe_config(config, **overrides)
    if not torch.cuda.is_available():
        raise NoGPUError("graphdoctor check --probe needs a CUDA GPU and none is visible")
    remaining = list(range(diff_config.num_layers)) if layers is None else sorted(layers)
    import_dir = user_import_dir(diff_config)
    payloads: list[dict[str, Any]] = []
    while remaining and len(payloads) < MAX_WORKER_RUNS:
        job = ProbeJob(config=diff_config, layers=tuple(remaining), warmup_iters=warmup_iters,
                       import_dir=import_dir)
        payload = _run_worker(job, timeout_s or diff_config.timeout_s)
        payloads.append(payload)
        poisoned = payload.get("poisoned_at")
        if payload.get("tool_error") or poisoned is None:
            break
        remaining = [i for i in remaining if i > poisoned]
    return report_from_payloads(payloads, spec=diff_config.to_dict(), show_library_findings=show_library_findings)


def _run_worker(job: ProbeJob, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="graphdoctor-probe-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(job.to_json(), encoding="utf-8")
        # One child of the machine-wide budget (graphdoctor.parent.slots): probes queue beside running diffs.
        turn = HostTurn.on(physical_gpus(None), child_bytes(job.config), "check --probe worker",
                           lambda line: print(f"graphdoctor: {line}", file=sys.stderr))
        turn.take()
        try:
            ended = run_isolated(python_command(WORKER_MODULE, str(job_path), str(out_path)),
                                 timeout_s=timeout_s, env=child_env(job.config.env))
        finally:
            turn.release()
        if ended.timed_out:
            return {"tool_error": f"probe worker for layers {list(job.layers)} timed out after "
                                  f"{timeout_s:g} s"}
        if not out_path.exists():
            tail = "\n".join(ended.log_tail.strip().splitlines()[-8:])
            return {"tool_error": f"probe worker {ended.describe_exit()} and no result: {tail}"}
        result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
        return result


def report_from_payloads(payloads: list[dict[str, Any]], *, spec: dict[str, Any] | None = None,
                         show_library_findings: bool = False) -> ProbeReport:
    """Merge worker payloads (see megatron.probe_layers) and analyze them into a ProbeReport; the
    library-internal findings go to `hidden_findings` unless `show_library_findings`."""
    observations: list[Observation] = []
    captures: list[CaptureResult] = []
    tool_errors: list[str] = []
    recording_errors: list[str] = []
    for payload in payloads:
        observations.extend(Observation.from_dict(o) for o in payload.get("observations", []))
        captures.extend(CaptureResult.from_dict(c) for c in payload.get("captures", []))
        recording_errors.extend(payload.get("recording_errors", []))
        if payload.get("tool_error"):
            tool_errors.append(str(payload["tool_error"]))
    findings = analyze(observations, captures)
    hidden: list[Finding] = []
    if not show_library_findings:
        findings, hidden = hide_library_findings(findings)
    return ProbeReport(
        findings=tuple(findings),
        hidden_findings=tuple(hidden),
        captures=tuple(captures),
        num_observations=len(observations),
        tool_errors=tuple(tool_errors),
        extra={"spec": spec or {}, "num_worker_runs": len(payloads),
               "recording_errors": recording_errors,
               "tracebacks": [p["traceback"] for p in payloads if p.get("traceback")]},
    )


__all__ = ["MAX_WORKER_RUNS", "probe", "probe_config", "report_from_payloads"]
