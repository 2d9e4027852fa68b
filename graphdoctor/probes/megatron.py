"""Megatron side of the probes: build a 1-GPU GPTModel from a spec, record and capture each layer.

Setup follows Megatron's required order (process group, model parallel, graph-safe RNG tracker, model).
Units are `decoder.layers.<i>` and, when a layer fails to capture, its submodules on the inputs they
saw during the eager pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from graphdoctor.config import (
    BUILTIN_LAYER_SPECS,
    DTYPES,
    build_layer_spec,
    check_entry_point,
    resolve_entry_point,
)
from graphdoctor.errors import UsageError
from graphdoctor.harness.spec import free_port
from graphdoctor.probes.capture import capture_unit
from graphdoctor.probes.modules import (
    changed_attributes,
    scan_hooks,
    tensor_attribute_ptrs,
    track_hook_registrations,
)
from graphdoctor.probes.recorder import Recorder, pick_location
from graphdoctor.probes.types import CaptureResult, Observation

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_CAPTURE_DEPTH = 2
"""How far below a failing layer the probe descends (layer -> mlp -> linear_fc1)."""


@dataclass(kw_only=True, slots=True)
class ProbeSpec:
    """The model a probe builds; the DiffConfig fields it needs plus probe knobs."""

    num_layers: int = 2
    """Transformer layers of the GPT model."""

    hidden_size: int = 64
    """Hidden size."""

    num_attention_heads: int = 4
    """Attention heads."""

    seq_length: int = 32
    """Sequence length of the sample hidden_states [s, b, h]."""

    micro_batch_size: int = 2
    """Batch dimension of the sample hidden_states."""

    vocab_size: int = 128
    """Vocabulary size (only the embedding uses it)."""

    dtype: str = "fp32"
    """Parameter and activation dtype: fp32, bf16 or fp16."""

    dropout: float = 0.0
    """hidden_dropout and attention_dropout."""

    seed: int = 1234
    """Seed for the RNG tracker and the sample inputs."""

    layer_spec: str | None = None
    """`pkg.mod:fn` returning the layer ModuleSpec; default Megatron's local GPT spec."""

    transformer: dict[str, Any] = field(default_factory=dict)
    """Extra TransformerConfig fields."""

    warmup_iters: int = 2
    """Eager calls on a side stream before each capture."""

    timeout_s: float = 300.0
    """Wall-clock limit of one worker process."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"dtype: got {self.dtype!r}, expected one of {', '.join(DTYPES)}")
        if self.layer_spec is not None and self.layer_spec not in BUILTIN_LAYER_SPECS:
            check_entry_point("layer_spec", self.layer_spec)
        if self.warmup_iters < 1:
            raise UsageError(f"warmup_iters: got {self.warmup_iters!r}, expected >= 1")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (the worker's spec file)."""
        return dataclasses.asdict(self)


