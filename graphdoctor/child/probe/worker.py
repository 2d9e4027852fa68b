"""The probe worker (`python -P -m graphdoctor.child.probe.worker JOB.json OUT.json`): build the model
`graphdoctor diff` builds (graphdoctor.child.megatron_setup, the one set-up path) on one GPU, then
record and capture each decoder layer.

Units are `decoder.layers.<i>` and, when a layer fails to capture, its submodules on the inputs they
saw during the eager pass. The worker always writes OUT.json, with `tool_error` set when the probe
itself failed.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from graphdoctor.child.probe.capture import capture_unit
from graphdoctor.child.probe.modules import changed_attributes, scan_hooks, tensor_attribute_ptrs
from graphdoctor.child.probe.recorder import Recorder, pick_location
from graphdoctor.config import DiffConfig
from graphdoctor.probes.types import CaptureResult, Observation
from graphdoctor.protocol.spec import ProbeJob

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_CAPTURE_DEPTH = 2
"""How far below a failing layer the probe descends (layer -> mlp -> linear_fc1)."""


def registered_generators() -> list[torch.Generator]:
    """Generators a Megatron capture registers: the RNG tracker's states and the default one."""
    from megatron.core.tensor_parallel import random as mrandom

    gens: list[torch.Generator] = [torch.cuda.default_generators[torch.cuda.current_device()]]
    for state in mrandom.get_cuda_rng_tracker().get_states().values():
        if isinstance(state, torch.Generator):
            gens.append(state)
    return gens


def sample_inputs(config: DiffConfig, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """hidden_states [s, b, h] (requires grad) and a causal boolean mask [b, 1, s, s] (True = masked)."""
    gen = torch.Generator(device=device).manual_seed(config.seed)
    s, b, h = config.seq_length, config.micro_batch_size, config.hidden_size
    hidden = torch.randn(s, b, h, device=device, generator=gen).to(_TORCH_DTYPES[config.dtype])
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


def decoder_layers(model: torch.nn.Module) -> Any:
    """`model.decoder.layers` of a GPTModel (or a user model built like one).

    Raises:
        UsageError: the model has no `decoder.layers` to probe.
    """
    from graphdoctor.errors import UsageError

    layers = getattr(getattr(model, "decoder", None), "layers", None)
    if layers is None:
        raise UsageError(f"the probes call each decoder layer, and the model ({type(model).__name__}) "
                         "has no decoder.layers")
    return layers


def probe_layers(job: ProbeJob) -> dict[str, Any]:
    """Worker body: set up, build, record and capture the job's layers.

    Returns:
        JSON-able dict: observations, captures, recording_errors, poisoned_at (layer index whose
        capture poisoned the context, else None) and layers_done.
    """
    from graphdoctor.child.megatron_setup import build_probe_model

    model, registrations = build_probe_model(job.config)
    module_names = {id(m): n for n, m in model.named_modules()}
    gens = registered_generators()
    hidden, mask = sample_inputs(job.config)
    layers = decoder_layers(model)
    out: dict[str, Any] = {"observations": [], "captures": [], "recording_errors": [],
                           "poisoned_at": None, "layers_done": []}
    for index in job.layers:
        layer = layers[index]
        name = module_names[id(layer)]

        def call(layer: Any = layer) -> Any:
            return layer(hidden, attention_mask=mask)
        recording = record_layer(name, layer, call, module_names, registrations, gens)
        out["observations"].extend(o.to_dict() for o in recording.observations)
        if recording.error:
            out["recording_errors"].append(f"{name}: {recording.error}")
        results = capture_tree(name, layer, call, recording.inputs, gens, job.warmup_iters)
        out["captures"].extend(r.to_dict() for r in results)
        out["layers_done"].append(index)
        if any(r.poisoned for r in results):
            out["poisoned_at"] = index
            break
    return out


def main(argv: list[str] | None = None) -> int:
    """Read the job, probe, write the result; exit 0 unless the output cannot be written."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m graphdoctor.child.probe.worker JOB.json OUT.json\n")
        return 2
    job_path, out_path = args
    from graphdoctor.child.stacks import die_with_parent

    die_with_parent()
    result: dict[str, Any]
    try:
        with open(job_path, encoding="utf-8") as fh:
            job = ProbeJob.from_json(fh.read())
        if job.import_dir:
            sys.path.append(job.import_dir)
        result = probe_layers(job)
    except Exception as exc:  # reported to the parent as a tool error, never swallowed
        tail = traceback.format_exc().strip().splitlines()[-6:]
        result = {"tool_error": f"{type(exc).__name__}: {exc}", "traceback": tail}
    finally:
        _shutdown()
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


def _shutdown() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        try:
            torch.distributed.destroy_process_group()
        except RuntimeError as exc:
            # A poisoned context can fail teardown; the result file matters more than a clean exit.
            sys.stderr.write(f"graphdoctor probe worker: teardown failed: {exc}\n")


__all__ = [
    "MAX_CAPTURE_DEPTH",
    "LayerRecording",
    "capture_tree",
    "decoder_layers",
    "main",
    "probe_layers",
    "record_layer",
    "registered_generators",
    "sample_inputs",
]


if __name__ == "__main__":
    sys.exit(main())
