"""diff's forensics pass on the tap tables recorded on the H200: when it taps, which runs it reads,
what it attaches. The session is a stand-in for graphdoctor's own child runner (no torch or
Megatron is replaced); the tap tables are real."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffRun
from graphdoctor.parent.children import ChildRequest
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import EAGER, Role
from graphdoctor.protocol.taptable import TapTable
from graphdoctor.types import Verdict
from tests.unit.recorded import as_recorded
from tests.unit.sessions import DeferredSession

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "forensics"


def _pair() -> tuple[dict[str, Any], RunRecord, RunRecord]:
    with gzip.open(DATA / "h200_local_dropout_te_spec.json.gz", "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    ref = RunRecord(impl=EAGER, dropout=0.1, status="ok", forensics=TapTable.from_dict(doc["reference"]))
    graphed = RunRecord(impl="local", dropout=0.1, status="ok", forensics=TapTable.from_dict(doc["graphed"]))
    return doc, ref, graphed


class RecordedSession(DeferredSession):
    """Hands out the recorded tapped runs instead of starting children; counts the requests."""

    def __init__(self, config: DiffConfig, ref: RunRecord, graphed: RunRecord, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.ref, self.graphed = ref, graphed
        self.requests: list[tuple[str, Role, bool]] = []

    def run_request(self, request: ChildRequest) -> RunRecord:
        self.requests.append((request.impl, request.role, request.taps))
        return self.ref if request.impl == EAGER else self.graphed

    def run_many(self, requests: list[ChildRequest]) -> list[RunRecord]:
        return [self.run_request(r) for r in requests]


def _forensics(session: RecordedSession, result: ImplResult, reference: RunRecord,
               graphed: RunRecord) -> ImplResult:
    return DiffRun(session).tree.forensics(result, reference, graphed)  # type: ignore[arg-type]


def test_auto_mode_runs_a_tapped_pair_after_a_divergence(tmp_path: Path) -> None:
    doc, ref, graphed = _pair()
    plain_ref = RunRecord(impl=EAGER, dropout=0.1, status="ok")
    plain = RunRecord(impl="local", dropout=0.1, status="ok")
    session = RecordedSession(DiffConfig(impls=("local",)), ref, graphed, tmp_path)
    result = _forensics(session, ImplResult(impl="local", verdict=Verdict.RNG_DIVERGENCE), plain_ref, plain)
    assert session.requests == [(EAGER, Role.TAPPED, True), ("local", Role.TAPPED, True)]
    assert result.forensics is not None
    assert result.forensics is not None and as_recorded(result.forensics.to_dict(), doc["live_analysis"]) == doc["live_analysis"]
    assert result.runs == (ref, graphed)
    assert any("GD401" in note for note in result.notes)


def test_with_localize_a_divergent_row_reads_the_taps_its_first_runs_carried(tmp_path: Path) -> None:
    doc, ref, graphed = _pair()
    config = DiffConfig(impls=("local",), localize=True)
    session = RecordedSession(config, ref, graphed, tmp_path)
    result = _forensics(session, ImplResult(impl="local", verdict=Verdict.RNG_DIVERGENCE), ref, graphed)
    assert session.requests == []  # no tapped pair: the first runs carried the taps
    assert result.forensics is not None and as_recorded(result.forensics.to_dict(), doc["live_analysis"]) == doc["live_analysis"]
    assert result.runs == ()
    assert any("GD401" in note for note in result.notes)


@pytest.mark.parametrize("localize, verdict", [(None, Verdict.MATCH), (False, Verdict.RNG_DIVERGENCE)])
def test_no_taps_when_not_asked_or_not_needed(localize: bool | None, verdict: Verdict, tmp_path: Path) -> None:
    _, ref, graphed = _pair()
    session = RecordedSession(DiffConfig(impls=("local",), localize=localize), ref, graphed, tmp_path)
    before = ImplResult(impl="local", verdict=verdict)
    assert _forensics(session, before, ref, graphed) is before
    assert session.requests == []


def test_localize_reads_the_runs_themselves(tmp_path: Path) -> None:
    doc, ref, graphed = _pair()
    session = RecordedSession(DiffConfig(impls=("local",), localize=True), ref, graphed, tmp_path)
    result = _forensics(session, ImplResult(impl="local", verdict=Verdict.MATCH), ref, graphed)
    assert session.requests == []
    assert result.forensics is not None and as_recorded(result.forensics.to_dict(), doc["live_analysis"]) == doc["live_analysis"]


def test_a_failed_tapped_run_becomes_a_note(tmp_path: Path) -> None:
    _, ref, _ = _pair()
    failed = RunRecord(impl="local", dropout=0.1, status="error")
    session = RecordedSession(DiffConfig(impls=("local",)), ref, failed, tmp_path)
    result = _forensics(session, ImplResult(impl="local", verdict=Verdict.NUMERIC_DIVERGENCE), ref, failed)
    assert result.forensics is None
    assert result.notes == ("forensics unavailable: the tapped local run ended with status error",)
