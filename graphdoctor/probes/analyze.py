"""Turn recorder observations and capture results into Findings (GD501-GD510).

Pure Python: no torch, no CUDA. Code, name, severity, message template and fix come from the rule
catalogue (`get_rule`), the one source of truth. Observations are deduplicated by (code, location); a
failed capture either confirms an observation or, when it only shows the 901 cascade, becomes a GD510
naming the root. Library-internal findings (LIBRARY_HIDDEN_CODES with no user frame) are marked, and
`hide_library_findings` splits them off.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphdoctor.cuda_errors import CUDA_CAPTURE_ERRORS
from graphdoctor.probes.types import CaptureResult, Observation
from graphdoctor.rules.finding import Finding, Severity
from graphdoctor.rules.registry import get_rule

PROBE_CODES: tuple[str, ...] = tuple(f"GD5{n:02d}" for n in range(1, 11))
"""Codes the probes report: the runtime rules of the catalogue (checks/gd5xx_runtime.py)."""

CAPTURE_BREAKING: frozenset[str] = frozenset({"GD501", "GD502", "GD503", "GD504", "GD505"})
"""Codes whose operation makes the capture itself fail (the others replay wrongly)."""



CULPRIT_CODES: frozenset[str] = CAPTURE_BREAKING | {"GD506"}
"""Codes that can name why a capture failed: the capture-breaking ones, and GD506, recorded just
before the pageable copy (GD504) of a host-drawn random tensor: pinning alone would freeze the draw."""


def culprit_of(observations: Iterable[Observation]) -> Observation | None:
    """The first observation whose kind can make a capture fail (CULPRIT_CODES), or None.

    One classification for both sides: `check --probe` reports these observations, and the culprit
    hunt of `graphdoctor diff` names the rule of the one the failed capture raised at.
    """
    return next((o for o in observations if o.code in CULPRIT_CODES), None)


# Heuristic rules are only errors when the offending line is user code.
_USER_ONLY_ERRORS = frozenset({"GD507", "GD508", "GD509"})


HOST_ONLY_LIBRARY_REASON = ("library code that touched only host tensors: it launched no device work, "
                            "so it cannot change what the graph computes")
"""Why a host-only operation in library code is reported as info, not as a warning."""


def host_only_library(obs: Observation) -> bool:
    """True for an operation the probe saw touch only host (CPU) tensors, issued by library code
    (torch, megatron, ...; not the user's): e.g. Megatron's RNG tracker comparing CPU RNG states.
    Decided from what the recorder saw, not from file names."""
    return obs.host_only and (obs.library_issuer or not obs.user_code)


LIBRARY_HIDDEN_CODES: frozenset[str] = frozenset({"GD507"})
"""Codes hidden by default when no frame of the recorded stack is user code: host work inside
Megatron, torch, TE or apex that the user can neither see nor change."""

SHOW_LIBRARY_OPTION = "--show-library-findings"
"""The `graphdoctor check` flag that shows library-internal findings (Python: show_library_findings)."""


def library_internal(obs: Observation) -> bool:
    """True for an observation hidden by default: its code is in LIBRARY_HIDDEN_CODES and no frame
    of its stack was user code (`Observation.user_code`, decided by the recorder's pick_location),
    e.g. the `aten::eq` of Megatron's RNG tracker check inside core attention. A hit with a user
    frame anywhere on its stack is never library-internal."""
    return obs.code in LIBRARY_HIDDEN_CODES and not obs.user_code


def hide_library_findings(findings: Iterable[Finding]) -> tuple[list[Finding], list[Finding]]:
    """Split findings into (shown, hidden): hidden are those `analyze` marked
    `extra['library_internal']`; the order of each part is kept."""
    shown: list[Finding] = []
    hidden: list[Finding] = []
    for finding in findings:
        (hidden if finding.extra.get("library_internal") is True else shown).append(finding)
    return shown, hidden


def hidden_note(num_hidden: int) -> str | None:
    """The report note for `num_hidden` hidden library-internal findings, or None when there are none."""
    if not num_hidden:
        return None
    codes = ", ".join(sorted(LIBRARY_HIDDEN_CODES))
    return (f"probe: {num_hidden} library-internal finding(s) hidden ({codes} with no user frame on the "
            f"stack); {SHOW_LIBRARY_OPTION} shows them")


def _severity(obs: Observation, default: Severity) -> Severity:
    if host_only_library(obs):
        return Severity.INFO
    if obs.code in _USER_ONLY_ERRORS and not obs.user_code and default is Severity.ERROR:
        return Severity.WARNING
    return default


def _finding(obs: Observation, *, also_in: list[str], confirmed: bool) -> Finding:
    rule = get_rule(obs.code)
    severity = _severity(obs, rule.severity)
    detail = f"{obs.operator} in {obs.module or '<root>'}"
    if obs.detail:
        detail += f" ({obs.detail})"
    if host_only_library(obs):
        detail += f"; info: {HOST_ONLY_LIBRARY_REASON}"
    if also_in:
        detail += f" and {len(also_in)} more module(s)"
    return rule.finding(
        locations=(obs.location,), severity=severity, source="probe", detail=detail, where=obs.location,
        extra={"module": obs.module, "operator": obs.operator, "user_code": obs.user_code,
               "host_only": obs.host_only, "library_internal": library_internal(obs),
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
    """GD510 for a failed capture: info under a recorded first culprit (which has its own finding),
    error when the recording explains nothing, since no other finding then reports the failure."""
    rule = get_rule("GD510")
    if capture.cuda_error is not None:
        enum_name = CUDA_CAPTURE_ERRORS[capture.cuda_error].cuda_error
        error = f"{enum_name} ({capture.cuda_error})"
    else:
        error = f"{capture.error_type}: {capture.error_message}"
    severity = rule.severity
    if root is None:
        where = capture.location or "<unknown>"
        detail = (f"capture of {capture.unit} failed in {capture.phase} with {error}; "
                  f"no unsafe operation was recorded in it")
        extra: dict[str, object] = {"module": capture.unit, "operator": capture.error_type,
                                    "root_code": None}
        severity = Severity.ERROR
    else:
        where = root.location
        detail = (f"capture of {capture.unit} failed with {error}; first culprit "
                  f"{root.code} {root.operator} in {root.module}")
        extra = {"module": root.module, "operator": root.operator, "root_code": root.code}
    extra.update({"unit": capture.unit, "cuda_error": capture.cuda_error,
                  "error_message": capture.error_message})
    return rule.finding(locations=(where,), severity=severity, source="probe", detail=detail,
                        where=where, extra=extra)


def _capture_only_finding(capture: CaptureResult, code: str) -> Finding:
    where = capture.location or "<unknown>"
    detail = (f"capture of {capture.unit} failed in {capture.phase} "
              f"({capture.error_type}: {capture.error_message})")
    return get_rule(code).finding(
        locations=(where,), source="probe", detail=detail, where=where,
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
        _finding(obs, also_in=also_in, confirmed=(obs.code, obs.location) in confirmed)
        for obs, also_in in unique
    ]
    findings.extend(extra_findings)
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(findings, key=lambda f: (order[f.severity], f.code))


__all__ = ["CAPTURE_BREAKING", "CULPRIT_CODES", "HOST_ONLY_LIBRARY_REASON", "LIBRARY_HIDDEN_CODES", "PROBE_CODES",
           "SHOW_LIBRARY_OPTION", "analyze", "culprit_of", "dedupe", "failing_leaves", "hidden_note",
           "hide_library_findings", "host_only_library", "library_internal"]
