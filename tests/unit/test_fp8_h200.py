"""FP8 under graphs, read on the CPU from diff reports recorded on the H200 with Transformer Engine 2.20.2
(fixtures/data/fp8/, written by tests/benchmarks/fp8_table.py): the FP8 state each row compared (the report keeps
the comparison and the state's layout, not the per-step lanes), the planted GD521 named again from the graphed
run's evidence at its module and marked line, the clean recipes equal, and the recipe the H200 cannot run
reported unavailable."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fixtures.planted.markers import marked_location
from graphdoctor.compare.causes import apply_causes
from graphdoctor.diff import DiffReport
from graphdoctor.report.diff import render_text
from graphdoctor.types import Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "fp8"
CLEAN = ("default-delayed-hybrid", "default-delayed-e4m3", "default-tensorwise", "llama-line")


def report(name: str) -> DiffReport:
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return DiffReport.from_dict(json.load(fh))


@pytest.mark.parametrize("name", CLEAN)
def test_clean_recipes_match_with_fp8_state_compared(name: str) -> None:
    rep = report(name)
    delayed = "delayed" in name or name == "llama-line"  # the Llama-3 line: hybrid delayed, FP8 primary weights
    weights = rep.config.fp8_param_gather
    for row in rep.results:
        graphed = row.runs[0]
        assert row.verdict == Verdict.MATCH, (row.impl, row.diagnosis)
        state = row.fp8_state
        if delayed:  # scale and amax history of every TE module, fwd and bwd, at every unprofiled step
            assert state is not None and state.equal and state.steps == len(graphed.steps) - 1
            assert len(graphed.fp8_layouts[0]) == state.tensors
            assert weights or state.tensors == 4 * state.modules
            assert not weights or any(n.endswith("weight._scale_inv") for n in graphed.fp8_layouts[0])
            assert graphed.fp8_layouts == rep.reference.fp8_layouts
        else:  # current scaling keeps no state between steps
            assert state is None and not graphed.fp8_layouts
        assert not [c for c in row.causes if c.severity in ("error", "warning")]


def test_planted_scale_reset_is_found_at_its_module_and_line() -> None:
    rep = report("planted-gd521")
    expected = marked_location("fp8_scale_reset", "GD521")
    for row in rep.results:
        graphed = row.runs[0]
        state = row.fp8_state
        assert state is not None and state.first_step == 3 and state.differing_steps == (3, 4, 5, 6, 7)
        assert state.module is not None and state.module.startswith("decoder.layers.0.")
        assert row.divergence is not None and row.divergence.step == 3
        again = apply_causes(row.__class__(impl=row.impl, verdict=row.verdict, divergence=row.divergence,
                                           runs=row.runs, fp8_state=row.fp8_state), graphed)
        assert again.diagnosis is not None and again.diagnosis.rule == "GD521"
        assert again.diagnosis.location == expected
        assert any(h.rule == "GD521" and h.location is None for h in graphed.hazards)  # the watch, no line
    text = render_text(rep)
    assert "GD521" in text and "FP8 state: 80 tensors in 20 modules, first differs at step 3" in text


def test_mxfp8_is_unavailable_on_the_h200_with_its_reason() -> None:
    rep = report("default-mxfp8")
    for row in rep.results:
        assert row.verdict == Verdict.UNAVAILABLE
        assert row.diagnosis is not None and "mxfp8 needs Blackwell" in row.diagnosis.message
        assert "sm_90" in row.diagnosis.message
