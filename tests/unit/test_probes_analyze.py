"""CPU tests of graphdoctor.probes.analyze, capture error translation and report merging."""

from __future__ import annotations

import os

import pytest

from graphdoctor.child.probe.capture import translate_error
from graphdoctor.cuda_errors import cuda_error_number, exception_chain
from graphdoctor.probes import ProbeReport, report_from_payloads
from graphdoctor.probes.analyze import PROBE_CODES, analyze, dedupe, failing_leaves
from graphdoctor.probes.types import CaptureResult, Observation
from graphdoctor.rules import get_rule
from graphdoctor.rules.finding import Severity

THIS_FILE = os.path.relpath(os.path.realpath(__file__), os.path.realpath(os.getcwd()))


def obs(code: str, module: str, location: str, seq: int = 0, *, user: bool = True,
        operator: str = "op") -> Observation:
    return Observation(code=code, operator=operator, module=module, location=location,
                       user_code=user, seq=seq)


def test_probe_codes_are_the_catalogue_runtime_rules():
    assert [get_rule(c).name for c in PROBE_CODES] == [
        "host-sync-in-capture", "data-dependent-shape", "legacy-default-stream-work", "pageable-h2d-copy",
        "unregistered-generator", "host-drawn-random-mask", "cpu-tensor-in-capture",
        "forward-hook-in-capture", "attribute-tensor-reassigned", "capture-invalidated-cascade",
    ]
    assert all(get_rule(c).runtime for c in PROBE_CODES)


@pytest.mark.parametrize("code", PROBE_CODES[:9])
def test_findings_take_name_severity_message_and_fix_from_the_catalogue(code: str):
    rule = get_rule(code)
    (f,) = analyze([obs(code, "decoder.layers.0.mlp", "m.py:4", operator="op()")], [])
    assert (f.code, f.name, f.severity, f.fix) == (code, rule.name, rule.severity, rule.fix_title())
    assert f.message == rule.message(detail="op() in decoder.layers.0.mlp", where="m.py:4")


def test_dedupe_keeps_first_module_and_counts_the_rest():
    items = [obs("GD501", "decoder.layers.0.mlp", "m.py:3", 0, operator="Tensor.item()"),
             obs("GD501", "decoder.layers.0.mlp", "m.py:3", 1, operator="aten::_local_scalar_dense"),
             obs("GD501", "decoder.layers.1.mlp", "m.py:3", 2)]
    (first, also_in), = dedupe(items)
    assert first.operator == "Tensor.item()"
    assert also_in == ["decoder.layers.1.mlp"]


def test_findings_carry_module_operator_location():
    findings = analyze([obs("GD502", "decoder.layers.0.mlp", "m.py:9", operator="aten::nonzero")], [])
    (f,) = findings
    assert (f.code, f.name, f.severity) == ("GD502", "data-dependent-shape", Severity.ERROR)
    assert f.locations == ("m.py:9",)
    assert f.extra["module"] == "decoder.layers.0.mlp" and f.extra["operator"] == "aten::nonzero"
    assert "m.py:9" in f.message and f.source == "probe"


def test_heuristic_rules_in_library_code_are_warnings():
    findings = analyze([obs("GD509", "decoder.layers.0", "megatron/x.py:1", user=False)], [])
    assert findings[0].severity is Severity.WARNING


def test_failing_leaves_are_the_narrowest_failures():
    caps = [CaptureResult(unit="decoder.layers.0", ok=False),
            CaptureResult(unit="decoder.layers.0.self_attention", ok=True),
            CaptureResult(unit="decoder.layers.0.mlp", ok=False),
            CaptureResult(unit="decoder.layers.0.mlp.linear_fc1", ok=True)]
    assert [c.unit for c in failing_leaves(caps)] == ["decoder.layers.0.mlp"]


def test_capture_error_at_recorded_line_confirms_the_observation():
    items = [obs("GD501", "decoder.layers.0.mlp", "m.py:3")]
    caps = [CaptureResult(unit="decoder.layers.0.mlp", ok=False, cuda_error=900, location="m.py:3")]
    findings = analyze(items, caps)
    assert [f.code for f in findings] == ["GD501"]
    assert findings[0].extra["confirmed_by_capture"] is True


