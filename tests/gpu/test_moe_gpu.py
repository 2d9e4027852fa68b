"""MoE GPT models (docs/moe.md) through `graphdoctor diff` and `check --probe` on a real GPU: dropless
MoE under whole-layer graphs fails capture at the token dispatcher's host copy and is diagnosed GD217
with the Megatron file:line; scopes that stop before token dispatch, and drop-and-pad, replay."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kept import diff

from graphdoctor.child.megatron_setup import have_transformer_engine
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
RUNFILES = REPO / "fixtures" / "runfiles"
ALLGATHER_COPY = "megatron/core/transformer/moe/token_dispatcher.py:317"
TE_SCOPE = "attn,moe_router,moe_preprocess"


def moe_config(name: str, impl: str, modules: str = "") -> DiffConfig:
    return diff_config_from(load_run_file(RUNFILES / f"moe_{name}.yaml"), impls=impl, cuda_graph_modules=modules,
                            dropout=0.0, timeout_s=240.0)


def test_dropless_allgather_whole_layer_is_capture_failed_gd217() -> None:
    report = diff(moe_config("dropless_allgather", "local"))
    (local,) = report.results
    assert report.reference.status == "ok", report.reference.diagnosis
    assert local.verdict == Verdict.CAPTURE_FAILED, local
    diag = local.diagnosis
    assert diag is not None and diag.rule == "GD217", diag
    assert diag.location == ALLGATHER_COPY, diag
    assert diag.fix and "attn, moe_router, moe_preprocess" in diag.fix
    assert any(note.startswith("static GD217") for note in local.notes), local.notes


def test_dropless_alltoall_whole_layer_is_capture_failed_gd217() -> None:
    (local,) = diff(moe_config("dropless_alltoall", "local")).results
    assert local.verdict == Verdict.CAPTURE_FAILED, local
    assert local.diagnosis is not None and local.diagnosis.rule == "GD217", local.diagnosis
    assert local.diagnosis.location is not None
    assert local.diagnosis.location.startswith("megatron/core/transformer/moe/"), local.diagnosis


@pytest.mark.without_te
@pytest.mark.parametrize("name", ["dropless_allgather", "dropless_alltoall"])
def test_local_attn_scope_is_the_whole_layer_and_fails_at_the_dispatcher(name: str) -> None:
    """megatron-core 0.19.2: local + attn graphs the whole GPT TransformerLayer (transformer_layer.py:541-567),
    token dispatch included, so it fails capture like the whole layer (H200: token_dispatcher.py:317)."""
    (local,) = diff(moe_config(name, "local", "attn")).results
    assert local.verdict == Verdict.CAPTURE_FAILED, local
    diag = local.diagnosis
    assert diag is not None and diag.rule == "GD217", diag
    assert diag.location is not None and diag.location.startswith("megatron/core/transformer/moe/"), diag
    if name == "dropless_allgather":
        assert diag.location == ALLGATHER_COPY, diag
    assert any(note.startswith("static GD217") for note in local.notes), local.notes
    assert any(note.startswith("static GD219") for note in local.notes), local.notes


@pytest.mark.without_te
def test_drop_and_pad_local_attn_scope_is_the_whole_layer() -> None:
    (local,) = diff(moe_config("drop_pad", "local", "attn")).results
    assert_match_but_capture_tracker_values(local)
    assert any(note.startswith("static GD219") for note in local.notes), local.notes
    assert local.timing is not None and local.timing.graphed_ms is not None


def assert_match_but_capture_tracker_values(local: ImplResult) -> None:
    """Match: loss, grads, params and every replay step's logged values equal; only the MoE tracker
    values logged at the capture step differ (Megatron's capture passes add to them), as GD515 notes."""
    assert local.verdict == Verdict.MATCH, local
    capture = [n for n in local.notes if n.startswith("GD515 logged-value-at-capture")]
    assert capture and all("'tracker/" in n and "phase capture" in n for n in capture), local.notes


@pytest.mark.without_te
def test_drop_and_pad_whole_layer_matches() -> None:
    (local,) = diff(moe_config("drop_pad", "local")).results
    assert_match_but_capture_tracker_values(local)


@pytest.mark.parametrize("name", ["dropless_allgather", "dropless_alltoall", "drop_pad"])
def test_transformer_engine_router_and_preprocess_scope(name: str) -> None:
    """The scope Megatron's own MoE CI graphs: the allgather dispatcher's host copy (dispatch_postprocess) and
    the alltoall's stay outside it. bf16: Megatron's TECudaGraphHelper captures with bf16 sample inputs."""
    (te,) = diff(dataclasses.replace(moe_config(name, "transformer_engine", TE_SCOPE), dtype="bf16")).results
    available, why = have_transformer_engine()
    if not available:
        assert te.verdict == Verdict.UNAVAILABLE, (te, why)
        return
    assert te.verdict == Verdict.MATCH, te
    assert not [n for n in te.notes if n.startswith("static ")], te.notes


def _probe(name: str) -> tuple[int, dict[str, Any]]:
    cmd = [sys.executable, "-m", "graphdoctor.cli", "check", str(RUNFILES / f"moe_{name}.yaml"), "--probe",
           "--probe-timeout", "240", "--format", "json"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=570, check=False)
    assert proc.stdout.strip(), f"exit {proc.returncode}, no report; stderr:\n{proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def test_check_probe_builds_the_moe_model_and_finds_the_dispatcher_copy() -> None:
    code, data = _probe("dropless_allgather")
    static = [f for f in data["findings"] if f["code"] == "GD217"]
    assert len(static) == 3, data["findings"]  # diff's default impls: local, full_iteration, transformer_engine
    probed = [f for f in data["findings"] if f.get("source") == "probe"]
    assert any("megatron/core/transformer/moe/" in loc for f in probed for loc in f["locations"]), probed
    assert code == 1
