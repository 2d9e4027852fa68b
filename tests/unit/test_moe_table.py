"""tests/benchmarks/moe_table.py on the CPU: its rows read a recorded H200 diff report, its predictions
are the static MoE findings, and --help works (the GPU rows themselves run on the lead's H200)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("moe_table", REPO / "tests" / "benchmarks" / "moe_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summarize_reads_a_recorded_capture_failure() -> None:
    data = json.loads((REPO / "fixtures" / "data" / "diff" / "h200_item_mlp_schema2.json").read_text())
    row = table().summarize({**data, "impls": data["impls"][:1]})
    assert (row["verdict"], row["rule"], row["location"]) == ("capture-failed", "GD501", "fixtures/planted/item_mlp.py:19")
    assert row["reference"] == "ok"
    rendered = table().render([{"config": "c", "impl": "local", "scope": "attn", **row}])
    assert "| c | local | attn | - | capture-failed | GD501 | fixtures/planted/item_mlp.py:19 |" in rendered


def test_predictions_are_the_static_findings() -> None:
    moe_table = table()
    runfiles = REPO / "fixtures" / "runfiles"
    assert moe_table.predicted(runfiles / "moe_dropless_allgather.yaml", "local", "") == "GD217"
    # local + attn graphs the whole GPT layer in megatron-core 0.19.2 (GD219), token dispatch included
    assert moe_table.predicted(runfiles / "moe_dropless_alltoall.yaml", "local", "attn") == "GD217"
    assert moe_table.predicted(runfiles / "moe_dropless_alltoall.yaml", "transformer_engine",
                               "attn,moe_router,moe_preprocess") == "clean"
    assert moe_table.predicted(runfiles / "moe_drop_pad.yaml", "local", "") == "clean"


def test_help_runs() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "benchmarks" / "moe_table.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "--out DIR" in proc.stdout and "--parallel N" in proc.stdout
