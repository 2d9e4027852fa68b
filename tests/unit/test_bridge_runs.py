"""The recorded GPU runs of real Megatron-Bridge recipe dumps and a Megatron container YAML
(fixtures/data/bridge_runs/, written by tests/gpu/test_bridge_gpu.py on an H100 with Transformer Engine 2.20.2):
the model each diff built on the GPU is the model `diff --plan` describes on this CPU for the same flags, and
each saved report loads into graphdoctor's own report type with its step times."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.compare.verdict import judge
from graphdoctor.diff import DiffReport

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "fixtures" / "bridge" / "real"
RUNS = ROOT / "fixtures" / "data" / "bridge_runs"
CASES: dict[str, list[str]] = json.loads((RUNS / "cases.json").read_text())
LOCAL_ONLY = ("source", "unavailable")
"""Model fields that describe this machine, not the model: where the file was, whether TE imports here."""


def _recorded(name: str) -> dict[str, Any]:
    with gzip.open(RUNS / f"{name.split('.')[0]}.json.gz", "rt", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plan_describes_the_model_the_gpu_ran(name: str, tmp_path: Path) -> None:
    recorded = _recorded(name)
    plan = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["diff", "--config", str(REAL / name), "--fit", "--num-layers", "2",
                                       *CASES[name], "--steps", str(recorded["config"]["steps"]), "--plan",
                                       "--json", str(plan)])
    assert result.exit_code in (0, 1), result.output
    planned = json.loads(plan.read_text())["model"]
    ran = recorded["model"]
    for field in LOCAL_ONLY:
        planned.pop(field), ran.pop(field)
    assert planned == ran


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_row_is_judged_again_from_its_recorded_runs(name: str) -> None:
    """graphdoctor's own judge, on the recorded eager and graphed runs, gives each row's verdict, first divergence
    and steady-state step times again (the Llama-3 run had 6 steps: no steady window, so no step times)."""
    recorded = _recorded(name)
    report = DiffReport.from_dict(recorded)
    cfg = recorded["config"]
    assert report.results
    for row in report.results:
        graphed = row.runs[0]
        assert graphed.impl == row.impl and graphed.status == "ok", (graphed.impl, graphed.status)
        again = judge(report.reference, graphed, warmup_steps=cfg["cuda_graph_warmup_steps"],
                      rtol=cfg["rtol"], atol=cfg["atol"])
        assert again.verdict == row.verdict
        first = (again.divergence.step, again.divergence.what) if again.divergence else None
        assert first == ((row.divergence.step, row.divergence.what) if row.divergence else None)
        assert again.timing == row.timing
