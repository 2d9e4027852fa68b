"""CLI tests for `graphdoctor check --probe` and its model options (CliRunner, CPU only).

The probe itself is replaced by a recorded ProbeReport where a test needs one; the real probe runs in
tests/gpu/test_check_probe_gpu.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.cli.check import PROBE_MODEL_NAMES, PROBE_MODEL_OPTIONS
from graphdoctor.options import DIFF_OPTIONS
from graphdoctor.probes import CaptureResult, ProbeReport, check_with_probes, combined
from graphdoctor.rules import Finding, Severity

REPO = Path(__file__).resolve().parents[2]
RULE_FIXTURES = REPO / "fixtures" / "rules"
# glog-style lines torch itself may print on import (e.g. "W1129 12:00:00.0 ... cpp_extension.py")
TORCH_LOG_LINE = re.compile(r"^[IWEF]\d{4} ")
PLANTED_GD501 = Finding(code="GD501", name="host-sync-in-capture", severity=Severity.ERROR,
                        message="host sync inside captured region: Tensor.item() at fixtures/planted/item_mlp.py:19",
                        fix="Move the read before capture or keep the value on device",
                        locations=("fixtures/planted/item_mlp.py:19",), source="probe",
                        extra={"module": "decoder.layers.0.mlp", "operator": "Tensor.item()"})


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def fake_probe(report: ProbeReport, calls: list[dict[str, Any]]) -> Any:
    def probe(config: Any, **kwargs: Any) -> ProbeReport:
        calls.append({"config": config, **kwargs})
        return report

    return probe


def recorded(*findings: Finding, tool_errors: tuple[str, ...] = ()) -> ProbeReport:
    captures = (CaptureResult(unit="decoder.layers.0", ok=not findings),
                CaptureResult(unit="decoder.layers.1", ok=True))
    return ProbeReport(findings=findings, captures=captures, num_observations=len(findings), tool_errors=tool_errors)


def test_probe_without_gpu_is_one_line_and_exit_2() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "graphdoctor.cli", "check", "--probe"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not TORCH_LOG_LINE.match(line)]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "GPU" in lines[0] and lines[0].startswith("graphdoctor: error:"), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and proc.stdout == ""


@pytest.mark.parametrize("fixture", ["GD101_bad.yaml", "GD106_good.yaml"])
def test_model_flags_without_probe_are_noted_and_keep_the_exit_code(fixture: str) -> None:
    config = str(RULE_FIXTURES / fixture)
    base_code, base_out, _ = invoke("check", "--config", config, "--format", "json")
    code, out, err = invoke("check", "--config", config, "--format", "json", "--layer-spec", "nocolon",
                            "--num-layers", "2", "--dropout", "0.0", "--probe-timeout", "5")
    assert code == base_code and err == ""
    data, base = json.loads(out), json.loads(base_out)
    assert data["findings"] == base["findings"]
    for flag in ("--layer-spec", "--num-layers", "--dropout", "--probe-timeout"):
        assert f"{flag} has no effect without --probe" in data["notes"]
    assert "--hidden-size has no effect without --probe" not in data["notes"]


def test_model_flag_note_in_text_output() -> None:
    code, out, _ = invoke("check", "--config", str(RULE_FIXTURES / "GD106_good.yaml"), "--layer-spec", "a.b:c")
    assert code == 0 and "note: --layer-spec has no effect without --probe" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--layer-spec", "nocolon"), "layer_spec"),
        (("--model-provider", "pkg.mod"), "model_provider"),
        (("--dtype", "fp64"), "dtype"),
        (("--hidden-size", "65", "--num-attention-heads", "4"), "hidden_size"),
        (("--probe-timeout", "0"), "probe_timeout"),
    ],
)
def test_probe_bad_model_option_exits_2_naming_the_field(args: tuple[str, ...], needle: str) -> None:
    # Validation happens before any GPU work, so this is safe on a GPU machine too.
    code, out, err = invoke("check", "--probe", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_help_lists_probe_and_model_options() -> None:
    code, out, _ = invoke("check", "--help")
    assert code == 0
    for flag in ("--probe", "--probe-timeout", "--config", *(f"--{name}" for name in PROBE_MODEL_NAMES)):
        assert re.search(rf"^\s+{re.escape(flag)}\b", out, re.MULTILINE), flag
    assert "--impl" not in out and "--strict-rng" not in out


def test_model_options_are_the_diff_option_rows() -> None:
    assert [o.name for o in PROBE_MODEL_OPTIONS] == [o.name for o in DIFF_OPTIONS if o.name in PROBE_MODEL_NAMES]
    assert all(any(o is d for d in DIFF_OPTIONS) for o in PROBE_MODEL_OPTIONS)


def test_probe_findings_merge_into_report_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(combined, "probe", fake_probe(recorded(PLANTED_GD501), calls))
    code, out, err = invoke("check", "--probe", "--config", str(RULE_FIXTURES / "GD106_good.yaml"),
                            "--layer-spec", "fixtures.planted.item_mlp:layer_spec", "--num-layers", "2",
                            "--probe-timeout", "120", "--format", "json")
    assert code == 1, err
    data = json.loads(out)
    finding = next(f for f in data["findings"] if f["code"] == "GD501")
    assert finding["source"] == "probe" and finding["locations"] == ["fixtures/planted/item_mlp.py:19"]
    assert any(n.startswith("probe: 2 capture(s), 1 failed (decoder.layers.0)") for n in data["notes"])
    (call,) = calls
    assert call["timeout_s"] == 120.0
    assert call["config"].layer_spec == "fixtures.planted.item_mlp:layer_spec" and call["config"].num_layers == 2


def test_probe_clean_exits_0_and_select_filters_probe_findings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combined, "probe", fake_probe(recorded(), []))
    code, out, _ = invoke("check", "--probe")
    assert code == 0 and "No findings." in out and "note: probe: 2 capture(s), 0 failed" in out
    monkeypatch.setattr(combined, "probe", fake_probe(recorded(PLANTED_GD501), []))
    code, out, _ = invoke("check", "--probe", "--select", "GD502", "--format", "json")
    assert code == 0 and json.loads(out)["findings"] == []


def test_probe_tool_error_exits_2_with_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combined, "probe", fake_probe(recorded(tool_errors=("probe worker timed out",)), []))
    code, out, _ = invoke("check", "--probe", "--format", "json")
    assert code == 2 and "probe tool error: probe worker timed out" in json.loads(out)["notes"]


def test_library_check_with_probes_notes_unused_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combined, "probe", fake_probe(recorded(PLANTED_GD501), []))
    result = check_with_probes({"model_provider": "pkg.mod:build", "forward_step": "pkg.mod:step",
                                "num_layers": 2},
                               {"transformer": {"cuda_graph_impl": "local", "enable_cuda_graph": True}})
    assert result.exit_code == 1 and result.report.codes()[:2] == ["GD101", "GD501"]
    # The probes build the model diff builds (model provider included); only forward_step is unused.
    assert ("forward_step has no effect on the probes (they call each decoder layer on sample inputs, "
            "not the forward step)") in result.report.notes
    assert not any(note.startswith("model_provider") for note in result.report.notes)
