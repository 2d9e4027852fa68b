"""Property test: `check` reports an error exactly when megatron-core rejects the config on this machine.

The oracle is TransformerConfig(**fields) on CPU (any exception = rejected) over the CUDA-graph related
fields, followed by the first assert of TECudaGraphHelper.__init__ (`HAVE_TE_GRAPHS`), which rejects
every transformer_engine config where Transformer Engine does not import. The machine facts are this
machine's, as Megatron's own TE checks are; the job environment is empty, so env rules stay silent.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphdoctor.rules import check, detect_facts

BASE: dict[str, Any] = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128}
MODULE_VALUES = ["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full", "full_iteration",
                 "full_iteration_inference", "bogus"]
FACTS = detect_facts()
PAST_CONFIG = ("GD309", "GD240")
"""Error rules about what fails after TransformerConfig accepted the config (checked against Megatron on the GPU)."""
IMPL_WEIGHTS = ["none"] * 2 + ["local"] * 3 + ["transformer_engine"] * 3 + ["full_iteration"] * 2 + ["bogus"]
TOGGLES = ["enable_cuda_graph", "external_cuda_graph", "moe_router_padding_for_fp8", "expert_model_parallel_size",
           "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "cpu_offloading",
           "fine_grained_activation_offloading", "moe_pad_expert_input_to_capacity", "moe_pad_expert_input_to_capacity"]


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value, or the marker that leaves the field at its default."""
    return st.one_of(st.just(_DEFAULT), strategy)


def _rare(*values: Any, common: Any = False) -> st.SearchStrategy[Any]:
    """Mostly `common` (a list `common` gives its items as weights), else one of `values`."""
    commons = common if isinstance(common, list) else [common] * (3 if len(values) == 1 else 2)
    return st.sampled_from([*commons, *values])


_DEFAULT = object()
_modules = st.one_of(
    st.sampled_from(["full", None, "", "attn", "attn,mlp", "moe_router,moe_preprocess", "full_iteration"]),
    st.lists(st.sampled_from(MODULE_VALUES[:6]), max_size=3),
    st.lists(st.sampled_from(MODULE_VALUES), max_size=3),
)


@st.composite
def transformer_fields(draw: st.DrawFn) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "cuda_graph_impl": draw(st.sampled_from(IMPL_WEIGHTS)),
        "cuda_graph_modules": draw(_optional(_modules)),
        "cuda_graph_scope": draw(st.one_of(st.none(), _modules)) if draw(_rare(True)) else _DEFAULT,
        "inference_cuda_graph_scope": draw(_optional(st.sampled_from([None, "none", "layer", "block", "bogus"]))),
        "num_moe_experts": draw(st.sampled_from([None, 1, 2, 4])),
        "moe_layer_freq": draw(st.sampled_from([1, 2, [0, 1], [1, 1]])),
        "moe_expert_capacity_factor": draw(st.sampled_from([None, -1.0, 1.0])),
        "moe_token_dispatcher_type": draw(st.sampled_from(["allgather", "alltoall", "alltoall", "flex"])),
        "moe_input_jitter_eps": draw(st.sampled_from([None, 0.01])),
        "bf16": draw(st.booleans()),
        "recompute_granularity": draw(_rare("selective", "full", common=None)),
        "recompute_modules": draw(_optional(st.lists(
            st.sampled_from(["core_attn", "mlp", "moe", "layernorm", "shared_experts", "moe_act"]), max_size=3,
            unique=True))),
        "offload_modules": draw(st.lists(st.sampled_from(
            ["core_attn", "core_attn", "expert_fc1", "moe_act", "attn_norm", "qkv_linear", "attn_proj", "fused_group_mlp"]),
            max_size=3, unique=True)),
        "fine_grained_offloading_max_inflight_offloads": draw(st.sampled_from([None, -1, 0, 2])),
        "cuda_graph_warmup_steps": draw(st.sampled_from([0, 1, 3])),
        "hidden_dropout": draw(st.sampled_from([0.0, 0.1])),
        "attention_dropout": draw(st.sampled_from([0.0, 0.1])),
    }
    # at most two risky switches per example, so that about half the configs are valid
    for name in draw(st.lists(st.sampled_from(TOGGLES), max_size=2, unique=True)):
        fields[name] = 2 if name == "expert_model_parallel_size" else True
    if fields["recompute_granularity"] == "full" and draw(_rare(False, common=True)):
        fields["recompute_method"], fields["recompute_num_layers"] = "uniform", 1
    return {k: v for k, v in fields.items() if v is not _DEFAULT}


def megatron_accepts(fields: dict[str, Any]) -> tuple[bool, str]:
    """The oracle: does TransformerConfig(**BASE, **fields) construct, and could TECudaGraphHelper
    be built for it here (cuda_graphs.py:2098)?"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.cuda_graphs import HAVE_TE_GRAPHS
        from megatron.core.transformer.transformer_config import TransformerConfig

        try:
            config = TransformerConfig(**BASE, **fields)
        except Exception as exc:  # noqa: BLE001 - the oracle: any exception means rejected
            return False, f"{type(exc).__name__}: {exc}"
    if config.cuda_graph_impl == "transformer_engine" and not HAVE_TE_GRAPHS:
        return False, "AssertionError: CUDA Graphs are not supported without TE."
    return True, ""


def _copy(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, list) else v for k, v in fields.items()}


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fields=transformer_fields())
def test_check_agrees_with_transformer_config(fields: dict[str, Any]) -> None:
    accepted, why = megatron_accepts(_copy(fields))
    report = check({"transformer": {**BASE, **_copy(fields)}}, facts=FACTS)
    # GD309 (recompute without Transformer Engine) is a NameError at the first forward, past what
    # TransformerConfig checks: not the oracle's to judge.
    errors = [f"{f.code} {f.message}" for f in report.findings if f.severity == "error" and f.code not in PAST_CONFIG]
    if accepted:
        assert not errors, f"Megatron accepts {fields} but check reports {errors}"
    else:
        assert errors, f"Megatron rejects {fields} ({why}) but check reports no error"


@pytest.mark.parametrize(
    "fields",
    [
        {"cuda_graph_impl": "local", "enable_cuda_graph": True},
        {"cuda_graph_modules": ["full_iteration"], "cuda_graph_impl": "local", "hidden_dropout": 0.0},
        {"cuda_graph_impl": "transformer_engine", "num_moe_experts": 4, "cuda_graph_modules": ["moe"]},
    ],
)
def test_known_cases_agree(fields: dict[str, Any]) -> None:
    accepted, _ = megatron_accepts(_copy(fields))
    findings = check({"transformer": {**BASE, **fields}}, facts=FACTS).findings
    assert any(f.severity == "error" and f.code not in PAST_CONFIG for f in findings) is (not accepted)
