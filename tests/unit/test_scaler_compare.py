"""fp16's loss scaler in the comparison, on a diff recorded on the H200 (fixtures/data/holders/fp16_dynamic.json.gz:
graphdoctor's 4 x 256 GPT in fp16 for 30 steps with Megatron's dynamic scaler, local and full_iteration): the
verdicts, first differences and notes derived again from the recorded runs."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.compare.scaler import scaler_notes, step_ranges
from graphdoctor.compare.verdict import find_divergence, judge
from graphdoctor.memory.leaks import replay_slope
from graphdoctor.protocol.record import RunRecord
from graphdoctor.types import Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "holders"


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    with gzip.open(DATA / "fp16_dynamic.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _runs(report: dict[str, Any], impl: str) -> tuple[RunRecord, RunRecord]:
    row = next(r for r in report["impls"] if r["impl"] == impl)
    return RunRecord.from_dict(report["reference"]), RunRecord.from_dict(row["runs"][0])


def test_the_recorded_runs_skip_the_early_steps_in_both(report: dict[str, Any]) -> None:
    reference, graphed = _runs(report, "local")
    skipped = [s.step for s in reference.steps if s.skipped]
    assert skipped == list(range(15)), skipped  # Megatron's scaler: 2^32 backed off to 2^18
    assert reference.steps[0].loss_scale == 2.0 ** 32 and reference.steps[14].loss_scale == 2.0 ** 18
    assert [s.step for s in graphed.steps if s.skipped] == skipped


def test_local_matches_with_its_skipped_steps_named(report: dict[str, Any]) -> None:
    reference, graphed = _runs(report, "local")
    result = judge(reference, graphed, warmup_steps=2)
    assert result.verdict == Verdict.MATCH, result.divergence
    assert result.notes[0].startswith("steps 0-14 skipped by the loss scaler in both runs"), result.notes


def test_full_iteration_first_differs_at_the_first_real_update(report: dict[str, Any]) -> None:
    reference, graphed = _runs(report, "full_iteration")
    div = find_divergence(reference, graphed)
    assert div is not None and (div.step, div.what, div.key) == (15, "skipped", "eager updated, graphed skipped")
    assert div.label == "loss-scaler skip (eager updated, graphed skipped)"
    notes = scaler_notes(reference, graphed)
    assert "step 15 skipped by the loss scaler in full_iteration only (eager updated)" in notes, notes
    # Step 3 was measured element by element (the first step whose fingerprints differ): the graph scaled the loss
    # by the scale it captured, so fp16 overflowed at other places. A non-finite pattern that differs on a step
    # both runs discarded is its own note, not the first divergence.
    measured = next(s for s in graphed.steps if s.step == 3).grads
    assert measured is not None and measured.measured and measured.max_abs == float("inf")
    assert any(n.startswith("steps 3, 5, 7, 9, 11, 13: both runs skipped and discarded their main_grads") and
               "measured at step 3: non-finite values" in n for n in notes), notes


def test_skipped_steps_gradients_would_count_without_the_loss_scaler_semantics(report: dict[str, Any]) -> None:
    """The same runs read as if no step were skipped: the first difference moves back to a step both discarded."""
    reference, graphed = _runs(report, "full_iteration")
    unskipped = [dataclasses.replace(r, steps=tuple(dataclasses.replace(s, skipped=False) for s in r.steps))
                 for r in (reference, graphed)]
    div = find_divergence(*unskipped)
    assert div is not None and div.what == "grads" and div.step < 15, div


def test_step_ranges() -> None:
    assert step_ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3, 7, 9-10"
    assert step_ranges([]) == ""


def test_replay_slope_leaves_a_one_off_allocation_out() -> None:
    mib = 1 << 20
    one_off = [100 * mib] * 14 + [128 * mib] * 16
    gained, note = replay_slope(one_off, 65536)
    assert gained == 0.0 and "one step gained 28.0 MiB once" in note, note
    leak = [100 * mib + i * mib for i in range(30)]
    assert replay_slope(leak, 65536)[0] == mib
    every_other = [100 * mib + (i // 2) * mib for i in range(30)]
    assert replay_slope(every_other, 65536)[0] > 0.4 * mib


def test_measured_comparison_takes_equal_infinities_and_canonical_nans_as_equal() -> None:
    import torch

    from graphdoctor.compare.reduce import FlatLayout, SegmentIndex, compare_flat

    expected = torch.tensor([1.0, float("inf"), float("nan"), -float("inf")], dtype=torch.float16)
    other_nan = expected.clone().view(torch.int16)
    other_nan[2] = other_nan[2] ^ 1  # another NaN payload at the same place
    actual = other_nan.view(torch.float16)
    index = SegmentIndex(FlatLayout(("a", "b"), (2, 2)), torch.device("cpu"))
    loose = compare_flat(actual, expected, index)
    assert loose.num_unequal == 1 and loose.max_abs == 0.0  # bitwise: the NaN's bits differ, no magnitude
    canonical = compare_flat(actual, expected, index, canonical_nan=True)
    assert canonical.equal and canonical.max_abs == 0.0
    moved = expected.clone()
    moved[0] = float("nan")
    assert compare_flat(moved, expected, index, canonical_nan=True).max_abs == float("inf")
