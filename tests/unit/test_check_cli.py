"""CLI tests for `graphdoctor check`, `graphdoctor rules` and `graphdoctor rule` (CliRunner, CPU only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.rules import EnvironmentFacts, check, parse_megatron_args

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_check_error_finding_exits_1_with_table() -> None:
    code, out, _ = invoke("check", "--config", str(FIXTURES / "GD101_bad.yaml"), "--output-format", "table")
    assert code == 1
    for column in ("code", "name", "severity", "fields", "message", "fix"):
        assert column in out
    assert "GD101" in out and "legacy-flag-with-cuda-graph-impl" in out


def test_default_output_is_one_block_per_finding() -> None:
    """ruff's full format: `severity[CODE] name: message`, the location with its source line, settings, fix."""
    path = FIXTURES / "GD101_bad.yaml"
    code, out, _ = invoke("check", str(path))
    assert code == 1
    block = out.split("\n\n")[0].splitlines()
    assert block[0].startswith("error[GD101] legacy-flag-with-cuda-graph-impl: enable_cuda_graph=True")
    assert block[1] == f"  --> {path}:2"
    assert block[3] == "2 |   cuda_graph_impl: local          # [GD101]"
    assert block[-2].startswith("  = settings: ") and block[-1].startswith("  = fix: Remove enable_cuda_graph")
    assert out.rstrip().splitlines()[-1].endswith("finding(s): 1 error, 2 warning, 0 info")


def test_check_clean_config_exits_0() -> None:
    code, out, _ = invoke("check", "--config", str(FIXTURES / "GD106_good.yaml"))
    assert code == 0, out


def test_check_json_schema(tmp_path: Path) -> None:
    path = write(tmp_path, "transformer:\n  cuda_graph_impl: full_iteration\n  cuda_graph_modules: [attn]\n")
    code, out, _ = invoke("check", "--config", path, "--format", "json")
    data = json.loads(out)
    # schema 2: the one envelope of docs/json.md (schema_version, tool, command, then the payload)
    assert code == 1 and data["schema_version"] == 2 and data["has_errors"] is True
    assert data["command"] == "check" and data["tool"]["name"] == "graphdoctor"
    finding = next(f for f in data["findings"] if f["code"] == "GD114")
    assert set(finding) >= {"code", "name", "severity", "message", "fix", "fields", "locations"}
    assert finding["locations"] == [f"{path}:2", f"{path}:3"]


def test_megatron_args_inline_and_ignored_flags_noted() -> None:
    code, out, _ = invoke("check", "--megatron-args", "pretrain_gpt.py --cuda-graph-impl full_iteration --lr 1e-4")
    assert code == 1 and "GD115" in out and "flag no rule reads (Megatron-LM's parser takes them): --lr" in out


def test_megatron_args_from_file() -> None:
    _, out, _ = invoke("check", "--megatron-args", f"@{FIXTURES / 'GD115_good.txt'}", "--format", "json")
    assert "GD115" not in [f["code"] for f in json.loads(out)["findings"]]


def test_config_and_args_combined(tmp_path: Path) -> None:
    path = write(tmp_path, "transformer:\n  cuda_graph_impl: local\n")
    code, out, _ = invoke("check", "--config", path, "--megatron-args", "--enable-cuda-graph", "--format", "json")
    assert code == 1 and "GD101" in [f["code"] for f in json.loads(out)["findings"]]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("transformer:\n  cuda_graph_implementation: local\n", "cuda_graph_implementation"),
        ("transformer:\n  cuda_graph_warmup_steps: three\n", "cuda_graph_warmup_steps"),
        ("transformer:\n  enable_cuda_graph: 1\n", "enable_cuda_graph"),
        ("transformer: [1, 2]\n", "transformer"),
        ("transformer:\n  a: [\n", "not valid YAML"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, text: str, needle: str) -> None:
    code, out, err = invoke("check", "--config", write(tmp_path, text))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err + out


def test_missing_file_and_no_input_exit_2(tmp_path: Path) -> None:
    assert invoke("check", "--config", str(tmp_path / "nope.yaml"))[0] == 2
    assert invoke("check", "--megatron-args", f"@{tmp_path / 'nope.txt'}")[0] == 2
    assert invoke("check")[0] == 2
    assert invoke("check", "--megatron-args", "--num-experts many")[0] == 2


def test_select_and_gpu_arch(tmp_path: Path) -> None:
    path = write(tmp_path, "transformer:\n  cuda_graph_impl: local\n  hidden_dropout: 0.0\n  attention_dropout: 0.0\n"
                           "env:\n  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\n")
    _, out, _ = invoke("check", "--config", path, "--select", "GD301", "--gpu-arch", "sm_90", "--format", "json")
    assert [f["code"] for f in json.loads(out)["findings"]] == ["GD301"]
    _, out, _ = invoke("check", "--config", path, "--select", "GD301", "--gpu-arch", "sm_100", "--format", "json")
    assert json.loads(out)["findings"] == []
    assert invoke("check", "--config", path, "--select", "GD999")[0] == 2


def test_rules_listing_formats(tmp_path: Path) -> None:
    code, out, _ = invoke("rules")
    assert code == 0 and "GD101" in out and "GD510" in out
    data = json.loads(invoke("rules", "--format", "json")[1])
    # schema 2: the envelope (docs/json.md) around {"rules": [...]} instead of a bare list
    assert data["schema_version"] == 2 and data["command"] == "rules"
    assert {"code", "name", "family", "severity", "fix", "status", "explanation"} <= set(data["rules"][0])
    code, out, _ = invoke("rules", "--format", "md", "--output", str(tmp_path / "docs"))
    assert code == 0 and (tmp_path / "docs" / "index.md").is_file() and (tmp_path / "docs" / "GD301.md").is_file()


def test_rule_command() -> None:
    code, out, _ = invoke("rule", "GD101")
    assert code == 0
    for needle in ("legacy-flag-with-cuda-graph-impl", "GD101", "Family: configuration", "Fix is always available.",
                   "Status: stable", "## Why is this bad?"):
        assert needle in out
    data = json.loads(invoke("rule", "gd501", "--format", "json")[1])
    assert data["name"] == "host-sync-in-capture" and data["runtime"] is True
    code, _, err = invoke("rule", "GD999")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_library_check_without_click() -> None:
    report = check({"transformer": {"cuda_graph_impl": "local", "enable_cuda_graph": True}})
    assert report.has_errors and "GD101" in report.codes()
    te_installed = EnvironmentFacts(te_version="2.12.0")
    assert not check({"transformer": {"cuda_graph_impl": "transformer_engine"}}, facts=te_installed).has_errors


def test_parse_megatron_args_mapping() -> None:
    parsed = parse_megatron_args("torchrun x.py --num-experts 8 --moe-layer-freq ([0]+[1]*3)*2 "
                                 "--cuda-graph-modules attn moe_router --no-check-for-nan-in-loss-and-grad --lr 1")
    assert parsed.transformer["num_moe_experts"] == 8
    assert parsed.transformer["moe_layer_freq"] == [0, 1, 1, 1, 0, 1, 1, 1]
    assert parsed.transformer["cuda_graph_modules"] == ["attn", "moe_router"]
    assert parsed.args["check_for_nan_in_loss_and_grad"] is False
    assert parsed.notes == ["flag no rule reads (Megatron-LM's parser takes them): --lr"]
