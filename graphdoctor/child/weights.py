"""Identical weights in every child without CPU initialisation (DiffConfig.gpu_init): Megatron builds the model on
the GPU with its own init methods, which record the tensor each one filled (InitRecorder); each recorded tensor is
then filled again by the same init method from a seed of its own (the run's seed, the parameter's name, the view's
offset and this rank's tensor, pipeline and expert ranks), so what it holds depends neither on the RNG tracker a
graphed child needs nor on what was drawn before it.

Tensor-parallel shards are seeded per (name, tensor-parallel rank): each rank draws its shard, not a slice of one full
tensor. Children of one diff share their placement, so the same rank of every child draws the same shard; a
different placement gives different (equally distributed) weights, as Megatron's own GPU initialisation does.
Constant initialisations (norms' ones, biases' zeros) need no seed. A parameter no recorded init method filled and that
is not constant is listed as unseeded: its values may differ between children, and the parent says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def parameter_seed(seed: int, name: str, offset: int, ranks: tuple[int, ...]) -> int:
    """A 63-bit seed for one tensor: the run's seed, the parameter's name (module-local, no wrappers), the element
    offset of the view filled, and this rank's (tensor, pipeline, expert) ranks."""
    text = f"{seed}|{name}|{offset}|{','.join(map(str, ranks))}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


class InitRecorder:
    """Wraps the init methods of a TransformerConfig (every callable field named `*init_method`) so that each call
    is recorded with the tensor it filled; the original still runs (a tensor nothing re-seeds keeps Megatron's
    values). The wrappers are plain closures: a config Megatron copies keeps recording here."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, Callable[..., Any]]] = []

    def install(self, tconfig: Any) -> list[str]:
        """Wrap `tconfig`'s init methods in place; the names of the fields wrapped."""
        wrapped = []
        for f in dataclasses.fields(tconfig):
            method = getattr(tconfig, f.name, None)
            if f.name.endswith("init_method") and callable(method):
                setattr(tconfig, f.name, self._wrap(method))
                wrapped.append(f.name)
        return wrapped

    def _wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.calls

        def recorded(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            calls.append((tensor, method))
            return method(tensor, *args, **kwargs)

        return recorded


@dataclass(frozen=True, slots=True)
class Reseeded:
    """What seeded_initialisation did."""

    num_tensors: int
    """Recorded tensors filled again from their own seed."""
    unseeded: tuple[str, ...]
    """Parameters no recorded init method filled and that are not constant."""


def _owners(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter, int, int]]:
    """(name, parameter, first byte address, end byte address) of every parameter."""
    out = []
    for name, param in model.named_parameters():
        start = param.data_ptr()
        out.append((name, param, start, start + param.numel() * param.element_size()))
    return out


def _locate(tensor: torch.Tensor, owners: list[tuple[str, torch.nn.Parameter, int, int]]) -> tuple[str, int] | None:
    """(parameter name, element offset) of the parameter whose storage holds `tensor`; None: none does."""
    address = tensor.data_ptr()
    for name, param, start, end in owners:
        if start <= address < end and param.device == tensor.device:
            return name, (address - start) // max(1, param.element_size())
    return None


@torch.no_grad()
def seeded_initialisation(model: torch.nn.Module, recorder: InitRecorder, seed: int,
                          ranks: tuple[int, ...]) -> Reseeded:
    """Fill every recorded tensor of `model` again with its init method, from its own seed (parameter_seed), with
    the default generators forked (the RNG tracker and the process's generators are left as they were)."""
    owners = _owners(model)
    covered: set[str] = set()
    devices = sorted({p.device.index for _, p, _, _ in owners if p.device.type == "cuda"})
    num = 0
    for tensor, method in recorder.calls:
        found = _locate(tensor, owners)
        if found is None:
            continue
        name, offset = found
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(parameter_seed(seed, name, offset, ranks))
            method(tensor)
        covered.add(name)
        num += 1
    unseeded = tuple(name for name, param, _, _ in owners
                     if name not in covered and param.numel() > 1 and bool((param != param.flatten()[0]).any()))
    return Reseeded(num_tensors=num, unseeded=unseeded)


def model_ranks() -> tuple[int, ...]:
    """This process's (tensor, pipeline, expert) model-parallel ranks ((0, 0, 0) before Megatron's groups exist)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return (0, 0, 0)
    return (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_expert_model_parallel_rank())


def weights_digest(model: torch.nn.Module) -> str:
    """A bitwise digest of every parameter in name order (graphdoctor.compare.bitprint's lanes, computed on the
    parameters' device): equal in two children iff their weights are (up to the lanes' collision bound)."""
    from graphdoctor.compare.bitprint import BitFingerprinter, host_lanes

    params = sorted(model.named_parameters(), key=lambda item: item[0])
    if not params:
        return ""
    printer = BitFingerprinter([(n, p.numel(), p.dtype) for n, p in params], params[0][1].device)
    lanes = host_lanes(printer.fingerprint([p.detach() for _, p in params]))
    text = "|".join(f"{n}:{a:016x}{b:016x}" for (n, _), (a, b) in zip(params, lanes, strict=True))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


__all__ = ["InitRecorder", "Reseeded", "model_ranks", "parameter_seed", "seeded_initialisation", "weights_digest"]
