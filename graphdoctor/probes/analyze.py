"""Turn recorder observations and capture results into Findings (GD501-GD510).

Pure Python: no torch, no CUDA. Observations are deduplicated by (code, location); a failed capture
either confirms an observation or, when it only shows the 901 cascade, becomes a GD510 naming the root.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from graphdoctor.probes.capture_errors import CUDA_CAPTURE_ERRORS
from graphdoctor.probes.types import CaptureResult, Observation
from graphdoctor.rules.finding import Finding, Severity


@dataclass(frozen=True, slots=True)
class ProbeRule:
    """What the probes need to know about one GD5xx rule."""

    code: str
    name: str
    severity: Severity
    summary: str
    """Start of the message: what went wrong."""
    fix: str
    """Imperative fix title."""


PROBE_RULES: dict[str, ProbeRule] = {r.code: r for r in (
    ProbeRule("GD501", "host-sync-in-capture", Severity.ERROR, "host sync inside captured region",
              "Move the read before capture or keep the value on the device"),
    ProbeRule("GD502", "data-dependent-shape", Severity.ERROR,
              "data-dependent output shape inside captured region",
              "Use a fixed-shape op (torch.where, masked_fill, nonzero_static) inside the graph"),
    ProbeRule("GD503", "legacy-default-stream-work", Severity.ERROR,
              "work launched on the legacy default stream",
              "Launch on the current stream instead of torch.cuda.default_stream()"),
    ProbeRule("GD504", "pageable-h2d-copy", Severity.ERROR, "pageable host-to-device copy",
              "Create the tensor on the device or copy from a pinned buffer filled before capture"),
    ProbeRule("GD505", "unregistered-generator", Severity.ERROR,
              "random op with a generator not registered with the graph",
              "Register the generator with CUDAGraph.register_generator_state or use the RNG tracker"),
    ProbeRule("GD506", "host-drawn-random-mask", Severity.ERROR,
              "random values drawn on the host and copied into the graph",
              "Draw the random values on the device with a graph-registered generator"),
    ProbeRule("GD507", "cpu-tensor-in-capture", Severity.WARNING,
              "host tensor computed inside captured region",
              "Compute on the device or move the host computation before capture"),
    ProbeRule("GD508", "forward-hook-in-capture", Severity.ERROR,
              "module hook on a captured module (replay skips it)",
              "Remove the hook before capture or move its side effect outside the graphed module"),
    ProbeRule("GD509", "attribute-tensor-reassigned", Severity.ERROR,
              "tensor attribute rebound to a new tensor between steps",
              "Update the tensor in place with copy_() instead of assigning a new tensor"),
    ProbeRule("GD510", "capture-invalidated-cascade", Severity.ERROR,
              "capture invalidated by an earlier error",
              "Fix the first culprit; the later capture errors are its cascade"),
)}
"""Probe rule metadata; names and codes match the catalogue in graphdoctor/rules."""

CAPTURE_BREAKING: frozenset[str] = frozenset({"GD501", "GD502", "GD503", "GD504", "GD505"})
"""Codes whose operation makes the capture itself fail (the others replay wrongly)."""

# Heuristic rules are only errors when the offending line is user code.
_USER_ONLY_ERRORS = frozenset({"GD507", "GD508", "GD509"})


def _finding(rule: ProbeRule, obs: Observation, *, also_in: list[str], confirmed: bool) -> Finding:
    severity = rule.severity
    if rule.code in _USER_ONLY_ERRORS and not obs.user_code:
        severity = Severity.WARNING
    message = f"{rule.summary}: {obs.operator} in {obs.module or '<root>'} at {obs.location}"
    if obs.detail:
        message += f" ({obs.detail})"
    if also_in:
        message += f"; also in {len(also_in)} more module(s)"
    return Finding(
        code=rule.code, name=rule.name, severity=severity, message=message, fix=rule.fix,
        locations=(obs.location,), source="probe",
        extra={"module": obs.module, "operator": obs.operator, "user_code": obs.user_code,
               "also_in": also_in, "confirmed_by_capture": confirmed, "detail": obs.detail},
    )


def dedupe(observations: Iterable[Observation]) -> list[tuple[Observation, list[str]]]:
    """First observation per (code, location), in order, with the other modules it was seen in."""
    first: dict[tuple[str, str], Observation] = {}
    others: dict[tuple[str, str], list[str]] = {}
    for obs in observations:
        key = (obs.code, obs.location)
        if key not in first:
            first[key] = obs
            others[key] = []
        elif obs.module != first[key].module and obs.module not in others[key]:
            others[key].append(obs.module)
    return [(obs, others[key]) for key, obs in first.items()]


def failing_leaves(captures: Iterable[CaptureResult]) -> list[CaptureResult]:
    """Failed captures none of whose submodules also failed: the narrowest failing units."""
    failed = [c for c in captures if not c.ok]
    return [c for c in failed if not any(o.unit.startswith(c.unit + ".") for o in failed)]


def _in_unit(obs: Observation, unit: str) -> bool:
    return obs.module == unit or obs.module.startswith(unit + ".")


def _cascade_finding(capture: CaptureResult, root: Observation | None) -> Finding:
    rule = PROBE_RULES["GD510"]
    if capture.cuda_error is not None:
        enum_name = CUDA_CAPTURE_ERRORS[capture.cuda_error][0]
        error = f"{enum_name} ({capture.cuda_error})"
    else:
        error = f"{capture.error_type}: {capture.error_message}"
    if root is None:
        where = capture.location or "<unknown>"
        message = (f"{rule.summary}: capture of {capture.unit} failed in {capture.phase} with {error}; "
                   f"no unsafe operation was recorded in it")
        extra: dict[str, object] = {"module": capture.unit, "operator": capture.error_type,
                                    "root_code": None}
    else:
        where = root.location
        message = (f"{rule.summary}: capture of {capture.unit} failed with {error}; first culprit "
                   f"{root.code} {root.operator} in {root.module} at {root.location}")
        extra = {"module": root.module, "operator": root.operator, "root_code": root.code}
    extra.update({"unit": capture.unit, "cuda_error": capture.cuda_error,
                  "error_message": capture.error_message})
    return Finding(code=rule.code, name=rule.name, severity=rule.severity, message=message,
                   fix=rule.fix, locations=(where,), source="probe", extra=extra)


def _capture_only_finding(capture: CaptureResult, code: str) -> Finding:
    rule = PROBE_RULES[code]
    where = capture.location or "<unknown>"
    message = (f"{rule.summary}: capture of {capture.unit} failed in {capture.phase} at {where} "
               f"({capture.error_type}: {capture.error_message})")
    return Finding(code=rule.code, name=rule.name, severity=rule.severity, message=message,
                   fix=rule.fix, locations=(where,), source="probe",
                   extra={"module": capture.unit, "operator": capture.error_type,
                          "confirmed_by_capture": True, "cuda_error": capture.cuda_error})


def analyze(observations: Iterable[Observation], captures: Iterable[CaptureResult]) -> list[Finding]:
    """Findings for one probe run, errors first, then by code.

    Args:
        observations: everything the recorder saw, in execution order.
        captures: every capture attempt.

    Returns:
        One finding per distinct (code, location), plus one per failing unit the recording does not
        explain (GD510 when the capture error is a cascade, the direct code when the text names it).
    """
    observations = list(observations)
    captures = list(captures)
    unique = dedupe(observations)
    confirmed: set[tuple[str, str]] = set()
    extra_findings: list[Finding] = []
    for capture in failing_leaves(captures):
        in_unit = [o for o in observations if _in_unit(o, capture.unit)]
        if capture.location is not None:
            match = next((o for o in in_unit if o.location == capture.location
                          and (capture.code is None or o.code == capture.code)), None)
            if match is not None:
                confirmed.add((match.code, match.location))
                continue
            if capture.code is not None:
                extra_findings.append(_capture_only_finding(capture, capture.code))
                continue
        elif capture.code is not None:
            match = next((o for o in in_unit if o.code == capture.code), None)
            if match is not None:
                confirmed.add((match.code, match.location))
                continue
        root = next((o for o in in_unit if o.code in CAPTURE_BREAKING), None)
        extra_findings.append(_cascade_finding(capture, root))
    findings = [
        _finding(PROBE_RULES[obs.code], obs, also_in=also_in,
                 confirmed=(obs.code, obs.location) in confirmed)
        for obs, also_in in unique
    ]
    findings.extend(extra_findings)
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(findings, key=lambda f: (order[f.severity], f.code))


__all__ = ["CAPTURE_BREAKING", "PROBE_RULES", "ProbeRule", "analyze", "dedupe", "failing_leaves"]
