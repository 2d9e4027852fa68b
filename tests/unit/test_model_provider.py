"""Model providers get what their signature accepts: the config, Megatron-LM's keywords (`pre_process`,
`post_process`, `vp_stage` where named) and graphdoctor's sizes; and real GPT models build on CPU from
providers of each signature (Megatron's own GPTModel class among them)."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from graphdoctor.child.megatron_setup import provider_arguments
from graphdoctor.errors import UsageError

CONFIG = object()  # stands for the TransformerConfig: only its identity matters here
SIZES = {"vocab_size": 512, "max_sequence_length": 64, "transformer_layer_spec": "spec"}
MEGATRON = {"pre_process": True, "post_process": True}


def arguments(provider: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return provider_arguments(provider, "pkg.mod:provider", CONFIG, dict(SIZES))


def test_megatron_lm_core_v0_19_provider_gets_its_keywords_and_config_by_name() -> None:
    def model_provider(model_builder: Any, pre_process: bool = True, post_process: bool = True,
                       vp_stage: int | None = None, config: Any = None, pg_collection: Any = None) -> Any:
        return model_builder

    args, kwargs = arguments(functools.partial(model_provider, "builder"))
    assert args == () and kwargs == {**MEGATRON, "vp_stage": None, "config": CONFIG}


def test_graphdoctor_provider_gets_config_first_and_everything_through_kwargs() -> None:
    def build(cfg: Any, **kwargs: Any) -> Any:
        return cfg

    assert arguments(build) == ((CONFIG,), {**MEGATRON, **SIZES})


def test_only_named_parameters_are_passed() -> None:
    def build(config: Any, vocab_size: int, *, post_process: bool = True) -> Any:
        return config

    assert arguments(build) == ((), {"config": CONFIG, "vocab_size": 512, "post_process": True})


def test_keywords_only_provider_gets_config_through_kwargs_but_no_vp_stage() -> None:
    def build(pre_process: bool = True, **kwargs: Any) -> Any:
        return kwargs

    assert arguments(build) == ((), {**MEGATRON, **SIZES, "config": CONFIG})


def test_a_provider_that_takes_no_config_is_refused() -> None:
    def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None) -> Any:
        return None

    with pytest.raises(UsageError, match=r"model_provider: got pkg.mod:provider, which takes no config; "):
        arguments(model_provider)


def test_a_parameter_graphdoctor_cannot_fill_is_one_line() -> None:
    def gpt_builder(args: Any, pre_process: bool, post_process: bool, config: Any = None) -> Any:
        return args

    with pytest.raises(UsageError) as caught:
        arguments(gpt_builder)
    assert str(caught.value) == (
        "model_provider: got pkg.mod:provider, which cannot be called with what graphdoctor passes "
        "(config, post_process, pre_process): missing a required argument: 'args'")


BUILD_SCRIPT = textwrap.dedent("""
    import torch
    from megatron.core import parallel_state
    from graphdoctor.child.megatron_setup import build_probe_model
    from graphdoctor.config import DiffConfig
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    for provider in (None, "megatron.core.models.gpt.gpt_model:GPTModel",
                     "fixtures.planted.model_providers:megatron_lm_style",
                     "fixtures.planted.model_providers:graphdoctor_style"):
        config = DiffConfig(num_layers=1, hidden_size=32, num_attention_heads=2, seq_length=64,
                            vocab_size=512, model_provider=provider)
        model, _ = build_probe_model(config, device="cpu")
        shapes = sorted((n, tuple(p.shape)) for n, p in model.named_parameters())
        print(provider, type(model).__name__, model.pre_process, model.post_process, hash(tuple(shapes)))
""")


def test_real_gpt_models_build_from_providers_of_every_signature() -> None:
    # A child process: the process group and model-parallel state must not leak into other tests.
    proc = subprocess.run([sys.executable, "-c", BUILD_SCRIPT], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Megatron's own log lines (GPTModel's deprecation warning, through megatron.training's logging) aside
    lines = [line.split() for line in proc.stdout.strip().splitlines() if not line.startswith("WARNING:")]
    assert [line[0] for line in lines] == [
        "None", "megatron.core.models.gpt.gpt_model:GPTModel", "fixtures.planted.model_providers:megatron_lm_style",
        "fixtures.planted.model_providers:graphdoctor_style"]
    # The same GPT model (every parameter name and shape) whichever signature built it.
    assert {tuple(line[1:]) for line in lines} == {("GPTModel", "True", "True", lines[0][4])}
