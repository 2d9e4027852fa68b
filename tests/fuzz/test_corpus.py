"""The committed corpus (tests/fuzz/corpus/) and the large shapes built at test time: each of the
specific inputs issue 19 found gives its expected outcome (mostly a clean one-line error)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from corpus import BUILDERS, CASES, CORPUS, SMALL_FILES, Case
from harness import run_case


def test_committed_corpus_is_current() -> None:
    for name, data in SMALL_FILES.items():
        assert (CORPUS / name).read_bytes() == data, f"{name}: run python tests/fuzz/corpus.py"


def _input(tmp_path: Path, name: str) -> Path | None:
    if name in ("-", ".") or name.startswith("/"):
        return None
    if name in BUILDERS:
        return BUILDERS[name](tmp_path)
    return Path(shutil.copy(CORPUS / name, tmp_path / name))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.command}-{c.input_name}-{len(c.argv)}")
def test_corpus_case(tmp_path: Path, case: Case) -> None:
    path = _input(tmp_path, case.input_name)
    name = path.name if path is not None else case.input_name
    argv = [a.replace("{IN}", name) for a in case.argv]
    inputs = [path] if path is not None and path.is_file() else []
    outcome = run_case(case.command, case.input_name, argv, cwd=tmp_path, inputs=inputs)
    assert not outcome.problems, outcome
    assert outcome.kind == case.kind, outcome
    assert case.needle in outcome.stderr, outcome


def test_escapes_reach_the_terminal_escaped(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from graphdoctor.cli import main

    snapshot = shutil.copy(CORPUS / "osc_frame_name.pickle", tmp_path / "osc_frame_name.pickle")
    result = CliRunner().invoke(main, ["triage", str(snapshot)])
    assert result.exit_code == 0 and "\x1b" not in result.output and "\\x1b]0;owned\\x07f" in result.output
    trace = shutil.copy(CORPUS / "trace_osc_name.json", tmp_path / "trace_osc_name.json")
    result = CliRunner().invoke(main, ["count", "--trace", str(trace)])
    assert result.exit_code == 0 and "\x1b" not in result.output


def test_rules_output_keeps_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "GDPR.md").write_text("our privacy notes\n")
    outcome = run_case("rules", "GDPR.md", ["rules", "--output", "."], cwd=tmp_path, inputs=[tmp_path / "GDPR.md"],
                       outputs=tuple(p.name for p in Path("docs/rules").iterdir()))
    assert outcome.kind == "accepted" and (tmp_path / "GDPR.md").read_text() == "our privacy notes\n", outcome
    (tmp_path / "GD999.md").write_text("stale page we wrote\n")
    index = tmp_path / "index.md"
    index.unlink()
    index.write_text("my own index\n")
    outcome = run_case("rules", "index.md", ["rules", "--output", "."], cwd=tmp_path, inputs=[index])
    assert outcome.kind == "clean error" and "not written by graphdoctor" in outcome.stderr, outcome
    assert index.read_text() == "my own index\n" and (tmp_path / "GD999.md").exists()
