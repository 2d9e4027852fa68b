"""VerdictTree.measure: where fingerprints differ, a targeted re-run pair measures that step; the eager
re-run runs once per (dropout, steps) however many implementations differ there. The session hands
out records instead of starting children (no torch or Megatron is replaced)."""

from __future__ import annotations

from pathlib import Path

from graphdoctor.compare.verdict import find_divergence
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffRun
from graphdoctor.parent.children import ChildRequest
from graphdoctor.protocol import EAGER, Role, RunRecord
from graphdoctor.protocol.steps import StepPrints, StepRecord
from graphdoctor.types import TensorDiff
from tests.unit.sessions import DeferredSession

NAMES = ("embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight")


def run(impl: str, prints: list[tuple[int, ...]], dropout: float = 0.0) -> RunRecord:
    steps = tuple(StepRecord(step=i, phase="eager" if impl == EAGER else "replay", loss=1.0, step_time_ms=1.0,
                             prints=StepPrints(grads=p, params=p)) for i, p in enumerate(prints))
    return RunRecord(impl=impl, dropout=dropout, status="ok", steps=steps, tensor_names=NAMES)


EQUAL, OTHER = (1, 2, 3, 4), (1, 2, 9, 4)  # the second tensor's lanes differ


class Session(DeferredSession):
    def __init__(self, workdir: Path) -> None:
        self.config = DiffConfig(impls=("local", "full_iteration"), dropout=0.0)
        self.workdir = workdir
        self.requests: list[ChildRequest] = []

    def run_request(self, request: ChildRequest) -> RunRecord:
        self.requests.append(request)
        measured = TensorDiff(num_tensors=2, num_unequal=1, max_abs=0.25, max_rel=0.5, first_tensor=NAMES[1])
        compared = request.role is Role.GRAPHED
        steps = tuple(StepRecord(step=i, phase="replay", loss=1.0, step_time_ms=1.0,
                                 grads=measured if compared and i in request.io_steps else None,
                                 params=measured if compared and i in request.io_steps else None)
                      for i in range((request.stop_after or 0) + 1))
        return RunRecord(impl=request.impl, dropout=request.dropout, status="ok", steps=steps)


def test_first_differing_step_is_measured_and_the_eager_rerun_is_shared(tmp_path: Path) -> None:
    session = Session(tmp_path)
    diff_run = DiffRun(session)  # type: ignore[arg-type]
    reference = run(EAGER, [EQUAL, EQUAL, EQUAL])
    for impl in ("local", "full_iteration"):
        graphed = diff_run.tree.measure(reference, run(impl, [EQUAL, OTHER, OTHER]))
        divergence = find_divergence(reference, graphed)
        assert divergence is not None and divergence.step == 1 and divergence.measured
        assert divergence.tensor == NAMES[1] and divergence.max_abs == 0.25
    roles = [(r.impl, r.role, r.io_steps, r.stop_after) for r in session.requests]
    assert roles == [(EAGER, Role.REFERENCE, (1,), 1), ("local", Role.GRAPHED, (1,), 1),
                     ("full_iteration", Role.GRAPHED, (1,), 1)]
    assert all(r.ref_dir == diff_run.schedule.ref_dir / "d0" for r in session.requests)


def test_equal_fingerprints_start_no_rerun(tmp_path: Path) -> None:
    session = Session(tmp_path)
    reference = run(EAGER, [EQUAL, EQUAL])
    graphed = run("local", [EQUAL, EQUAL])
    assert DiffRun(session).tree.measure(reference, graphed) is graphed  # type: ignore[arg-type]
    assert session.requests == [] and find_divergence(reference, graphed) is None
