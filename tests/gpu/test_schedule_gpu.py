"""The run schedule end to end on a real GPU: evaluation between steps and a final one, gradient
accumulation over micro-batches, a checkpoint save and a resume in a fresh process, and the planted
schedule fixtures (a mode-dependent module under graphs that evaluation reuses, micro-batch gradient
aliasing, a logged value frozen at capture, a parameter only a recompute uses), each found with its
phase and where."""

from __future__ import annotations

from pathlib import Path

import pytest
from kept import diff

from fixtures.planted.markers import marked_line
from graphdoctor.compare.phases import phase_list
from graphdoctor.config import DiffConfig
from graphdoctor.report.diff import render_text
from graphdoctor.types import Verdict

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 512, "steps": 7, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0}
SCHEDULE = {"eval_interval": 3, "eval_iters": 2, "num_microbatches": 4}


@pytest.mark.without_te
def test_clean_schedule_matches_eager_with_every_phase_listed() -> None:
    report = diff(DiffConfig(impls=("local", "full_iteration"), dropout=0.0, **SCHEDULE, **SMALL))
    assert [r.verdict for r in report.results] == [Verdict.MATCH, Verdict.MATCH], report.results
    reference = report.reference
    assert [(e.index, e.after_step, e.final) for e in reference.evals] == [(0, 2, False), (1, 5, False), (2, 6, True)]
    for result in report.results:
        run = result.runs[0]
        assert [e.loss for e in run.evals] == [e.loss for e in reference.evals]
        assert {"replay", "eval"} <= set(phase_list(run))
        # the first training step after each evaluation is a replay, compared like every other
        assert all(s.phase == "replay" for s in run.steps if s.step in (3, 6))
    text = render_text(report)
    assert "eval" in text and "phases" in text
    assert report.exit_code() == 0


@pytest.mark.without_te
def test_clean_schedule_with_checkpoint_resume_matches_eager_with_every_phase_listed(tmp_path: Path) -> None:
    # The acceptance command: --eval-interval 3 --eval-iters 2 --save-at 4 --resume --num-microbatches 4,
    # 8 steps (the default): the first process trains steps 0-3 and saves; the resumed one loads and trains
    # 4-7 (local captures again at 4; full_iteration warms up at 4-5, captures at 6, replays at 7).
    config = DiffConfig(impls=("local", "full_iteration"), dropout=0.0, save_at=4, resume=True,
                        **SCHEDULE, **{**SMALL, "steps": 8})
    report = diff(config, workdir=tmp_path)
    assert [r.verdict for r in report.results] == [Verdict.MATCH, Verdict.MATCH], report.results
    reference = report.reference
    assert [(e.index, e.after_step, e.final) for e in reference.evals] == [(0, 2, False), (1, 5, False), (2, 7, True)]
    expected = {"eager": ["eager"] * 4, "local": ["capture", "replay", "replay", "replay"],
                "full_iteration": ["warmup", "warmup", "capture", "replay"]}
    runs = [reference] + [r.runs[0] for r in report.results]
    for run in runs:
        assert [(c.action, c.iteration) for c in run.checkpoints] == [("save", 4), ("load", 4)], run.checkpoints
        compared = [s for s in run.steps if not s.profiled]
        assert [s.step for s in compared] == list(range(8))
        assert [s.step for s in compared if s.resumed] == [4, 5, 6, 7]
        assert [s.phase for s in compared if s.resumed] == expected[run.impl], run.impl
        assert {"checkpoint", "resume", "eval"} <= set(phase_list(run)), phase_list(run)
        assert [e.loss for e in run.evals] == [e.loss for e in reference.evals]
        assert [s.loss for s in compared] == [s.loss for s in reference.steps if not s.profiled]
    text = render_text(report)
    assert "checkpoint after step 3" in text and "resume at step 4" in text and "eval" in text
    for result in report.results:
        assert "resume" in result.to_dict()["phases"]
    # both processes of every run left their files; the checkpoints were removed; nothing left running
    assert (tmp_path / "events-local-graphed-d0-resumed.jsonl").is_file()
    assert (tmp_path / "log-eager-reference-d0-resumed.txt").is_file()
    assert not list(tmp_path.glob("checkpoint-*"))
    assert report.exit_code() == 0


@pytest.mark.without_te
def test_mode_dependent_module_under_reused_local_graphs_diverges_in_eval_only() -> None:
    config = DiffConfig(impls=("local", "full_iteration"), dropout=0.0,
                        layer_spec="fixtures.planted.schedule_eval_mode_mlp:layer_spec", **SCHEDULE, **SMALL)
    report = diff(config)
    by_impl = {r.impl: r for r in report.results}
    local = by_impl["local"]
    assert local.verdict == Verdict.NUMERIC_DIVERGENCE, local
    assert local.divergence is not None and local.divergence.what == "eval", local.divergence
    assert local.divergence.step == 2  # the first evaluation, after step 2
    note = next(n for n in local.notes if n.startswith("GD514"))
    assert "phase eval" in note and "every training step matches" in note
    assert any(n.startswith("static GD402") for n in local.notes), local.notes
    assert by_impl["full_iteration"].verdict == Verdict.MATCH, by_impl["full_iteration"]
    assert marked_line("schedule_eval_mode_mlp", "GD514") > 0


@pytest.mark.without_te
def test_microbatch_grad_aliasing_diverges_at_the_aliased_parameter() -> None:
    config = DiffConfig(impls=("local", "full_iteration"), dropout=0.0,
                        forward_step="fixtures.planted.schedule_grad_alias:forward_step", **SCHEDULE, **SMALL)
    report = diff(config)
    by_impl = {r.impl: r for r in report.results}
    local = by_impl["local"]
    assert local.verdict == Verdict.NUMERIC_DIVERGENCE, local
    div = local.divergence
    assert div is not None and (div.what, div.step) == ("grads", 1), div  # the first replay
    assert div.tensor == "embedding.word_embeddings.weight", div
    assert by_impl["full_iteration"].verdict == Verdict.MATCH, by_impl["full_iteration"]
    assert marked_line("schedule_grad_alias", "alias") > 0


def test_value_frozen_at_capture_is_a_frozen_logged_value_finding() -> None:
    config = DiffConfig(impls=("local", "full_iteration"), dropout=0.0,
                        forward_step="fixtures.planted.schedule_frozen_metric:forward_step", **SCHEDULE, **SMALL)
    report = diff(config)
    by_impl = {r.impl: r for r in report.results}
    full = by_impl["full_iteration"]
    assert full.verdict == Verdict.NUMERIC_DIVERGENCE, full
    assert full.divergence is not None and (full.divergence.what, full.divergence.key) == ("reported", "calls")
    note = next(n for n in full.notes if n.startswith("GD513"))
    assert "'calls'" in note and "phase train" in note
    # the loss itself matches at every step
    eager_losses = [s.loss for s in report.reference.steps]
    assert [s.loss for s in full.runs[0].steps] == eager_losses
    assert marked_line("schedule_frozen_metric", "GD513") > 0


@pytest.mark.without_te
def test_recompute_only_parameter_gets_no_gradient_under_local_graphs() -> None:
    config = DiffConfig(impls=("local",), dropout=0.0,
                        layer_spec="fixtures.planted.schedule_recompute_param:layer_spec", **SMALL)
    report = diff(config)
    (local,) = report.results
    assert local.verdict == Verdict.NUMERIC_DIVERGENCE, local
    div = local.divergence
    assert div is not None and div.what == "grads" and div.step >= 1, div
    assert div.tensor is not None and div.tensor.endswith("mlp.recompute_scale"), div
