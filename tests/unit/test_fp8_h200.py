"""FP8 under graphs, read on the CPU from diff reports recorded on the H200 with Transformer Engine 2.20.2
(fixtures/data/fp8/, written by tests/benchmarks/fp8_table.py): each clean row judged again from its recorded
steps, with the FP8 state's size derived again from its layout (the report keeps the comparison and the state's
layout, not the per-step lanes), the planted GD521 named again from the graphed run's evidence at its module and
marked line, and the recipe the H200 cannot run reported unavailable."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fixtures.planted.markers import marked_location
from graphdoctor.compare.causes import apply_causes
from graphdoctor.compare.fp8_state import compare_fp8_state
from graphdoctor.compare.verdict import judge
from graphdoctor.diff import DiffReport
from graphdoctor.report.diff import render_text
from graphdoctor.types import Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "fp8"
CLEAN = ("default-delayed-hybrid", "default-delayed-e4m3", "default-tensorwise", "default-blockwise",
         "default-delayed-hybrid-attn", "llama-line", "llama-line-resume")


def report(name: str) -> DiffReport:
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return DiffReport.from_dict(json.load(fh))


@pytest.mark.parametrize("name", CLEAN)
def test_clean_recipes_match_with_fp8_state_compared(name: str) -> None:
    """Each row judged again from its recorded steps (losses, reported values, the main_grads and parameter
    comparisons) with diff's judge, and its causes derived again from the graphed run's evidence; the FP8 state's
    size derived again from the runs' layouts. The report keeps no per-step lanes, so how many steps compared
    equal is the recorded comparison's, as the rendered report states it."""
    rep = report(name)
    cfg = rep.config
    delayed = "delayed" in name or name.startswith("llama-line")  # the Llama-3 line: hybrid delayed, FP8 weights
    weights = cfg.fp8_param_gather
    text = render_text(rep)
    eager_loss = {s.step: s.loss for s in rep.reference.steps}
    for row in rep.results:
        graphed = row.runs[0]
        # independent of the product: every graphed step's loss is eager's, bit for bit
        assert [s.step for s in graphed.steps] == sorted(eager_loss)
        assert all(s.loss == eager_loss[s.step] for s in graphed.steps), row.impl
        again = judge(rep.reference, graphed, warmup_steps=cfg.cuda_graph_warmup_steps, rtol=cfg.rtol, atol=cfg.atol)
        assert again.verdict == row.verdict == Verdict.MATCH, (row.impl, again.divergence)
        state = compare_fp8_state(rep.reference, graphed)
        if delayed:  # scale and amax history of every TE module, fwd and bwd, at every unprofiled step
            assert state is not None and row.fp8_state is not None
            assert (state.tensors, state.modules) == (row.fp8_state.tensors, row.fp8_state.modules)
            assert all(len(layout) == state.tensors for layout in graphed.fp8_layouts)
            assert weights or state.tensors == 4 * state.modules
            assert not weights or any(n.endswith("weight._scale_inv") for n in graphed.fp8_layouts[0])
            assert graphed.fp8_layouts == rep.reference.fp8_layouts
            unprofiled = sum(not s.profiled for s in graphed.steps)
            assert unprofiled == len(graphed.steps) - 1
            line = f"{row.impl}: FP8 state: {state.tensors} tensors in {state.modules} modules, equal at {unprofiled} steps"
            assert line in text
        else:  # current scaling keeps no state between steps
            assert state is None and row.fp8_state is None and not graphed.fp8_layouts
        causes = apply_causes(again, graphed).causes
        assert causes == row.causes
        assert not [c for c in causes if c.severity in ("error", "warning")]


def test_the_llama_line_resumed_into_fp8_weights_matches_after_the_load() -> None:
    """Saved after step 4 and loaded in a fresh process into FP8 primary weights (Megatron-LM#6036's setting, GD406):
    every run saved and loaded, the state's layout made again by the resumed process, equal at every step."""
    rep = report("llama-line-resume")
    assert rep.config.fp8_param_gather and rep.config.resume and rep.config.save_at == 4
    for run in (rep.reference, *(row.runs[0] for row in rep.results)):
        assert [c.action for c in run.checkpoints] == ["save", "load"]
        assert [s.step for s in run.steps if s.resumed] == list(range(4, rep.config.steps + 1))
        assert len(run.fp8_layouts) == 2 and run.fp8_layouts[0] == run.fp8_layouts[1]
    for row in rep.results:
        assert row.verdict == Verdict.MATCH and row.fp8_state is not None and row.fp8_state.equal


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


def test_gd310_on_a_local_row_that_matched_says_it_was_not_seen() -> None:
    """Every FP8 run has Transformer Engine importable, so every `local` row carries GD310 (its graphed gradients
    can differ from eager). The Llama-3 line's local row matched bitwise on the H200: its note says the run did
    not see it, instead of a warning; a row that differs keeps the warning."""
    from dataclasses import replace

    from graphdoctor.parent.static import with_static_findings
    from graphdoctor.rules import EnvironmentFacts, check

    rep = report("llama-line")
    row = next(r for r in rep.results if r.impl == "local")
    facts = EnvironmentFacts().with_overrides({"te_version": "2.20.2", "te_has_torch_extension": True})
    (gd310,) = [f for f in check({"transformer": {"cuda_graph_impl": "local"}}, facts=facts).findings
                if f.code == "GD310"]
    bare = replace(row, notes=tuple(n for n in row.notes if "GD310" not in n))
    (matched,) = [n for n in with_static_findings(bare, rep.config, [gd310]).notes if "GD310" in n]
    assert matched.startswith("static GD310 te-weak-refs-in-local-graphs, not seen in this run")
    differing = replace(bare, verdict=Verdict.NUMERIC_DIVERGENCE)
    (warned,) = [n for n in with_static_findings(differing, rep.config, [gd310]).notes if "GD310" in n]
    assert warned.startswith("static GD310 te-weak-refs-in-local-graphs: ")
