"""Rule selection (`--select/--ignore/--extend-select` prefixes, `[tool.graphdoctor]`), inline
suppression in run files, launch-line files and Python files, and 'did you mean'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.rules import Finding, Severity, check, parse_megatron_args
from graphdoctor.rules.selection import Selection, load_project_settings
from graphdoctor.rules.suppression import is_suppressed
from graphdoctor.suggest import did_you_mean

REPO = Path(__file__).resolve().parents[2]
BAD = str(REPO / "examples" / "local_moe_bad.yaml")
ALL_CODES = ["GD101", "GD114", "GD201", "GD208", "GD301", "GD302", "GD303", "GD401", "GD402"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def found(*args: str) -> list[str]:
    code, out, err = invoke("check", *args, "--output-format", "json")
    assert code in (0, 1), err
    return sorted({f["code"] for f in json.loads(out)["findings"]})


def test_selection_prefixes() -> None:
    assert Selection().codes(ALL_CODES) is None
    assert Selection(select=("GD4",)).codes(ALL_CODES) == {"GD401", "GD402"}
    assert Selection(select=("GD30",), ignore=("GD302",)).codes(ALL_CODES) == {"GD301", "GD303"}
    assert Selection(ignore=("GD2", "GD3")).codes(ALL_CODES) == {"GD101", "GD114", "GD401", "GD402"}
    assert Selection(select=("GD1",), extend_select=("GD201",)).codes(ALL_CODES) == {"GD101", "GD114", "GD201"}


def test_cli_select_ignore_extend_select(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml above
    assert found(BAD, "--select", "GD4") == ["GD401", "GD402"]
    assert found(BAD, "--select", "GD30") == ["GD301", "GD302", "GD307"]  # GD306: not checked without --target
    assert "GD1" not in "".join(found(BAD, "--ignore", "GD1"))
    assert found(BAD, "--select", "GD4", "--extend-select", "GD101") == ["GD101", "GD401", "GD402"]
    code, _, err = invoke("check", BAD, "--select", "GD9")
    assert code == 2 and "--select" in err and len(err.strip().splitlines()) == 1
    code, _, err = invoke("check", BAD, "--ignore", "GD1O1")
    assert code == 2 and "did you mean 'GD101'" in err


def test_pyproject_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.graphdoctor]\nselect = ["GD1", "GD4"]\nignore = ["GD402"]\noutput-format = "concise"\n'
        'target = "te=none"\n', encoding="utf-8")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    settings = load_project_settings()
    assert settings.selection == Selection(select=("GD1", "GD4"), ignore=("GD402",))
    assert found(BAD) == ["GD101", "GD401"]
    assert found(BAD, "--select", "GD2") == ["GD201", "GD208", "GD219"]  # the command line's select replaces the file's
    code, out, _ = invoke("check", BAD)
    assert code == 1 and out.splitlines()[0].startswith(f"{BAD}:3:3: GD101 ")
    target = REPO / "fixtures" / "data" / "targets" / "cpu_no_te.json"
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "target.json").write_text(target.read_text(), encoding="utf-8")
    te_run = str(REPO / "examples" / "te_graphs.yaml")
    (tmp_path / "pyproject.toml").write_text('[tool.graphdoctor]\ntarget = "ci/target.json"\n', encoding="utf-8")
    code, out, _ = invoke("check", te_run, "--output-format", "json")  # relative to pyproject.toml, not sub/
    assert code == 1 and "GD304" in [f["code"] for f in json.loads(out)["findings"]]
    (tmp_path / "pyproject.toml").write_text('[tool.graphdoctor]\nselekt = ["GD1"]\n', encoding="utf-8")
    code, _, err = invoke("check", BAD)
    assert code == 2 and "did you mean 'select'" in err


def test_inline_suppression_in_yaml_and_launch_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = Path(BAD).read_text().replace("enable_cuda_graph: true", "enable_cuda_graph: true  # graphdoctor: ignore[GD101]")
    text = text.replace("cuda_graph_modules: [moe, moe_router]", "cuda_graph_modules: [moe, moe_router]  # graphdoctor: ignore[GD2]")
    run = tmp_path / "run.yaml"
    run.write_text(text, encoding="utf-8")
    codes = found(str(run))
    assert "GD101" not in codes and "GD201" not in codes and "GD208" not in codes and "GD401" in codes
    _, out, _ = invoke("check", str(run), "--output-format", "json")
    assert "4 finding(s) suppressed by inline comments" in json.loads(out)["notes"]  # GD101, GD201, GD208, GD219
    launch = tmp_path / "launch.txt"
    launch.write_text("pretrain_gpt.py \\\n  --cuda-graph-impl full_iteration \\  # graphdoctor: ignore[GD115]\n",
                      encoding="utf-8")
    assert "GD115" not in found(f"@{launch}")


def test_noqa_on_the_python_line_a_probe_finding_points_at(tmp_path: Path) -> None:
    source = tmp_path / "mlp.py"
    source.write_text("x = 1\ny = t.item()  # noqa: GD501\nz = t.item()  # noqa: E501\n", encoding="utf-8")
    probe = dict(code="GD501", name="host-sync-in-capture", severity=Severity.ERROR, message="m", source="probe")
    assert is_suppressed(Finding(**probe, locations=(f"{source}:2",)))
    assert not is_suppressed(Finding(**probe, locations=(f"{source}:3",)))
    assert not is_suppressed(Finding(**probe, locations=(f"{source}:1",)))


def test_did_you_mean_for_run_file_keys_sections_and_flags(tmp_path: Path) -> None:
    assert did_you_mean("cuda_graph_imp", ["cuda_graph_impl", "num_layers"]) == " (did you mean 'cuda_graph_impl'?)"
    assert did_you_mean("zzz", ["cuda_graph_impl"]) == ""
    run = tmp_path / "run.yaml"
    for text, hint in [("transformer:\n  cuda_graph_imp: local\n", "did you mean 'cuda_graph_impl'?"),
                       ("transfomer:\n  cuda_graph_impl: local\n", "did you mean 'transformer'?"),
                       ("run:\n  num_layer: 2\n", "did you mean 'num_layers'?")]:
        run.write_text(text, encoding="utf-8")
        code, _, err = invoke("check", str(run))
        assert code == 2 and hint in err and len(err.strip().splitlines()) == 1, err
    notes = parse_megatron_args("--cuda-graph-imp local --lr 1e-4").notes
    assert notes == ["flag no rule reads (Megatron-LM's parser takes them): --lr"]
    unknown = check(None, "--cuda-graph-imp local --lr 1e-4").findings
    assert [(f.code, f.message) for f in unknown] == [
        ("GD130", "--cuda-graph-imp is not a Megatron-LM flag: Megatron-LM's parser refuses it "
                  "(did you mean '--cuda-graph-impl'?)")]


def test_real_megatron_flags_near_a_known_one_are_not_called_typos() -> None:
    """`--moe-ffn-hidden-size` is close to `--ffn-hidden-size` but is Megatron-LM's own flag: it is
    counted with the other flags no rule reads, once, and is no GD130."""
    line = "--moe-ffn-hidden-size 512 --lr 1e-4 --lr 2e-4 --log-interval 1"
    notes = parse_megatron_args(line).notes
    assert notes == ["3 flags no rule reads (Megatron-LM's parser takes them): --moe-ffn-hidden-size, --lr, --log-interval"]
    assert "GD130" not in check(None, line).codes()
