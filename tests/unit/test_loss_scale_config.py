"""fp16's loss scaling reaching DiffConfig (graphdoctor.config): a Megatron-Bridge dump's optimizer fp16 and static
loss scale as its mixed_precision leaves them (what `check`'s GD312 reads, BridgeGuards), under the explicit
values; and a loss scale beside another dtype, which has no effect, warned of and dropped (the launch-line side is
in test_megatron_line.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.config.bridge import read_bridge
from graphdoctor.config.child_model import child_model

REPO = Path(__file__).resolve().parents[2]
BRIDGE = REPO / "fixtures" / "bridge" / "llama_te_graphs.yaml"
"""A bf16 Llama dump (test_model_sources.py); the cases below set its optimizer's fp16 loss scaling."""
OPTIMIZER = "optimizer:\n  _target_: megatron.core.optimizer.optimizer_config.OptimizerConfig\n"
NO_EFFECT = r"^loss_scale: got 4096\.0 with dtype bf16, expected dtype fp16 \(only fp16 scales the loss\)"


def bridge_file(tmp_path: Path, optimizer: str = "", tail: str = "") -> Path:
    """The dump with `optimizer` lines added to its optimizer section and `tail` sections after it."""
    text = BRIDGE.read_text(encoding="utf-8")
    assert text.count(OPTIMIZER) == 1
    path = tmp_path / "bridge.yaml"
    path.write_text(text.replace(OPTIMIZER, OPTIMIZER + optimizer) + tail, encoding="utf-8")
    return path


@pytest.mark.parametrize(("optimizer", "tail", "dtype", "loss_scale"), [
    ("  fp16: true\n  bf16: false\n  loss_scale: 4096\n", "", "fp16", 4096.0),
    ("  fp16: true\n  bf16: false\n", "", "fp16", None),  # Megatron's dynamic scaler
    ("  fp16: true\n  loss_scale: 0\n", "", "fp16", None),  # 0 is the dynamic scaler too (`if config.loss_scale`)
    ("", "mixed_precision:\n  fp16: true\n  bf16: false\n  loss_scale: 1024.0\n", "fp16", 1024.0),
    # the recipe's fields (loss_scale None) are written over the optimizer's by MixedPrecisionConfig.setup
    ("  loss_scale: 4096\n", "mixed_precision: fp16_mixed\n", "fp16", None),
    ("  fp16: false\n  bf16: true\n  loss_scale: null\n", "", "bf16", None),  # a bf16 dump writes every field
], ids=["optimizer-static", "optimizer-dynamic", "optimizer-zero", "mapping-static", "recipe-over-optimizer",
        "bf16-dump"])
def test_bridge_fp16_loss_scaling_reaches_diff_config(tmp_path: Path, optimizer: str, tail: str, dtype: str,
                                                      loss_scale: float | None) -> None:
    path = bridge_file(tmp_path, optimizer, tail)
    config = diff_config_from(load_run_file(path))
    assert (config.dtype, config.loss_scale) == (dtype, loss_scale)
    guards = read_bridge(path).guards
    assert guards.loss_scale == loss_scale  # the static loss scale `check` (GD312) reads is the one diff trains with
    graphed = child_model(config, "transformer_engine", config.dropout)
    assert (graphed.value("fp16"), graphed.value("bf16")) == (dtype == "fp16", dtype == "bf16")


def test_bridge_notes_say_what_diff_takes_of_the_optimizer_and_the_recipe(tmp_path: Path) -> None:
    notes = read_bridge(bridge_file(tmp_path, "  fp16: true\n  loss_scale: 4096\n")).not_applied
    assert "optimizer (all but fp16 and loss_scale)" in notes and "optimizer" not in notes
    assert "optimizer" in read_bridge(BRIDGE).not_applied  # sets neither
    recipe = read_bridge(bridge_file(tmp_path, "  loss_scale: 4096\n", "mixed_precision: fp16_mixed\n")).not_applied
    assert "optimizer" in recipe  # the recipe writes its own loss scale over the optimizer's
    assert not any(note.startswith("mixed_precision") for note in recipe)  # the recipe is applied, not skipped
    applied = read_bridge(bridge_file(tmp_path, "", "mixed_precision: fp16_mixed\n")).transformer
    assert (applied["fp16"], applied["bf16"]) == (True, False)  # Bridge's fp16_mixed, written over the model's


def test_explicit_values_sit_over_the_bridge_loss_scaling(tmp_path: Path) -> None:
    run_file = load_run_file(bridge_file(tmp_path, "  fp16: true\n  loss_scale: 4096\n"))
    assert diff_config_from(run_file, loss_scale=512.0).loss_scale == 512.0
    with pytest.warns(UserWarning, match=NO_EFFECT):
        config = diff_config_from(run_file, dtype="bf16")
    assert (config.dtype, config.loss_scale) == ("bf16", None)
    static = load_run_file(bridge_file(tmp_path, "  fp16: true\n"))
    assert diff_config_from(static, loss_scale=4096).loss_scale == 4096


def test_a_loss_scale_beside_another_dtype_warns_at_the_caller_and_is_dropped() -> None:
    with pytest.warns(UserWarning, match=NO_EFFECT) as caught:
        config = DiffConfig(dtype="bf16", loss_scale=4096.0)
    assert len(caught) == 1 and caught[0].filename == __file__  # the line that built the config
    assert config.loss_scale is None and DiffConfig.from_dict(config.to_dict()).loss_scale is None
    with pytest.warns(UserWarning, match=r"^loss_scale: got 8 with dtype fp32, expected dtype fp16"):
        DiffConfig(loss_scale=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DiffConfig(dtype="fp16", loss_scale=4096.0).loss_scale == 4096.0
        assert DiffConfig(dtype="bf16").loss_scale is None
