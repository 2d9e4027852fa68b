"""State held anywhere in the training run, watched on a real GPU: fp16 with Megatron's dynamic loss scaler under
full_iteration diverges at the first real difference and names the scaler's scale tensor and grad_scaler.py's
rebinding line; a static loss scale and bf16 match; one planted holder of each kind (the optimizer's parameter
group, a closure, a global tensor, a class attribute number, a global number, a config callback) is named at its
line and holder on the rows whose graphs read it, and the others match."""

from __future__ import annotations

from typing import Any

import pytest
from kept import diff

from fixtures.planted.markers import marked_location
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.report.diff import render_text
from graphdoctor.rules import get_rule
from graphdoctor.types import Verdict

pytestmark = [pytest.mark.gpu, pytest.mark.without_te]

FP16 = {"dtype": "fp16", "steps": 30, "dropout": 0.0, "timeout_s": 400.0, "launches": False, "localize": False}
"""The clean GPT (4 x 256, graphdoctor's default model) in fp16 for 30 steps: Megatron's scaler starts at 2^32
and skips the early steps until it has backed off far enough."""

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "vocab_size": 512,
         "steps": 6, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0, "dropout": 0.0, "memory": False,
         "launches": False, "localize": False}
"""The planted holders' model (issue 34's planted causes' size); the causes come from the graphed run's own watch,
so neither memory, launches nor the tapped pair run."""


def _row(report: DiffReport, impl: str) -> Any:
    return next(r for r in report.results if r.impl == impl)


def _above_info(row: Any) -> list[str]:
    out = [f"cause {c.rule}" for c in row.causes]
    for note in row.notes:
        code = note.split(" ", 1)[0]
        if code.startswith("GD5") and get_rule(code).severity.value != "info":
            out.append(note)
    return out


def test_fp16_dynamic_scaler_full_iteration_names_the_scale_tensor_and_its_rebinding_line() -> None:
    report = diff(DiffConfig(impls=("local", "full_iteration"), **FP16))
    local = _row(report, "local")
    assert local.verdict == Verdict.MATCH, (local.divergence, local.notes)
    assert _above_info(local) == [], local.notes
    assert any("skipped by the loss scaler in both runs" in n for n in local.notes), local.notes
    assert local.memory is None or local.memory.report is None or local.memory.report.verdict == "ok", local.memory
    full = _row(report, "full_iteration")
    assert full.verdict == Verdict.NUMERIC_DIVERGENCE, full
    diag = full.diagnosis
    assert diag is not None and diag.rule == "GD522", (diag, full.notes)
    assert diag.location in ("megatron/core/optimizer/grad_scaler.py:143",
                             "megatron/core/optimizer/grad_scaler.py:153"), diag
    assert "grad_scaler._scale" in diag.message and "--loss-scale" in diag.fix, diag
    # The first replay multiplies the loss by the scale captured at step 2, eager by the backed-off one: the
    # finite main_grads differ from then on, and the skip decisions part at eager's first update.
    eager_updates = [s.step for s in report.reference.steps if not s.skipped and not s.profiled]
    assert eager_updates and diag.step is not None and diag.step < full.divergence.step <= eager_updates[0], (
        full.divergence, diag, eager_updates)
    assert full.divergence.what in ("skipped", "params", "grads", "loss"), full.divergence
    assert any(f"{eager_updates[0]} skipped by the loss scaler in full_iteration only" in n for n in full.notes), \
        full.notes
    text = render_text(report)
    assert "grad_scaler.py:1" in text and "[GD522]" in text, text


@pytest.mark.parametrize("extra", [{"loss_scale": 4096.0}, {"dtype": "bf16"}], ids=["static-4096", "bf16"])
def test_static_loss_scale_and_bf16_match_on_both(extra: dict[str, Any]) -> None:
    report = diff(DiffConfig(impls=("local", "full_iteration"), **{**FP16, **extra}))
    for row in report.results:
        assert row.verdict == Verdict.MATCH, (row.impl, row.divergence, row.diagnosis, row.notes)
        assert _above_info(row) == [], (row.impl, row.notes)


PLANTED = [  # fixture, entry points, rule, marker, the holder's path ends with, rows whose graphs read it
    ("holder_param_group", ("forward_step",), "GD522", "GD522", "param_groups[0]['aux_weight']", ("full_iteration",)),
    ("holder_closure", ("forward_step",), "GD522", "GD522", "<closure>.weight", ("full_iteration",)),
    ("holder_global", ("layer_spec",), "GD522", "GD522", "holder_global.GAIN", ("local", "full_iteration")),
    ("holder_class_number", ("layer_spec",), "GD518", "GD518", "DampedMLP.damping", ("local", "full_iteration")),
    ("holder_global_number", ("forward_step",), "GD518", "GD518", "holder_global_number.Z_WEIGHT",
     ("full_iteration",)),
    ("holder_grad_scale", ("forward_step",), "GD522", "GD522", "grad_scale_func.<closure>.boost",
     ("full_iteration",)),
]


@pytest.mark.parametrize(("fixture", "entries", "rule", "marker", "holder", "reads"), PLANTED,
                         ids=[p[0] for p in PLANTED])
def test_planted_holder_is_named_at_its_line_and_holder(fixture: str, entries: tuple[str, ...], rule: str,
                                                         marker: str, holder: str, reads: tuple[str, ...]) -> None:
    config = DiffConfig(impls=("local", "full_iteration"), **SMALL,
                        **{entry: f"fixtures.planted.{fixture}:{entry}" for entry in entries})
    report = diff(config)
    for row in report.results:
        if row.impl not in reads:
            assert row.verdict == Verdict.MATCH, (row.impl, row.divergence, row.notes)
            assert _above_info(row) == [], (row.impl, row.notes)
            continue
        assert row.verdict == Verdict.NUMERIC_DIVERGENCE, (row.impl, row)
        diag = row.diagnosis
        assert diag is not None and diag.rule == rule, (row.impl, diag, row.notes)
        assert diag.location == marked_location(fixture, marker), (row.impl, diag)
        explained = [c for c in row.causes if c.explains]
        assert len(explained) == 1 and explained[0].subject.endswith(holder), (row.impl, row.causes)


def test_rng_tracker_reseeded_after_capture_is_gd522_on_its_generator_state() -> None:
    """The tracker's generator states replaced after every step: with dropout on, both rows' masks differ from
    eager's (rng-divergence: the dropout-free control pair matches), the cause names the tracker's state and the
    reseed's line, and the diff exits 1."""
    config = DiffConfig(impls=("local", "full_iteration"), **{**SMALL, "dropout": 0.1},
                        forward_step="fixtures.planted.holder_rng_reseed:forward_step")
    report = diff(config)
    for row in report.results:
        assert row.verdict == Verdict.RNG_DIVERGENCE, (row.impl, row.divergence, row.notes)
        diag = row.diagnosis
        assert diag is not None and diag.rule == "GD522", (row.impl, diag, row.notes)
        assert diag.location == marked_location("holder_rng_reseed", "GD522"), (row.impl, diag)
        explained = [c for c in row.causes if c.explains]
        assert len(explained) == 1 and explained[0].subject.startswith("rng_tracker.states_["), (row.impl, row.causes)
    assert report.exit_code() == 1
