"""A run file's CUDA-graph settings under `transformer:` (config.GRAPH_FIELDS) choose what diff compares, as a
launch line's do, and never reach the eager reference. Before, they went into every child's TransformerConfig:
`enable_cuda_graph: true` gave the eager reference local graphs (and the graphed runs Megatron's refusal), and
the deprecated `cuda_graph_scope: full_iteration` made every child, eager included, a full_iteration run, so the
diff compared graphs against graphs. Checked on megatron-core's real TransformerConfig (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.cli.diff import build_config
from graphdoctor.config import GRAPH_FIELDS, DiffConfig
from graphdoctor.config.build import child_transformer_config as transformer_config
from graphdoctor.errors import UsageError
from graphdoctor.options import DIFF_OPTIONS

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, text: str, **given: object) -> DiffConfig:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return build_config(str(path), {**{option.field: None for option in DIFF_OPTIONS}, **given})


def _graphs(config: DiffConfig, impl: str) -> tuple[str, bool, list[str]]:
    built = transformer_config(config, impl, 0.0)
    return built.cuda_graph_impl, built.enable_cuda_graph, [m.name for m in built.cuda_graph_modules]


def test_the_legacy_enable_flag_diffs_local_and_leaves_the_eager_reference_eager(tmp_path: Path) -> None:
    config = _config(tmp_path, "transformer:\n  enable_cuda_graph: true\n")
    assert config.impls == ("local",) and config.transformer == {}
    assert _graphs(config, "eager") == ("none", False, [])
    assert _graphs(config, "local") == ("local", False, [])


def test_the_deprecated_full_iteration_scope_diffs_full_iteration_against_eager(tmp_path: Path) -> None:
    config = _config(tmp_path, "transformer:\n  cuda_graph_impl: local\n  cuda_graph_scope: full_iteration\n")
    assert config.impls == ("full_iteration",)
    assert _graphs(config, "eager") == ("none", False, [])
    assert _graphs(config, "full_iteration") == ("full_iteration", False, [])


def test_the_example_run_file_is_diffed_as_it_trains(tmp_path: Path) -> None:
    """examples/te_graphs.yaml: transformer_engine graphs of attn and mlp, TE layers, bf16."""
    config = build_config(str(REPO / "examples/te_graphs.yaml"), {option.field: None for option in DIFF_OPTIONS})
    assert (config.impls, config.cuda_graph_modules, config.dtype, config.layer_spec) == \
        (("transformer_engine",), ("attn", "mlp"), "bf16", "te")
    assert not set(GRAPH_FIELDS) & set(config.transformer)
    assert _graphs(config, "eager") == ("none", False, [])
    assert _graphs(config, "transformer_engine") == ("transformer_engine", False, ["attn", "mlp"])
    eager = transformer_config(config, "eager", 0.0)
    assert eager.bf16 is True and str(eager.params_dtype) == "torch.bfloat16"


def test_flags_win_over_the_run_files_graph_and_precision_settings(tmp_path: Path) -> None:
    text = (REPO / "examples/te_graphs.yaml").read_text(encoding="utf-8")
    config = _config(tmp_path, text, impls="local,full_iteration", dtype="fp32", cuda_graph_modules="mlp")
    assert (config.impls, config.cuda_graph_modules, config.dtype) == (("local", "full_iteration"), ("mlp",), "fp32")
    assert config.transformer["bf16"] is False  # the mapping's copy agrees with --dtype
    built = transformer_config(config, "local", 0.0)
    assert built.bf16 is False and str(built.params_dtype) == "torch.float32"


def test_the_run_file_sits_over_a_launch_line(tmp_path: Path) -> None:
    config = _config(tmp_path, "transformer:\n  cuda_graph_impl: full_iteration\nrun:\n  megatron_args: "
                               "--cuda-graph-impl local --num-layers 2 --hidden-size 128 --num-attention-heads 4\n")
    assert config.impls == ("full_iteration",)
    assert any("impls full_iteration (line: --cuda-graph-impl local)" in note for note in config.launch_notes)


def test_one_dropout_the_larger_as_for_a_launch_line(tmp_path: Path) -> None:
    config = _config(tmp_path, "transformer:\n  hidden_dropout: 0.1\n  attention_dropout: 0.0\n")
    assert config.dropout == 0.1
    assert config.transformer == {"hidden_dropout": 0.1, "attention_dropout": 0.1}


@pytest.mark.parametrize(("text", "message"), [
    ("transformer:\n  enable_cuda_graph: true\n  cuda_graph_impl: local\n",
     r"run.yaml: transformer.enable_cuda_graph: expected it, or external_cuda_graph, without cuda_graph_impl local"),
    ("transformer:\n  cuda_graph_impl: local\n  cuda_graph_modules: [atn]\n",
     r"run.yaml: transformer.cuda_graph_modules: got 'atn', expected one of .*did you mean 'attn'"),
    ("transformer:\n  cuda_graph_impl: full_iteration\n  cuda_graph_modules: [attn]\n",
     r"run.yaml: transformer.cuda_graph_modules: expected none with .*transformer.cuda_graph_impl full_iteration"),
])
def test_graph_settings_megatron_refuses_are_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _config(tmp_path, text)
    result = CliRunner().invoke(main, ["diff", "--config", str(tmp_path / "run.yaml"), "-q"])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_child_never_lets_the_eager_reference_build_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard behind RUN_OWNED_FIELDS: were a graph setting to reach the eager reference's TransformerConfig,
    the child refuses to train it rather than compare graphs against graphs."""
    from graphdoctor.config import diff_config

    config = DiffConfig(impls=("full_iteration",), transformer={"cuda_graph_scope": "full_iteration"})
    assert _graphs(config, "eager") == ("none", False, [])  # skipped: the API's mapping is not consulted
    monkeypatch.setattr(diff_config, "RUN_OWNED_FIELDS", frozenset())
    with pytest.raises(UsageError, match="the eager reference would build CUDA graphs .*'full_iteration'"):
        transformer_config(config.replace(), "eager", 0.0)  # the model derived again without the guard


def test_modules_with_only_full_iteration_are_refused_as_megatron_refuses_them(tmp_path: Path) -> None:
    """`--impl full_iteration --cuda-graph-modules moe` graphs the whole step and would drop the modules without a
    word; Megatron's TransformerConfig refuses the pair, and so does the diff (exit 2, one line). Beside local or
    transformer_engine the modules apply to those and full_iteration runs whole."""
    with pytest.raises(UsageError, match="cuda_graph_modules: got moe with only full_iteration"):
        DiffConfig(impls=("full_iteration",), cuda_graph_modules=("moe",))
    from megatron.core.transformer.transformer_config import TransformerConfig

    with pytest.raises(AssertionError, match="cuda_graph_modules must be empty"):
        TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, cuda_graph_impl="full_iteration",
                          cuda_graph_modules=["moe"])
    mixed = DiffConfig(impls=("local", "full_iteration"), cuda_graph_modules=("mlp",))
    assert _graphs(mixed, "local")[2] == ["mlp"] and _graphs(mixed, "full_iteration")[2] == []
    result = CliRunner().invoke(main, ["diff", "--impl", "full_iteration", "--cuda-graph-modules", "moe"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "cuda_graph_modules: got moe" in result.output
