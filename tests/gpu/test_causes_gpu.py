"""Every numeric divergence named with its cause on a real GPU: the planted cause fixtures (one or more per
cause) each give their rule, module and marked line; the older planted fixtures keep their verdicts and now
name their cause too; clean models (dropout 0 and 0.1, with evaluation, micro-batches and resume) give no
cause and no finding above info."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kept import diff

from fixtures.planted.markers import marked_location
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.report.diff import render_text
from graphdoctor.rules import get_rule, rule_fix
from graphdoctor.types import Verdict

pytestmark = [pytest.mark.gpu, pytest.mark.without_te]

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 512, "steps": 6, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0}
SCHEDULE = {"eval_interval": 3, "eval_iters": 2, "num_microbatches": 4}


def _run(impls: tuple[str, ...], fixture: str, *, layer_spec: bool = False, forward_step: bool = False,
         **extra: Any) -> DiffReport:
    config = DiffConfig(impls=impls, dropout=0.0, **{**SMALL, **extra},
                        layer_spec=f"fixtures.planted.{fixture}:layer_spec" if layer_spec else None,
                        forward_step=f"fixtures.planted.{fixture}:forward_step" if forward_step else None)
    return diff(config)


def _named(report: DiffReport, impl: str, rule: str, fixture: str, marker: str) -> Any:
    """The row of `impl`: a numeric divergence whose diagnosis names `rule` at the fixture's marked line, with
    the rule's fix, in the JSON (causes) and the terminal summary."""
    row = next(r for r in report.results if r.impl == impl)
    assert row.verdict == Verdict.NUMERIC_DIVERGENCE, row
    diag = row.diagnosis
    assert diag is not None and diag.rule == rule, (diag, row.notes)
    assert diag.location == marked_location(fixture, marker), diag
    assert diag.fix == rule_fix(rule)
    explained = [c for c in row.causes if c.explains]
    assert len(explained) == 1 and explained[0].location == diag.location, row.causes
    data = row.to_dict(include_steps=False)
    assert any(c["explains"] and c["location"] == diag.location for c in data["causes"])
    text = render_text(report)
    assert diag.location in text and f"[{rule}]" in text, text
    return row


def test_tensor_rebound_by_the_training_loop_is_gd509_at_the_rebinding_line() -> None:
    report = _run(("local",), "cause_rebound_gain", layer_spec=True, forward_step=True)
    row = _named(report, "local", "GD509", "cause_rebound_gain", "GD509")
    assert row.diagnosis.module.endswith(".mlp"), row.diagnosis


def test_python_number_read_in_a_graphed_forward_is_gd518_at_the_read() -> None:
    report = _run(("local",), "cause_host_temperature", layer_spec=True, forward_step=True)
    row = _named(report, "local", "GD518", "cause_host_temperature", "GD518")
    assert row.diagnosis.module.endswith(".mlp")
    assert row.diagnosis.also_at and row.diagnosis.also_at[0].startswith("fixtures/planted/cause_host_temperature.py:")


def test_branch_on_capture_state_is_gd519_at_the_branch() -> None:
    report = _run(("local",), "cause_capture_branch", layer_spec=True)
    row = _named(report, "local", "GD519", "cause_capture_branch", "GD519")
    assert row.diagnosis.module.endswith(".mlp")


def test_hook_keeping_graph_outputs_is_gd520_at_its_registration() -> None:
    report = _run(("local",), "cause_kept_activation", forward_step=True, num_microbatches=4)
    row = _named(report, "local", "GD520", "cause_kept_activation", "GD520")
    assert row.divergence.what == "reported" and row.divergence.key == "kept norm", row.divergence
    assert row.diagnosis.module == "decoder.final_layernorm", row.diagnosis


def test_backward_hook_keeping_gradients_is_gd520_at_its_registration() -> None:
    report = _run(("local",), "cause_kept_backward", forward_step=True, num_microbatches=4)
    row = _named(report, "local", "GD520", "cause_kept_backward", "GD520")
    assert (row.divergence.what, row.divergence.key) == ("reported", "grad norm"), row.divergence
    assert row.diagnosis.module == "embedding", row.diagnosis


