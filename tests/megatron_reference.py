"""Megatron-LM's own model of a launch line, for the tests that hold graphdoctor's against it
(tests/unit/test_model_description.py on the CPU, tests/gpu/test_model_description_gpu.py with Transformer Engine):
the lines (fixtures/megatron_lines), how a user shrinks each to one GPU, Megatron-LM's parse_args, validate_args and
config functions on an argv, and the comparison of every field."""

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

from graphdoctor.config import diff_config_from
from graphdoctor.config.build import model_config, transformer_config
from graphdoctor.config.child_model import child_model
from graphdoctor.config.codec import encode
from graphdoctor.config.fp8 import initialisation
from graphdoctor.config.launch_scan import scan_launch
from graphdoctor.installed import te_findable

LINES = Path(__file__).resolve().parents[1] / "fixtures" / "megatron_lines"
SHRINK = {"llama3_8b": ["--num-layers", "2", "--global-batch-size", "2"],
          "mixtral_8x7b": ["--num-layers", "2", "--pipeline-model-parallel-size", "1",
                           "--expert-model-parallel-size", "1", "--global-batch-size", "2", "--vocab-size", "32000"],
          "deepseek_mla_mtp": ["--num-layers", "2", "--moe-layer-freq", "[0,1]", "--global-batch-size", "2"]}
"""What the user passes graphdoctor to shrink each line to one GPU (the flags of the test's diff_config_from)."""
GRAPHDOCTOR_FLAGS = ["--use-cpu-initialization"]
"""graphdoctor's own setting for every child (graphdoctor.config.fp8.SAME_WEIGHTS), but FP8 primary weights'
(graphdoctor.config.fp8.initialisation)."""
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


def line_flags(name: str) -> list[str]:
    """The line's Megatron-LM flags (torchrun's aside), as Megatron-LM's parser takes them."""
    uses, _ = scan_launch(f"@{LINES / (name + '.txt')}")
    return [token for use in uses if not use.launcher and use.flag not in ("--nproc_per_node", "--nnodes",
                                                                           "--node_rank", "--master_addr",
                                                                           "--master_port")
            for token in (use.flag, *use.values)]


def fields_of(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A config dataclass's init fields, encoded (functions and partials compare by name and arguments)."""
    return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init and f.name not in skip}


def graphdoctor_config(name: str, extra_flags: list[str]) -> Any:
    """graphdoctor's DiffConfig of the line with `extra_flags` added, shrunk by graphdoctor's flags (SHRINK)."""
    shrink = dict(zip(SHRINK[name][::2], SHRINK[name][1::2], strict=True))
    text = (LINES / (name + ".txt")).read_text(encoding="utf-8")
    text = text.replace("pretrain_gpt.py \\", "pretrain_gpt.py " + " ".join(extra_flags) + " \\")
    values: dict[str, Any] = {"num_layers": int(shrink["--num-layers"]), "nproc_per_node": 1, "num_microbatches": 2}
    if "--pipeline-model-parallel-size" in shrink:
        values.update(pipeline_model_parallel_size=1, expert_model_parallel_size=1)
    if "--vocab-size" in shrink:
        values["vocab_size"] = int(shrink["--vocab-size"])
    return diff_config_from(None, megatron_args=text, **values)  # --moe-layer-freq shrinks with --num-layers


def assert_same_model(name: str, impl: str, extra_flags: list[str]) -> None:
    """graphdoctor's model of one child of the shrunk line (`extra_flags` added to it) against Megatron-LM's own of
    the same argv: every TransformerConfig and GPTModelConfig field; the layer and MTP block specs where Megatron
    can build them here (Transformer Engine's specs need it installed)."""
    config = graphdoctor_config(name, extra_flags)
    if impl != "eager":
        config = config.replace(impls=(impl,), cuda_graph_modules=())
    ours_model = child_model(config, impl, config.dropout)
    ours = transformer_config(ours_model)
    argv = line_flags(name) + SHRINK[name] + extra_flags
    fp8_weights = "--fp8-param-gather" in argv
    theirs, their_model = megatron_lm(argv[:len(argv) - len(extra_flags)] + ([] if fp8_weights else GRAPHDOCTOR_FLAGS)
                                      + extra_flags + IMPL_FLAGS[impl])
    if fp8_weights:  # graphdoctor's own setting, which no Megatron-LM flag can say (--use-cpu-initialization off)
        theirs.use_cpu_initialization = initialisation(True)["use_cpu_initialization"]
    assert type(ours) is type(theirs)
    mine, reference = fields_of(ours), fields_of(theirs)
    assert {k for k in mine if mine[k] != reference.get(k)} == set(), \
        {k: (mine[k], reference.get(k)) for k in mine if mine[k] != reference.get(k)}
    model = model_config(ours_model, ours)
    skip = ("transformer", "transformer_layer_spec", "pre_wrap_hooks", "post_wrap_hooks")
    assert fields_of(model, skip) == fields_of(their_model, skip)
    if te_findable() or ours.transformer_impl == "local":  # Megatron builds TE layer specs only with TE
        assert_same_specs(model, their_model)


def spec_form(value: Any) -> Any:
    """A layer spec as plain data: classes and functions by name, partials by function and arguments, specs and
    other dataclasses by their fields (Megatron builds fresh partials for each spec, equal only in form)."""
    import functools
    import inspect

    if isinstance(value, functools.partial):
        return ("partial", spec_form(value.func), [spec_form(a) for a in value.args],
                sorted((k, spec_form(v)) for k, v in value.keywords.items()))
    if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismethod(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__, {f.name: spec_form(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return sorted((str(k), spec_form(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return [spec_form(v) for v in value]
    return repr(value)


def _model_parallel_world() -> None:
    """One gloo process with Megatron's model-parallel groups: the MoE block spec reads the pipeline rank."""
    import torch
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def assert_same_specs(model: Any, their_model: Any) -> None:
    """The layer spec and the MTP block spec GPTModelBuilder gives GPTModel, from both model configs."""
    from megatron.training.models.gpt import default_layer_spec, mtp_block_spec

    _model_parallel_world()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = default_layer_spec(their_model, None)
        assert spec_form(default_layer_spec(model, None)) == spec_form(spec)
        assert spec_form(mtp_block_spec(model, spec, None)) == spec_form(mtp_block_spec(their_model, spec, None))
