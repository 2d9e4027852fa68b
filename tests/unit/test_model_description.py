"""The model diff builds is the model Megatron-LM builds from the same line: for Megatron-LM's Llama-3 8B and
Mixtral 8x7B examples and a DeepSeek-style MLA + MTP line, every TransformerConfig field and every GPTModelConfig
field (what GPTModelBuilder passes GPTModel), the layer spec and the MTP block spec are equal between Megatron-LM's
own `core_transformer_config_from_args` / `gpt_config_from_args` on the argv and graphdoctor's resolve, but for
graphdoctor's documented overrides (docs/diff.md "The model"): the layer count the user shrinks to, the graph
settings per implementation, the CPU initialisation, and the processes.

On this CPU machine without Transformer Engine one flag is added to the examples as written: --no-rope-fusion
(rotary fusion is Transformer Engine's kernel, which Megatron's TransformerConfig asks for); the GPU test
tests/gpu/test_model_description_gpu.py compares the lines as written where Transformer Engine imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.config import diff_config_from
from graphdoctor.config.build import model_config, transformer_config
from graphdoctor.config.child_model import child_model
from graphdoctor.config.codec import encode
from graphdoctor.config.launch_scan import scan_launch
from graphdoctor.installed import te_findable

LINES = Path(__file__).resolve().parents[2] / "fixtures" / "megatron_lines"
SHRINK = {"llama3_8b": ["--num-layers", "2", "--global-batch-size", "2"],
          "mixtral_8x7b": ["--num-layers", "2", "--pipeline-model-parallel-size", "1",
                           "--expert-model-parallel-size", "1", "--global-batch-size", "2", "--vocab-size", "32000"],
          "deepseek_mla_mtp": ["--num-layers", "2", "--moe-layer-freq", "[0,1]", "--global-batch-size", "2"]}
"""What the user passes graphdoctor to shrink each line to one GPU (the flags of the test's diff_config_from)."""
GRAPHDOCTOR_FLAGS = ["--use-cpu-initialization"]
"""graphdoctor's own setting for every child (from_megatron.SAME_WEIGHTS)."""
CPU_FLAGS = ["--no-rope-fusion"]
IMPL_FLAGS = {
    "eager": ["--cuda-graph-impl", "none"],
    "local": ["--cuda-graph-impl", "local"],
    "full_iteration": ["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"],
    "transformer_engine": ["--cuda-graph-impl", "transformer_engine"],
}
"""Each child's graph settings; the warm-up steps are the line's (Megatron-LM's default 3)."""


@contextlib.contextmanager
def _megatron_argv(argv: list[str]) -> Iterator[None]:
    saved, env = sys.argv, dict(os.environ)
    sys.argv = ["pretrain_gpt.py", *argv]
    os.environ.update(WORLD_SIZE="1", RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.argv = saved
        os.environ.clear()
        os.environ.update(env)


def megatron_lm(argv: list[str]) -> tuple[Any, Any]:
    """Megatron-LM's own TransformerConfig and GPTModelConfig of an argv (parse_args, validate_args, then its
    config functions), as pretrain_gpt.py makes them."""
    import torch
    from megatron.training import arguments
    from megatron.training.argument_utils import core_transformer_config_from_args, gpt_config_from_args

    deterministic = torch.are_deterministic_algorithms_enabled()
    capability = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: (9, 0)  # type: ignore[assignment]  # --moe-grouped-gemm asks
    try:
        with _megatron_argv(argv):
            args = arguments.parse_args()
            arguments.validate_args(args, {})
            tconfig = core_transformer_config_from_args(args)
            return tconfig, gpt_config_from_args(args, tconfig)
    finally:
        torch.cuda.get_device_capability = capability  # type: ignore[assignment]
        torch.use_deterministic_algorithms(deterministic)


def _flags(name: str) -> list[str]:
    uses, _ = scan_launch(f"@{LINES / (name + '.txt')}")
    return [token for use in uses if not use.launcher and use.flag not in ("--nproc_per_node", "--nnodes",
                                                                           "--node_rank", "--master_addr",
                                                                           "--master_port")
            for token in (use.flag, *use.values)]


def _fields(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init and f.name not in skip}


def _graphdoctor(name: str) -> Any:
    shrink = dict(zip(SHRINK[name][::2], SHRINK[name][1::2], strict=True))
    text = (LINES / (name + ".txt")).read_text(encoding="utf-8")
    text = text.replace("pretrain_gpt.py \\", "pretrain_gpt.py " + " ".join(CPU_FLAGS) + " \\")
    values: dict[str, Any] = {"num_layers": int(shrink["--num-layers"]), "nproc_per_node": 1, "num_microbatches": 2}
    if "--pipeline-model-parallel-size" in shrink:
        values.update(pipeline_model_parallel_size=1, expert_model_parallel_size=1)
    if "--vocab-size" in shrink:
        values["vocab_size"] = int(shrink["--vocab-size"])
    if name == "deepseek_mla_mtp":
        values["megatron_args"] = text.replace("([0]+[1]*3)", "[0,1]")
    return diff_config_from(None, **{"megatron_args": text, **values})


@pytest.mark.parametrize("name", sorted(SHRINK))
@pytest.mark.parametrize("impl", sorted(IMPL_FLAGS))
def test_every_field_is_megatron_lms_own(name: str, impl: str) -> None:
    config = _graphdoctor(name)
    if impl != "eager":
        config = config.replace(impls=(impl,), cuda_graph_modules=())
    ours_model = child_model(config, impl, config.dropout)
    ours = transformer_config(ours_model)
    theirs, their_model = megatron_lm(_flags(name) + SHRINK[name] + GRAPHDOCTOR_FLAGS + CPU_FLAGS + IMPL_FLAGS[impl])
    assert type(ours) is type(theirs)
    mine, reference = _fields(ours), _fields(theirs)
    assert {k for k in mine if mine[k] != reference.get(k)} == set(), \
        {k: (mine[k], reference.get(k)) for k in mine if mine[k] != reference.get(k)}
    model = model_config(ours_model, ours)
    skip = ("transformer", "transformer_layer_spec", "pre_wrap_hooks", "post_wrap_hooks")
    assert _fields(model, skip) == _fields(their_model, skip)
    if te_findable() or ours.transformer_impl == "local":  # Megatron builds TE layer specs only with TE
        assert_same_specs(model, their_model)


def assert_same_specs(model: Any, their_model: Any) -> None:
    """The layer spec and the MTP block spec GPTModelBuilder gives GPTModel, from both model configs."""
    from megatron.training.models.gpt import default_layer_spec, mtp_block_spec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert default_layer_spec(model, None) == default_layer_spec(their_model, None)
        spec = default_layer_spec(their_model, None)
        assert mtp_block_spec(model, spec, None) == mtp_block_spec(their_model, spec, None)


def test_the_lines_are_the_models_users_train() -> None:
    """What each resolved model is, as the header and JSON show it."""
    llama, mixtral, deepseek = (_graphdoctor(n).model for n in ("llama3_8b", "mixtral_8x7b", "deepseek_mla_mtp"))
    assert llama is not None and mixtral is not None and deepseek is not None
    assert (llama.value("position_embedding_type"), llama.value("share_embeddings_and_output_weights"),
            llama.value("activation_func"), llama.value("num_query_groups"), llama.value("normalization")) == \
        ("rope", False, "torch.nn.functional.silu", 8, "RMSNorm")
    assert (llama.value("fp8"), llama.value("transformer_impl"), llama.value("hidden_size")) == \
        ("hybrid", "transformer_engine", 4096)
    assert (mixtral.value("num_moe_experts"), mixtral.value("moe_router_topk"),
            mixtral.value("moe_token_dispatcher_type"), mixtral.value("moe_grouped_gemm")) == (8, 2, "alltoall", True)
    assert deepseek.transformer_class.endswith("MLATransformerConfig")
    assert (deepseek.value("mtp_num_layers"), deepseek.value("moe_layer_freq"), deepseek.value("q_lora_rank")) == \
        (1, [0, 1], None)
