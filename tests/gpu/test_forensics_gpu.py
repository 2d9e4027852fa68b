"""RNG and dropout forensics on a real GPU with real Megatron-Core models (issue 5 acceptance).

Set GD_REPORT_DIR to keep each diff's JSON report (the closing note and docs/forensics.md quote them).
"""

from __future__ import annotations

import pytest
from kept import keep

from fixtures.planted.markers import marked_line
from graphdoctor.config import DiffConfig
from graphdoctor.diff import diff
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 512, "steps": 6, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0,
         "memory": False, "launches": False}




def test_host_drawn_mask_is_frozen_rng_at_its_module() -> None:
    report = diff(DiffConfig(impls=("local",), dropout=0.0,
                             layer_spec="fixtures.planted.host_mask_dropout:layer_spec", **SMALL))
    keep(report, "frozen_host_mask")
    local = report.results[0]
    assert local.verdict == Verdict.FROZEN_RNG, local
    diag = local.diagnosis
    assert diag is not None and diag.module is not None and diag.module.endswith(".mlp"), diag
    assert diag.rule == "GD506"
    assert diag.location is not None
    assert diag.location.endswith(f"host_mask_dropout.py:{marked_line('host_mask_dropout', 'GD506') + 1}")
    assert report.exit_code() == 1


def test_reassigned_scale_is_numeric_divergence_localized_to_its_layer() -> None:
    report = diff(DiffConfig(impls=("local",), dropout=0.0,
                             layer_spec="fixtures.planted.reassigned_scale:layer_spec", **SMALL))
    keep(report, "numeric_reassigned_scale")
    local = report.results[0]
    assert local.verdict == Verdict.NUMERIC_DIVERGENCE, local
    diag = local.diagnosis
    # The cause (GD509, seen while capturing at step 0) is the diagnosis; the taps' localization, the layer's
    # output at the first replay, is its meaning.
    assert diag is not None and diag.rule == "GD509" and (diag.step, diag.phase) == (0, "capture"), diag
    assert diag.module == "decoder.layers.0.mlp", diag
    assert diag.meaning is not None and "the output of decoder.layers.0.mlp" in diag.meaning and "at step 1" in diag.meaning
    assert local.forensics is not None and local.forensics.frozen == ()
    first = local.forensics.first_numeric_divergence
    assert first is not None and (first.module, first.step) == ("decoder.layers.0.mlp", 1), first


@pytest.mark.without_te
def test_clean_dropout_is_rng_divergence_only_and_aligned_rng_matches_bitwise() -> None:
    base = DiffConfig(impls=("local",), dropout=0.1, localize=True, **SMALL)
    shifted = diff(base)
    keep(shifted, "clean_dropout_local")
    local = shifted.results[0]
    assert local.verdict == Verdict.RNG_DIVERGENCE, local
    assert local.forensics is not None
    assert local.forensics.frozen == ()
    assert local.forensics.first_numeric_divergence is None
    assert local.forensics.first_draw_mismatch is not None
    assert any("GD401" in note for note in local.notes), local.notes
    aligned = diff(base.replace(align_rng=True))
    keep(aligned, "clean_dropout_local_aligned")
    result = aligned.results[0]
    assert result.verdict == Verdict.MATCH, result
    assert result.divergence is None
    assert result.forensics is not None and result.forensics.rng_aligned is True
