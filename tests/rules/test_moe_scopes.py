"""Every MoE configuration x graph scope of docs/moe.md, judged on the CPU twice: by megatron-core
0.19.2's own TransformerConfig (built through the one set-up path) and by `graphdoctor check` on the
fixture run file with the scope added. Megatron refuses only dropless MoE under the `moe` scope (GD205);
the capture failures of the token dispatcher's host copies are GD217's. Under `local`, `attn` graphs the
whole GPT layer (token dispatch included) and `moe_router` graphs nothing in megatron-core 0.19.2 (GD219;
on the H200 `local` + `attn` of dropless MoE failed capture at token_dispatcher.py:317)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.config import diff_config_from, load_run_file
from graphdoctor.rules import EnvironmentFacts, check

RUNFILES = Path(__file__).resolve().parents[2] / "fixtures" / "runfiles"
FACTS = EnvironmentFacts(te_version="2.12.0", torch_version="2.11.0", torch_has_stale_capture_override=True,
                         torch_has_graph_safe_rng=True, gpu_capability=None)
ALLGATHER = "megatron/core/transformer/moe/token_dispatcher.py:317"
ALLTOALL = "megatron/core/transformer/moe/token_dispatcher.py:695"
SCOPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "local whole layer": ("local", ()),
    "local attn": ("local", ("attn",)),
    "local moe_router": ("local", ("moe_router",)),
    "te attn,moe_router,moe_preprocess": ("transformer_engine", ("attn", "moe_router", "moe_preprocess")),
    "te moe": ("transformer_engine", ("moe",)),
    "full_iteration": ("full_iteration", ()),
}
# (configuration, scope) -> (Megatron accepts, codes check reports, Megatron file:line named)
EXPECTED: dict[tuple[str, str], tuple[bool, set[str], str | None]] = {
    ("dropless_allgather", "local whole layer"): (True, {"GD217"}, ALLGATHER),
    ("dropless_allgather", "local attn"): (True, {"GD217", "GD219"}, ALLGATHER),
    ("dropless_allgather", "local moe_router"): (True, {"GD219"}, None),
    ("dropless_allgather", "te attn,moe_router,moe_preprocess"): (True, set(), None),
    ("dropless_allgather", "te moe"): (False, {"GD205", "GD217"}, ALLGATHER),
    ("dropless_allgather", "full_iteration"): (True, {"GD217"}, ALLGATHER),
    ("dropless_alltoall", "local whole layer"): (True, {"GD217"}, ALLTOALL),
    ("dropless_alltoall", "local attn"): (True, {"GD217", "GD219"}, ALLTOALL),
    ("dropless_alltoall", "local moe_router"): (True, {"GD219"}, None),
    ("dropless_alltoall", "te attn,moe_router,moe_preprocess"): (True, set(), None),
    ("dropless_alltoall", "te moe"): (False, {"GD205", "GD217"}, ALLTOALL),
    ("dropless_alltoall", "full_iteration"): (True, {"GD217"}, ALLTOALL),
    ("drop_pad", "local whole layer"): (True, set(), None),
    ("drop_pad", "local attn"): (True, {"GD219"}, None),
    ("drop_pad", "local moe_router"): (True, {"GD219"}, None),
    ("drop_pad", "te attn,moe_router,moe_preprocess"): (True, set(), None),
    ("drop_pad", "te moe"): (True, set(), None),
    ("drop_pad", "full_iteration"): (True, set(), None),
}


def _run_file(config: str, scope: str) -> dict[str, Any]:
    run_file = load_run_file(RUNFILES / f"moe_{config}.yaml")
    impl, modules = SCOPES[scope]
    return {"transformer": run_file.transformer,
            "run": {**run_file.run, "impls": [impl], "cuda_graph_modules": list(modules)}}


def megatron_accepts(mapping: dict[str, Any]) -> bool:
    """TransformerConfig of the graphed child, as graphdoctor diff builds it (CPU only)."""
    from graphdoctor.config import RunFile
    from graphdoctor.config.build import child_transformer_config as transformer_config

    run = RunFile(path="<test>", transformer=mapping["transformer"], env={}, run=mapping["run"])
    config = diff_config_from(run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            transformer_config(config, config.impls[0], 0.0)
        except (AssertionError, ValueError):
            return False
    return True


@pytest.mark.parametrize(("config", "scope"), sorted(EXPECTED), ids=lambda v: str(v).replace(" ", "-"))
def test_moe_scope_static_verdicts(config: str, scope: str) -> None:
    accepts, codes, location = EXPECTED[(config, scope)]
    mapping = _run_file(config, scope)
    assert megatron_accepts(mapping) is accepts
    findings = check(mapping, facts=FACTS).findings
    assert {f.code for f in findings if f.severity in ("error", "warning")} == codes
    errors = {f.code for f in findings if f.severity == "error"}
    assert bool(errors) is (not accepts)
    gd217 = [f for f in findings if f.code == "GD217"]
    if location is None:
        assert not gd217
    else:
        assert len(gd217) == 1 and location in gd217[0].message
        assert "attn, moe_router, moe_preprocess" in (gd217[0].fix or "")


def test_drop_and_pad_with_allgather_still_copies_to_host() -> None:
    mapping = _run_file("drop_pad", "local whole layer")
    mapping["transformer"] = {**mapping["transformer"], "moe_token_dispatcher_type": "allgather"}
    assert [ALLGATHER in f.message for f in check(mapping, facts=FACTS).findings if f.code == "GD217"] == [True]


def test_capacity_without_padding_names_the_sync_point_assertion() -> None:
    mapping = _run_file("drop_pad", "local whole layer")
    mapping["transformer"] = {k: v for k, v in mapping["transformer"].items()
                              if k != "moe_pad_expert_input_to_capacity"}
    found = [f.message for f in check(mapping, facts=FACTS).findings if f.code == "GD217"]
    assert len(found) == 1 and "token_dispatcher.py:612" in found[0]


def test_run_file_without_impls_is_judged_for_diffs_default_impls() -> None:
    findings = check(RUNFILES / "moe_dropless_allgather.yaml", facts=FACTS).findings
    assert sorted(f.message.split(" graph")[0] for f in findings if f.code == "GD217") == [
        "capture will fail: full_iteration", "capture will fail: local", "capture will fail: transformer_engine"]
    assert not [f for f in check(RUNFILES / "moe_drop_pad.yaml", facts=FACTS).findings
                if f.severity in ("error", "warning")]


def test_local_scopes_name_what_megatron_graphs_and_gd217_does_not_recommend_local_attn() -> None:
    mapping = _run_file("dropless_allgather", "local attn")
    findings = {f.code: f for f in check(mapping, facts=FACTS).findings}
    assert "(the whole GPT layer under local)" in findings["GD217"].message
    assert "local [attn]" not in (findings["GD217"].fix or "").replace("local [attn] does not", "")
    assert "graphs the whole layer" in findings["GD219"].message
    assert "transformer_layer.py:556-567" in findings["GD219"].message
    nothing = {f.code: f for f in check(_run_file("drop_pad", "local moe_router"), facts=FACTS).findings}
    assert "graphs nothing" in nothing["GD219"].message and "transformer_engine" in (nothing["GD219"].fix or "")


def test_gd219_is_not_judged_for_a_custom_layer_spec() -> None:
    mapping = _run_file("drop_pad", "local attn")
    mapping["run"] = {**mapping["run"], "layer_spec": "my_pkg.specs:moe_layer_spec"}
    assert "GD219" not in {f.code for f in check(mapping, facts=FACTS).findings}
