"""advise candidates: which graph configurations a dense and an MoE model get, and which Megatron's own
validation (TransformerConfig built on the CPU) or the rule catalogue reject before any GPU run."""

from __future__ import annotations

import pytest

from graphdoctor.advise.candidates import (
    MEGATRON_RULE,
    Candidate,
    candidates_for,
    catalogue_mapping,
    is_moe,
    megatron_rejection,
    screen,
)
from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.rules.registry import all_rules

UNKNOWN = EnvironmentFacts.unknown_machine()
MOE_RUN = """\
transformer:
  num_moe_experts: 4
  moe_router_topk: 2
  add_bias_linear: false
run:
  num_layers: 2
  hidden_size: 128
  num_attention_heads: 4
  dtype: bf16
  dropout: 0.0
"""


@pytest.fixture(scope="module")
def moe_config(tmp_path_factory: pytest.TempPathFactory) -> DiffConfig:
    path = tmp_path_factory.mktemp("run") / "moe.yaml"
    path.write_text(MOE_RUN, encoding="utf-8")
    return diff_config_from(load_run_file(path))


def labels(config: DiffConfig) -> list[str]:
    return [c.label for c in candidates_for(config)]


def test_dense_candidates_cover_every_impl_and_scope() -> None:
    assert labels(DiffConfig()) == [
        "full_iteration whole step", "local whole layer", "local attn", "local mlp",
        "transformer_engine whole layer", "transformer_engine attn", "transformer_engine mlp",
        "transformer_engine attn+mlp"]


def test_impl_option_limits_the_candidates() -> None:
    assert labels(DiffConfig(impls=("transformer_engine",))) == [
        "transformer_engine whole layer", "transformer_engine attn", "transformer_engine mlp",
        "transformer_engine attn+mlp"]


def test_moe_candidates_come_from_the_run_file(moe_config: DiffConfig) -> None:
    assert is_moe(moe_config) and not is_moe(DiffConfig())
    got = labels(moe_config)
    assert "transformer_engine moe_router+moe_preprocess" in got
    assert "transformer_engine attn+moe_router+moe_preprocess" in got
    assert "local moe_router" in got and "transformer_engine moe" in got


def test_dense_candidates_pass_megatron_and_the_catalogue() -> None:
    config = DiffConfig(dropout=0.0)
    for candidate in candidates_for(config):
        if candidate.impl == "transformer_engine":
            continue  # unavailable without TE (and in fp32); checked below
        screening = screen(candidate, config, facts=UNKNOWN)
        if candidate.impl == "local" and candidate.modules == ("mlp",):
            # megatron-core 0.19.2 cannot build it (Megatron-Bridge#4583): refused, never run
            assert [r.rule for r in screening.rejections] == ["GD240"], (candidate.label, screening)
            assert "has no attribute 'is_moe_layer'" in screening.rejections[0].message
            continue
        if candidate.impl == "local" and candidate.modules:
            # megatron-core 0.19.2: local attn graphs the whole GPT layer, the `local whole layer` run
            assert [r.rule for r in screening.rejections] == ["GD219"], (candidate.label, screening)
            assert "graphs the whole layer" in screening.rejections[0].message
            continue
        assert screening.runnable, (candidate.label, screening)


def test_local_scopes_of_a_custom_layer_spec_are_run() -> None:
    """GD219 judges Megatron's GPT layers only: a custom spec may build MoETransformerLayer."""
    config = DiffConfig(dropout=0.0, layer_spec="fixtures.planted.schedule_eval_mode_mlp:layer_spec")
    assert screen(Candidate("local", ("attn",)), config, facts=UNKNOWN).runnable


def test_moe_rejections_name_the_rule_and_megatron(moe_config: DiffConfig) -> None:
    by_label = {c.label: screen(c, moe_config, facts=UNKNOWN) for c in candidates_for(moe_config)}
    mlp = by_label["local mlp"].rejections
    assert [r.rule for r in mlp] == ["GD204", MEGATRON_RULE]
    assert "mlp cuda graph is only supported for dense layers" in mlp[-1].message
    moe = by_label["transformer_engine moe"].rejections
    assert [r.rule for r in moe] == ["GD205", MEGATRON_RULE] and moe[0].fix
    assert [r.rule for r in by_label["local moe"].rejections] == ["GD205", "GD219", MEGATRON_RULE]
    for label in ("transformer_engine attn", "transformer_engine moe_router+moe_preprocess",
                  "transformer_engine attn+moe_router+moe_preprocess"):
        assert by_label[label].rejections == (), (label, by_label[label].rejections)
    # megatron-core 0.19.2 GPT layers under local: attn is the whole layer, moe_router graphs nothing
    assert [r.rule for r in by_label["local attn"].rejections] == ["GD219"]
    assert [r.rule for r in by_label["local moe_router"].rejections] == ["GD219"]
    assert "graphs nothing" in by_label["local moe_router"].rejections[0].message


