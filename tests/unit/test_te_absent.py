"""The Transformer Engine-absent path on CPU: every entry point says so in one line, never a traceback.

Transformer Engine is hidden with `sys.modules[name] = None` (find_spec then returns None and an
import raises ImportError), so the tests mean the same on a machine that has it; torch and megatron
are the real ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphdoctor.cli import main

TE_MODULES = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine_torch")


@pytest.fixture
def no_te(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transformer Engine is not installed, as far as this process can tell."""
    for name in TE_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.usefixtures("no_te")
def test_te_available_says_why_without_raising() -> None:
    from graphdoctor.parent.availability import te_available

    ok, why = te_available()
    assert ok is False and "not installed" in why


@pytest.mark.usefixtures("no_te")
def test_have_transformer_engine_says_why_without_raising() -> None:
    from graphdoctor.child.megatron_setup import have_transformer_engine

    ok, why = have_transformer_engine()
    assert ok is False
    assert why.startswith(("ModuleNotFoundError", "ImportError")) and "transformer_engine" in why
    assert "\n" not in why


@pytest.mark.usefixtures("no_te")
def test_check_reports_te_missing_for_a_transformer_engine_run_file(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  cuda_graph_impl: transformer_engine\n", encoding="utf-8")
    # issue 16: the checking machine is not the training machine; `--target local` says it is
    result = CliRunner().invoke(main, ["check", "--config", str(run), "--format", "json", "--target", "local"])
    assert result.exit_code == 1, result.output
    (finding,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "GD304"]
    assert finding["name"] == "transformer-engine-missing" and finding["severity"] == "error"
    assert finding["locations"] == [f"{run}:2"]
    assert "pip install 'graphdoctor[transformer-engine]'" in finding["fix"]


@pytest.mark.usefixtures("no_te")
def test_check_of_a_local_run_file_does_not_need_te(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  cuda_graph_impl: local\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["check", "--config", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "GD304" not in [f["code"] for f in json.loads(result.stdout)["findings"]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible; this is the no-GPU path")
@pytest.mark.usefixtures("no_te")
def test_diff_transformer_engine_without_gpu_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(main, ["diff", "--impl", "transformer_engine"])
    assert result.exit_code == 2
    line = one_line(result.output)
    assert line.startswith("graphdoctor: error:") and "needs a CUDA GPU" in line
