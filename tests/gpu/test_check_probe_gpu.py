"""`graphdoctor check --probe` end to end on a real GPU: the CLI process, the probe workers, the report.

Both specs run at once (one CLI process each, from the repository root so that `fixtures.planted.*`
imports); each worker owns its process group and CUDA context.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fixtures.planted.markers import marked_line

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SMALL_MODEL = ("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
               "--vocab-size", "128")
SPECS = {"item_mlp": "fixtures.planted.item_mlp:layer_spec", "clean": "fixtures.planted.clean:layer_spec"}


def run_check(layer_spec: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "graphdoctor.cli", "check", "--probe", "--layer-spec", layer_spec, *SMALL_MODEL,
           "--probe-timeout", "240", "--format", "json"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=570, check=False)


@pytest.fixture(scope="module")
def results() -> dict[str, subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(max_workers=len(SPECS)) as pool:
        return dict(zip(SPECS, pool.map(run_check, SPECS.values()), strict=False))


def report_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.strip(), f"exit {proc.returncode}, no report; stderr:\n{proc.stderr}"
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_planted_item_is_gd501_at_the_marked_line(results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = results["item_mlp"]
    data = report_of(proc)
    assert proc.returncode == 1, f"{proc.stdout}\n{proc.stderr}"
    expected = f"fixtures/planted/item_mlp.py:{marked_line('item_mlp', 'GD501')}"
    matches = [f for f in data["findings"] if f["code"] == "GD501"]
    assert matches, proc.stdout
    assert matches[0]["severity"] == "error" and matches[0]["source"] == "probe", proc.stdout
    assert any(loc.endswith(expected) for loc in matches[0]["locations"]), proc.stdout


def test_clean_spec_exits_0_without_errors(results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    proc = results["clean"]
    data = report_of(proc)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert data["has_errors"] is False and data["counts"]["error"] == 0, proc.stdout
    assert not [f for f in data["findings"] if f["severity"] == "error"], proc.stdout
