"""GD310: `local` graphs with Transformer Engine importable. megatron-core 0.19.2's make_weakref then weak-references
graph-pool buffers; on the H200 the graphed gradients differed from eager and matched bitwise once make_weakref kept
strong references or HAVE_TE_GRAPHS was off (tests/gpu/test_te_weakref_gpu.py, recorded in fixtures/data/diff).
Here: the Megatron code the rule cites, what the rule flags on which machine, and the recorded reports."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.parent.static import installation_static_findings
from graphdoctor.rules import check
from graphdoctor.rules.facts import TE_IMPORTABLE, EnvironmentFacts, te_facts
from graphdoctor.types import Verdict

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"
TE = EnvironmentFacts.unknown_machine().with_overrides(dict(TE_IMPORTABLE))


def _codes(transformer: dict[str, object], facts: EnvironmentFacts) -> list[tuple[str, str]]:
    found = check({"transformer": transformer}, select=["GD310"], facts=facts).findings
    return [(f.code, f.severity) for f in found]


def test_the_cited_megatron_code_weak_references_static_gradients_only_with_te_graphs() -> None:
    from megatron.core.transformer import cuda_graphs

    source = inspect.getsource(cuda_graphs.make_weakref)
    assert "HAVE_TE_GRAPHS" in source and "is_from_global_mempool" in source and "make_weak_ref(ten)" in source
    lines, first = inspect.getsourcelines(cuda_graphs)
    weakref_grads = [i + 1 for i, line in enumerate(lines) if "tree_map(make_weakref, self.static_grad_inputs)" in line]
    assert weakref_grads == [1544]  # the line GD310 cites (megatron-core 0.19.2)
    assert inspect.getsourcelines(cuda_graphs.make_weakref)[1] == 395
    import megatron.core.full_cuda_graph as full

    assert "make_weakref" not in inspect.getsource(full)  # full_iteration takes no weak references


def test_flags_local_graphs_where_te_imports_and_nothing_else() -> None:
    assert _codes({"cuda_graph_impl": "local"}, TE) == [("GD310", "warning")]
    assert _codes({"enable_cuda_graph": True}, TE) == [("GD310", "warning")]
    for impl in ("full_iteration", "transformer_engine", "none"):
        assert _codes({"cuda_graph_impl": impl}, TE) == [], impl
    no_te = EnvironmentFacts.unknown_machine().with_overrides({"te_version": None, "te_has_torch_extension": False})
    assert _codes({"cuda_graph_impl": "local"}, no_te) == []
    no_extension = TE.with_overrides({"te_has_torch_extension": False})
    assert _codes({"cuda_graph_impl": "local"}, no_extension) == []  # TE does not import: HAVE_TE_GRAPHS is off


def test_an_unknown_machine_is_not_checked_rather_than_guessed() -> None:
    report = check({"transformer": {"cuda_graph_impl": "local"}}, select=["GD310"])
    assert not report.findings
    (finding,) = report.not_checked
    assert finding.severity == "info" and finding.message.startswith("not checked: the training machine is unknown")
    assert "does Transformer Engine import there" in finding.message


def test_check_names_the_line_and_the_fix(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  cuda_graph_impl: local\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["check", str(run), "--target", "te=2.20.2", "--format", "concise",
                                       "--select", "GD310"])
    assert result.exit_code == 0, result.output  # a warning: check exits 1 on errors only
    assert f"{run}:2:3: GD310" in result.output and "make_weakref" in result.output


def test_diff_notes_it_on_local_rows_of_this_machine() -> None:
    expected = [] if te_facts()["te_has_torch_extension"] is False else ["GD310"]
    assert [f.code for f in installation_static_findings(DiffConfig(), "local")] == expected
    assert installation_static_findings(DiffConfig(), "full_iteration") == []


@pytest.mark.parametrize(("name", "verdict"), [("h200_te_weakref_unchanged_schema2.json", Verdict.NUMERIC_DIVERGENCE),
                                               ("h200_te_weakref_strong_refs_schema2.json", Verdict.MATCH),
                                               ("h200_te_weakref_no_te_graphs_schema2.json", Verdict.MATCH)])
def test_recorded_h200_runs_differ_only_with_megatrons_weak_references(name: str, verdict: Verdict) -> None:
    report = DiffReport.from_dict(json.loads((DATA / name).read_text()))
    row = next(r for r in report.results if r.impl == "local")
    assert row.verdict == verdict
    if verdict == Verdict.NUMERIC_DIVERGENCE:
        assert row.divergence is not None and row.divergence.step == 1
        assert row.divergence.tensor == "embedding.word_embeddings.weight"
        assert row.diagnosis is not None and row.diagnosis.module == "decoder.layers.0"
        assert any(n.startswith("static GD310 te-weak-refs-in-local-graphs") for n in row.notes)
        # full_iteration in the same diff, with the same Transformer Engine importable, matches
        (full,) = [r for r in report.results if r.impl == "full_iteration"]
        assert full.verdict == Verdict.MATCH and not full.notes


def test_layernorm_recompute_divergence_is_not_the_weak_references() -> None:
    """The layernorm recompute's divergence (GD220) is the same with make_weakref keeping strong references: the
    same tensor, step and figures (two diffs at once on the H200, TE 2.20.2, local, fp32, dropout 0)."""
    rows = []
    for name in ("h200_layernorm_recompute_te_unchanged_schema2.json", "h200_layernorm_recompute_te_strong_schema2.json"):
        report = DiffReport.from_dict(json.loads((DATA / name).read_text()))
        (row,) = report.results
        assert row.verdict == Verdict.NUMERIC_DIVERGENCE and row.divergence is not None
        assert any(n.startswith("static GD220 ") for n in row.notes)
        rows.append((row.divergence.step, row.divergence.tensor, row.divergence.max_abs, row.divergence.max_rel))
    assert rows[0] == rows[1] and rows[0][:2] == (1, "decoder.layers.0.input_layernorm.weight")


def test_a_launch_script_is_flagged_at_its_cuda_graph_impl_line() -> None:
    script = Path(__file__).resolve().parents[2] / "examples" / "megatron" / "pretrain_gpt_small.sh"
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "--cuda-graph-impl local" in text)
    result = CliRunner().invoke(main, ["check", f"@{script}", "--target", "te=2.20.2", "--format", "concise",
                                       "--select", "GD310"])
    assert result.exit_code == 0, result.output
    assert f"{script}:{line}:5: GD310 local CUDA graphs with Transformer Engine 2.20.2 importable" in result.output