def test_evaluation_replaying_the_training_graph_is_gd402_at_the_mode_test() -> None:
    report = _run(("local", "full_iteration"), "cause_eval_grad_mode", layer_spec=True, **SCHEDULE)
    row = _named(report, "local", "GD402", "cause_eval_grad_mode", "GD402")
    assert row.divergence.what == "eval", row.divergence
    assert any("megatron/core/transformer/cuda_graphs.py" in a for a in row.diagnosis.also_at), row.diagnosis
    assert next(r for r in report.results if r.impl == "full_iteration").verdict == Verdict.MATCH


def test_logged_value_filled_at_capture_is_gd513_at_the_fill() -> None:
    report = _run(("full_iteration",), "cause_frozen_fill", forward_step=True, **SCHEDULE)
    row = _named(report, "full_iteration", "GD513", "cause_frozen_fill", "GD513")
    assert (row.divergence.what, row.divergence.key) == ("reported", "tokens seen"), row.divergence


@pytest.mark.parametrize(("fixture", "kind", "impl", "rule", "marker"), [
    ("reassigned_scale", "layer_spec", "local", "GD509", "GD509"),
    ("schedule_eval_mode_mlp", "layer_spec", "local", "GD402", "GD514"),
    ("schedule_frozen_metric", "forward_step", "full_iteration", "GD513", "GD513"),
])
def test_older_planted_fixtures_keep_their_verdict_and_name_their_cause(fixture: str, kind: str, impl: str,
                                                                         rule: str, marker: str) -> None:
    extra = SCHEDULE if fixture.startswith("schedule") else {}
    report = _run((impl,), fixture, layer_spec=kind == "layer_spec", forward_step=kind == "forward_step", **extra)
    _named(report, impl, rule, fixture, marker)


def test_older_grad_alias_fixture_names_the_hook_on_the_embedding() -> None:
    report = _run(("local",), "schedule_grad_alias", forward_step=True, **SCHEDULE)
    row = next(r for r in report.results if r.impl == "local")
    assert row.verdict == Verdict.NUMERIC_DIVERGENCE and row.divergence.tensor == "embedding.word_embeddings.weight"
    diag = row.diagnosis
    assert diag is not None and diag.rule == "GD520" and diag.module == "embedding", (diag, row.notes)
    assert diag.location is not None and diag.location.startswith("fixtures/planted/schedule_grad_alias.py:")


def test_full_iteration_legacy_stream_work_names_module_and_line() -> None:
    report = _run(("full_iteration",), "default_stream_mlp", layer_spec=True)
    (row,) = report.results
    assert row.verdict == Verdict.CAPTURE_FAILED, row
    assert row.diagnosis is not None and row.diagnosis.rule == "GD503", row.diagnosis
    assert row.diagnosis.location == marked_location("default_stream_mlp", "GD503"), (row.diagnosis, row.notes)
    assert row.diagnosis.module is not None and row.diagnosis.module.endswith(".mlp"), row.diagnosis


def _above_info(report: DiffReport) -> list[str]:
    """Runtime findings above info in a report: causes, and notes that cite a runtime rule that is not info."""
    out = []
    for row in report.results:
        out += [f"{row.impl}: cause {c.rule}" for c in row.causes]
        for note in row.notes:
            code = note.split(" ", 1)[0]
            if code.startswith("GD5") and get_rule(code).severity.value != "info":
                out.append(f"{row.impl}: {note}")
        assert "refuses module hooks" not in " ".join(row.notes), row.notes  # no TE note without TE
    return out


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_clean_model_with_every_phase_gives_no_cause(dropout: float, tmp_path: Path) -> None:
    config = DiffConfig(impls=("local", "full_iteration"), dropout=dropout, save_at=4, resume=True,
                        localize=True, **SCHEDULE, **{**SMALL, "steps": 8})
    report = diff(config, workdir=tmp_path)
    expected = Verdict.MATCH if dropout == 0.0 else None
    for row in report.results:
        if expected is not None:
            assert row.verdict == expected, row
        else:
            assert row.verdict in (Verdict.MATCH, Verdict.RNG_DIVERGENCE), row
            assert not any(n.startswith("GD514") for n in row.notes), row.notes
    assert _above_info(report) == []
