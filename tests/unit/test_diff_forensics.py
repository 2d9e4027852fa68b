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
from graphdoctor.diff import _forensics
from graphdoctor.types import RunRecord, Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "forensics"


def _pair() -> tuple[dict[str, Any], RunRecord, RunRecord]:
    with gzip.open(DATA / "h200_local_dropout_te_spec.json.gz", "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    ref = RunRecord(impl="none", dropout=0.1, status="ok", forensics=doc["reference"])
    graphed = RunRecord(impl="local", dropout=0.1, status="ok", forensics=doc["graphed"])
    return doc, ref, graphed


class RecordedSession:
    """Hands out the recorded tapped runs instead of starting children; counts the requests."""

    def __init__(self, config: DiffConfig, ref: RunRecord, graphed: RunRecord) -> None:
        self.config = config
        self.ref, self.graphed = ref, graphed
        self.requests: list[tuple[str, str, bool]] = []

    def tapped_reference(self, ref_dir: Path) -> RunRecord:
        self.requests.append(("none", "plain", True))
        return self.ref

    def run(self, impl: str, dropout: float, role: str, ref_dir: Path, *, hunt: bool = False,
            taps: bool = False) -> RunRecord:
        self.requests.append((impl, role, taps))
        return self.graphed


def test_auto_mode_runs_a_tapped_pair_after_a_divergence() -> None:
    doc, ref, graphed = _pair()
    plain_ref = RunRecord(impl="none", dropout=0.1, status="ok")
    plain = RunRecord(impl="local", dropout=0.1, status="ok")
    session = RecordedSession(DiffConfig(impls=("local",)), ref, graphed)
    result = _forensics(session, ImplResult(impl="local", verdict=Verdict.RNG_DIVERGENCE),  # type: ignore[arg-type]
                        plain_ref, plain, Path("."))
    assert session.requests == [("none", "plain", True), ("local", "plain", True)]
    assert result.forensics == doc["live_analysis"]
    assert result.runs == (ref, graphed)
    assert any("GD401" in note for note in result.notes)


@pytest.mark.parametrize("localize, verdict", [(None, Verdict.MATCH), (False, Verdict.RNG_DIVERGENCE)])
def test_no_taps_when_not_asked_or_not_needed(localize: bool | None, verdict: Verdict) -> None:
    _, ref, graphed = _pair()
    session = RecordedSession(DiffConfig(impls=("local",), localize=localize), ref, graphed)
    before = ImplResult(impl="local", verdict=verdict)
    assert _forensics(session, before, ref, graphed, Path(".")) is before  # type: ignore[arg-type]
    assert session.requests == []


def test_localize_reads_the_runs_themselves() -> None:
    doc, ref, graphed = _pair()
    session = RecordedSession(DiffConfig(impls=("local",), localize=True), ref, graphed)
    result = _forensics(session, ImplResult(impl="local", verdict=Verdict.MATCH),  # type: ignore[arg-type]
                        ref, graphed, Path("."))
    assert session.requests == []
    assert result.forensics == doc["live_analysis"]


def test_a_failed_tapped_run_becomes_a_note() -> None:
    _, ref, _ = _pair()
    failed = RunRecord(impl="local", dropout=0.1, status="error")
    session = RecordedSession(DiffConfig(impls=("local",)), ref, failed)
    result = _forensics(session, ImplResult(impl="local", verdict=Verdict.NUMERIC_DIVERGENCE),  # type: ignore[arg-type]
                        ref, failed, Path("."))
    assert result.forensics is None
    assert result.notes == ("forensics unavailable: the tapped local run ended with status error",)
