"""A set-up Megatron cannot build is `setup-failed`, on a real GPU (issue 33 acceptance): `local` with an `mlp`-only
scope (GD240, Megatron-Bridge#4583) is known to the catalogue, so diff starts no child for it and advise lists it as
refused; on a model provider built of Megatron's TransformerLayer (which the static rule does not judge) the child's
own crash is setup-failed with the rule, at Megatron's file:line.

Set GD_SAMPLE_DIR to keep the advise terminal output for docs/advise.md; GD_REPORT_DIR keeps the diff reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kept import keep

from graphdoctor.config import DiffConfig
from graphdoctor.diff import diff
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "vocab_size": 512,
         "steps": 4, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0, "memory": False, "launches": False,
         "dropout": 0.0}
CRASH_LINE = "megatron/core/transformer/transformer_layer.py:566"


def test_a_known_setup_failure_costs_no_gpu_run() -> None:
    report = diff(DiffConfig(impls=("local",), cuda_graph_modules=("mlp",), **SMALL))
    keep(report, "setup_failed_local_mlp")
    (row,) = report.results
    assert row.verdict is Verdict.SETUP_FAILED and row.diagnosis is not None
    assert row.diagnosis.rule == "GD240" and row.diagnosis.location == CRASH_LINE
    assert not row.runs  # no child was started for it
    assert report.reference.status == "ok" and report.exit_code() == 1


def test_a_spec_built_on_transformer_layer_fails_setup_at_megatrons_line() -> None:
    """Megatron-LM's model_provider with the local spec: the static rule does not judge a model provider, so the
    child runs and dies while it builds the model, and the row names the rule from the error."""
    report = diff(DiffConfig(impls=("local",), cuda_graph_modules=("mlp",),
                             model_provider="fixtures.planted.model_providers:megatron_lm_style",
                             **{**SMALL, "vocab_size": 512, "seq_length": 64}))
    keep(report, "setup_failed_model_provider_local_mlp")
    (row,) = report.results
    assert row.verdict is Verdict.SETUP_FAILED, (row.verdict, row.diagnosis)
    diag = row.diagnosis
    assert diag is not None and "is_moe_layer" in diag.message and diag.phase == "setup"
    assert diag.rule == "GD240" and diag.fix
    assert any(CRASH_LINE.split(":")[0] in line for line in diag.traceback_tail), diag.traceback_tail


def test_advise_lists_local_mlp_as_refused_without_running_it(tmp_path: Path) -> None:
    report = tmp_path / "advise.json"
    done = subprocess.run(
        [sys.executable, "-m", "graphdoctor", "advise", "--impl", "local", "--num-layers", "2", "--hidden-size", "128",
         "--num-attention-heads", "4", "--seq-length", "64", "--vocab-size", "512", "--steps", "4", "--dropout", "0",
         "--no-memory", "--no-launches", "--json", str(report), "-q"],
        capture_output=True, text=True, timeout=400, check=False)
    sample = os.environ.get("GD_SAMPLE_DIR")
    if sample:
        Path(sample, "advise_local_refused.txt").write_text(done.stdout + done.stderr, encoding="utf-8")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    candidates = {c["candidate"]["label"]: c for c in json.loads(report.read_text())["candidates"]}
    refused = candidates["local mlp"]
    assert refused["status"] == "rejected" and [r["rule"] for r in refused["rejections"]] == ["GD240"]
    assert candidates["local whole layer"]["status"] == "ran"
    assert "rejected: local mlp: GD240" in done.stdout
