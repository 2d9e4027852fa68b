"""GD515 on real H200 records: a drop-and-pad MoE GPT under `local` whole-layer graphs whose loss,
gradients and parameters are bitwise equal at every step, and whose MoE tracker values differ only at
the capture step (Megatron's warmup and capture passes add to the aux-loss tracker), is a `match`
with a GD515 note; any other difference stays a divergence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from graphdoctor.compare.phases import find_capture_logged_values
from graphdoctor.compare.verdict import judge
from graphdoctor.diff import load_report
from graphdoctor.protocol import RunRecord
from graphdoctor.rules import get_rule
from graphdoctor.rules.finding import Severity
from graphdoctor.types import TensorDiff, Verdict

REPORT = (Path(__file__).resolve().parents[2] / "fixtures" / "data" / "moe"
          / "h200_drop_pad_local_capture_tracker.json")


def recorded() -> tuple[RunRecord, RunRecord, int]:
    """The eager reference and the graphed run of the H200 report, and its cuda_graph_warmup_steps."""
    report = load_report(REPORT)
    (row,) = report.results
    return report.reference, row.runs[0], report.config.cuda_graph_warmup_steps


def with_step(run: RunRecord, step: int, **changes: object) -> RunRecord:
    """`run` with one step's fields replaced."""
    steps = tuple(dataclasses.replace(s, **changes) if s.step == step else s for s in run.steps)  # type: ignore[arg-type]
    return dataclasses.replace(run, steps=steps)


def with_reported(run: RunRecord, step: int, key: str, value: float) -> RunRecord:
    rec = next(s for s in run.steps if s.step == step)
    return with_step(run, step, reported=tuple((k, value if k == key else v) for k, v in rec.reported))


def test_the_record_differs_only_in_tracker_values_at_the_capture_step() -> None:
    reference, graphed, _ = recorded()
    assert [s.phase for s in graphed.steps] == ["capture"] + ["replay"] * 5
    assert [s.loss for s in graphed.steps] == [s.loss for s in reference.steps]
    values = find_capture_logged_values(reference, graphed)
    assert [(v.key, v.step) for v in values] == [("tracker/z_loss", 0), ("tracker/load_balancing_loss", 0)]
    z_loss = values[0]
    assert round(z_loss.eager, 4) == 4.0697 and round(z_loss.graphed, 4) == 11.7569
    assert z_loss.ratio is not None and round(z_loss.ratio, 3) == 2.889


def test_capture_only_tracker_values_are_a_match_with_a_gd515_note() -> None:
    reference, graphed, warmup = recorded()
    result = judge(reference, graphed, warmup_steps=warmup)
    assert result.verdict == Verdict.MATCH and result.divergence is None, result
    notes = [n for n in result.notes if n.startswith("GD515 logged-value-at-capture")]
    assert len(notes) == 2, result.notes
    assert "'tracker/z_loss' at step 0" in notes[0] and "eager 4.069681167602539" in notes[0]
    assert "graphed 11.756929397583008" in notes[0] and "ratio 2.889" in notes[0]
    assert "'tracker/load_balancing_loss' at step 0" in notes[1] and "ratio 2.970" in notes[1]
    assert result.to_dict(include_steps=False)["notes"] == list(result.notes)
    assert result.timing is not None and result.timing.graphed_ms is not None


def test_gd515_is_an_info_runtime_rule_so_a_match_keeps_exit_code_0() -> None:
    rule = get_rule("GD515")
    assert rule.runtime and rule.name == "logged-value-at-capture" and rule.severity is Severity.INFO
    assert Verdict.MATCH.passed


def test_a_tracker_value_that_differs_at_a_replay_step_stays_a_divergence() -> None:
    reference, graphed, warmup = recorded()
    replay = next(s for s in graphed.steps if s.step == 3)
    z_loss = dict(replay.reported)["tracker/z_loss"]
    result = judge(reference, with_reported(graphed, 3, "tracker/z_loss", z_loss * 1.5), warmup_steps=warmup)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE, result
    assert result.divergence is not None and result.divergence.step == 0  # the first difference, as before
    assert result.divergence.key == "tracker/z_loss"
    assert not [n for n in result.notes if n.startswith("GD515")]


def test_a_loss_difference_at_the_capture_step_stays_a_divergence() -> None:
    reference, graphed, warmup = recorded()
    capture = graphed.steps[0]
    changed = with_step(graphed, 0, loss=capture.loss + 1e-3,
                        reported=tuple((k, capture.loss + 1e-3 if k == "lm loss" else v) for k, v in capture.reported))
    result = judge(reference, changed, warmup_steps=warmup)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE, result
    assert result.divergence is not None and (result.divergence.step, result.divergence.what) == (0, "loss")


def test_a_gradient_difference_at_the_capture_step_stays_a_divergence() -> None:
    reference, graphed, warmup = recorded()
    grads = graphed.steps[0].grads
    assert grads is not None and grads.equal
    name = graphed.tensor_names[0] if graphed.tensor_names else "decoder.layers.0.mlp.router.weight"
    unequal = TensorDiff(num_tensors=grads.num_tensors, num_unequal=1, max_abs=0.0, max_rel=0.0,
                         first_tensor=name, measured=False)
    result = judge(reference, with_step(graphed, 0, grads=unequal), warmup_steps=warmup)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE, result
    assert result.divergence is not None and result.divergence.step == 0
    assert not [n for n in result.notes if n.startswith("GD515")]