def test_te_candidates_are_unavailable_without_te_with_the_reason() -> None:
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("Transformer Engine is installed here")
    from graphdoctor.rules.facts import detect_facts

    for facts in (UNKNOWN, detect_facts()):  # this machine's facts: GD304 would say the same again
        screening = screen(Candidate("transformer_engine", ("attn",)), DiffConfig(dtype="bf16"), facts=facts)
        assert screening.unavailable == "transformer_engine is not installed" and not screening.runnable
        assert screening.rejections == (), screening.rejections


def test_megatron_validation_is_the_child_s_transformer_config() -> None:
    assert megatron_rejection(Candidate("local", ("attn",)), DiffConfig()) is None
    moe = DiffConfig(transformer={"num_moe_experts": 4, "moe_router_topk": 2, "add_bias_linear": False})
    found = megatron_rejection(Candidate("transformer_engine", ("moe_preprocess",)), moe)
    assert found is not None and found.rule == MEGATRON_RULE
    assert "moe_preprocess cuda graph is only supported with moe_router" in found.message


def test_warnings_stay_notes_and_the_candidate_runs() -> None:
    screening = screen(Candidate("local"), DiffConfig(dropout=0.1), facts=UNKNOWN)
    assert screening.runnable and any(w.startswith("GD401 ") for w in screening.warnings)


def test_catalogue_mapping_passes_the_candidate_settings() -> None:
    mapping = catalogue_mapping(Candidate("transformer_engine", ("attn", "mlp")), DiffConfig(dtype="bf16", dropout=0.0))
    t = mapping["transformer"]
    assert t["cuda_graph_impl"] == "transformer_engine" and t["cuda_graph_modules"] == ["attn", "mlp"]
    assert t["bf16"] is True and t["hidden_dropout"] == 0.0
    assert catalogue_mapping(Candidate("full_iteration"), DiffConfig())["transformer"]["cuda_graph_modules"] == []


def test_a_rule_added_to_the_catalogue_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    """screen() goes through graphdoctor.rules.check: whatever the registry holds is applied."""
    import graphdoctor.rules.engine as engine

    rules = all_rules()
    gd205 = next(r for r in rules if r.code == "GD205")

    monkeypatch.setattr(engine, "all_rules", lambda: [r for r in rules if r is not gd205])
    config = DiffConfig(transformer={"num_moe_experts": 4, "moe_router_topk": 2, "add_bias_linear": False})
    codes = [r.rule for r in screen(Candidate("transformer_engine", ("moe",)), config, facts=UNKNOWN).rejections]
    assert codes == [MEGATRON_RULE]


def test_candidate_keys_are_unique_and_round_trip(moe_config: DiffConfig) -> None:
    cands = candidates_for(moe_config) + [Candidate("local", ("attn",), (0,)), Candidate("local", ("attn",), (1, 2))]
    assert len({c.key for c in cands}) == len(cands)
    assert all(Candidate.from_dict(c.to_dict()) == c for c in cands)
    assert Candidate("transformer_engine", ("attn",), (0,)).label == "transformer_engine attn (layer 0)"
    assert Candidate("local").config(DiffConfig(num_layers=2)).impls == ("local",)
    assert Candidate("local", (), (1,)).config(DiffConfig(num_layers=2)).graph_layers == (1,)


def test_graph_layers_is_validated_and_round_trips() -> None:
    from graphdoctor.errors import UsageError

    config = DiffConfig(num_layers=4, graph_layers=[0, 2])  # type: ignore[arg-type]
    assert config.graph_layers == (0, 2)
    assert DiffConfig.from_dict(config.to_dict()) == config
    with pytest.raises(UsageError, match="graph_layers: got 4"):
        DiffConfig(num_layers=4, graph_layers=(4,))
