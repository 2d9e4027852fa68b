"""Megatron-Bridge's own refusals (GD141-GD145) on ConfigContainer YAML dumps in Bridge's format
(fixtures/bridge/): each refused dump gets its one Bridge rule, at the YAML keys, in Bridge's words; the clean
dumps get none; the rules never fire outside Bridge inputs, and on Bridge inputs the Megatron-LM rule of the same
cause (GD115, GD116, GD219) stands down."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdoctor.config.bridge import read_bridge
from graphdoctor.errors import UsageError
from graphdoctor.rules import Severity, check
from graphdoctor.rules.finding import Finding

REPO = Path(__file__).resolve().parents[2]
BRIDGE = REPO / "fixtures" / "bridge"
BRIDGE_CODES = {"GD141", "GD142", "GD143", "GD144", "GD145"}
CLEAN = ["llama_te_graphs.yaml", "llama_packed_te_graphs.yaml"]
REFUSED = {
    # dump: (code, keys whose lines the finding names, Bridge's file, Bridge's own words)
    "llama_local_attn.yaml": (
        "GD141", ["cuda_graph_impl", "cuda_graph_modules"],
        "megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration",
        'Megatron Bridge supports model.cuda_graph_impl="local" only for full-iteration CUDA graphs with scopes '
        "['attn']. Use model.cuda_graph_impl=\"transformer_engine\" for scoped CUDA graph capture"),
    "llama_full_iteration_nan_check.yaml": (
        "GD142", ["cuda_graph_impl", "check_for_nan_in_loss"],
        "megatron/bridge/training/config.py ConfigContainer.validate",
        "check_for_nan_in_loss must be disabled when using full_iteration CUDA graph. "
        "Set rerun_state_machine.check_for_nan_in_loss=False."),
    "llama_te_graphs_no_rng_tracker.yaml": (
        "GD143", ["te_rng_tracker", "cuda_graph_impl", "use_te_rng_tracker"],
        "megatron/bridge/models/gpt_provider.py GPTModelProvider.provide",
        "Transformer engine's RNG tracker is required for cudagraphs, it can be enabled with use_te_rng_tracker=True'."),
    "llama_packed_no_padding.yaml": (
        "GD144", ["cuda_graph_impl", "offline_packing_specs", "pad_to_max_length"],
        "megatron/bridge/training/config.py ConfigContainer.validate",
        "Offline packing with CUDA graphs requires dataset pad_to_max_length=True."),
    "llama_packed_attn_no_pad_cu_seqlens.yaml": (
        "GD145", ["cuda_graph_impl", "cuda_graph_modules", "pad_cu_seqlens"],
        "megatron/bridge/training/config.py ConfigContainer.validate",
        "Packed attention CUDA graphs require offline_packing_specs.pad_cu_seqlens=True."),
}
OVERRIDE_MODEL = ("model:\n  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n  num_layers: 2\n"
                  "  hidden_size: 256\n  num_attention_heads: 4\n")


def bridge_findings(path: Path, megatron_args: str | None = None) -> list[Finding]:
    return [f for f in check(path, megatron_args).findings if f.code in BRIDGE_CODES]


def key_lines(path: Path, *keys: str) -> set[str]:
    """`path:line` of each line that sets one of `keys` (each set once in the dump)."""
    found = {f"{path}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
             if any(line.strip().startswith(f"{key}:") for key in keys)}
    assert len(found) == len(keys), (keys, found)
    return found


def override(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text(OVERRIDE_MODEL + text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", CLEAN)
def test_a_clean_dump_has_no_bridge_refusal(name: str) -> None:
    assert bridge_findings(BRIDGE / name) == []


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_dump_gets_its_rule_at_the_keys_in_bridges_words(name: str) -> None:
    code, keys, site, words = REFUSED[name]
    path = BRIDGE / name
    findings = bridge_findings(path)
    assert [f.code for f in findings] == [code]
    finding = findings[0]
    assert finding.severity is Severity.ERROR
    assert site in finding.message and words in finding.message
    assert set(finding.locations) == key_lines(path, *keys)
    assert finding.fix.startswith("Set ")


def test_the_rules_read_only_bridge_inputs(tmp_path: Path) -> None:
    run_file = tmp_path / "run.yaml"
    run_file.write_text("transformer:\n  cuda_graph_impl: local\n  cuda_graph_modules: [attn]\n", encoding="utf-8")
    codes = {f.code for f in check(run_file).findings}
    assert "GD219" in codes and not codes & BRIDGE_CODES  # Megatron-Core's own reading of local attn
    line = {f.code for f in check(None, "--cuda-graph-impl full_iteration").findings}
    assert not line & BRIDGE_CODES


def test_on_bridge_inputs_the_megatron_lm_rule_of_the_same_cause_stands_down() -> None:
    local = {f.code for f in check(BRIDGE / "llama_local_attn.yaml").findings}
    assert "GD141" in local and "GD219" not in local
    line = "--cuda-graph-impl full_iteration"  # a launch line does not configure Bridge
    nan = {f.code for f in check(BRIDGE / "llama_full_iteration_nan_check.yaml", line).findings}
    assert "GD142" in nan and "GD115" not in nan
    rng = {f.code for f in check(BRIDGE / "llama_te_graphs_no_rng_tracker.yaml", "--cuda-graph-impl "
                                 "transformer_engine").findings}
    assert "GD143" in rng and "GD116" not in rng


def test_a_dump_sets_every_guard_an_override_file_gets_bridges_defaults(tmp_path: Path) -> None:
    dump = read_bridge(BRIDGE / "llama_te_graphs_no_rng_tracker.yaml").guards
    assert {"rng.te_rng_tracker", "model.use_te_rng_tracker", "rerun_state_machine.check_for_nan_in_loss"} <= dump.given
    path = override(tmp_path, "  cuda_graph_impl: full_iteration\n  use_te_rng_tracker: true\n")
    findings = bridge_findings(path)
    assert [f.code for f in findings] == ["GD142"]  # RerunStateMachineConfig's check_for_nan_in_loss is True
    assert "not set (Bridge's default true)" in findings[0].message
    assert findings[0].locations == (f"{path}:6",)  # model.cuda_graph_impl: the file has no rerun section


@pytest.mark.parametrize(("model", "codes"), [
    ("  cuda_graph_impl: local\n", {"GD141"}),  # whole-layer local graphs: refused too
    ("  cuda_graph_impl: local\n  cuda_graph_modules: 'attn,mlp'\n", {"GD141"}),  # Bridge splits a string
    ("  cuda_graph_impl: local\n  inference_cuda_graph_scope: layer\n", set()),  # a local inference graph
    ("  cuda_graph_impl: local\n  inference_cuda_graph_scope: layer\n  cuda_graph_modules: [attn]\n", {"GD141"}),
    ("  cuda_graph_impl: local\n  cuda_graph_scope: [full_iteration]\n", {"GD142"}),  # full iteration, old API
    ("  cuda_graph_impl: none\n  cuda_graph_modules: [full_iteration]\n", set()),  # Bridge clears them
])
def test_local_graphs_are_judged_as_validate_cuda_graph_configuration_does(tmp_path: Path, model: str,
                                                                          codes: set[str]) -> None:
    path = override(tmp_path, model + "  use_te_rng_tracker: true\n")
    assert {f.code for f in bridge_findings(path)} == codes


@pytest.mark.parametrize(("text", "codes"), [
    ("  cuda_graph_impl: transformer_engine\nrng:\n  te_rng_tracker: true\n", set()),  # validate() syncs the flags
    ("  cuda_graph_impl: transformer_engine\n  use_te_rng_tracker: true\nrng:\n  te_rng_tracker: false\n", set()),
    ("  cuda_graph_impl: transformer_engine\nrng:\n  te_rng_tracker: false\n", {"GD143"}),
    ("  cuda_graph_impl: none\n", set()),
])
def test_the_te_rng_tracker_is_required_once_either_flag_is_true(tmp_path: Path, text: str, codes: set[str]) -> None:
    assert {f.code for f in bridge_findings(override(tmp_path, text))} == codes


def test_the_hybrid_provider_does_not_require_the_tracker(tmp_path: Path) -> None:
    path = tmp_path / "hybrid.yaml"
    path.write_text("model:\n  _target_: megatron.bridge.models.mamba.mamba_provider.MambaModelProvider\n"
                    "  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n  hybrid_layer_pattern: M*\n"
                    "  cuda_graph_impl: transformer_engine\nrng:\n  te_rng_tracker: false\n", encoding="utf-8")
    assert read_bridge(path).kind == "hybrid"
    assert bridge_findings(path) == []


PACKED = ("  cuda_graph_impl: {impl}\n  cuda_graph_modules: {modules}\n  use_te_rng_tracker: true\ndataset:\n"
          "  _target_: megatron.bridge.data.builders.gpt_sft.GPTSFTDatasetConfig\n  seq_length: 1024\n"
          "  dataset_root: /data/squad\n  enable_offline_packing: true\n  offline_packing_specs: {specs}\n{extra}")


@pytest.mark.parametrize(("impl", "modules", "specs", "extra", "codes"), [
    ("transformer_engine", "[mlp]", "{packed_sequence_size: 1024}", "  pad_to_max_length: true\n", set()),
    ("transformer_engine", "[mlp]", "{packed_sequence_size: 1024}", "  dataset_kwargs: {pad_to_max_length: 1}\n",
     {"GD144"}),  # `is True`: 1 is not padding
    ("transformer_engine", "[]", "{packed_sequence_size: 1024}", "  dataset_kwargs: {pad_to_max_length: true}\n",
     {"GD145"}),  # whole layers capture attention
    ("full_iteration", "[]", "{packed_sequence_size: 1024}", "", {"GD142", "GD144", "GD145"}),
    ("none", "[]", "{packed_sequence_size: 1024, pad_cu_seqlens: true}", "", {"GD144"}),  # refused without graphs
    ("local", "[attn]", "{packed_sequence_size: 1024}", "", {"GD141"}),  # local layers are no training graph
    ("transformer_engine", "[attn]", "null", "", set()),  # no offline packing specs: the checks do not run
])
def test_packed_data_is_judged_as_config_validate_does(tmp_path: Path, impl: str, modules: str, specs: str,
                                                       extra: str, codes: set[str]) -> None:
    path = override(tmp_path, PACKED.format(impl=impl, modules=modules, specs=specs, extra=extra))
    findings = bridge_findings(path)
    assert {f.code for f in findings} == codes
    if impl == "none":
        assert "offline_packing_specs.pad_cu_seqlens=True requires dataset pad_to_max_length=True." in \
            findings[0].message


def test_a_guard_that_is_not_true_or_false_is_refused_with_its_line(tmp_path: Path) -> None:
    path = override(tmp_path, "  cuda_graph_impl: full_iteration\nrerun_state_machine:\n"
                              "  check_for_nan_in_loss: 'no'\n")
    with pytest.raises(UsageError, match=rf"{path}:8: rerun_state_machine.check_for_nan_in_loss: got 'no', "
                                         "expected true or false"):
        read_bridge(path)
