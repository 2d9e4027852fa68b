"""`graphdoctor triage`: text, --json, --html, --against, exit codes, and no torch import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.memory import SCHEMA_VERSION, triage
from graphdoctor.memory.loader import save_snapshot
from graphdoctor.memory.synthetic import graphed_run


@pytest.fixture
def snaps(tmp_path: Path) -> dict[str, Path]:
    before, captured, after = graphed_run(num_replay_steps=4, leak_bytes=1 << 20)
    _, clean_captured, clean_after = graphed_run(num_replay_steps=4)
    return {
        "captured": save_snapshot(captured, tmp_path / "captured.pickle"),
        "leak": save_snapshot(after, tmp_path / "leak.pickle.gz"),
        "clean_captured": save_snapshot(clean_captured, tmp_path / "clean_captured.pickle"),
        "clean": save_snapshot(clean_after, tmp_path / "clean.pickle"),
        "before": save_snapshot(before, tmp_path / "before.pickle"),
    }


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["triage", *args])
    return result.exit_code, result.stdout, result.stderr


def test_text_report(snaps: dict[str, Path]) -> None:
    code, out, _ = _run(str(snaps["clean"]))
    assert code == 0
    for heading in ("By pool", "By stream", "By segment type", "Live bytes by allocation site",
                    "Largest free (cached) blocks", "Trace by phase"):
        assert heading in out
    assert "graph 1,0" in out and "allocated/reserved" in out
    assert "work/train.py:40 train_step" in out


def test_against_finds_leak_exit_1(snaps: dict[str, Path], tmp_path: Path) -> None:
    code, out, _ = _run(str(snaps["leak"]), "--against", str(snaps["captured"]), "--json", str(tmp_path / "r.json"))
    assert code == 1
    assert "Leak suspects" in out and "work/train.py:52 train_step" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    # the CLI document is the envelope of docs/json.md (schema 2) around the schema 1 TriageReport payload
    assert SCHEMA_VERSION == 1 and doc["schema_version"] == 2 and doc["command"] == "triage"
    assert doc["leak_suspects"][0]["growth_bytes"] == 4 << 20
    assert doc["diff"]["total"]["num_new"] >= 4
    assert doc["against"]["path"].endswith("captured.pickle")


def test_against_without_growth_exit_0(snaps: dict[str, Path]) -> None:
    code, out, _ = _run(str(snaps["clean"]), "--against", str(snaps["clean"]))
    assert code == 0
    assert "verdict: no site's live bytes grew" in out


def test_min_growth_filters(snaps: dict[str, Path]) -> None:
    code, _, _ = _run(str(snaps["leak"]), "--against", str(snaps["captured"]), "--min-growth", str(64 << 20))
    assert code == 0


def test_json_to_stdout_only(snaps: dict[str, Path]) -> None:
    code, out, _ = _run(str(snaps["clean"]), "--json", "-")
    assert code == 0
    assert json.loads(out)["snapshot"]["totals"]["graph_pool_reserved_bytes"] == 20 << 20


def test_html_is_self_contained(snaps: dict[str, Path], tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    code, _, _ = _run(str(snaps["leak"]), "--against", str(snaps["captured"]), "--html", str(page))
    assert code == 1
    html = page.read_text()
    assert html.count("<svg") == 2 and "<polyline" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html and "<link" not in html
    for phase in ("eager", "warmup", "capture", "replay"):
        assert phase in html
    assert "Leak suspects" in html


def test_all_frames(snaps: dict[str, Path]) -> None:
    code, out, _ = _run(str(snaps["clean"]), "--all-frames", "--json", "-")
    assert code == 0
    sites = [s["site"] for s in json.loads(out)["snapshot"]["top_sites"]]
    assert any(" <- " in s and "linear.py" in s for s in sites)


@pytest.mark.parametrize("kind", ["missing", "truncated", "evil"])
def test_bad_input_exit_2(tmp_path: Path, snaps: dict[str, Path], kind: str) -> None:
    path = tmp_path / f"{kind}.pickle"
    marker = tmp_path / "marker"
    if kind == "truncated":
        path.write_bytes(snaps["clean"].read_bytes()[:100])
    elif kind == "evil":
        path.write_bytes(b"cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR.")
    result = CliRunner().invoke(main, ["triage", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("graphdoctor: error: snapshot")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_library_api_matches_cli(snaps: dict[str, Path]) -> None:
    report = triage(snaps["leak"], against=snaps["captured"])
    assert report.has_leak_suspects
    with pytest.raises(AttributeError):
        report.all_frames = True  # type: ignore[misc]


def test_triage_never_imports_torch(snaps: dict[str, Path], tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from graphdoctor.cli import main\n"
        f"try:\n    main(['triage', {str(snaps['leak'])!r}, '--html', {str(tmp_path / 'x.html')!r}])\n"
        "except SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'numpy' not in sys.modules, 'numpy imported'\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
