"""`graphdoctor diff` argument handling and errors: one line, exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.options import DIFF_OPTIONS


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "needle"), [
    (["diff", "--dropout", "1.5"], "dropout: got 1.5"),
    (["diff", "--impl", "eager"], "impl: got 'eager'"),
    (["diff", "--steps", "3"], "steps: got 3"),
    (["diff", "--layer-spec", "nocolon"], "layer_spec: got 'nocolon'"),
    (["diff", "--config", "/nonexistent/run.yaml"], "no such file"),
])
def test_bad_values_are_one_line_exit_2(args: list[str], needle: str) -> None:
    code, output = invoke(*args)
    assert code == 2
    assert needle in output
    assert "Traceback" not in output
    assert len([ln for ln in output.splitlines() if ln.strip()]) == 1


def test_unknown_flag_exit_2() -> None:
    code, output = invoke("diff", "--no-such-flag")
    assert code == 2 and "No such option" in output


def test_unknown_transformer_field(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  num_layerz: 2\n", encoding="utf-8")
    code, output = invoke("diff", "--config", str(run))
    assert code == 2
    assert "transformer.num_layerz is not a TransformerConfig field" in output


def test_without_gpu_one_line_naming_cpu_commands() -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "graphdoctor.cli", "diff"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "needs a CUDA GPU" in lines[0] and "graphdoctor triage" in lines[0]


def test_help_lists_every_option_with_default() -> None:
    code, output = invoke("diff", "--help")
    assert code == 0
    flat = " ".join(output.split())
    for opt in DIFF_OPTIONS:
        assert f"--{opt.name}" in flat
    assert flat.count("Default:") >= len(DIFF_OPTIONS)