def test_invalidated_capture_without_user_frame_names_the_first_culprit():
    items = [obs("GD507", "decoder.layers.0.mlp", "m.py:2", 0),
             obs("GD502", "decoder.layers.0.mlp", "m.py:5", 1, operator="aten::nonzero"),
             obs("GD501", "decoder.layers.0.mlp", "m.py:8", 2)]
    caps = [CaptureResult(unit="decoder.layers.0", ok=False, cuda_error=901),
            CaptureResult(unit="decoder.layers.0.mlp", ok=False, cuda_error=901)]
    findings = analyze(items, caps)
    cascade = [f for f in findings if f.code == "GD510"]
    assert len(cascade) == 1
    assert cascade[0].locations == ("m.py:5",)
    assert cascade[0].extra["root_code"] == "GD502"
    assert "cudaErrorStreamCaptureInvalidated (901)" in cascade[0].message
    assert cascade[0].severity is get_rule("GD510").severity is Severity.INFO  # the root is the error
    # errors first, then the GD507 warning, then the informational cascade
    assert [f.code for f in findings] == ["GD501", "GD502", "GD507", "GD510"]


def test_capture_only_error_with_known_text_becomes_its_rule():
    caps = [CaptureResult(unit="decoder.layers.1.mlp", ok=False, code="GD505", location="d.py:7",
                          error_type="RuntimeError", error_message="Attempt to increase offset")]
    (f,) = analyze([], caps)
    assert (f.code, f.locations, f.extra["module"]) == ("GD505", ("d.py:7",), "decoder.layers.1.mlp")


def test_capture_failure_with_nothing_recorded_is_still_reported():
    caps = [CaptureResult(unit="decoder.layers.0", ok=False, error_type="RuntimeError",
                          error_message="boom")]
    (f,) = analyze([], caps)
    assert f.code == "GD510" and "no unsafe operation was recorded" in f.message
    assert f.severity is Severity.ERROR  # the only finding of a failed capture must fail the check


def test_cuda_error_numbers_from_text():
    assert cuda_error_number("CUDA error: operation not permitted when stream is capturing") == 900
    assert cuda_error_number("Search for 'cudaErrorStreamCaptureInvalidated'") == 901
    assert cuda_error_number("CUDA error 905") == 905
    assert cuda_error_number("failed with error code: 904") == 904
    assert cuda_error_number("out of memory") is None


def _planted_capture_failure() -> None:
    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")  # [root]


def test_translate_error_reports_the_root_of_a_900_901_chain():
    try:
        try:
            _planted_capture_failure()
        finally:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as exc:
        chain = exception_chain(exc)
        result = translate_error("decoder.layers.0.mlp", "capture", exc, 0.5)
    assert len(chain) == 2
    line = _planted_capture_failure.__code__.co_firstlineno + 1
    assert result.cuda_error == 900
    assert result.location == f"{THIS_FILE}:{line}"
    assert result.error_message.startswith("CUDA error: operation not permitted")
    assert not result.ok and result.phase == "capture"


def test_translate_error_maps_generator_text_to_gd505():
    exc = RuntimeError("Attempt to increase offset for a CUDA generator not in capture mode.")
    assert translate_error("u", "capture", exc, 0.0).code == "GD505"


def test_report_from_payloads_round_trips_and_sets_exit_code():
    payload = {
        "observations": [obs("GD501", "decoder.layers.0.mlp", "m.py:3").to_dict()],
        "captures": [CaptureResult(unit="decoder.layers.0", ok=False, cuda_error=900,
                                   location="m.py:3").to_dict()],
        "recording_errors": [],
    }
    report = report_from_payloads([payload])
    assert isinstance(report, ProbeReport)
    assert report.codes() == ["GD501"] and report.exit_code == 1
    data = report.to_dict()
    assert data["findings"][0]["code"] == "GD501" and data["captures"][0]["cuda_error"] == 900
    crashed = report_from_payloads([{"tool_error": "worker died"}])
    assert crashed.exit_code == 2 and crashed.tool_errors == ("worker died",)
    assert report_from_payloads([{"observations": [], "captures": []}]).exit_code == 0


@pytest.mark.parametrize("code", PROBE_CODES)
def test_fix_titles_are_imperative(code: str):
    first_word = get_rule(code).fix_title().split()[0]
    assert first_word[0].isupper() and not first_word.endswith(("s", "ed", "ing"))
