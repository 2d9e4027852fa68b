"""The memory analyses on snapshots recorded on an H200 (torch 2.11) by fixtures/record_memory.py.

Record them with `python fixtures/record_memory.py fixtures/data/memory` on a CUDA machine; each test
skips, naming the missing file, until they exist.
"""

from __future__ import annotations

import gzip
import json
import pickletools
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.memory import analyze_run, load_snapshot, parse_snapshot, triage
from graphdoctor.memory.model import DEFAULT_POOL
from graphdoctor.memory.phases import phase_stats

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "memory"
NAMES = (
    "eager",
    "graphed_before",
    "graphed_after_capture",
    "graphed",
    "leak_before",
    "leak_after_capture",
    "leak",
)


def fixture(name: str) -> Path:
    path = DATA / (f"{name}.pickle.gz" if name != "meta" else "meta.json")
    if not path.exists():
        pytest.skip(f"recorded fixture {path.relative_to(DATA.parents[2])} absent: "
                    "run `python fixtures/record_memory.py fixtures/data/memory` on a GPU machine")
    return path


def meta() -> dict:
    return json.loads(fixture("meta").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_fixture_is_small_plain_data(name: str) -> None:
    path = fixture(name)
    assert path.stat().st_size < 1_500_000
    opcodes = {op.name for op, _, _ in pickletools.genops(gzip.decompress(path.read_bytes()))}
    assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ"}
    snap = parse_snapshot(load_snapshot(path))
    assert snap.segments and snap.trace


def test_eager_has_only_the_default_pool() -> None:
    snap = parse_snapshot(load_snapshot(fixture("eager")))
    assert {seg.pool for seg in snap.segments} == {DEFAULT_POOL}
    assert "eager" in {p.phase for p in phase_stats(snap)}


def test_graphed_has_a_graph_pool_and_phases() -> None:
    snap = parse_snapshot(load_snapshot(fixture("graphed")))
    assert any(seg.pool != DEFAULT_POOL for seg in snap.segments)
    assert {"capture", "replay"} <= {p.phase for p in phase_stats(snap)}


def _analyze(scenario: str):  # noqa: ANN202
    info = meta()["scenarios"]
    eager = info["eager"]
    return analyze_run(
        load_snapshot(fixture(f"{scenario}_before")),
        load_snapshot(fixture(f"{scenario}_after_capture")),
        load_snapshot(fixture(scenario)),
        num_replay_steps=info[scenario]["num_replay_steps"],
        eager_peak_allocated_bytes=eager["peak_allocated_bytes"],
        eager_peak_reserved_bytes=eager["peak_reserved_bytes"],
        peak_allocated_bytes=info[scenario]["peak_allocated_bytes"],
        peak_reserved_bytes=info[scenario]["peak_reserved_bytes"],
    )


def test_graphed_run_is_ok() -> None:
    report = _analyze("graphed")
    assert report.verdict == "ok", report.summary()
    assert report.graph_pool_reserved_bytes > 0
    assert report.phase_tags_found


def test_leak_run_is_growth_at_the_planted_line() -> None:
    report = _analyze("leak")
    assert report.verdict == "growth", report.summary()
    assert report.bytes_gained_per_replay_step == pytest.approx(256 << 10, rel=0.05)
    top = report.unfreed_replay_sites[0]
    assert top.is_suspect and "record_memory.py" in top.site
    assert top.num_steps == meta()["scenarios"]["leak"]["num_replay_steps"]


def test_triage_cli_on_leak_exits_1() -> None:
    result = CliRunner().invoke(
        main, ["triage", str(fixture("leak")), "--against", str(fixture("leak_after_capture"))]
    )
    assert result.exit_code == 1, result.output
    report = triage(fixture("leak"), against=fixture("leak_after_capture"))
    assert "record_memory.py" in report.leak_suspects[0].site
