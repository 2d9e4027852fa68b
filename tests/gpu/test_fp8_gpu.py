"""FP8 under CUDA graphs on a real GPU (issue 35 acceptance); needs Transformer Engine and an FP8 GPU (Ada or newer).

One run of tests/benchmarks/fp8_table.py, `graphdoctor diff` as a user runs it, for every FP8 recipe on the default
model (TE spec, bf16) under local, full_iteration and transformer_engine (and TE's attn scope), the shrunk
Llama-3 8B FP8 example line with its own FP8 flags (and again saved after step 4 and resumed in a fresh process
that loads the checkpoint into FP8 primary weights), and the planted FP8 scale reset. The tests below read its
reports. GD_FP8_OUT keeps the reports and the table (the device call brings them back).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _fp8_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


pytestmark = [pytest.mark.gpu,
              pytest.mark.needs_te,
              pytest.mark.skipif(not _fp8_gpu(), reason="an FP8 GPU (Ada, sm_89, or newer) is needed")]

CLEAN = ("default-delayed-hybrid", "default-delayed-e4m3", "default-tensorwise", "default-blockwise",
         "default-delayed-hybrid-attn", "llama-line", "llama-line-resume")
DELAYED = ("default-delayed-hybrid", "default-delayed-e4m3", "default-delayed-hybrid-attn", "llama-line",
           "llama-line-resume")


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = Path(os.environ["GD_FP8_OUT"]) if os.environ.get("GD_FP8_OUT") else tmp_path_factory.mktemp("fp8")
    spec = importlib.util.spec_from_file_location("fp8_table", REPO / "tests" / "benchmarks" / "fp8_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fp8_table"] = module
    spec.loader.exec_module(module)
    assert module.main(["--out", str(out)]) == 0
    return out


def _report(table: Path, case: str) -> dict[str, Any]:
    path = table / f"{case}.json"
    assert path.is_file(), (table / f"{case}.txt").read_text() if (table / f"{case}.txt").is_file() else case
    return json.loads(path.read_text())


@pytest.mark.parametrize("case", CLEAN)
def test_clean_fp8_runs_match_bitwise_with_the_state_compared(table: Path, case: str) -> None:
    report = _report(table, case)
    assert report["exit_code"] == 0, [(r["impl"], r["verdict"], r.get("diagnosis")) for r in report["impls"]]
    for row in report["impls"]:
        assert row["verdict"] == "match", (row["impl"], row.get("diagnosis"))
        state = row["fp8_state"]
        if case in DELAYED:
            assert state is not None and state["first_step"] is None and state["tensors"] > 0, row["impl"]
        assert not [c for c in row.get("causes", []) if c["severity"] in ("error", "warning")]
        timing = row["timing"]
        assert timing["eager"]["median_ms"] > 0
        # A resumed full_iteration or TE run warms up and captures again after the load (steps 4-7 of 8): no steady
        # replay step is left to time, and the row says so rather than time a capture.
        steady = not report["config"]["resume"] or row["impl"] == "local"
        assert (timing["graphed"] is not None and timing["graphed"]["median_ms"] > 0) if steady else \
            (timing["graphed"] is None and not timing["measurable"])


def test_the_llama_line_resumes_into_fp8_primary_weights(table: Path) -> None:
    report = _report(table, "llama-line-resume")
    assert report["config"]["fp8_param_gather"] and report["config"]["resume"]
    for run in [report["reference"], *(row["runs"][0] for row in report["impls"])]:
        assert [c["action"] for c in run["checkpoints"]] == ["save", "load"], run["name"]
        steps = report["config"]["steps"]  # the resumed process's steps: 4 to the last, and the profiled one after it
        assert [s["step"] for s in run["steps"] if s["resumed"]] == list(range(4, steps + 1)), run["name"]
        assert [s["step"] for s in run["steps"] if s["profiled"]] == [steps], run["name"]
        assert any(name.endswith("weight._scale_inv") for name in run["fp8_layouts"][-1]), run["name"]


def test_the_planted_scale_reset_is_gd521_at_its_module_and_line(table: Path) -> None:
    from fixtures.planted.markers import marked_location

    report = _report(table, "planted-gd521")
    assert report["exit_code"] == 1
    for row in report["impls"]:
        assert row["verdict"] == "numeric-divergence", row["impl"]
        state = row["fp8_state"]
        assert state["first_step"] == 3 and state["first_module"].startswith("decoder.layers.0."), row["impl"]
        diagnosis = row["diagnosis"]
        assert diagnosis["rule"] == "GD521", diagnosis
        assert diagnosis["location"] == marked_location("fp8_scale_reset", "GD521")


def test_mxfp8_is_unavailable_on_hopper_with_its_reason(table: Path) -> None:
    report = _report(table, "default-mxfp8")
    for row in report["impls"]:
        assert row["verdict"] == "unavailable" and "mxfp8 needs Blackwell" in row["diagnosis"]["message"]
