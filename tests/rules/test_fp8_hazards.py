"""GD406 (FP8 primary weights loaded under graphs, Megatron-LM#6036) and GD407 (NVFP4 TE graphs of Mamba layers
across an evaluation, TransformerEngine#3316) on the inputs users give: a launch line, a Megatron-Bridge config,
a run file; with the training machine's Transformer Engine known, too old to matter, or unknown."""

from __future__ import annotations

from pathlib import Path

from graphdoctor.rules import EnvironmentFacts, check

LINE = ("pretrain_gpt.py --bf16 --fp8-format hybrid --fp8-param-gather --use-distributed-optimizer "
        "--cuda-graph-impl {impl} --load ckpt/llama3")


def _findings(source: object, te: str | None, line: str | None = None) -> list:
    """GD406 and GD407 findings, "not checked" ones included; `te` "unknown": the training machine is unknown."""
    facts = EnvironmentFacts.unknown_machine() if te == "unknown" else EnvironmentFacts().with_overrides(
        {"te_version": te})
    report = check(source, line, facts=facts)
    return [f for f in (*report.findings, *report.not_checked) if f.code in ("GD406", "GD407")]


def test_fp8_weights_loaded_under_each_graph_impl() -> None:
    for impl in ("local", "transformer_engine", "full_iteration"):
        extra = " --no-check-for-nan-in-loss-and-grad" if impl == "full_iteration" else ""
        found = _findings(None, "2.20.2", LINE.format(impl=impl) + extra)
        assert [f.code for f in found] == ["GD406"], impl
        assert "ckpt/llama3" in found[0].message and impl in found[0].message


def test_fp8_weights_loaded_before_te_2_18_or_without_graphs_or_load() -> None:
    assert _findings(None, "2.17.0", LINE.format(impl="transformer_engine")) == []
    assert _findings(None, "2.20.2", LINE.format(impl="none")) == []
    assert _findings(None, "2.20.2", LINE.format(impl="local").replace(" --load ckpt/llama3", "")) == []


def test_fp8_weights_load_with_unknown_te_is_not_checked() -> None:
    found = _findings(None, "unknown", LINE.format(impl="transformer_engine"))
    assert found and all(f.severity.value == "info" and f.extra.get("not_checked") for f in found)


def test_bridge_checkpoint_load_is_located(tmp_path: Path) -> None:  # and not checked on an unknown machine
    config = tmp_path / "bridge.yaml"
    config.write_text("model:\n  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n  bf16: true\n"
                      "  fp8: hybrid\n  fp8_param: true\n  cuda_graph_impl: transformer_engine\n"
                      "  use_te_rng_tracker: true\nrng:\n  te_rng_tracker: true\n"
                      "checkpoint:\n  pretrained_checkpoint: /ckpt/base\n")
    found = _findings(config, "2.20.2")
    assert [f.code for f in found] == ["GD406"]
    assert f"{config}:13" in found[0].locations and "/ckpt/base" in found[0].message
    unknown = _findings(config, "unknown")
    assert [f.code for f in unknown] == ["GD406"] and unknown[0].extra.get("not_checked")


def test_nvfp4_mamba_graphs_on_a_hybrid_line_with_and_without_evaluation() -> None:
    line = ("pretrain_mamba.py --hybrid-layer-pattern M*M* --bf16 --fp4-format e2m1 --fp4-recipe nvfp4 "
            "--cuda-graph-impl transformer_engine --eval-iters {iters}")
    found = _findings(None, "2.20.2", line.format(iters=10))
    assert [f.code for f in found] == ["GD407"] and "whole hybrid layers" in found[0].message
    assert _findings(None, "2.20.2", line.format(iters=0)) == []
    assert _findings(None, "2.20.2", line.format(iters=10).replace("nvfp4", "mxfp8")) == []
