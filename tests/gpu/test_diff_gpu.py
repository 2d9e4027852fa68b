"""`diff` end to end on a real GPU with real Megatron-Core models (no mocks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kept import diff

from fixtures.planted.markers import marked_line
from graphdoctor.config import DiffConfig
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 512, "steps": 6, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0}


@pytest.mark.without_te
def test_dropout_local_rng_divergence_full_iteration_match() -> None:
    report = diff(DiffConfig(impls=("local", "full_iteration"), dropout=0.1, **SMALL))
    by_impl = {r.impl: r for r in report.results}
    local, full = by_impl["local"], by_impl["full_iteration"]
    assert local.verdict == Verdict.RNG_DIVERGENCE, local
    assert local.control is not None and local.control.verdict.value == "match"
    assert local.divergence is not None and local.divergence.step >= 1
    # the fingerprints found the step; the control pair says it is the masks', so no re-run pair measures it
    assert not local.divergence.measured and local.divergence.loss_max_abs > 0, local.divergence
    assert any("not measured element by element" in note for note in local.notes), local.notes
    assert report.scratch_bytes == 0
    assert full.verdict == Verdict.MATCH, full
    assert full.timing is not None and full.timing.speedup is not None
    assert full.timing.speedup_range is not None
    assert report.exit_code() == 0
    assert report.reference.env is not None and report.reference.env.world_size == 1


@pytest.mark.without_te
def test_dropout0_matches_from_fingerprints_alone(tmp_path: Path) -> None:
    report = diff(DiffConfig(impls=("local", "full_iteration"), dropout=0.0, **SMALL), workdir=tmp_path)
    assert [r.verdict for r in report.results] == [Verdict.MATCH, Verdict.MATCH], report.results
    assert report.scratch_bytes == 0 and not list(tmp_path.rglob("*.pt"))
    for run in (report.reference, *(r.runs[0] for r in report.results)):
        assert run.tensor_names and run.num_parameters > 0
        assert all(s.prints is not None for s in run.steps if not s.profiled)


def test_item_in_mlp_is_capture_failed_with_user_line() -> None:
    config = DiffConfig(impls=("local", "full_iteration"), dropout=0.0,
                        layer_spec="fixtures.planted.item_mlp:layer_spec", **SMALL)
    report = diff(config)
    by_impl = {r.impl: r for r in report.results}
    local = by_impl["local"]
    assert local.verdict == Verdict.CAPTURE_FAILED, local
    diag = local.diagnosis
    assert diag is not None
    assert diag.location is not None
    assert diag.location.endswith(f"item_mlp.py:{marked_line('item_mlp', 'GD501')}"), diag
    assert diag.module is not None and "mlp" in diag.module
    assert diag.cuda_error == "cudaErrorStreamCaptureUnsupported"
    # The other implementation still reports its own verdict.
    assert by_impl["full_iteration"].verdict in (Verdict.CAPTURE_FAILED, Verdict.MATCH)
    assert report.exit_code() == 1
