"""`local` with an `mlp`-only scope never builds (GD240, Megatron-Bridge#4583): Megatron's own TransformerLayer
raises on this CPU as the rule says, the parent's diagnosis of that error names the rule, diff's row is setup-failed
without a child, and advise's plan refuses the candidate."""

from __future__ import annotations

import traceback
import warnings

import pytest
from click.testing import CliRunner
from graphdoctor.checks.gd2xx_local_scope import SETUP_CRASH

from graphdoctor.cli import main
from graphdoctor.compare.verdict import verdict_for_failure
from graphdoctor.config import DiffConfig
from graphdoctor.parent.diagnose import diagnose
from graphdoctor.parent.static import predicted_setup_failure
from graphdoctor.protocol.record import RunRecord
from graphdoctor.types import Verdict


def _megatron_crash() -> BaseException:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.transformer_layer import TransformerLayer

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, cuda_graph_impl="local",
                               cuda_graph_modules=["mlp"])
    with pytest.raises(AttributeError) as raised:
        TransformerLayer(config, get_gpt_layer_local_spec().submodules)
    return raised.value


def test_megatron_raises_where_the_rule_says() -> None:
    error = _megatron_crash()
    assert "has no attribute 'is_moe_layer'" in str(error)
    inside = [f for f in traceback.extract_tb(error.__traceback__) if "/megatron/" in f.filename.replace("\\", "/")]
    last = inside[-1]  # (torch's Module.__getattr__ raises it)
    assert f"megatron/{last.filename.replace(chr(92), '/').rsplit('/megatron/', 1)[-1]}:{last.lineno}" == SETUP_CRASH


def test_the_childs_crash_is_setup_failed_with_the_rule() -> None:
    error = _megatron_crash()
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(error.__traceback__)]
    diag = diagnose("AttributeError", str(error), frames, phase="setup")
    assert diag.rule == "GD240" and diag.fix and diag.fix.startswith("Use transformer_engine")
    assert verdict_for_failure(RunRecord(impl="local", dropout=0.0, status="error", diagnosis=diag)) \
        is Verdict.SETUP_FAILED


def test_diff_knows_it_before_any_child() -> None:
    row = predicted_setup_failure(DiffConfig(impls=("local",), cuda_graph_modules=("mlp",)), "local")
    assert row is not None and row.verdict is Verdict.SETUP_FAILED and not row.runs
    assert row.diagnosis is not None and (row.diagnosis.rule, row.diagnosis.location) == ("GD240", SETUP_CRASH)
    assert predicted_setup_failure(DiffConfig(impls=("local",), cuda_graph_modules=("attn",)), "local") is None
    provided = DiffConfig(impls=("local",), cuda_graph_modules=("mlp",),
                          model_provider="fixtures.planted.model_providers:megatron_lm_style")
    assert predicted_setup_failure(provided, "local") is None  # the child's own error tells (test above)


def test_advise_plan_refuses_local_mlp() -> None:
    result = CliRunner().invoke(main, ["advise", "--plan", "--impl", "local", "--num-layers", "2", "--dropout", "0"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("local mlp"))
    assert "rejected" in row and "GD240" in row


def test_diff_plan_says_the_row_is_never_started() -> None:
    result = CliRunner().invoke(main, ["diff", "--plan", "--impl", "local", "--cuda-graph-modules", "mlp",
                                       "--num-layers", "2"])
    assert result.exit_code == 1, result.output  # a row with an error-level finding
    assert "would start the eager reference and 0 graphed runs (local mlp: setup-failed from the catalogue, " \
           "never started)" in result.output
