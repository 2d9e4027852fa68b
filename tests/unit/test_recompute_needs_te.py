"""GD309 and diff's refusal: selective recompute of layernorm, moe_act or gdn_norm_out without Transformer
Engine. megatron-core 0.19.2 builds CheckpointWithoutOutput() with its default fp8=False, which it reads as
"fp8 is not None" (tensor_parallel/random.py:740) and then calls FP8GlobalStateManager, imported only with TE;
on the H200 the eager reference of `recompute_modules: [layernorm]` failed with that NameError."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.config import DiffConfig
from graphdoctor.errors import MissingDependencyError
from graphdoctor.placement import RECOMPUTE_NEEDING_TE, check_recompute_without_te, te_findable


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


def test_refused_only_for_selective_recompute_of_those_modules_without_te() -> None:
    layernorm = DiffConfig(recompute_granularity="selective", recompute_modules=("layernorm", "core_attn"))
    with pytest.raises(MissingDependencyError, match="selective recompute of layernorm needs Transformer Engine"):
        check_recompute_without_te(layernorm, te_found=False)
    with pytest.raises(MissingDependencyError, match="moe_act"):
        check_recompute_without_te(layernorm.replace(recompute_modules=("moe_act",)), te_found=False)
    check_recompute_without_te(layernorm, te_found=True)
    check_recompute_without_te(layernorm.replace(recompute_modules=("core_attn", "mlp")), te_found=False)
    check_recompute_without_te(DiffConfig(recompute_granularity="full", recompute_method="uniform",
                                          recompute_num_layers=1), te_found=False)


@pytest.mark.skipif(te_findable(), reason="Transformer Engine is installed here")
def test_diff_exits_2_with_one_line_before_any_gpu_work() -> None:
    result = CliRunner().invoke(main, ["diff", "--recompute-granularity", "selective",
                                       "--recompute-modules", "layernorm", "-q"])
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert "needs Transformer Engine" in line and "FP8GlobalStateManager" in line


def test_check_flags_it_where_the_target_has_no_te(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  recompute_granularity: selective\n  recompute_modules: [layernorm]\n",
                   encoding="utf-8")
    flagged = CliRunner().invoke(main, ["check", str(run), "--target", "te=none", "--format", "concise"])
    assert flagged.exit_code == 1, flagged.output
    assert "GD309" in flagged.output and f"{run}:2:3: GD309" in flagged.output
    clean = CliRunner().invoke(main, ["check", str(run), "--target", "te=2.20.2", "--format", "concise"])
    assert "GD309" not in clean.output
