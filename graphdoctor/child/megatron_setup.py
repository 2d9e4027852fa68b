"""The one Megatron set-up path: a real Megatron-Core training setup built the way Megatron-LM's
trainer builds it, for the diff and count children, and the same model for the probe worker.

Order matters and follows megatron-core 0.19.2: process group, initialize_model_parallel, graph-safe RNG
seeded before the model, GPTModel (local spec by default, or the user's model provider), Float16Module
for bf16/fp16, Megatron DDP (on the shared capture stream for full_iteration), get_megatron_optimizer,
the schedule (wrapped by FullCudaGraphWrapper for full_iteration). Imported only inside children.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from graphdoctor.child import distributed as rank_setup
from graphdoctor.child.batches import default_forward_step, forward_step_name
from graphdoctor.child.probe.modules import track_hook_registrations
from graphdoctor.child.reported import checked_forward_step
from graphdoctor.config import DiffConfig, build
from graphdoctor.config.build import padded_vocab_size
from graphdoctor.config.child_model import child_model, one_gpu
from graphdoctor.config.description import ModelDescription
from graphdoctor.config.entry_points import resolve_entry_point
from graphdoctor.config.impl import Impl
from graphdoctor.errors import MissingDependencyError
from graphdoctor.protocol.seconds import StageClock
from graphdoctor.protocol.spec import EAGER, ChildSpec, Placement


@dataclass(slots=True)
class Setup:
    """A built model, its optimizer and the step function, ready to train."""

    model: Any
    """The DDP-wrapped model chunk (megatron DistributedDataParallel)."""

    optimizer: Any
    """Megatron optimizer."""

    config: Any
    """The TransformerConfig."""

    forward_backward: Callable[..., Any]
    """forward_backward_no_pipelining, wrapped for full_iteration."""

    forward_step: Callable[..., Any]
    """Megatron forward_step(data_iterator, model) -> (output, loss_func)."""

    te_helper: Any = None
    """TECudaGraphHelper for transformer_engine (None otherwise)."""

    weights: Any = None
    """The Weights event of a gpu_init run (graphdoctor.child.weights); None with CPU initialisation."""


def init_distributed(place: Placement, config: DiffConfig | None = None) -> None:
    """Process group (NCCL) and model-parallel groups, from the child's placement and the run's expert-parallel
    sizes (idempotent)."""
    from megatron.core import parallel_state

    torch.cuda.set_device(place.local_rank)
    if not torch.distributed.is_initialized():
        # Under torch.distributed.run its agent holds the store: the ranks meet through env://. One process
        # alone needs no port: a free port picked by one child could be taken by another before it listens
        # (EADDRINUSE seen on the H200 with many children at once), so it keeps its store in memory.
        where: dict[str, Any]
        if place.launcher:
            where = {"init_method": "env://"}
        elif place.world_size == 1:
            where = {"store": torch.distributed.HashStore(), "rank": 0, "world_size": 1}
        else:
            where = {"init_method": f"tcp://{place.master_addr}:{place.master_port}", "rank": place.rank,
                     "world_size": place.world_size}
        torch.distributed.init_process_group(backend="nccl", **where, **_bound_device(place))
    if not parallel_state.model_parallel_is_initialized():
        experts: dict[str, Any] = {}
        if config is not None and config.expert_model_parallel_size > 1:
            experts["expert_model_parallel_size"] = config.expert_model_parallel_size
        if config is not None and config.expert_tensor_parallel_size is not None:
            experts["expert_tensor_parallel_size"] = config.expert_tensor_parallel_size
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=place.tensor_model_parallel_size,
            pipeline_model_parallel_size=place.pipeline_model_parallel_size,
            **experts,
        )


def _bound_device(place: Placement) -> dict[str, Any]:
    """The device a process group binds, if any.

    A process alone binds none, as Megatron-LM's initialize.py binds none: NCCL then creates a communicator at its
    group's first collective (a one-GPU step reduces over the data-parallel and model-parallel groups, in the eager
    steps before any capture: cuda_graph_warmup_steps >= 1). A bound device makes every group of
    initialize_model_parallel create its communicator at once, which costs each child seconds and GPU memory
    outside the allocator, paid by every child that shares the GPU. Ranks of a multi-process child bind their
    device (the two-GPU acceptance ran so)."""
    return {} if place.world_size == 1 else {"device_id": torch.device("cuda", place.local_rank)}


def seed_everything(seed: int, impl: str, te_rng_tracker: bool = False, *, graph_safe: bool | None = None) -> None:
    """Seed Python, CPU and CUDA RNGs and Megatron's tracker before the model is built.

    `te_rng_tracker` is what the child's model says (ModelDescription.te_rng_tracker: Megatron-LM's validate_args
    for a launch line, its rule otherwise). The tracker is graph-safe for every graphed implementation (and for
    probes, which capture eager layers).
    """
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(
        seed,
        te_rng_tracker=te_rng_tracker,
        use_cudagraphable_rng=(impl != EAGER) if graph_safe is None else graph_safe,
        force_reset_rng=True,
    )


def _params_dtype(dtype: str) -> Any:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)


def clear_moe_metrics() -> None:
    """Zero Megatron's MoE metrics tracker (aux loss, z-loss, ...) at the end of a step, as
    Megatron-LM's training_log does through MoEMetricsTracker.report() every iteration.

    The tracker's per-layer tensors are zeroed in place (moe_logging.py:214-217), so the additions a
    graph captured keep landing in them on replay and eager and graphed runs accumulate the same.
    """
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    get_moe_metrics_tracker().clear()


def build_model(config: DiffConfig, model: ModelDescription, tconfig: Any, *, float16_wrapper: bool = True,
                device: str = "cuda") -> torch.nn.Module:
    """The model (this rank's pipeline stage) on the GPU, built by Megatron's builder for the description
    (graphdoctor.config.build), or by the user's model provider; Float16Module-wrapped for bf16/fp16 unless
    `float16_wrapper` is False (the probes call its layers directly). `device="cpu"` is for tests."""
    from megatron.core.transformer.module import Float16Module

    if config.model_provider:
        provider = resolve_entry_point(config.model_provider, "model_provider")
        args, kwargs = provider_arguments(provider, config.model_provider, tconfig, {
            "vocab_size": padded_vocab_size(model, config.tensor_model_parallel_size),
            "max_sequence_length": int(model.value("seq_length", config.seq_length)),
            "transformer_layer_spec": build.layer_spec(model) or _default_spec(model, tconfig),
            **rank_setup.stage_flags(config)})
        built = provider(*args, **kwargs)
    else:
        flags = rank_setup.stage_flags(config)
        built = build.build_model(model, tconfig, pre_process=flags.get("pre_process"),
                                  post_process=flags.get("post_process"))
    built = built.cuda(torch.cuda.current_device()) if device == "cuda" else built.to(device)
    if float16_wrapper and config.dtype in ("bf16", "fp16"):
        built = Float16Module(tconfig, built)
    return built


def _default_spec(model: ModelDescription, tconfig: Any) -> Any:
    """Megatron's own layer spec for the model (what its builder would choose), for a model provider."""
    from megatron.training.models.gpt import default_layer_spec

    return default_layer_spec(build.model_config(model, tconfig), None)


MEGATRON_PROVIDER_KEYWORDS: dict[str, Any] = {"pre_process": True, "post_process": True}
"""What Megatron-LM's get_model passes every model provider (one pipeline stage: both True)."""


def provider_arguments(provider: Callable[..., Any], name: str, tconfig: Any,
                       extras: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments a model provider accepts, from its signature.

    The TransformerConfig goes to a parameter named `config` (or `**kwargs` alone), else to a first
    positional parameter that is none of the keywords below (graphdoctor's `fn(config, ...)`); a
    provider that takes no config is refused, since it would not build the run's graphs. `pre_process` and
    `post_process` (True), as Megatron-LM passes them, and graphdoctor's `vocab_size`,
    `max_sequence_length` and `transformer_layer_spec` go where the signature names them or takes
    `**kwargs`; `vp_stage` (None: no virtual pipeline) only where it is named. Nothing else is passed.

    Raises:
        UsageError: the provider takes no config, or needs a parameter none of these fill.
    """
    import inspect

    from graphdoctor.errors import UsageError

    offered = {**MEGATRON_PROVIDER_KEYWORDS, **extras}
    try:
        params = inspect.signature(provider).parameters
    except (TypeError, ValueError):  # no signature (a builtin): graphdoctor's own form
        return (tconfig,), offered
    kinds = inspect.Parameter
    takes_any = any(p.kind is kinds.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    first = next(iter(params.values()), None)
    positional = first is not None and first.kind in (
        kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD, kinds.VAR_POSITIONAL) and first.name not in offered \
        and first.name != "vp_stage"
    args: tuple[Any, ...] = ()
    kwargs = {key: value for key, value in offered.items() if key in named or takes_any}
    if "config" in named or (takes_any and not positional):
        kwargs["config"] = tconfig
    elif positional:
        args = (tconfig,)
    else:
        raise UsageError(f"model_provider: got {name}, which takes no config; graphdoctor builds each run's "
                         "TransformerConfig (its cuda_graph_impl and dropout) and passes it as `config` or as "
                         "the first positional argument")
    if "vp_stage" in named:
        kwargs["vp_stage"] = None
    try:
        inspect.signature(provider).bind(*args, **kwargs)
    except TypeError as exc:
        passed = ", ".join((["config (positional)"] if args else []) + sorted(kwargs))
        raise UsageError(f"model_provider: got {name}, which cannot be called with what graphdoctor "
                         f"passes ({passed}): {exc}") from None
    return args, kwargs


def wrap_ddp(impl: str, config: Any, model: torch.nn.Module, run: DiffConfig | None = None) -> torch.nn.Module:
    """Megatron DDP with the run's DDP settings; for full_iteration on the shared capture stream."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.full_cuda_graph import get_shared_capture_stream

    settings = rank_setup.ddp_config(run)
    if impl != Impl.FULL_ITERATION:
        return DistributedDataParallel(config=config, ddp_config=settings, module=model)
    # Without this, torch 2.11 (no set_override_stale_capture_stream) fails capture with
    # cudaErrorStreamCaptureImplicit: DDP's AccumulateGrad nodes would live on another stream.
    stream = get_shared_capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ddp = DistributedDataParallel(config=config, ddp_config=settings, module=model)
    torch.cuda.current_stream().wait_stream(stream)
    return ddp


def build_optimizer(dtype: str, config: Any, model: torch.nn.Module, *, distributed: bool = False,
                    loss_scale: float | None = None) -> Any:
    """get_megatron_optimizer (Adam; sharded over data-parallel ranks when `distributed`; for fp16 Megatron's
    dynamic loss scaler, or a static one of `loss_scale`) and the config hooks Megatron's trainer sets."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    opt_config = OptimizerConfig(
        optimizer="adam", lr=1e-3, weight_decay=0.01, clip_grad=1.0,
        bf16=dtype == "bf16", fp16=dtype == "fp16",
        params_dtype=_params_dtype(dtype), use_distributed_optimizer=distributed,
        loss_scale=loss_scale if dtype == "fp16" else None,
    )
    optimizer = get_megatron_optimizer(opt_config, [model])
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return optimizer


def have_transformer_engine() -> tuple[bool, str]:
    """(available, why not) without letting an import error escape."""
    import warnings

    try:
        with warnings.catch_warnings():
            # TE warns at import about optional extensions (e.g. Jax); under -W error that would
            # read as "not installed".
            warnings.simplefilter("ignore")
            import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # TE raises OSError/RuntimeError for missing .so files, not only ImportError
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return True, ""


def require_transformer_engine(model: ModelDescription, impl: str) -> None:
    """Raise MissingDependencyError when the run needs Transformer Engine and it does not import."""
    if impl == Impl.TRANSFORMER_ENGINE or build.uses_te_layers(model):
        ok, why = have_transformer_engine()
        if not ok:
            raise MissingDependencyError(f"transformer_engine is not importable ({why})")


def build_setup(spec: ChildSpec, clock: StageClock | None = None) -> Setup:
    """Everything up to the first step, in Megatron-LM's order; `clock` times each stage (STAGE_NAMES)."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper
    from megatron.core.pipeline_parallel import get_forward_backward_func

    stage = (clock or StageClock()).stage
    config, impl = spec.config, spec.impl
    with stage("megatron_args"):
        model_description = spec.model if spec.model is not None else child_model(config, impl, spec.dropout)
        require_transformer_engine(model_description, impl)
    with stage("distributed"):
        init_distributed(spec.placement, config)
        if impl == Impl.TRANSFORMER_ENGINE:
            # Megatron-LM's initialize.py:288 leaves the legacy default stream for this impl; on it,
            # TE's backward capture fails with cudaErrorStreamCaptureImplicit (AccumulateGrad work on
            # the blocking legacy stream meets the capturing stream).
            torch.cuda.set_stream(torch.cuda.Stream())
        seed_everything(config.seed, impl, model_description.te_rng_tracker)
        if impl == Impl.TRANSFORMER_ENGINE:
            init_microbatches(config, spec.placement)
    with stage("megatron_args"):
        tconfig = build.described_transformer_config(model_description, impl)
    with stage("model"):
        recorder = _gpu_init(config, tconfig)
        model = build_model(config, model_description, tconfig)
        weights = None if recorder is None else reseed(model, recorder, config.seed)
        if impl == Impl.LOCAL:
            restrict_graph_layers(config, model)
    with stage("ddp"):
        model = rank_setup.sync_hooks(tconfig, wrap_ddp(impl, tconfig, model, config), config)
    with stage("optimizer"):
        optimizer = build_optimizer(config.dtype, tconfig, model, distributed=config.use_distributed_optimizer,
                                    loss_scale=config.loss_scale)
    with stage("graphs"):
        forward_backward, te_helper = _graph_wrappers(config, impl, tconfig, model, optimizer,
                                                      get_forward_backward_func(), FullCudaGraphWrapper)
        forward_step = default_forward_step
        if config.forward_step:
            forward_step = resolve_entry_point(config.forward_step, "forward_step")
        forward_step = checked_forward_step(forward_step, forward_step_name(config.forward_step))
    return Setup(model=model, optimizer=optimizer, config=tconfig,
                 forward_backward=forward_backward, forward_step=forward_step,
                 te_helper=te_helper, weights=weights)


def _gpu_init(config: DiffConfig, tconfig: Any) -> Any:
    """With gpu_init: the model is built on the GPU (use_cpu_initialization off) with its init methods recorded
    (graphdoctor.child.weights.InitRecorder); None otherwise, or for FP8 primary weights, which TE initialises on
    the GPU already (graphdoctor.config.fp8.FP8_WEIGHTS_ON_GPU) inside its own quantized tensors."""
    if not config.gpu_init or getattr(tconfig, "fp8_param", False):
        return None
    from graphdoctor.child.weights import InitRecorder

    tconfig.use_cpu_initialization = False
    recorder = InitRecorder()
    recorder.install(tconfig)
    return recorder


def reseed(model: torch.nn.Module, recorder: Any, seed: int) -> Any:
    """The recorded tensors filled again from their own seeds, before DDP moves the parameters into its buffers;
    the Weights event of what was done and the weights' digest."""
    from graphdoctor.child.weights import model_ranks, seeded_initialisation, weights_digest
    from graphdoctor.protocol.events import Weights

    done = seeded_initialisation(model, recorder, seed, model_ranks())
    return Weights(digest=weights_digest(model), num_seeded=done.num_tensors, unseeded=done.unseeded)


def _graph_wrappers(config: DiffConfig, impl: str, tconfig: Any, model: Any, optimizer: Any,
                    forward_backward: Callable[..., Any], wrapper: Any) -> tuple[Callable[..., Any], Any]:
    """(forward_backward, TECudaGraphHelper or None): wrapped by FullCudaGraphWrapper for full_iteration; the
    helper built after model and optimizer for transformer_engine, as Megatron-LM's trainer does
    (training.py:3714-3721)."""
    if impl == Impl.FULL_ITERATION:
        return wrapper(forward_backward, cuda_graph_warmup_steps=tconfig.cuda_graph_warmup_steps), None
    if impl != Impl.TRANSFORMER_ENGINE:
        return forward_backward, None
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

    te_helper = TECudaGraphHelper(model=[model], config=tconfig, seq_length=config.seq_length,
                                  micro_batch_size=config.micro_batch_size, optimizers=[optimizer])
    restrict_graph_layers(config, model, te_helper)
    return forward_backward, te_helper


def decoder_layers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Decoder layer index -> layer: the model's `decoder.layers.<i>` modules, under any wrapper."""
    out: dict[int, torch.nn.Module] = {}
    for name, module in model.named_modules():
        head, _, index = name.rpartition(".")
        if (head == "decoder.layers" or head.endswith(".decoder.layers")) and index.isdigit():
            out[int(index)] = module
    return out


def restrict_graph_layers(config: DiffConfig, model: torch.nn.Module, te_helper: Any = None) -> None:
    """Graph only the decoder layers in config.graph_layers (every layer when it is empty).

    local (te_helper None, before DDP): the other layers lose their CudaGraphManagers and the
    methods those wrapped (MoE router/postprocess), so they run eagerly. transformer_engine: the
    other layers leave TECudaGraphHelper's layer lists, so make_graphed_callables never sees them.
    """
    if not config.graph_layers:
        return
    from megatron.core.transformer.cuda_graphs import CudaGraphManager

    keep = {id(layer) for index, layer in decoder_layers(model).items() if index in config.graph_layers}
    if te_helper is None:
        others: list[Any] = [layer for layer in decoder_layers(model).values() if id(layer) not in keep]
        for layer in others:
            for name, child in list(layer.named_children()):
                if isinstance(child, CudaGraphManager):
                    if child.func is not None:
                        layer.__dict__.pop(child.func.__name__, None)
                    delattr(layer, name)
            if getattr(layer, "use_partial_cudagraphs", False):
                layer.use_partial_cudagraphs = False
        return
    chunks = [[c for c in chunk if id(c) in keep] for chunk in te_helper.callables_per_chunk]
    te_helper.chunks_with_decoder = [owner if chunk else None
                                     for owner, chunk in zip(te_helper.chunks_with_decoder, chunks, strict=True)]
    te_helper.callables_per_chunk = chunks
    te_helper.callables_per_chunk_is_mtp = [[False] * len(chunk) for chunk in chunks]
    te_helper.num_layers_per_chunk = [len(chunk) for chunk in chunks]
    te_helper.flattened_callables = [c for chunk in chunks for c in chunk]
    te_helper.flattened_callables_is_mtp = [False] * len(te_helper.flattened_callables)


def build_probe_model(config: DiffConfig, *, device: str = "cuda") -> tuple[torch.nn.Module, dict[int, str]]:
    """The model `graphdoctor diff` builds for its eager run, on one GPU, for the probes: the same
    TransformerConfig, layer spec and model provider, with a graph-safe RNG tracker (the probes
    capture its layers themselves) and no DDP, optimizer or Float16Module around it.

    Args:
        config: the run.
        device: "cuda" (process group, model parallel and RNG set up here), or "cpu" for tests
            whose caller set up the process group and model-parallel state itself.

    Returns:
        (model, hook registrations made while building it: handle id -> `path:line`).
    """
    config = one_gpu(config)  # the probes capture layers in one process
    model_description = child_model(config, EAGER, config.dropout)
    require_transformer_engine(model_description, EAGER)
    if device == "cuda":
        init_distributed(Placement())
        seed_everything(config.seed, EAGER, model_description.te_rng_tracker, graph_safe=True)
    tconfig = build.described_transformer_config(model_description, EAGER)
    with track_hook_registrations() as registrations:
        model = build_model(config, model_description, tconfig, float16_wrapper=False, device=device)
    return model, registrations


def init_microbatches(config: DiffConfig, place: Placement) -> None:
    """Megatron's microbatch calculator: TECudaGraphHelper reads get_num_microbatches()."""
    from megatron.core.num_microbatches_calculator import (
        destroy_num_microbatches_calculator,
        init_num_microbatches_calculator,
    )

    data_parallel = place.data_parallel_size
    destroy_num_microbatches_calculator()
    init_num_microbatches_calculator(
        rank=place.rank, rampup_batch_size=None,
        global_batch_size=config.micro_batch_size * config.num_microbatches * data_parallel,
        micro_batch_size=config.micro_batch_size, data_parallel_size=data_parallel)


__all__ = [
    "Setup",
    "build_probe_model",
    "build_setup",
    "clear_moe_metrics",
    "decoder_layers",
    "have_transformer_engine",
    "provider_arguments",
    "restrict_graph_layers",
]
