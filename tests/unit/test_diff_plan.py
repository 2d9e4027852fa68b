"""`graphdoctor diff --plan`: the run as diff reads it, each implementation screened without a GPU, and the
children it would start; refused as diff refuses before any GPU work. Real run files, launch lines and rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.installed import te_findable

REPO = Path(__file__).resolve().parents[2]


def _plan(*args: str) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(main, ["diff", "--plan", *args])
    return result.exit_code, result.stdout.splitlines(), result.stderr


def _row(lines: list[str], label: str) -> list[str]:
    row, = [line for line in lines if line.startswith(label + "  ")]
    return row.split(None, len(label.split()) + 1)[len(label.split()):]


@pytest.mark.skipif(te_findable(), reason="Transformer Engine is installed here")
def test_the_defaults_plan_two_graphed_runs_and_a_control_pair() -> None:
    code, lines, _ = _plan()
    assert code == 0
    assert lines[0].startswith("graphdoctor diff --plan: GPTModel 4x256 (8 heads), seq 128")
    assert _row(lines, "local whole layer")[0] == "run"
    assert _row(lines, "full_iteration whole step") == ["run"]
    assert _row(lines, "transformer_engine whole layer")[0] == "unavailable"
    assert lines[-1] == ("would start the eager reference and 2 graphed runs; a row that differs at dropout 0.1 also "
                         "runs a dropout-0 control pair; 0 with error-level findings; nothing ran (no GPU needed)")


def test_a_run_files_graph_settings_are_the_rows() -> None:
    """config._fill_from_transformer: `enable_cuda_graph: true` is a local row, and only that."""
    code, lines, _ = _plan("--config", str(REPO / "fixtures/runfiles/legacy_enable_cuda_graph.yaml"))
    assert code == 0, lines
    assert lines[0].startswith("graphdoctor diff --plan: GPTModel 2x128 (4 heads)") and "dropout 0," in lines[0]
    assert [line.split("  ")[0] for line in lines if line.startswith(("local", "full_iteration", "transformer"))] == \
        ["local whole layer"]
    assert "1 graphed run;" in lines[-1]


def test_a_launch_line_scope_that_graphs_the_whole_layer_runs_with_its_warnings() -> None:
    """GD219 keeps an advise candidate from running (another candidate runs that graph); diff runs what it is
    asked, so it is a warning here, beside GD217 on the alltoall dispatcher, as `check` reports them."""
    code, lines, _ = _plan("--megatron-args", "@examples/megatron/pretrain_moe_small.sh", "--num-layers", "2")
    assert code == 0, lines
    status, why = _row(lines, "local attn")
    assert status == "run" and {"GD219", "GD217"} <= set(why.removeprefix("warnings ").split(", "))


def test_an_implementation_megatron_refuses_is_an_error_and_exit_1() -> None:
    code, lines, _ = _plan("--config", str(REPO / "fixtures/runfiles/moe_dropless_allgather.yaml"),
                           "--impl", "local", "--cuda-graph-modules", "moe")
    assert code == 1
    status, why = _row(lines, "local moe")
    assert status == "error" and why.startswith("GD205 ") and "(also megatron)" in why
    assert "1 with error-level findings" in lines[-1]


def test_a_placement_prints_its_line() -> None:
    code, lines, _ = _plan("--impl", "full_iteration", "--nproc-per-node", "2", "--tensor-model-parallel-size", "2")
    assert code == 0
    assert lines[1].startswith("  model: 4 layers x 256") and lines[2].startswith("  model built on the meta device")
    assert lines[3].startswith("  2 processes per run: TP 2, PP 1, DP 1")


@pytest.mark.skipif(te_findable(), reason="Transformer Engine is installed here")
def test_what_diff_refuses_here_the_plan_lists_with_the_model() -> None:
    code, lines, _ = _plan("--recompute-granularity", "selective", "--recompute-modules", "layernorm")
    assert code == 1 and lines[0].startswith("graphdoctor diff --plan: GPTModel")
    block = lines[lines.index(next(x for x in lines if x.startswith("refused here (1;"))) + 1:]
    assert len(block) == 1 and "(GD309)" in block[0] and "fix:" in block[0]


@pytest.mark.skipif(te_findable(), reason="Transformer Engine is installed here")
def test_the_te_layer_spec_without_te_is_planned_with_its_rows_unavailable() -> None:
    """What only this machine lacks is not a refusal of the plan: diff itself refuses it (test_te_absent)."""
    code, lines, _ = _plan("--layer-spec", "te")
    assert code == 0, lines
    assert lines[2].startswith("  model not built here: transformer_engine is not installed")
    rows = [line for line in lines if line.startswith(("local", "full_iteration", "transformer_engine"))]
    assert len(rows) == 3 and all(" unavailable " in row for row in rows), rows


def test_the_plan_document_of_diff_and_of_advise(tmp_path: Path) -> None:
    import json

    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["diff", "--plan", "--config", str(REPO / "fixtures/runfiles/moe_dropless_allgather.yaml"),
                                       "--impl", "local", "--cuda-graph-modules", "moe", "--json", str(out)])
    assert result.exit_code == 1 and "local moe" in result.stdout
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert list(doc)[:3] == ["schema_version", "tool", "command"] and (doc["command"], doc["of"]) == ("plan", "diff")
    row, = doc["rows"]
    assert row["candidate"]["label"] == "local moe" and row["plan"] == "error" and doc["exit_code"] == 1
    assert [r["rule"] for r in row["rejections"]][0] == "GD205" and doc["config"]["impls"] == ["local"]
    advised = CliRunner().invoke(main, ["advise", "--plan", "--num-layers", "2", "--json", "-"])
    doc = json.loads(advised.stdout)  # stdout is the document alone
    assert (doc["command"], doc["of"], doc["exit_code"]) == ("plan", "advise", advised.exit_code)
    assert {row["plan"] for row in doc["rows"]} <= {"run", "rejected", "unavailable"}


def test_json_on_stdout_carries_the_document_alone_and_never_replaces_an_input(tmp_path: Path) -> None:
    import json

    result = CliRunner().invoke(main, ["diff", "--plan", "--megatron-args", "@examples/megatron/pretrain_moe_small.sh",
                                       "--num-layers", "2", "--json", "-"])
    assert json.loads(result.stdout)["of"] == "diff"
    assert "launch line: explicit values override the launch line" in result.stderr
    run = tmp_path / "run.yaml"
    run.write_text("run:\n  steps: 6\n", encoding="utf-8")
    refused = CliRunner().invoke(main, ["diff", "--plan", "--config", str(run), "--json", str(run)])
    assert refused.exit_code == 2 and run.read_text(encoding="utf-8") == "run:\n  steps: 6\n"


@pytest.mark.parametrize("command", ["diff", "advise"])
def test_a_page_is_refused_with_the_plan(tmp_path: Path, command: str) -> None:
    result = CliRunner().invoke(main, [command, "--plan", "--html", str(tmp_path / "page.html")])
    assert result.exit_code == 2
    line, = result.stderr.strip().splitlines()
    assert "a page is written for a run; expected it without --plan" in line
    assert not (tmp_path / "page.html").exists()
