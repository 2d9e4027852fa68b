"""The probe entry point the CLI calls: run workers, restart after a poisoned context, analyze.

Importing this module imports neither torch nor megatron; the work happens in child processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from graphdoctor.errors import NoGPUError
from graphdoctor.probes.analyze import analyze
from graphdoctor.probes.types import CaptureResult, Observation, ProbeReport

MAX_WORKER_RUNS = 8
"""Upper bound on fresh worker processes per probe (one more after each poisoned context)."""


def probe(
    config: Any,
    *,
    layers: list[int] | None = None,
    isolate: bool = True,
    timeout_s: float | None = None,
    **overrides: Any,
) -> ProbeReport:
    """Probe every layer of the configured GPT model for operations that are unsafe to capture.

    Args:
        config: a DiffConfig, a ProbeSpec, a mapping or any object with the ProbeSpec field names.
        layers: decoder layer indices to probe; all when None.
        isolate: run in child processes (the default). False runs here: this process then owns a
            process group and CUDA context, and a poisoned context cannot be recovered.
        timeout_s: wall-clock limit of each child; default the spec's timeout_s.
        **overrides: ProbeSpec fields that replace the config's (None values are ignored).

    Returns:
        The ProbeReport; `exit_code` follows the CLI convention (0 clean, 1 findings, 2 tool error).

    Raises:
        NoGPUError: no CUDA device is visible.
        UsageError: a bad field in `config` or `overrides`.
    """
    import torch

    from graphdoctor.probes.megatron import probe_layers, spec_from_config

    spec = spec_from_config(config, **overrides)
    if not torch.cuda.is_available():
        raise NoGPUError("graphdoctor check --probe needs a CUDA GPU and none is visible")
    remaining = list(range(spec.num_layers)) if layers is None else sorted(layers)
    if not isolate:
        return report_from_payloads([probe_layers(spec, remaining)], spec=spec.to_dict())
    payloads: list[dict[str, Any]] = []
    while remaining and len(payloads) < MAX_WORKER_RUNS:
        payload = _run_worker(spec.to_dict(), remaining, timeout_s or spec.timeout_s)
        payloads.append(payload)
        poisoned = payload.get("poisoned_at")
        if payload.get("tool_error") or poisoned is None:
            break
        remaining = [i for i in remaining if i > poisoned]
    return report_from_payloads(payloads, spec=spec.to_dict())


def _run_worker(spec: dict[str, Any], layers: list[int], timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="graphdoctor-probe-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = os.path.join(tmp, "out.json")
        with open(spec_path, "w", encoding="utf-8") as fh:
            json.dump({"spec": spec, "layers": layers}, fh)
        cmd = [sys.executable, "-m", "graphdoctor.probes.worker", spec_path, out_path]
        try:
            proc = subprocess.run(cmd, cwd=os.getcwd(), capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"tool_error": f"probe worker for layers {layers} timed out after {timeout_s:g} s"}
        if not os.path.exists(out_path):
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            return {"tool_error": f"probe worker exited with {proc.returncode} and no result: {tail}"}
        with open(out_path, encoding="utf-8") as fh:
            result: dict[str, Any] = json.load(fh)
        return result


def report_from_payloads(payloads: list[dict[str, Any]], *, spec: dict[str, Any] | None = None) -> ProbeReport:
    """Merge worker payloads (see megatron.probe_layers) and analyze them into a ProbeReport."""
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
    return ProbeReport(
        findings=tuple(analyze(observations, captures)),
        captures=tuple(captures),
        num_observations=len(observations),
        tool_errors=tuple(tool_errors),
        extra={"spec": spec or {}, "num_worker_runs": len(payloads),
               "recording_errors": recording_errors,
               "tracebacks": [p["traceback"] for p in payloads if p.get("traceback")]},
    )


__all__ = ["MAX_WORKER_RUNS", "probe", "report_from_payloads"]
