"""GPU tests of `graphdoctor check --probe`: each planted layer spec is found with code, module and line.

All probes run at once (one worker process each, sharing the GPU) so that the file stays well under
90 s on an H200; each worker owns its process group and CUDA context.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fixtures.planted.markers import marked_location
from graphdoctor.probes import ProbeReport, probe
from graphdoctor.rules.finding import Severity

REPO = Path(__file__).resolve().parents[2]
SMALL_MODEL = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
               "micro_batch_size": 2, "vocab_size": 128, "dtype": "fp32", "dropout": 0.0}

CASES: dict[str, tuple[str | None, str, dict[str, float]]] = {
    # fixture -> (expected code, fixture module, spec overrides)
    "item_mlp": ("GD501", "item_mlp", {}),
    "nonzero_mlp": ("GD502", "nonzero_mlp", {}),
    "default_stream_mlp": ("GD503", "default_stream_mlp", {}),
    "unregistered_generator_dropout": ("GD505", "unregistered_generator_dropout", {}),
    "host_mask_dropout": ("GD506", "host_mask_dropout", {}),
    "forward_hook_mlp": ("GD508", "forward_hook_mlp", {}),
    "reassigned_scale": ("GD509", "reassigned_scale", {}),
    "clean": (None, "clean", {}),
    "clean_with_dropout": (None, "clean", {"dropout": 0.1}),
}
CAPTURE_BREAKING = {"GD501", "GD502", "GD505"}


def describe(report: ProbeReport) -> str:
    lines = [f"{f.severity.value} {f.code} {f.message}" for f in report.findings]
    lines += [f"capture {c.unit}: ok={c.ok} {c.error_type} {c.cuda_error} {c.error_message} "
              f"at {c.location}" for c in report.captures]
    lines += [f"tool error: {e}" for e in report.tool_errors]
    lines += [f"recording error: {e}" for e in report.extra.get("recording_errors", [])]
    lines += ["traceback: " + " | ".join(t) for t in report.extra.get("tracebacks", [])]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def reports() -> Iterator[dict[str, ProbeReport]]:
    old_cwd = os.getcwd()
    os.chdir(REPO)  # planted specs import as fixtures.planted.* from the repo root
    try:
        def run(case: str) -> ProbeReport:
            _, fixture, overrides = CASES[case]
            spec = {**SMALL_MODEL, **overrides, "layer_spec": f"fixtures.planted.{fixture}:layer_spec"}
            return probe(spec, timeout_s=240)

        with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
            results = dict(zip(CASES, pool.map(run, CASES), strict=False))
        yield results
    finally:
        os.chdir(old_cwd)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c, (code, _, _) in CASES.items() if code is not None])
def test_planted_unsafe_op_is_found_with_module_and_line(reports: dict[str, ProbeReport], case: str):
    code, fixture, _ = CASES[case]
    assert code is not None
    report = reports[case]
    assert not report.tool_errors, describe(report)
    expected_location = marked_location(fixture, code)
    matches = [f for f in report.findings if f.code == code]
    assert matches, f"no {code} in:\n{describe(report)}"
    finding = matches[0]
    assert finding.severity is Severity.ERROR, describe(report)
    assert finding.locations == (expected_location,), describe(report)
    assert "decoder.layers.0.mlp" in finding.extra["module"], describe(report)
    assert report.exit_code == 1


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CAPTURE_BREAKING))
def test_capture_breaking_ops_fail_their_capture_and_are_narrowed(reports: dict[str, ProbeReport],
                                                                  case: str):
    case_name = next(c for c, (code, _, _) in CASES.items() if code == case)
    report = reports[case_name]
    by_unit = {c.unit: c for c in report.captures}
    assert by_unit["decoder.layers.0"].ok is False, describe(report)
    assert by_unit["decoder.layers.0.mlp"].ok is False, describe(report)
    assert by_unit["decoder.layers.0.self_attention"].ok is True, describe(report)
    # a failed capture must not hide the next layer (in this worker or in a fresh one if poisoned)
    assert "decoder.layers.1" in by_unit, describe(report)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["clean", "clean_with_dropout"])
def test_clean_spec_has_no_error(reports: dict[str, ProbeReport], case: str):
    report = reports[case]
    assert not report.tool_errors, describe(report)
    assert report.num_errors == 0, describe(report)
    assert [c.unit for c in report.captures] == ["decoder.layers.0", "decoder.layers.1"], describe(report)
    assert all(c.ok for c in report.captures), describe(report)
    assert report.exit_code == 0
