"""GD312 beyond its fixtures: fp16's dynamic loss scaler under full-iteration graphs, from a run file, a
Megatron-LM launch line and a Megatron-Bridge config; silent with a static loss scale, bf16 or per-layer graphs;
its message names the grad_scaler.py lines of the megatron-core installed here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graphdoctor.errors import UsageError
from graphdoctor.rules import EnvironmentFacts, Severity, check
from graphdoctor.rules.finding import Finding
from graphdoctor.rules.scaler import installed_scaler

FACTS = EnvironmentFacts(te_version="2.12.0", torch_version="2.11.0", torch_has_stale_capture_override=True,
                         torch_has_graph_safe_rng=True)
LINE = ("--fp16 --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 2")
BRIDGE_MODEL = ("model:\n  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n  num_layers: 2\n"
                "  hidden_size: 256\n  num_attention_heads: 4\n  cuda_graph_impl: full_iteration\n"
                "  use_te_rng_tracker: true\nrng:\n  te_rng_tracker: true\n"
                "rerun_state_machine:\n  check_for_nan_in_loss: false\n")


def gd312(source: Any = None, megatron_args: str | None = None) -> list[Finding]:
    return [f for f in check(source, megatron_args, facts=FACTS).findings if f.code == "GD312"]


def line_of(path: Path, start: str) -> str:
    """`path:line` of the one line that starts with `start`."""
    (found,) = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(start)]
    return f"{path}:{found}"


def run_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_fp16_full_iteration_run_file_names_the_installed_scaler_lines(tmp_path: Path) -> None:
    path = run_file(tmp_path, "transformer:\n  cuda_graph_impl: full_iteration\nrun:\n  dtype: fp16\n")
    (finding,) = gd312(path)
    lines = installed_scaler().lines
    assert lines and finding.severity is Severity.WARNING
    assert f"grad_scaler.py:{lines[0]}" in finding.message
    assert all(f":{n}" in finding.message for n in lines)
    if installed_scaler().version == "0.19.2":
        assert lines == (143, 153)
        assert "megatron-core 0.19.2's DynamicGradScaler.update rebinds self._scale (grad_scaler.py:143, :153)" \
            in finding.message
    assert finding.locations == (f"{path}:2", f"{path}:4")
    assert set(finding.fields) == {"run.dtype", "transformer.cuda_graph_impl"}
    assert finding.fix == ("Train in bf16, set a static loss scale (--loss-scale, run.loss_scale), or graph with "
                           "local / transformer_engine, which keep the loss scaling outside the graph")


@pytest.mark.parametrize("source", [
    {"transformer": {"cuda_graph_impl": "full_iteration"}, "run": {"dtype": "fp16", "loss_scale": 4096}},
    {"transformer": {"cuda_graph_impl": "full_iteration"}, "run": {"dtype": "bf16"}},
    {"transformer": {"cuda_graph_impl": "full_iteration", "bf16": True}},
    {"transformer": {"cuda_graph_impl": "local"}, "run": {"dtype": "fp16"}},
    {"transformer": {"cuda_graph_impl": "transformer_engine", "fp16": True}},
    {"transformer": {"cuda_graph_impl": "full_iteration"}, "run": {"dtype": "fp32"}},
], ids=["static-4096", "bf16", "transformer-bf16", "fp16-local", "fp16-te", "fp32"])
def test_silent_with_static_scale_bf16_or_per_layer_graphs(source: dict[str, Any]) -> None:
    assert not gd312(source)


@pytest.mark.parametrize("source", [
    {"transformer": {"cuda_graph_impl": "full_iteration", "fp16": True}},
    {"transformer": {"enable_cuda_graph": True, "cuda_graph_modules": ["full_iteration"], "fp16": True}},
    {"transformer": {"fp16": True}, "run": {"impls": ["local", "full_iteration"]}},
    {"run": {"dtype": "fp16"}},
], ids=["transformer-fp16", "legacy-module", "run-impls", "diff-default-impls"])
def test_every_spelling_of_fp16_and_full_iteration(source: dict[str, Any]) -> None:
    (finding,) = gd312(source)
    assert finding.severity is Severity.WARNING


def test_launch_line_with_and_without_a_static_loss_scale() -> None:
    (finding,) = gd312(megatron_args=LINE)
    assert finding.locations == ("--cuda-graph-impl", "--fp16")
    assert not gd312(megatron_args=f"{LINE} --loss-scale 4096")
    assert not gd312(megatron_args=LINE.replace("--fp16", "--bf16"))
    assert not gd312(megatron_args=LINE.replace("full_iteration", "local"))


def test_run_file_loss_scale_covers_its_own_launch_line(tmp_path: Path) -> None:
    path = run_file(tmp_path, f"run:\n  megatron_args: \"{LINE}\"\n")
    assert len(gd312(path)) == 1
    assert not gd312(run_file(tmp_path, f"run:\n  loss_scale: 4096\n  megatron_args: \"{LINE}\"\n"))


@pytest.mark.parametrize(("tail", "fp16_line"), [
    ("optimizer:\n  fp16: true\n", "  fp16: true"),
    ("mixed_precision: fp16_mixed\n", "mixed_precision:"),
    # the recipe's loss_scale (None) is written over the optimizer's by MixedPrecisionConfig.setup
    ("optimizer:\n  loss_scale: 4096\nmixed_precision: fp16-mixed\n", "mixed_precision:"),
    ("mixed_precision:\n  fp16: true\n", "  fp16: true"),
], ids=["optimizer-fp16", "recipe", "recipe-over-optimizer-scale", "mapping"])
def test_bridge_fp16_with_the_dynamic_scaler(tmp_path: Path, tail: str, fp16_line: str) -> None:
    path = run_file(tmp_path, BRIDGE_MODEL + tail)
    (finding,) = gd312(path)
    assert set(finding.locations) == {line_of(path, "  cuda_graph_impl:"), line_of(path, fp16_line)}


@pytest.mark.parametrize("tail", [
    "optimizer:\n  fp16: true\n  loss_scale: 4096\n",
    "mixed_precision:\n  fp16: true\n  loss_scale: 1024.0\n",
    "mixed_precision: bf16_mixed\n",
    "optimizer:\n  fp16: false\n",
], ids=["optimizer-static", "mapping-static", "bf16-recipe", "optimizer-fp32"])
def test_bridge_silent(tmp_path: Path, tail: str) -> None:
    assert not gd312(run_file(tmp_path, BRIDGE_MODEL + tail))


def test_bridge_bad_loss_scale_is_refused_with_its_line(tmp_path: Path) -> None:
    path = run_file(tmp_path, BRIDGE_MODEL + "optimizer:\n  loss_scale: big\n")
    with pytest.raises(UsageError, match=r"run.yaml:\d+: optimizer.loss_scale: got .*expected a number >= 0 or null"):
        check(path, facts=FACTS)


def test_run_file_loss_scale_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"run.loss_scale: expected a number > 0, got"):
        check(run_file(tmp_path, "run:\n  dtype: fp16\n  loss_scale: -1\n"), facts=FACTS)
