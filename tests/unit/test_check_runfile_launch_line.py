"""`check` reads a run file's own launch line (`run.megatron_args`) as `diff` does: under the run file's
`transformer:` and `run:` keys. A run file that names Megatron-LM's MoE example script is linted for what
that script configures (dropless alltoall MoE under local attn graphs: GD217 and GD219), and a
`transformer:` key of the run file wins over the script's flag."""

from __future__ import annotations

from pathlib import Path

from graphdoctor.rules import check

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "megatron" / "pretrain_moe_small.sh"


def _codes(tmp_path: Path, text: str) -> set[str]:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return {f.code for f in check(path).findings}


def test_the_run_files_launch_line_is_checked(tmp_path: Path) -> None:
    bare = _codes(tmp_path, "run:\n  steps: 4\n")
    with_line = _codes(tmp_path, f"run:\n  steps: 4\n  megatron_args: '@{SCRIPT}'\n")
    assert {"GD217", "GD219"} <= with_line - bare


def test_run_file_keys_override_its_launch_line(tmp_path: Path) -> None:
    drop_and_pad = _codes(tmp_path, (
        "transformer:\n  moe_expert_capacity_factor: 1.0\n  moe_pad_expert_input_to_capacity: true\n"
        f"run:\n  megatron_args: '@{SCRIPT}'\n"))
    assert "GD217" not in drop_and_pad  # alltoall with drop-and-pad makes no host copy in dispatch
    assert "GD219" in drop_and_pad     # still local attn on GPT layers


def test_a_bad_value_in_the_run_files_launch_line_names_the_run_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from graphdoctor.cli import main

    path = tmp_path / "run.yaml"
    path.write_text("run:\n  megatron_args: '--num-layers two'\n", encoding="utf-8")
    said = {"check": "--num-layers: got 'two', expected an integer",
            "diff": "Megatron-LM's parser refuses the line: argument --num-layers: invalid int value: 'two'"}
    for command in (["check", str(path)], ["diff", "--config", str(path), "-q"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, result.output
        expected = f"{path}: run.megatron_args: {said[command[0]]}"
        assert result.stderr.strip() == f"graphdoctor: error: {expected}", result.stderr
    # a --megatron-args given on the command line is named by its flag alone, as before
    flag = CliRunner().invoke(main, ["diff", "--config", str(path), "--megatron-args", "--num-layers x", "-q"])
    assert flag.exit_code == 2 and str(path) not in flag.stderr, flag.stderr