def spec_from_config(config: Any, **overrides: Any) -> ProbeSpec:
    """ProbeSpec from a DiffConfig, a mapping or any object with the same field names.

    Raises:
        UsageError: a field of the wrong value (ProbeSpec validation).
    """
    names = [f.name for f in dataclasses.fields(ProbeSpec)]
    if isinstance(config, ProbeSpec):
        values = config.to_dict()
    elif isinstance(config, dict):
        values = {k: v for k, v in config.items() if k in names}
    else:
        values = {k: getattr(config, k) for k in names if hasattr(config, k)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise UsageError(f"{unknown[0]}: not a probe field, expected one of {', '.join(names)}")
    values["transformer"] = dict(values.get("transformer") or {})
    return ProbeSpec(**values)


def load_entry_point(value: str) -> Callable[..., Any]:
    """Import the `--layer-spec` `pkg.mod:fn` (see graphdoctor.config.resolve_entry_point)."""
    return resolve_entry_point(value, "layer_spec")  # type: ignore[no-any-return]


def init_single_process(seed: int, *, backend: str = "nccl") -> None:
    """World size 1: process group, model parallel (1, 1) and the graph-safe RNG tracker.

    Idempotent: an existing process group and model-parallel state are kept; the RNG tracker is
    always reset so that it is the cudagraph-safe one.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if backend == "nccl":
        torch.cuda.set_device(0)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1
        )
    model_parallel_cuda_manual_seed(seed, use_cudagraphable_rng=True, force_reset_rng=True)


def build_gpt(spec: ProbeSpec, *, device: str = "cuda") -> tuple[torch.nn.Module, dict[int, str]]:
    """Build the GPTModel of `spec` (process state must be initialised).

    Returns:
        (model on `device`, hook registrations: handle id -> `path:line` of the register call).
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = _TORCH_DTYPES[spec.dtype]
    values: dict[str, Any] = {
        "num_layers": spec.num_layers, "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads, "hidden_dropout": spec.dropout,
        "attention_dropout": spec.dropout, "use_cpu_initialization": True, "params_dtype": dtype,
        "bf16": spec.dtype == "bf16", "fp16": spec.dtype == "fp16",
    }
    values.update(spec.transformer)
    config = TransformerConfig(**values)
    layer_spec = build_layer_spec(spec.layer_spec)
    with track_hook_registrations() as registrations:
        model = GPTModel(config=config, transformer_layer_spec=layer_spec,
                         vocab_size=spec.vocab_size, max_sequence_length=spec.seq_length)
    return model.to(device), registrations


def registered_generators() -> list[torch.Generator]:
    """Generators a Megatron capture registers: the RNG tracker's states and the default one."""
    from megatron.core.tensor_parallel import random as mrandom

    gens: list[torch.Generator] = [torch.cuda.default_generators[torch.cuda.current_device()]]
    for state in mrandom.get_cuda_rng_tracker().get_states().values():
        if isinstance(state, torch.Generator):
            gens.append(state)
    return gens


def sample_inputs(spec: ProbeSpec, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """hidden_states [s, b, h] (requires grad) and a causal boolean mask [b, 1, s, s] (True = masked)."""
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    s, b, h = spec.seq_length, spec.micro_batch_size, spec.hidden_size
    hidden = torch.randn(s, b, h, device=device, generator=gen).to(_TORCH_DTYPES[spec.dtype])
    hidden.requires_grad_(True)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=device), diagonal=1)
    return hidden, mask.view(1, 1, s, s).expand(b, 1, s, s).contiguous()


def _detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad and value.is_floating_point())
    return value


@dataclass
class LayerRecording:
    """What the eager passes of one layer produced."""

    observations: list[Observation]
    inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]]
    error: str = ""


