"""Megatron's own config container (graphdoctor.config.container): what loading it may run, and a model section
that is never dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from graphdoctor.config.bridge import read_bridge
from graphdoctor.config.container import MEGATRON_CONTAINER, container_target, nested_model, screen_targets
from graphdoctor.errors import InputFileError, UsageError

GPT = "megatron.training.models.gpt.GPTModelConfig"
TRANSFORMER = "megatron.core.transformer.transformer_config.TransformerConfig"
TRAINING = "megatron.training.config.training_config"


def _container(**model: Any) -> dict[str, Any]:
    transformer = {"_target_": TRANSFORMER, "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                   **model.pop("transformer", {})}
    return {"_target_": MEGATRON_CONTAINER,
            "model": {"_target_": GPT, "_builder_": "megatron.training.models.gpt.GPTModelBuilder",
                      "vocab_size": 1024, "seq_length": 64, "transformer": transformer, **model},
            "train": {"_target_": f"{TRAINING}.TrainingConfig", "micro_batch_size": 1, "global_batch_size": 8,
                      "train_iters": 10},
            "optimizer": {"_target_": "megatron.core.optimizer.optimizer_config.OptimizerConfig"},
            **{name: {"_target_": f"{TRAINING}.{cls}"} for name, cls in
               (("scheduler", "SchedulerConfig"), ("logger", "LoggerConfig"), ("checkpoint", "CheckpointConfig"))}}


@pytest.mark.parametrize(("node", "said"), [
    ({"_target_": "os.system", "_args_": ["true"]}, "would be called"),
    ({"_target_": "torch.load", "f": "/tmp/x"}, "would be called"),
    ({"_target_": "builtins.eval", "_call_": False}, "outside megatron.core"),
    ({"_target_": "torch.hub.load", "_partial_": True}, "a partial of torch.hub.load"),
    ({"_target_": "functools.partial", "_args_": []}, "would be called"),
    ({"_target_": "megatron.core.parallel_state.initialize_model_parallel"}, "would be called"),
    ({"_target_": "../x"}, "not a dotted name"),
])
def test_loading_runs_nothing_but_megatrons_config_classes(node: dict[str, Any], said: str) -> None:
    data = _container()
    data["model"]["transformer"]["init_method"] = node
    with pytest.raises(UsageError, match=said):
        screen_targets(data, "c.yaml")


def test_what_a_dump_holds_passes_the_screen() -> None:
    data = _container(transformer={
        "attention_backend": {"_target_": "megatron.core.transformer.enums.AttnBackend", "_call_": True,
                              "_args_": [5], "_name_": "auto"},
        "params_dtype": {"_target_": "torch.float32", "_call_": False},
        "init_method": {"_target_": "torch.nn.init.normal_", "_partial_": True, "std": 0.02}})
    data["train"]["exit_signal"] = {"_target_": "signal.Signals", "_call_": True, "_args_": [15], "_name_": "SIGTERM"}
    screen_targets(data, "c.yaml")


@pytest.mark.parametrize("ref", ["${oc.env:HOME}", "${model}", "${model.transformer}", "${nowhere.at_all}"])
def test_an_interpolation_names_a_plain_value_of_the_file(ref: str) -> None:
    data = _container()
    data["train"]["train_iters"] = ref
    with pytest.raises(UsageError, match="interpolation"):
        screen_targets(data, "c.yaml")
    data["train"]["train_iters"] = "${model.seq_length}"
    screen_targets(data, "c.yaml")


def test_the_transformer_section_is_lifted_beside_the_models_fields() -> None:
    data = _container()
    assert container_target(data) == MEGATRON_CONTAINER
    lifted, nested = nested_model(data["model"])
    assert nested and lifted["num_layers"] == 2 and lifted["seq_length"] == 64 and "_builder_" not in lifted
    assert nested_model({"num_layers": 2}) == ({"num_layers": 2}, False)


def test_a_container_is_read_by_megatrons_loader_and_its_model_is_never_dropped(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_container(transformer={"cuda_graph_impl": "full_iteration"})))
    bridge = read_bridge(path)
    assert bridge.owner == "Megatron's PretrainConfigContainer"
    assert bridge.transformer["num_layers"] == 2 and bridge.graph["cuda_graph_impl"] == "full_iteration"
    assert bridge.where["model.cuda_graph_impl"] == bridge.where["model.transformer.cuda_graph_impl"]
    refused = _container(transformer={"cuda_graph_impl": "bogus"})
    path.write_text(yaml.safe_dump(refused))
    with pytest.raises(UsageError, match="refuses it: Invalid cuda graph implementation: bogus"):
        read_bridge(path)
    empty = _container()
    empty["model"]["transformer"] = {"_target_": TRANSFORMER}
    del empty["model"]["_builder_"]
    empty["_target_"] = "megatron.bridge.training.config.ConfigContainer"  # not loaded by Megatron: read only
    path.write_text(yaml.safe_dump(empty))
    with pytest.raises(InputFileError, match="model: graphdoctor read no TransformerConfig field"):
        read_bridge(path)


def test_without_omegaconf_the_container_is_a_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron imports omegaconf only inside its instantiation, where a missing one reads as the file's fault;
    graphdoctor says what is missing instead (exit 2, MissingDependencyError)."""
    import importlib.util

    from graphdoctor.config.container import load_megatron_container
    from graphdoctor.errors import MissingDependencyError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "omegaconf" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="needs omegaconf, which is not installed here"):
        load_megatron_container(_container(), "c.yaml")
