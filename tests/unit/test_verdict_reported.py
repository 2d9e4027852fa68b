"""Reported values in the per-step record, the step event, the verdict and the report: a graphed run that
differs from eager only in one value its loss function reported diverges there, named by its key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from graphdoctor.compare.verdict import find_divergence, judge
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport, load_report
from graphdoctor.protocol import EAGER, RunRecord, Step, decode, encode
from graphdoctor.protocol.steps import StepPrints, StepRecord
from graphdoctor.report.diff import render_text, write_json
from graphdoctor.report.html import render_payload
from graphdoctor.types import Verdict

NAMES = ("embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight")
LANES = (11, 12, 13, 14)  # equal main_grad and parameter fingerprints on both sides


def run(impl: str, reported: list[dict[str, float]]) -> RunRecord:
    steps = tuple(StepRecord(step=i, phase="eager" if impl == EAGER else ("capture" if i == 0 else "replay"),
                             loss=2.5 - 0.1 * i, step_time_ms=3.0, prints=StepPrints(grads=LANES, params=LANES),
                             reported=tuple(values.items()))
                  for i, values in enumerate(reported))
    return RunRecord(impl=impl, dropout=0.0, status="ok", steps=steps, tensor_names=NAMES)


EAGER_VALUES = [{"lm loss": 2.5, "z loss": 0.125}, {"lm loss": 2.4, "z loss": 0.25}, {"lm loss": 2.3, "z loss": 0.5}]


def test_records_differing_only_in_one_reported_value_diverge_at_that_key() -> None:
    graphed_values = [dict(v) for v in EAGER_VALUES]
    graphed_values[1]["z loss"] = 0.375
    reference, graphed = run(EAGER, EAGER_VALUES), run("local", graphed_values)
    result = judge(reference, graphed, warmup_steps=0)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE
    div = result.divergence
    assert div is not None
    assert (div.step, div.what, div.key, div.tensor) == (1, "reported", "z loss", None)
    assert div.label == "reported 'z loss'"
    assert div.max_abs == pytest.approx(0.125) and div.max_rel == pytest.approx(0.5)
    assert div.loss_max_abs == 0.0
    assert find_divergence(reference, graphed, rtol=0.6) is None  # within tolerance: no divergence


def test_a_key_only_one_side_reported_is_a_divergence() -> None:
    graphed_values = [dict(v) for v in EAGER_VALUES]
    del graphed_values[2]["z loss"]
    div = find_divergence(run(EAGER, EAGER_VALUES), run("full_iteration", graphed_values))
    assert div is not None and (div.step, div.what, div.key) == (2, "reported", "z loss")


def test_a_differing_loss_comes_first_and_still_names_the_differing_key() -> None:
    graphed = run("local", [dict(v, **{"z loss": 9.0}) for v in EAGER_VALUES])
    graphed = dataclasses.replace(graphed, steps=(dataclasses.replace(graphed.steps[0], loss=7.0),
                                                  *graphed.steps[1:]))
    div = find_divergence(run(EAGER, EAGER_VALUES), graphed)
    assert div is not None and (div.step, div.what, div.key) == (0, "loss", "z loss")
    assert div.label == "loss"


def test_nan_reported_on_both_sides_is_equal() -> None:
    values = [{"lm loss": float("nan")}] * 2
    assert find_divergence(run(EAGER, values), run("local", values)) is None


def test_the_step_event_and_the_json_carry_the_reported_values(tmp_path: Path) -> None:
    record = run(EAGER, EAGER_VALUES).steps[1]
    back = decode(encode(Step(record=record)))
    assert isinstance(back, Step) and back.record == record
    assert record.to_dict()["reported"] == {"lm loss": 2.4, "z loss": 0.25}
    assert StepRecord.from_dict(record.to_dict()).reported == (("lm loss", 2.4), ("z loss", 0.25))
    # A step of a report written before reported values existed loads with none.
    old = {k: v for k, v in record.to_dict().items() if k != "reported"}
    assert StepRecord.from_dict(old).reported == ()


def test_the_report_names_the_key_in_text_json_and_html(tmp_path: Path) -> None:
    graphed_values = [dict(v) for v in EAGER_VALUES]
    graphed_values[2]["lm loss"] = 2.25
    reference, graphed = run(EAGER, EAGER_VALUES), run("local", graphed_values)
    result = judge(reference, graphed, warmup_steps=0)
    report = DiffReport(config=DiffConfig(impls=("local",), dropout=0.0, steps=3, cuda_graph_warmup_steps=1), results=(result,),
                        reference=reference)
    text = render_text(report)
    assert "step 2 reported 'lm loss'" in text and "numeric-divergence FAIL" in text
    path = write_json(report, tmp_path / "report.json")
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["impls"][0]["first_divergence"]["key"] == "lm loss"
    assert saved["reference"]["steps"][2]["reported"] == {"lm loss": 2.3, "z loss": 0.5}
    loaded = load_report(path)
    assert loaded.results[0].divergence == result.divergence
    assert loaded.reference.steps[2].reported == (("lm loss", 2.3), ("z loss", 0.5))
    assert "step 2, reported &#x27;lm loss&#x27;" in render_payload(saved)
