"""Transformer Engine environment and version rules beyond their fixtures: GD301 per impl and GPU,
GD304 missing / not importable, GD305 feature gates, GD213 tiers, and TE detection by file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graphdoctor.rules import EnvironmentFacts, check, detect_facts

TE_OK = EnvironmentFacts(te_version="2.12.0", torch_has_stale_capture_override=True)
A2A = {"num_moe_experts": 8, "expert_model_parallel_size": 2, "moe_token_dispatcher_type": "alltoall",
       "bf16": True, "overlap_moe_expert_parallel_comm": True}


def findings(code: str, transformer: dict[str, Any], facts: EnvironmentFacts = TE_OK,
             env: dict[str, str] | None = None) -> list[Any]:
    report = check({"transformer": transformer, "env": env or {}}, facts=facts)
    return [f for f in report.findings if f.code == code]


@pytest.mark.parametrize("arch", [(9, 0), (10, 0), None])
def test_gd301_is_an_error_for_te_graphs_on_every_gpu(arch: tuple[int, int] | None) -> None:
    facts = EnvironmentFacts(te_version="2.12.0", gpu_capability=arch)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:True"}
    (finding,) = findings("GD301", {"cuda_graph_impl": "transformer_engine"}, facts, env)
    assert finding.severity == "error" and "Megatron asserts" in finding.message
    assert not findings("GD301", {"cuda_graph_impl": "transformer_engine"}, facts,
                        {**env, "NCCL_GRAPH_REGISTER": "0"})


@pytest.mark.parametrize(("arch", "expected"), [((9, 0), ["warning"]), (None, ["warning"]), ((10, 0), [])])
def test_gd301_local_graphs_only_warn_before_sm100(arch: tuple[int, int] | None, expected: list[str]) -> None:
    facts = EnvironmentFacts(gpu_capability=arch)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_GRAPH_REGISTER": "1"}
    got = findings("GD301", {"cuda_graph_impl": "local"}, facts, env)
    assert [f.severity for f in got] == expected


def test_gd304_missing_and_not_importable_are_errors_naming_the_extra() -> None:
    te = {"cuda_graph_impl": "transformer_engine"}
    (missing,) = findings("GD304", te, EnvironmentFacts(te_version=None))
    assert missing.severity == "error" and "not installed" in missing.message
    assert "pip install 'graphdoctor[transformer-engine]'" in missing.fix
    (broken,) = findings("GD304", te, EnvironmentFacts(te_version="2.12.0", te_has_torch_extension=False))
    assert broken.severity == "error" and "transformer_engine_torch" in broken.message
    assert not findings("GD304", te, TE_OK)
    assert not findings("GD304", {"cuda_graph_impl": "local"}, EnvironmentFacts(te_version=None))
    (legacy,) = findings("GD304", {"external_cuda_graph": True}, EnvironmentFacts(te_version=None))
    assert legacy.fields == ("transformer.external_cuda_graph",)


def test_version_rules_leave_a_missing_te_to_gd304() -> None:
    fields = {"cuda_graph_impl": "transformer_engine", "delay_wgrad_compute": True, **A2A}
    codes = [f.code for f in check({"transformer": fields}, facts=EnvironmentFacts(te_version=None)).findings]
    assert "GD304" in codes and "GD213" not in codes and "GD305" not in codes


FP8_BF16_EDGES = {"fp8": "e4m3", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True}


@pytest.mark.parametrize(
    ("te", "extra", "need", "gates"),
    [
        ("2.6.0", {}, "2.10", ["buffer reuse", "cannot reset"]),
        ("2.9.0", {}, "2.10", ["cannot reset"]),
        ("2.7.0", FP8_BF16_EDGES, "2.10", ["fp8 on", "cannot reset"]),
        ("2.10.0", FP8_BF16_EDGES, None, []),
        ("2.7.0", {**FP8_BF16_EDGES, "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0},
         "2.10", ["cannot reset"]),
    ],
)
def test_gd305_names_every_missing_gate(te: str, extra: dict[str, Any], need: str | None,
                                        gates: list[str]) -> None:
    got = findings("GD305", {"cuda_graph_impl": "transformer_engine", **extra}, EnvironmentFacts(te_version=te))
    if need is None:
        assert got == []
        return
    (finding,) = got
    assert finding.severity == "warning" and f"older than {need}:" in finding.message
    assert finding.fix == f"Upgrade transformer-engine to >= {need}"
    assert [g for g in ("buffer reuse", "fp8 on", "cannot reset") if g in finding.message] == gates


@pytest.mark.parametrize(
    ("te", "modules", "extra", "expected"),
    [
        ("2.9.0", [], {}, ("error", "2.10")),
        ("2.9.0", ["attn"], {}, ("error", "2.12")),
        ("2.11.0", ["attn"], {}, ("warning", "2.12")),
        ("2.11.0", [], {}, None),
        ("2.11.0", ["moe_router"], {}, None),
        ("2.11.0", ["moe_router"], {"moe_shared_expert_intermediate_size": 256}, ("warning", "2.12")),
        ("2.11.0", ["moe_router"], {"moe_shared_expert_intermediate_size": 256, "moe_shared_expert_overlap": True},
         None),
        ("2.12.0", ["attn"], {}, None),
    ],
)
def test_gd213_tiers(te: str, modules: list[str], extra: dict[str, Any],
                     expected: tuple[str, str] | None) -> None:
    fields = {"cuda_graph_impl": "transformer_engine", "delay_wgrad_compute": True, "cuda_graph_modules": modules,
              **A2A, **extra}
    got = [(f.severity.value, f.fix.split(">= ")[1].split()[0]) for f in
           findings("GD213", fields, EnvironmentFacts(te_version=te))]
    assert got == ([expected] if expected else [])


def test_gd213_leaves_the_launch_line_with_overlap_grad_reduce_to_gd215() -> None:
    line = ("pretrain_gpt.py --num-experts 8 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall "
            "--bf16 --overlap-moe-expert-parallel-comm --te-rng-tracker --cuda-graph-impl transformer_engine "
            "--delay-wgrad-compute --cuda-graph-modules attn --disable-bias-linear")
    facts = EnvironmentFacts(te_version="2.11.0")
    with_overlap = check(None, line + " --overlap-grad-reduce", facts=facts).codes()
    assert "GD215" in with_overlap and "GD213" not in with_overlap
    without = check(None, line, facts=facts)
    assert [f.severity for f in without.findings if f.code == "GD213"] == ["warning"]
    assert "GD215" not in without.codes()


def _fake_te(root: Path, version: str) -> Path:
    package = root / "transformer_engine"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('graphdoctor must never import transformer_engine')\n")
    dist = root / f"transformer_engine-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformer_engine\nVersion: {version}\n")
    return package


def test_detect_facts_reads_te_version_and_extension_without_importing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    package = _fake_te(tmp_path, "2.11.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    facts = detect_facts("sm_90")
    assert (facts.te_version, facts.te_has_torch_extension) == ("2.11.0", False)
    (package / "wheel_lib").mkdir()
    (package / "wheel_lib" / "transformer_engine_torch.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    assert detect_facts("sm_90").te_has_torch_extension is True
