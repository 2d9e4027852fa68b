"""`graphdoctor check --probe` end to end on a real GPU: the CLI process, the probe workers, the report.

All runs go at once (one CLI process each, from the repository root so that `fixtures.planted.*`
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
RUNS: dict[str, tuple[str, ...]] = {"item_mlp": (SPECS["item_mlp"],), "clean": (SPECS["clean"],),
                                    "clean_shown": (SPECS["clean"], "--show-library-findings")}


def run_check(layer_spec: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "graphdoctor.cli", "check", "--probe", "--layer-spec", layer_spec, *SMALL_MODEL,
           "--probe-timeout", "240", "--format", "json", *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=570, check=False)


@pytest.fixture(scope="module")
def results() -> dict[str, subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(max_workers=len(RUNS)) as pool:
        return dict(zip(RUNS, pool.map(lambda args: run_check(*args), RUNS.values()), strict=True))


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


def test_clean_spec_shows_no_library_gd507_by_default(results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    # Megatron's own host work (the RNG tracker's CPU state check in core attention) has no user frame:
    # hidden by default, counted in one note; --show-library-findings shows it, marked library_internal.
    data = report_of(results["clean"])
    assert not [f for f in data["findings"] if f["code"] == "GD507"], json.dumps(data["findings"], indent=1)
    shown = report_of(results["clean_shown"])
    gd507 = [f for f in shown["findings"] if f["code"] == "GD507"]
    assert all(f["extra"]["library_internal"] is True and f["severity"] == "info" for f in gd507), shown["findings"]
    library = [f for f in shown["findings"] if f["extra"].get("library_internal") is True]
    hidden = [n for n in data["notes"] if "library-internal finding(s) hidden" in n]
    if library:
        assert hidden == [f"probe: {len(library)} library-internal finding(s) hidden (GD507 with no user frame "
                          "on the stack); --show-library-findings shows them"], data["notes"]
    else:
        assert hidden == [], data["notes"]
