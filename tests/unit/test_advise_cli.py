"""`graphdoctor advise` on the command line: --help, diff's model options, errors as one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.options import DIFF_OPTIONS


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_help_lists_diff_s_options_and_the_budget() -> None:
    code, output = invoke("advise", "--help")
    assert code == 0
    for opt in DIFF_OPTIONS:
        assert f"--{opt.name}" in output, opt.name
    for flag in ("--config", "--max-candidates", "--time-budget", "--json", "--html", "--workdir", "--quiet"):
        assert flag in output
    assert "Exit code 0 when a candidate passes" in " ".join(output.split())


def test_listed_in_the_command_group() -> None:
    code, output = invoke("--help")
    assert code == 0 and "advise" in output


@pytest.mark.parametrize(("args", "needle"), [
    (["advise", "--max-candidates", "0"], "--max-candidates"),
    (["advise", "--time-budget", "0"], "--time-budget"),
    (["advise", "--dropout", "1.5"], "dropout: got 1.5"),
    (["advise", "--impl", "eager"], "impl: got 'eager'"),
    (["advise", "--config", "/nonexistent/run.yaml"], "no such file"),
])
def test_bad_values_are_one_line_exit_2(args: list[str], needle: str) -> None:
    code, output = invoke(*args)
    assert code == 2 and needle in output and "Traceback" not in output
    assert len([ln for ln in output.splitlines() if ln.strip()]) == 1


def test_json_may_not_overwrite_the_run_file(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("run:\n  num_layers: 2\n", encoding="utf-8")
    code, output = invoke("advise", "--config", str(run), "--json", str(run))
    assert code == 2 and "--json" in output and run.read_text(encoding="utf-8") == "run:\n  num_layers: 2\n"


def test_without_gpu_one_line_exit_2() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    code, output = invoke("advise", "--num-layers", "2")
    assert code == 2
    assert "graphdoctor advise needs a CUDA GPU" in output and "graphdoctor check" in output
    assert len([ln for ln in output.splitlines() if ln.strip()]) == 1


def test_html_and_json_may_not_be_the_same_file(tmp_path: Path) -> None:
    out = tmp_path / "advise.out"
    code, output = invoke("advise", "--json", str(out), "--html", str(out))
    assert code == 2 and "the same file as --json" in output and not out.exists()


def test_plan_screens_an_moe_run_file_without_a_gpu() -> None:
    """`--plan` on the committed dropless allgather run file: Megatron and the catalogue reject `mlp`
    (every layer is MoE: GD204) and `moe` (dropless: GD205); `attn` and `moe_router` are not run (GD219: under
local the whole GPT layer, or nothing); GD217 warns where token dispatch is graphed;
    TE candidates are unavailable on this machine (no Transformer Engine); nothing needs a GPU."""
    code, output = invoke("advise", "--plan", "--impl", "local,full_iteration",
                          "--config", "fixtures/runfiles/moe_dropless_allgather.yaml")
    assert code == 0, output
    rows = {line.split("  ")[0].strip(): line for line in output.splitlines()[2:] if "  " in line}
    assert "rejected" in rows["local mlp"] and "GD204" in rows["local mlp"] and "megatron" in rows["local mlp"]
    assert "rejected" in rows["local moe"] and "GD205" in rows["local moe"]
    # megatron-core 0.19.2: local attn is the whole-layer graph, local moe_router graphs nothing (GD219)
    assert "rejected" in rows["local attn"] and "GD219 local ['attn'] graphs the whole layer" in rows["local attn"]
    assert "rejected" in rows["local moe_router"] and "GD219" in rows["local moe_router"]
    assert "GD217" in rows["local whole layer"] and "GD217" in rows["full_iteration whole step"]
    assert output.rstrip().endswith("2 of 6 candidates would run (plus eager once); nothing ran")


def test_plan_exit_1_when_no_candidate_would_run() -> None:
    code, output = invoke("advise", "--plan", "--impl", "transformer_engine")
    assert code == 1, output
    assert "0 of" in output and "unavailable" in output
