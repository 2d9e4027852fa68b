"""Diff rows carry the static MoE findings beside the runtime verdict; a capture failure in Megatron's
token dispatcher is diagnosed as GD217 with the Megatron file:line and the catalogue's fix."""

from __future__ import annotations

from pathlib import Path

from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config import diff_config_from, load_run_file
from graphdoctor.parent.static import local_scope_static_findings, moe_static_findings, with_static_findings
from graphdoctor.rules import rule_fix
from graphdoctor.types import Diagnosis, Verdict

RUNFILES = Path(__file__).resolve().parents[2] / "fixtures" / "runfiles"
# What the H200 reported for dropless allgather MoE under whole-layer local graphs (issue 15).
PINNED = "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned"
TAIL = [
    "/usr/lib/python3/site-packages/megatron/core/transformer/moe/moe_layer.py:541 in routed_experts_compute",
    "/usr/lib/python3/site-packages/megatron/core/transformer/moe/token_dispatcher.py:317 in dispatch_postprocess",
]


def _config(name: str, **overrides: object):
    return diff_config_from(load_run_file(RUNFILES / f"moe_{name}.yaml"), **overrides)


def test_static_findings_per_impl_and_scope() -> None:
    whole = _config("dropless_allgather", impls="local")
    assert [f.code for f in moe_static_findings(whole, "local")] == ["GD217"]
    assert [f.code for f in moe_static_findings(whole, "full_iteration")] == ["GD217"]
    attn = _config("dropless_allgather", cuda_graph_modules="attn")
    # megatron-core 0.19.2: local + attn graphs the whole GPT layer, token dispatch included (GD219)
    assert [f.code for f in moe_static_findings(attn, "local")] == ["GD217"]
    assert [f.code for f in local_scope_static_findings(attn, "local")] == ["GD219"]
    assert local_scope_static_findings(attn, "transformer_engine") == []
    assert moe_static_findings(attn, "transformer_engine") == []
    assert local_scope_static_findings(whole, "local") == []
    te_scope = _config("dropless_allgather", cuda_graph_modules="attn,moe_router,moe_preprocess")
    assert moe_static_findings(te_scope, "transformer_engine") == []
    assert moe_static_findings(_config("drop_pad"), "local") == []
    dense = diff_config_from(None)
    assert moe_static_findings(dense, "local") == []


def test_capture_failure_in_the_dispatcher_is_diagnosed_as_gd217() -> None:
    diag = Diagnosis(error_type="RuntimeError", message=PINNED, module="decoder.layers.0.mlp",
                     phase="capture", step=0, traceback_tail=TAIL)
    row = ImplResult(impl="local", verdict=Verdict.CAPTURE_FAILED, diagnosis=diag)
    out = with_static_findings(row, _config("dropless_allgather"))
    assert out.diagnosis is not None
    assert out.diagnosis.rule == "GD217" and out.diagnosis.fix == rule_fix("GD217")
    assert out.diagnosis.location == "megatron/core/transformer/moe/token_dispatcher.py:317"
    assert out.diagnosis.message == PINNED and out.diagnosis.module == "decoder.layers.0.mlp"
    assert [n.split(":")[0] for n in out.notes] == ["static GD217 token-dispatch-host-copy-in-graph"]


def test_local_attn_capture_failure_in_the_dispatcher_is_gd217_not_gd504() -> None:
    """What the H200 gave for dropless allgather under local + attn (GD504 from the error text, at the
    dispatcher line): the static GD217 finding names it GD217, with the same Megatron file:line."""
    diag = Diagnosis(error_type="RuntimeError", message=PINNED, module="decoder.layers.0.mlp", phase="capture",
                     step=0, rule="GD504", location="megatron/core/transformer/moe/token_dispatcher.py:317",
                     fix="Create the tensor on the device before capture or copy from pinned memory",
                     traceback_tail=TAIL)
    row = ImplResult(impl="local", verdict=Verdict.CAPTURE_FAILED, diagnosis=diag)
    out = with_static_findings(row, _config("dropless_allgather", cuda_graph_modules="attn"))
    assert out.diagnosis is not None and out.diagnosis.rule == "GD217" and out.diagnosis.fix == rule_fix("GD217")
    assert out.diagnosis.location == "megatron/core/transformer/moe/token_dispatcher.py:317"
    assert [n.split(":")[0] for n in out.notes] == ["static GD217 token-dispatch-host-copy-in-graph",
                                                    "static GD219 local-scope-is-whole-layer-or-nothing"]
    assert "local [attn] does not stop before dispatch" in (out.diagnosis.fix or "")


def test_without_a_megatron_frame_the_rule_location_stands_in() -> None:
    diag = Diagnosis(error_type="RuntimeError", message=PINNED, phase="capture")
    row = ImplResult(impl="local", verdict=Verdict.CAPTURE_FAILED, diagnosis=diag)
    out = with_static_findings(row, _config("dropless_alltoall"))
    assert out.diagnosis is not None and out.diagnosis.location == \
        "megatron/core/transformer/moe/token_dispatcher.py:695"


def test_a_user_rule_outside_moe_code_is_kept_and_clean_rows_are_unchanged() -> None:
    diag = Diagnosis(error_type="RuntimeError", message="x", rule="GD502", location="mine.py:3",
                     traceback_tail=["mine.py:3 in f"])
    row = ImplResult(impl="local", verdict=Verdict.CAPTURE_FAILED, diagnosis=diag)
    out = with_static_findings(row, _config("dropless_allgather"))
    assert out.diagnosis == diag and len(out.notes) == 1
    clean = ImplResult(impl="local", verdict=Verdict.MATCH)
    assert with_static_findings(clean, _config("drop_pad")) == clean


def test_an_unpredicted_failure_in_moe_code_gets_the_megatron_frame_as_location() -> None:
    diag = Diagnosis(error_type="RuntimeError", message="operation not permitted when stream is capturing",
                     phase="capture", traceback_tail=TAIL)
    row = ImplResult(impl="transformer_engine", verdict=Verdict.CAPTURE_FAILED, diagnosis=diag)
    config = _config("drop_pad", cuda_graph_modules="attn,moe_router,moe_preprocess")
    out = with_static_findings(row, config)
    assert out.diagnosis is not None and out.diagnosis.rule is None
    assert out.diagnosis.location == "megatron/core/transformer/moe/token_dispatcher.py:317"
    assert out.notes == ()
