"""TransformerConfig fields DiffConfig has under the same name (config.TRANSFORMER_TWINS): a run file's
`transformer:` value fills the DiffConfig field, a flag wins over it, and the model the child builds, the
placement graphdoctor checks and the report all carry the one value. Before, through the CLI (which passes every
flag, unset ones as None) a run file's `num_layers: 6, hidden_size: 128` was reported as the default 4x256 while
the child built 6x128, and its tensor_model_parallel_size reached only the child's TransformerConfig."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.cli.diff import build_config
from graphdoctor.config import TRANSFORMER_TWINS, DiffConfig
from graphdoctor.config.build import child_transformer_config as transformer_config
from graphdoctor.config.child_model import one_gpu
from graphdoctor.config.twins import MISSING, TWINS, Twin, getter
from graphdoctor.diff import DiffReport
from graphdoctor.errors import UsageError
from graphdoctor.options import DIFF_OPTIONS
from graphdoctor.report.diff import render_text

REPO = Path(__file__).resolve().parents[2]

SHAPE = "transformer:\n  num_layers: 6\n  hidden_size: 128\n  num_attention_heads: 4\n"


def _cli_values(**given: object) -> dict[str, object]:
    """The flag values the CLI hands build_config: every option, unset ones as None."""
    return {**{option.field: None for option in DIFF_OPTIONS}, **given}


def _run_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_every_twin_is_a_field_of_both() -> None:
    """Every row of the one table: a DiffConfig field; its Megatron names are TransformerConfig fields where the
    run owns them, Megatron-LM argument dests otherwise (the names a launch line's parser gives)."""
    import dataclasses

    from megatron.core.transformer.transformer_config import TransformerConfig

    from graphdoctor.config.megatron_lm import megatron_flags

    transformer = {f.name for f in dataclasses.fields(TransformerConfig)}
    dests = {flag.dest for flag in megatron_flags().values()}
    assert set(TRANSFORMER_TWINS) <= {f.name for f in dataclasses.fields(DiffConfig)}
    assert set(TRANSFORMER_TWINS) <= transformer
    for twin in TWINS:
        assert twin.field in {f.name for f in dataclasses.fields(DiffConfig)}, twin.field
        if twin.transformer:
            assert set(twin.names) <= transformer, twin
        else:
            assert set(twin.names) <= dests, twin


@pytest.mark.parametrize("twin", TWINS, ids=lambda twin: twin.field)
def test_each_twin_reads_back_what_it_writes(twin: Twin) -> None:
    """DiffConfig value -> Megatron settings -> DiffConfig value gives the value again, for the default and, for
    the converted twins, each value they can take."""
    import dataclasses

    default = {f.name: f.default for f in dataclasses.fields(DiffConfig)}[twin.field]
    values = {"dtype": ["fp32", "bf16", "fp16"], "dropout": [0.0, 0.1], "layer_spec": ["local", "te"]}.get(
        twin.field, [default if default is not None else 1])
    for value in values:
        settings = twin.to_megatron(list(value) if isinstance(value, tuple) else value)
        assert set(settings) <= set(twin.names), settings
        read = twin.read(getter({**{name: False for name in twin.names}, **settings}))
        expected = tuple(value) if isinstance(value, tuple) else value
        if twin.field == "dtype" and value == "fp32":
            assert read is MISSING  # neither flag set: a run file that says nothing of the precision
        else:
            assert (tuple(read) if isinstance(read, list) else read) == expected, (twin.field, value, read)


def test_the_run_files_model_shape_is_the_one_reported_and_built(tmp_path: Path) -> None:
    config = build_config(_run_file(tmp_path, SHAPE), _cli_values())
    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (6, 128, 4)
    built = transformer_config(config, "eager", 0.0)
    assert (built.num_layers, built.hidden_size, built.num_attention_heads) == (6, 128, 4)


def test_a_flag_wins_over_the_run_file_in_the_model_too(tmp_path: Path) -> None:
    config = build_config(_run_file(tmp_path, SHAPE), _cli_values(num_layers=2))
    assert config.num_layers == 2 and config.transformer["num_layers"] == 2
    assert transformer_config(config, "eager", 0.0).num_layers == 2
    assert config.hidden_size == 128  # the fields no flag set still come from the run file


def test_the_run_files_run_section_wins_over_its_transformer_section(tmp_path: Path) -> None:
    config = build_config(_run_file(tmp_path, SHAPE + "run:\n  num_layers: 3\n"), _cli_values())
    assert config.num_layers == 3 and transformer_config(config, "eager", 0.0).num_layers == 3


def test_a_parallel_size_in_the_run_file_is_a_placement_refused_before_any_gpu_work(tmp_path: Path) -> None:
    path = _run_file(tmp_path, "transformer:\n  tensor_model_parallel_size: 2\n")
    with pytest.raises(UsageError, match="tensor_model_parallel_size 2 .* does not divide nproc_per_node 1"):
        build_config(path, _cli_values())
    result = CliRunner().invoke(main, ["diff", "--config", path, "-q"])
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert "does not divide nproc_per_node 1" in line
    placed = build_config(path, _cli_values(nproc_per_node=2))
    assert (placed.tensor_model_parallel_size, placed.nproc_per_node) == (2, 2)


def test_the_one_gpu_copy_of_a_placed_run_builds_one_gpu_too(tmp_path: Path) -> None:
    """The probe worker's model (child.distributed.one_gpu): the mapping's parallel sizes follow the fields."""
    path = _run_file(tmp_path, "transformer:\n  tensor_model_parallel_size: 2\n  sequence_parallel: true\n")
    placed = build_config(path, _cli_values(nproc_per_node=2))
    assert placed.sequence_parallel is True
    single = one_gpu(placed)
    assert single.transformer == {"tensor_model_parallel_size": 1, "sequence_parallel": False}
    assert transformer_config(single, "eager", 0.0).tensor_model_parallel_size == 1


def test_the_api_takes_the_fields_value_over_the_mappings() -> None:
    config = DiffConfig(num_layers=2, transformer={"num_layers": 8, "add_bias_linear": False})
    assert config.transformer == {"num_layers": 2, "add_bias_linear": False}
    assert DiffConfig.from_dict(config.to_dict()) == config


def test_a_transformer_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(UsageError, match="transformer: got .*expected a mapping"):
        DiffConfig(transformer=["num_layers"])  # type: ignore[arg-type]


def test_the_run_files_transformer_values_sit_over_a_launch_line(tmp_path: Path) -> None:
    """docs/diff.md's order: defaults < launch line < run file (run:, transformer:) < flags."""
    text = SHAPE + "  hidden_dropout: 0.0\nrun:\n  megatron_args: --num-layers 24 --hidden-size 512 " \
                   "--num-attention-heads 8 --seq-length 128 --max-position-embeddings 128\n"
    config = build_config(_run_file(tmp_path, text), _cli_values())
    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (6, 128, 4)
    assert config.dropout == 0.0  # Megatron-LM's default 0.1 is the launch line's, under the run file
    assert any("num_layers 6 (line: --num-layers 24)" in note for note in config.launch_notes)
    flagged = build_config(_run_file(tmp_path, text), _cli_values(num_layers=2))
    assert flagged.num_layers == 2 and transformer_config(flagged, "eager", 0.0).num_layers == 2


def _gpt_parameters(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Parameters of Megatron's local GPT spec as diff builds it: word and position embeddings, per layer the
    fused QKV, the projection, the two-layer MLP (4 x hidden) and two layernorms, the final layernorm and an
    untied output layer (biases everywhere, Megatron's defaults)."""
    layer = (hidden * 3 * hidden + 3 * hidden) + (hidden * hidden + hidden) + (hidden * 4 * hidden + 4 * hidden) \
        + (4 * hidden * hidden + hidden) + 2 * 2 * hidden
    return vocab * hidden + seq * hidden + layers * layer + 2 * hidden + vocab * hidden


def test_the_h200_run_of_a_shape_under_transformer_built_and_reported_that_shape() -> None:
    """fixtures/runfiles/shape_in_transformer.yaml ran on the H200 after the fix: the report's header, its config
    and the parameter count of the model the child built all say 2 x 128 (before, the header said 4 x 256)."""
    report = DiffReport.from_dict(json.loads(
        (REPO / "fixtures/data/diff/h200_runfile_shape_schema2.json").read_text(encoding="utf-8")))
    here = build_config(str(REPO / "fixtures/runfiles/shape_in_transformer.yaml"),
                        _cli_values(impls="local,full_iteration"))
    assert report.config.to_dict() == here.replace(launch_notes=report.config.launch_notes).to_dict()
    assert render_text(report).splitlines()[0].startswith("graphdoctor diff: GPTModel 2x128 (4 heads), seq 64")
    built = _gpt_parameters(2, 128, 512, 64)
    assert report.reference.num_parameters == built != _gpt_parameters(4, 256, 512, 64)
    assert [r.verdict.value for r in report.results] == ["match", "match"]
