"""The run schedule on the CPU: the evaluation planner, the Eval event and record round trips, the
verdict on real H200 RunRecords that differ only in an evaluation or a frozen logged value, the
tracker values read beside the reported ones, and the schedule's options on the CLI and in run files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphdoctor.child.reported import StepValues
from graphdoctor.child.schedule import TRACKER_PREFIX, EvalPoint, eval_plan, with_tracker_values
from graphdoctor.cli import main
from graphdoctor.compare.phases import find_eval_divergence, find_frozen_values, phase_list, phases_summary
from graphdoctor.compare.verdict import judge
from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.diff import load_report
from graphdoctor.errors import UsageError
from graphdoctor.parent.static import schedule_static_findings
from graphdoctor.protocol import Eval, EventWriter, RunRecord, decode, encode, read_events
from graphdoctor.types import EvalRecord, Verdict

REPORT = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff" / "h200_small_dropout0_fingerprints_schema2.json"


def recorded_pair(impl: str = "local") -> tuple[RunRecord, RunRecord]:
    """The eager reference and one graphed run of a real H200 diff (7 steps, dropout 0, matching)."""
    report = load_report(REPORT)
    graphed = next(r for r in report.results if r.impl == impl).runs[0]
    return report.reference, graphed


def with_evals(run: RunRecord, interval: int, losses: dict[int, float] | None = None) -> RunRecord:
    """`run` with the evaluations its schedule makes: each eval's loss the loss of the step it follows
    (a real figure of that run), or the value given for its index."""
    by_step = {s.step: s.loss for s in run.steps}
    evals = tuple(EvalRecord(index=p.index, after_step=p.after_step, final=p.final,
                             loss=(losses or {}).get(p.index, by_step[p.after_step]),
                             reported=(("lm loss", by_step[p.after_step]),))
                  for p in eval_plan(len(run.steps), interval))
    return dataclasses.replace(run, evals=evals)


@pytest.mark.parametrize(("steps", "interval", "expected"), [
    (8, 3, [(0, 2, False), (1, 5, False), (2, 7, True)]),
    (6, 3, [(0, 2, False), (1, 5, True)]),
    (3, 1, [(0, 0, False), (1, 1, False), (2, 2, True)]),
    (4, 10, [(0, 3, True)]),
    (8, 0, []),
])
def test_eval_plan_follows_megatron_interval_and_adds_one_final_eval(
        steps: int, interval: int, expected: list[tuple[int, int, bool]]) -> None:
    assert [(p.index, p.after_step, p.final) for p in eval_plan(steps, interval)] == expected


def test_eval_event_round_trips_through_the_events_file(tmp_path: Path) -> None:
    record = EvalRecord(index=1, after_step=5, loss=6.25, final=False,
                        reported=(("lm loss", 6.25), ("tracker/load_balancing_loss", 0.125)))
    line = encode(Eval(record=record))
    assert '"event": "eval"' in line
    assert decode(line) == Eval(record=record)
    writer = EventWriter(tmp_path / "events.jsonl")
    writer.emit(Eval(record=record))
    writer.close()
    assert read_events(tmp_path / "events.jsonl").of(Eval) == [Eval(record=record)]


def test_run_record_keeps_evals_through_json_and_old_reports_have_none() -> None:
    reference, _ = recorded_pair()
    run = with_evals(reference, 3)
    again = RunRecord.from_dict(run.to_dict())
    assert again.evals == run.evals and len(again.evals) == 3
    old = run.to_dict()
    del old["evals"]
    assert RunRecord.from_dict(old).evals == ()


@pytest.mark.parametrize("impl", ["local", "full_iteration"])
def test_real_records_with_equal_evals_match_and_list_every_phase(impl: str) -> None:
    reference, graphed = recorded_pair(impl)
    result = judge(with_evals(reference, 3), with_evals(graphed, 3), warmup_steps=2)
    assert result.verdict == Verdict.MATCH
    phases = phase_list(with_evals(graphed, 3))
    assert "eval" in phases and "replay" in phases
    summary = phases_summary(with_evals(graphed, 3))
    assert summary["evals"] == 3 and summary["steps_after_eval"] == 2


def test_real_records_differing_only_in_one_eval_loss_diverge_in_phase_eval() -> None:
    reference, graphed = recorded_pair()
    eager = with_evals(reference, 3)
    changed = with_evals(graphed, 3, losses={1: eager.evals[1].loss + 0.5})
    result = judge(eager, changed, warmup_steps=2)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE
    div = result.divergence
    assert div is not None and (div.what, div.step, div.key, div.label) == ("eval", 5, None, "eval loss")
    assert div.max_abs == pytest.approx(0.5)
    note = next(n for n in result.notes if n.startswith("GD514"))
    assert "phase eval" in note and "evaluation 1 (after step 5)" in note and "every training step matches" in note
    found = find_eval_divergence(eager, changed, atol=0.6)
    assert found is None  # within tolerance


def test_an_eval_reported_value_alone_diverges_with_its_key() -> None:
    reference, graphed = recorded_pair("full_iteration")
    eager = with_evals(reference, 3)
    last = eager.evals[-1]
    evals = (*eager.evals[:-1], dataclasses.replace(last, reported=(("lm loss", last.loss + 1.0),)))
    result = judge(eager, dataclasses.replace(with_evals(graphed, 3), evals=evals), warmup_steps=2)
    div = result.divergence
    assert div is not None and div.label == "eval 'lm loss'" and div.step == 6
    assert any("final evaluation (after step 6)" in n for n in result.notes)


def _with_logged(run: RunRecord, values: list[float]) -> RunRecord:
    steps = tuple(dataclasses.replace(s, reported=(*s.reported, ("tracker/load_balancing_loss", v)))
                  for s, v in zip(run.steps, values, strict=True))
    return dataclasses.replace(run, steps=steps)


def test_a_logged_value_frozen_over_replays_is_a_finding_with_its_key() -> None:
    reference, graphed = recorded_pair()
    eager_values = [s.loss / 10 for s in reference.steps]  # real per-step figures: all different
    frozen = [eager_values[0]] * len(graphed.steps)         # the capture step's value, replayed
    eager, ours = _with_logged(reference, eager_values), _with_logged(graphed, frozen)
    found = find_frozen_values(eager, ours)
    assert [f.key for f in found] == ["tracker/load_balancing_loss"]
    assert found[0].steps == (1, 2, 3, 4, 5)  # step 6 is the profiled step, not compared
    result = judge(eager, ours, warmup_steps=2)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE
    assert result.divergence is not None and result.divergence.key == "tracker/load_balancing_loss"
    note = next(n for n in result.notes if n.startswith("GD513"))
    assert "frozen-logged-value" in note and "phase train" in note and "'tracker/load_balancing_loss'" in note


def test_a_value_constant_on_both_sides_is_not_frozen() -> None:
    reference, graphed = recorded_pair()
    eager, ours = _with_logged(reference, [0.5] * 7), _with_logged(graphed, [0.5] * 7)
    assert find_frozen_values(eager, ours) == ()
    assert judge(eager, ours, warmup_steps=2).verdict == Verdict.MATCH


def test_tracker_values_are_appended_to_the_step_values_for_one_host_copy() -> None:
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    tracker = get_moe_metrics_tracker()
    try:
        tracker.record("load_balancing_loss", torch.tensor(0.25), layer_number=1, num_layers=2)
        tracker.record("load_balancing_loss", torch.tensor(0.5), layer_number=2, num_layers=2)
        values = with_tracker_values(StepValues(keys=("lm loss",), values=torch.tensor([2.0, 2.0])))
        assert values.keys == ("lm loss", f"{TRACKER_PREFIX}load_balancing_loss")
        assert values.host() == (2.0, (("lm loss", 2.0), ("tracker/load_balancing_loss", 0.75)))
    finally:
        tracker.metrics.pop("load_balancing_loss", None)


def test_schedule_options_reach_diff_config_from_flags_and_run_files(tmp_path: Path) -> None:
    config = diff_config_from(None, eval_interval=3, eval_iters=2, num_microbatches=4,
                              recompute_granularity="selective", recompute_modules="core_attn,mlp")
    assert (config.eval_interval, config.eval_iters, config.num_microbatches) == (3, 2, 4)
    assert config.recompute_settings() == {"recompute_granularity": "selective",
                                           "recompute_modules": ["core_attn", "mlp"]}
    assert DiffConfig.from_dict(config.to_dict()) == config
    path = tmp_path / "run.yaml"
    path.write_text("run:\n  eval_interval: 2\n  eval_iters: 1\n  recompute_granularity: full\n"
                    "  recompute_method: uniform\n  recompute_num_layers: 1\n")
    from_file = diff_config_from(load_run_file(path))
    assert from_file.recompute_settings() == {"recompute_granularity": "full", "recompute_method": "uniform",
                                              "recompute_num_layers": 1}
    assert from_file.eval_interval == 2


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("eval_interval", -1, ">= 0"), ("eval_iters", 0, ">= 1"), ("recompute_num_layers", 0, ">= 1"),
])
def test_bad_schedule_values_are_refused_with_field_and_expectation(field: str, value: int, expected: str) -> None:
    with pytest.raises(UsageError, match=f"{field}: got {value}, expected an integer {expected}"):
        DiffConfig(**{field: value})


def test_megatron_validates_recompute_settings_on_the_cpu() -> None:
    from graphdoctor.config.build import child_transformer_config as transformer_config

    config = DiffConfig(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    assert transformer_config(config, "full_iteration", 0.0).recompute_granularity == "full"
    with pytest.raises(AssertionError, match="full recompute is only supported with full iteration"):
        transformer_config(config, "local", 0.0)


def test_diff_help_lists_the_schedule_flags() -> None:
    out = CliRunner().invoke(main, ["diff", "--help"]).output
    for flag in ("--eval-interval", "--eval-iters", "--num-microbatches", "--recompute-granularity",
                 "--recompute-method", "--recompute-num-layers", "--recompute-modules"):
        assert flag in out


def test_diff_notes_the_static_schedule_rules_for_local_only() -> None:
    config = DiffConfig(eval_interval=3, dropout=0.0, recompute_granularity="selective",
                        recompute_modules=("layernorm",))
    assert sorted(f.code for f in schedule_static_findings(config, "local")) == ["GD220", "GD402"]
    assert schedule_static_findings(config, "full_iteration") == []
    assert [f.code for f in schedule_static_findings(config.replace(eval_interval=0), "local")] == ["GD220"]


def test_eval_point_is_plain_data() -> None:
    assert EvalPoint(index=0, after_step=2, final=False) == eval_plan(8, 3)[0]


def _report_with_evals(graphed_losses: dict[int, float] | None = None) -> object:
    report = load_report(REPORT)
    results = tuple(dataclasses.replace(r, runs=(with_evals(r.runs[0], 3, graphed_losses), *r.runs[1:]))
                    for r in report.results)
    return dataclasses.replace(report, reference=with_evals(report.reference, 3), results=results)


def test_terminal_summary_lists_phases_and_every_evaluation() -> None:
    from graphdoctor.report.diff import render_text

    text = render_text(_report_with_evals())  # type: ignore[arg-type]
    assert "  phases eager: eager 7; eval 3 (2 training steps right after one)" in text
    assert "  phases full_iteration: warmup 2, capture 1, replay 4; eval 3 (2 training steps right after one)" in text
    assert "eval 0 after step 2: eager " in text and "final eval after step 6" in text
    assert " | local " in text and " =" in text


def test_json_and_html_carry_the_evaluations(tmp_path: Path) -> None:
    import json

    from graphdoctor.compare.verdict import judge as judge_runs
    from graphdoctor.report.diff import write_json
    from graphdoctor.report.html import render_payload

    report = _report_with_evals({1: 1.5})
    report = dataclasses.replace(report, results=tuple(  # type: ignore[type-var]
        dataclasses.replace(r, verdict=Verdict.NUMERIC_DIVERGENCE,
                            divergence=judge_runs(report.reference, r.runs[0], warmup_steps=2).divergence)
        for r in report.results))  # type: ignore[attr-defined]
    path = tmp_path / "report.json"
    write_json(report, path)  # type: ignore[arg-type]
    payload = json.loads(path.read_text())
    runs = payload["impls"][0]["runs"]
    assert [e["after_step"] for e in runs[0]["evals"]] == [2, 5, 6]
    html = render_payload(payload)
    assert '<section id="eval">' in html and "Evaluations" in html
    assert "1.5 (differs)" in html and "(=)" in html
    assert "first difference: evaluation after step 5, its loss" in html


def test_terminal_first_divergence_names_the_evaluation() -> None:
    from graphdoctor.compare.verdict import judge as judge_runs
    from graphdoctor.report.diff import render_text

    report = _report_with_evals({1: 1.5})
    results = tuple(dataclasses.replace(r, **{f: getattr(judge_runs(report.reference, r.runs[0], warmup_steps=2), f)
                                             for f in ("verdict", "divergence", "notes")})
                    for r in report.results)  # type: ignore[attr-defined]
    text = render_text(dataclasses.replace(report, results=results))  # type: ignore[type-var]
    assert "eval loss after step 5" in text
    assert "GD514 eval-after-train-divergence: phase eval: evaluation 1 (after step 5)" in text


def test_check_reads_the_schedule_keys_of_a_run_file(tmp_path: Path) -> None:
    from graphdoctor.rules import check

    path = tmp_path / "run.yaml"
    path.write_text("run:\n  impls: [local]\n  eval_interval: 3\n  recompute_granularity: selective\n"
                    "  recompute_modules: [layernorm]\n")
    findings = [f for f in check(path).findings if f.code == "GD220"]
    assert [sorted(loc.rsplit(":", 1)[1] for loc in f.locations) for f in findings] == [["2", "4", "5"]]
    path.write_text("run:\n  eval_interval: 3\n  eval_iters: 0\n")
    with pytest.raises(UsageError, match=r"run.yaml:3: run.eval_iters: expected an integer >= 1, got 0"):
        check(path)
