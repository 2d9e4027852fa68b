"""`diff --forward-step` with every loss-function return form Megatron-Core's schedules accept, and
`--model-provider` with Megatron-LM's signature, on a real GPU (issue 15 acceptance): each matches
eager at dropout 0 under `local` and `full_iteration`; a loss function that calls .item() fails the
full-iteration capture at its own line.

Set GD_REPORT_DIR to keep each diff's JSON report for the closing note.
"""

from __future__ import annotations

import pytest
from kept import keep

from fixtures.planted.forward_forms import FORMS
from fixtures.planted.markers import marked_line
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport, diff
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 512, "steps": 6, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0,
         "memory": False, "launches": False}




def _check_reported(report: DiffReport, keys: tuple[str, ...]) -> None:
    for run in (report.reference, *(r.runs[0] for r in report.results)):
        assert run.status == "ok", run.diagnosis
        assert all(tuple(k for k, _ in s.reported) == keys for s in run.steps), [s.reported for s in run.steps]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_accepted_form_matches_under_full_iteration(form: str) -> None:
    report = diff(DiffConfig(impls=("full_iteration",), dropout=0.0,
                             forward_step=f"fixtures.planted.forward_forms:{form}", **SMALL))
    keep(report, f"forward_form_{form}_full_iteration")
    (full,) = report.results
    assert full.verdict == Verdict.MATCH, full
    _check_reported(report, FORMS[form])
    assert report.exit_code() == 0


@pytest.mark.without_te
@pytest.mark.parametrize("form", [*sorted(FORMS), "item_in_loss_func"])
def test_every_accepted_form_matches_under_local(form: str) -> None:
    report = diff(DiffConfig(impls=("local",), dropout=0.0,
                             forward_step=f"fixtures.planted.forward_forms:{form}", **SMALL))
    keep(report, f"forward_form_{form}_local")
    (local,) = report.results
    # local graphs end before the loss function: even the .item() one runs eagerly there.
    assert local.verdict == Verdict.MATCH, local
    _check_reported(report, FORMS.get(form, ("lm loss",)))


def test_item_in_a_two_tuple_loss_func_fails_the_full_iteration_capture_at_its_line() -> None:
    report = diff(DiffConfig(impls=("full_iteration",), dropout=0.0,
                             forward_step="fixtures.planted.forward_forms:item_in_loss_func", **SMALL))
    keep(report, "forward_form_item_full_iteration")
    assert report.reference.status == "ok", report.reference.diagnosis
    (full,) = report.results
    assert full.verdict == Verdict.CAPTURE_FAILED, full
    diag = full.diagnosis
    assert diag is not None and diag.location is not None
    assert diag.location.endswith(f"forward_forms.py:{marked_line('forward_forms', 'GD501')}"), diag
    assert report.exit_code() == 1


def test_megatron_lm_model_provider_signature_matches_under_full_iteration() -> None:
    report = diff(DiffConfig(impls=("full_iteration",), dropout=0.0,
                             model_provider="fixtures.planted.model_providers:megatron_lm_style", **SMALL))
    keep(report, "model_provider_megatron_lm_full_iteration")
    (full,) = report.results
    assert full.verdict == Verdict.MATCH, full
