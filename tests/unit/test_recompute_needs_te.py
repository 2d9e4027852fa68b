"""GD309 and diff's refusal: selective recompute of layernorm, moe_act or gdn_norm_out without Transformer
Engine. megatron-core 0.19.2 builds CheckpointWithoutOutput() with its default fp8=False, which it reads as
"fp8 is not None" (tensor_parallel/random.py:740) and then calls FP8GlobalStateManager, imported only with TE;
on the H200 the eager reference of `recompute_modules: [layernorm]` failed with that NameError."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.config.placement import RECOMPUTE_NEEDING_TE
from graphdoctor.installed import te_findable
from graphdoctor.parent.static import installation_refusals
from graphdoctor.rules.facts import EnvironmentFacts


def test_the_flagged_modules_are_the_ones_megatron_builds_with_the_default_fp8() -> None:
    import inspect

    from megatron.core.tensor_parallel.random import CheckpointWithoutOutput
    from megatron.core.transformer import transformer_layer
    from megatron.core.transformer.moe import experts

    assert CheckpointWithoutOutput(fp8=False).fp8 is True  # the quirk itself
    assert CheckpointWithoutOutput(fp8=None).fp8 is False
    assert "CheckpointWithoutOutput()" in inspect.getsource(transformer_layer.TransformerLayer)
    assert "CheckpointWithoutOutput()" in inspect.getsource(experts)
    assert set(RECOMPUTE_NEEDING_TE) == {"layernorm", "moe_act", "gdn_norm_out"}


def _refused(config: DiffConfig, te: str | None) -> list[str]:
    facts = EnvironmentFacts.unknown_machine().with_overrides({"te_version": te, "apex_installed": True})
    return [f.code for f in installation_refusals(config, facts)]


def test_refused_only_for_selective_recompute_of_those_modules_without_te() -> None:
    layernorm = DiffConfig(recompute_granularity="selective", recompute_modules=("layernorm", "core_attn"))
    assert _refused(layernorm, None) == ["GD309"]
    assert _refused(layernorm.replace(recompute_modules=("moe_act",)), None) == ["GD309"]
    assert _refused(layernorm, "2.20.2") == []
    assert _refused(layernorm.replace(recompute_modules=("core_attn", "mlp")), None) == []
    assert _refused(DiffConfig(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
                    None) == []


def test_recompute_set_by_the_run_file_or_the_launch_line_is_refused_too(tmp_path: Path) -> None:
    """diff's refusal reads the settings the children get, not only its own recompute flags: a run file's
    `transformer:` and a launch line's --recompute-* land there (a twin of GD309 once missed them)."""
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  recompute_granularity: selective\n  recompute_modules: [layernorm]\n",
                   encoding="utf-8")
    assert _refused(diff_config_from(load_run_file(run)), None) == ["GD309"]
    line = diff_config_from(None, megatron_args="--recompute-granularity selective --recompute-modules layernorm "
                                                "--transformer-impl local")
    assert _refused(line, None) == ["GD309"]


@pytest.mark.skipif(te_findable(), reason="Transformer Engine is installed here")
def test_diff_exits_2_with_one_line_before_any_gpu_work() -> None:
    result = CliRunner().invoke(main, ["diff", "--recompute-granularity", "selective",
                                       "--recompute-modules", "layernorm", "-q"])
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert "without Transformer Engine" in line and "FP8GlobalStateManager" in line and "(GD309)" in line


@pytest.mark.skipif(te_findable(), reason="Transformer Engine is installed here")
def test_advise_refuses_it_the_same_way() -> None:
    result = CliRunner().invoke(main, ["advise", "--recompute-granularity", "selective",
                                       "--recompute-modules", "gdn_norm_out", "-q"])
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert "selective recompute of gdn_norm_out without Transformer Engine" in line and "(GD309)" in line


def test_check_flags_it_where_the_target_has_no_te(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  recompute_granularity: selective\n  recompute_modules: [layernorm]\n",
                   encoding="utf-8")
    flagged = CliRunner().invoke(main, ["check", str(run), "--target", "te=none", "--format", "concise"])
    assert flagged.exit_code == 1, flagged.output
    assert "GD309" in flagged.output and f"{run}:2:3: GD309" in flagged.output
    clean = CliRunner().invoke(main, ["check", str(run), "--target", "te=2.20.2", "--format", "concise"])
    assert "GD309" not in clean.output


@pytest.mark.skipif(te_findable(), reason="Transformer Engine is installed here")
def test_live_count_refuses_a_run_file_that_diff_refuses(tmp_path: Path) -> None:
    """Live count builds the same model in its children: refused before any GPU work, as diff and advise are,
    not left to fail in the eager child (parent.static.refuse_before_gpu_work serves all three)."""
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  recompute_granularity: selective\n  recompute_modules: [layernorm]\n",
                   encoding="utf-8")
    result = CliRunner().invoke(main, ["count", "--config", str(run)])
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert "selective recompute of layernorm without Transformer Engine" in line and "(GD309)" in line
    assert result.stdout == ""