def record_layer(name: str, layer: torch.nn.Module, call: Callable[[], Any],
                 module_names: dict[int, str], registrations: dict[int, str],
                 gens: list[torch.Generator]) -> LayerRecording:
    """Two eager passes under the Recorder on a side stream, plus hook scan and address compare."""
    observations = scan_hooks(layer, name, registrations)
    inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    handles = []
    for _, module in layer.named_modules():
        if module is layer:
            continue

        def catch(mod: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if id(mod) not in inputs:
                inputs[id(mod)] = (tree_map(_detach, args), tree_map(_detach, kwargs))
        handles.append(module.register_forward_pre_hook(catch, with_kwargs=True))
    error = ""
    ptrs = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        for _ in range(2):
            ptrs.append(tensor_attribute_ptrs(layer, name))
            with torch.cuda.stream(side), Recorder(
                    device_type="cuda", module_names=module_names, registered_generators=gens,
                    check_streams=True) as recorder:
                call()
            observations.extend(recorder.observations)
        ptrs.append(tensor_attribute_ptrs(layer, name))
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    except Exception as exc:  # user code failing eagerly is reported, the capture runs anyway
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        for handle in handles:
            handle.remove()
    if len(ptrs) == 3:
        observations.extend(_attribute_changes(layer, name, observations, changed_attributes(ptrs[1], ptrs[2])))
    return LayerRecording(observations=observations, inputs=inputs, error=error)


def _attribute_changes(layer: torch.nn.Module, name: str, observations: list[Observation],
                       changed: list[tuple[str, str]]) -> list[Observation]:
    """GD509 for rebound attributes the setattr patch did not see (e.g. object.__setattr__)."""
    seen = {o.detail for o in observations if o.code == "GD509"}
    modules = dict(layer.named_modules(prefix=name))
    found: list[Observation] = []
    for module_name, attr in changed:
        if f"attribute {module_name}.{attr} rebound during forward" in seen:
            continue
        cls = type(modules[module_name])
        code = getattr(cls.forward, "__code__", None)
        where, user = pick_location([(code.co_filename, code.co_firstlineno)]) if code else ("<unknown>", False)
        found.append(Observation(
            code="GD509", operator=f"{cls.__name__}.{attr}", module=module_name, location=where,
            user_code=user, seq=len(observations) + len(found),
            detail=f"attribute {module_name}.{attr} has a new address after the second eager step",
        ))
    return found


def capture_tree(name: str, module: torch.nn.Module, call: Callable[[], Any],
                 inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]],
                 gens: list[torch.Generator], warmup_iters: int, depth: int = 0) -> list[CaptureResult]:
    """Capture `module`; when it fails, capture each child that ran (on its recorded inputs)."""
    results = [capture_unit(name, call, warmup_iters=warmup_iters, generators=gens)]
    if results[0].ok or results[0].poisoned or depth >= MAX_CAPTURE_DEPTH:
        return results
    for child_name, child in module.named_children():
        if id(child) not in inputs:
            continue
        args, kwargs = inputs[id(child)]

        def child_call(child: torch.nn.Module = child, args: Any = args, kwargs: Any = kwargs) -> Any:
            return child(*args, **kwargs)
        results.extend(capture_tree(f"{name}.{child_name}", child, child_call, inputs, gens,
                                    warmup_iters, depth + 1))
        if results[-1].poisoned:
            break
    return results


def probe_layers(spec: ProbeSpec, layers: list[int] | None = None) -> dict[str, Any]:
    """Worker body: set up, build, record and capture the chosen layers (all when None).

    Returns:
        JSON-able dict: observations, captures, recording_errors, poisoned_at (layer index whose
        capture poisoned the context, else None) and layers_done.
    """
    init_single_process(spec.seed)
    model, registrations = build_gpt(spec)
    module_names = {id(m): n for n, m in model.named_modules()}
    gens = registered_generators()
    hidden, mask = sample_inputs(spec)
    decoder_layers: Any = model.decoder.layers  # type: ignore[union-attr]
    chosen = list(range(len(decoder_layers))) if layers is None else layers
    out: dict[str, Any] = {"observations": [], "captures": [], "recording_errors": [],
                           "poisoned_at": None, "layers_done": []}
    for index in chosen:
        layer = decoder_layers[index]
        name = module_names[id(layer)]

        def call(layer: Any = layer) -> Any:
            return layer(hidden, attention_mask=mask)
        recording = record_layer(name, layer, call, module_names, registrations, gens)
        out["observations"].extend(o.to_dict() for o in recording.observations)
        if recording.error:
            out["recording_errors"].append(f"{name}: {recording.error}")
        results = capture_tree(name, layer, call, recording.inputs, gens, spec.warmup_iters)
        out["captures"].extend(r.to_dict() for r in results)
        out["layers_done"].append(index)
        if any(r.poisoned for r in results):
            out["poisoned_at"] = index
            break
    return out


__all__ = [
    "MAX_CAPTURE_DEPTH",
    "LayerRecording",
    "ProbeSpec",
    "build_gpt",
    "capture_tree",
    "init_single_process",
    "load_entry_point",
    "probe_layers",
    "record_layer",
    "registered_generators",
    "sample_inputs",
    "spec_from_config",
]
