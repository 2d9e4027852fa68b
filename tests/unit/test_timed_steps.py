"""Which children take a shared GPU alone for their steady-state steps (graphdoctor/child/loop.py timed_steps): only
those whose step times a report reads, diff's first runs (the eager reference and each graphed run at the run's
dropout). The control pair, the tapped pair, the measuring re-runs, the culprit hunt and eager run again are judged
on what they compute, so they run every step shared and do not hold up the first runs' timed steps."""

from __future__ import annotations

from pathlib import Path

from graphdoctor.child.loop import timed_steps, times_its_steps
from graphdoctor.config import DiffConfig
from graphdoctor.parent.children import ChildRequest, ChildSession
from graphdoctor.protocol.spec import EAGER, Role

CONFIG = DiffConfig(impls=("local", "full_iteration"), dropout=0.1, steps=8, cuda_graph_warmup_steps=2)


def _spec(tmp_path: Path, request: ChildRequest, config: DiffConfig = CONFIG):  # type: ignore[no-untyped-def]
    return ChildSession(config, tmp_path).spec(request)


def test_only_the_first_runs_time_their_steps(tmp_path: Path) -> None:
    first = [ChildRequest(EAGER, 0.1, Role.REFERENCE, tmp_path), ChildRequest("local", 0.1, Role.GRAPHED, tmp_path)]
    others = [ChildRequest(EAGER, 0.0, Role.REFERENCE, tmp_path),   # the control pair
              ChildRequest("local", 0.0, Role.GRAPHED, tmp_path),
              ChildRequest(EAGER, 0.1, Role.TAPPED, tmp_path, taps=True),  # the tapped pair
              ChildRequest("local", 0.1, Role.TAPPED, tmp_path, taps=True),
              ChildRequest(EAGER, 0.1, Role.REFERENCE, tmp_path, io_steps=(3,), stop_after=3),  # measuring
              ChildRequest("local", 0.1, Role.GRAPHED, tmp_path, io_steps=(3,), stop_after=3),
              ChildRequest("local", 0.1, Role.GRAPHED, tmp_path, hunt=True),  # the culprit hunt
              ChildRequest(EAGER, 0.1, Role.GRAPHED, tmp_path)]  # eager again
    for request in first:
        spec = _spec(tmp_path, request)
        assert times_its_steps(spec) and list(timed_steps(spec)) == [5, 6, 7], request
    for request in others:
        spec = _spec(tmp_path, request)
        assert not times_its_steps(spec) and list(timed_steps(spec)) == [], request


def test_at_dropout_zero_the_first_runs_are_the_dropout_zero_pair(tmp_path: Path) -> None:
    config = CONFIG.replace(dropout=0.0)
    for request in (ChildRequest(EAGER, 0.0, Role.REFERENCE, tmp_path), ChildRequest("local", 0.0, Role.GRAPHED, tmp_path)):
        assert list(timed_steps(_spec(tmp_path, request, config))) == [5, 6, 7]
