"""Every tensor a graph reads from outside its own memory pool, traced to the object that holds it, and watched.

A CUDA graph replays the addresses it saw while it was captured, wherever the tensors behind them are held: in
the model, in the optimizer (Megatron's fp16 loss scaler), in a config callback, in a closure or a global of the
user's forward_step. When the holder is later given a new tensor (`self._scale = torch.max(...)`), eager reads the
new one and every replay the captured one, which may already be freed and its memory reused. The user-code
witness (graphdoctor.child.witness) sees only the user's module attributes; this watcher sees every holder, the
library's included:

1. While a graph is captured, a dispatch mode notes each CUDA tensor an operation reads whose storage the capture
   did not allocate (its external inputs), and each host number an operation takes as an argument.
2. After the step, the external inputs are traced to their holders by a bounded search from the run's roots: the
   model's modules (parameters, buffers, tensor attributes, a parameter's `main_grad`), the optimizer (its loss
   scaler, parameter groups), the TransformerConfig's callbacks (`grad_scale_func`), the forward_step and the
   loss function (closure cells, the globals they read), class attributes of the model's classes and Megatron's
   MoE aux-loss scale. Each holder is a path (`optimizer.chained_optimizers[0].grad_scaler._scale`). Numbers are
   watched where a captured forward (or, under full_iteration, the forward_step or loss function) reads them from
   a global, a class attribute or a closure and their value reached a captured operation.
3. After every step each path is resolved again (a few dictionary look-ups each): a tensor path that now leads to
   another storage, or a number that changed, is a Hazard: GD522 for a tensor, GD518 for a number. The line that
   rebound it is the assignment itself where the holder's class can be watched (a patched `__setattr__`: Megatron's
   `grad_scaler.py:143` included), else the assignment found in the user's source (a global, a closure cell, a
   dictionary entry, a class attribute).

Operations outside PyTorch's dispatcher (Transformer Engine's extension kernels) are not seen; Transformer Engine's
FP8 state has its own watch (graphdoctor.child.fp8_state). Attached to graphed children only; it adds no kernel and
no host synchronisation.
"""

from __future__ import annotations

import functools
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from graphdoctor.child.holder_lines import issuer, source_assignments, user_issuer
from graphdoctor.child.holder_search import (
    MISSING,
    Found,
    Link,
    Parameters,
    Search,
    captured_numbers,
    function_of,
    is_number,
    megatron_holder_classes,
    model_classes,
    resolve,
    short_qualname,
    storage_of,
    unwrapped,
    user_class,
    user_code,
)
from graphdoctor.child.taps import graph_method_owner
from graphdoctor.child.watching_mode import WatchingMode
from graphdoctor.config.impl import Impl
from graphdoctor.protocol.events import Event, Hazard

MAX_WATCHES = 8192
"""Holder paths watched at most (a 7B model's parameters, gradients and the rest stay well below)."""

MAX_SCALARS = 4096
"""Distinct host numbers kept from the captured operations."""

_OWNED_ELSEWHERE = (".fp8_meta", ".quantizers")
"""Path parts of Transformer Engine's FP8 state, which its own watch follows (graphdoctor.child.fp8_state, GD521)."""


@functools.lru_cache(maxsize=4096)
def _fresh_outputs(func: Any) -> bool:
    """True when no output of the operator aliases an input (a new allocation, not a view or an in-place write)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    return all(ret.alias_info is None for ret in schema.returns)



@dataclass(slots=True)
class Watch:
    """One holder path of something a graph read, and what it held when the graph was captured."""

    path: str
    root: Any
    links: tuple[Link, ...]
    kind: str
    """`tensor`, `number` or `generator` (a graph-safe generator state of Megatron's RNG tracker)."""
    storage: int = 0
    """The captured tensor's storage address (tensor)."""
    data_ptr: int = 0
    tensor: weakref.ref[torch.Tensor] | None = None
    value: Any = None
    """The captured number (number), the captured generator state's seed (generator)."""
    seen: Any = None
    """What the path led to at the last check: a storage address (tensor), a value (number), an object
    (generator); a change from it is one more rebinding."""
    module: str = ""
    """The model module that holds it ("" outside the model)."""
    captured_step: int = -1
    read_at: str | None = None
    """`file:line` where captured code reads it (numbers), when found."""
    changed_step: int | None = None
    changed_phase: str | None = None
    changes: int = 0
    freed: bool = False
    new_values: list[Any] = field(default_factory=list)
    user_holder: bool = False
    """Held by the user's code (a module attribute the user-code witness already follows)."""

    def current(self) -> Any:
        """What the path leads to now, in the terms of `seen`."""
        current = resolve(self.root, self.links)
        if self.kind == "tensor":
            return (storage_of(current), current.data_ptr()) if isinstance(current, torch.Tensor) else None
        return _seed(current) if self.kind == "generator" else current

    def changed(self) -> bool:
        """Whether the path now leads somewhere else than at capture (resolved afresh)."""
        current = resolve(self.root, self.links)
        if self.kind == "generator":
            return _seed(current) != self.value
        if self.kind == "number":
            return current is MISSING or current != self.value
        held = self.tensor() if self.tensor is not None else None
        if current is held and held is not None:
            return False
        if not isinstance(current, torch.Tensor):
            return True
        return storage_of(current) != self.storage or current.data_ptr() != self.data_ptr


@dataclass(slots=True)
class _Setter:
    """Where a watched attribute was first assigned after its capture."""

    location: str
    user_location: str | None
    step: int
    phase: str
    count: int = 1


class _ReadMode(WatchingMode):
    """During a capture: the storages each operation reads and allocates, and its host-number arguments."""

    def __init__(self, watcher: HolderWatcher) -> None:
        super().__init__()
        self.watcher = watcher

    def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        began = time.perf_counter()
        kwargs = kwargs or {}
        w = self.watcher
        flat, _ = tree_flatten((args, kwargs))
        for value in flat:
            if isinstance(value, torch.Tensor):
                if value.dim() == 0 and value.device.type == "cpu" and not value.is_complex():
                    w.scalar(value.item())  # a Python number the operator received as a wrapped tensor
                if value.device.type != w.device_type:
                    continue
                ptr = storage_of(value)
                if ptr and ptr not in w.made and ptr not in w.inputs:
                    w.inputs[ptr] = str(getattr(func, "__name__", func))
            elif is_number(value):
                w.scalar(value)
        ran = time.perf_counter()
        out = func(*args, **kwargs)
        done = time.perf_counter()
        if _fresh_outputs(func):
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor) and value.device.type == w.device_type:
                    w.made.add(storage_of(value))
        w.inline_s += (ran - began) + (time.perf_counter() - done)
        return out


class HolderWatcher:
    """Step observer of a graphed child: captures' external inputs traced to their holders, and every holder
    watched after each step (see the module docstring). `finish()` returns one Hazard per changed holder.

    Args:
        setup: the child's Megatron set-up (model, optimizer, config, forward_step).
        names: id(module) -> qualified name.
        impl: the implementation (under full_iteration the forward_step and loss function are captured too).
    """

    def __init__(self, setup: Any, names: dict[int, str], impl: str, *, device_type: str = "cuda") -> None:
        self.setup = setup
        self.device_type = device_type
        self.names = names
        self.impl = impl
        self.step = -1
        self.phase = "setup"
        self.inputs: dict[int, str] = {}
        """Storage address -> first operator that read it, of every CUDA tensor a capture read."""
        self.made: set[int] = set()
        """Storage addresses the captures allocated (the graphs' own pools)."""
        self.scalars: set[float] = set()
        self.watches: list[Watch] = []
        self.traced: set[int] = set()
        self.search_s = 0.0
        """Seconds of the holder searches (once per step with new captures)."""
        self.check_s = 0.0
        """Seconds of the per-step checks."""
        self.inline_s = 0.0
        """Seconds spent inside the training step rather than in the step hooks: reading the captured operations
        and the searches run as the optimizer step begins (graphdoctor.child.observers.Timed counts them)."""
        self.checks = 0
        self._depth = 0
        self._mode = _ReadMode(self)
        self._setters: dict[tuple[int, str], _Setter] = {}
        self._watched_attrs: dict[tuple[int, str], Watch] = {}
        self._patched: set[type] = set()
        self._undo: list[Callable[[], None]] = []
        self._loss_funcs: list[Any] = []
        self._install()

    # -- observer ------------------------------------------------------------------------------------
    def begin_step(self, step: int, phase: str) -> None:
        """The step later evidence belongs to."""
        self.step, self.phase = step, phase

    def end_step(self, step: int, phase: str) -> None:
        """Trace new external inputs to their holders (where the optimizer step did not already); check every
        holder."""
        if self._depth:
            return
        self.flush()
        began = time.perf_counter()
        for watch in self.watches:
            if watch.changed_step is None:
                if watch.changed():
                    self._on_change(watch)
                continue
            now = watch.current()  # after the first change: count each further rebinding
            if now != watch.seen:
                watch.seen = now
                watch.changes += 1
                if watch.kind == "number" and len(watch.new_values) < 3:
                    watch.new_values.append(resolve(watch.root, watch.links))
        self.check_s += time.perf_counter() - began
        self.checks += 1

    def finish(self) -> list[Event]:
        """Remove the patches; one Hazard per holder that changed after its capture."""
        self.close()
        events: list[Event] = []
        for watch in self.watches:
            if watch.changed_step is None or (watch.user_holder and watch.kind == "tensor"):
                continue
            hazard = self._hazard(watch)
            if hazard is not None:
                events.append(hazard)
        return events

    def close(self) -> None:
        """Undo every patch (idempotent)."""
        while self._undo:
            self._undo.pop()()

    @property
    def watched(self) -> dict[str, int]:
        """The holder paths checked after every step, by kind (the child's seconds report them beside the
        watch's hook seconds)."""
        return {kind: sum(1 for w in self.watches if w.kind == kind) for kind in ("tensor", "number", "generator")}

    @property
    def per_step_ms(self) -> float:
        """Mean milliseconds of one step's check."""
        return 1000.0 * self.check_s / self.checks if self.checks else 0.0

    # -- patches -------------------------------------------------------------------------------------
    def _install(self) -> None:
        watcher = self
        owner = graph_method_owner("capture_begin", "capture_end")
        begin, end = owner.__dict__["capture_begin"], owner.__dict__["capture_end"]

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            result = begin(graph, *args, **kwargs)
            watcher.begin_capture()
            return result

        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            watcher.end_capture()
            return end(graph, *args, **kwargs)

        owner.capture_begin = capture_begin  # type: ignore[attr-defined]
        owner.capture_end = capture_end  # type: ignore[attr-defined]

        def undo() -> None:
            owner.capture_begin = begin  # type: ignore[attr-defined]
            owner.capture_end = end  # type: ignore[attr-defined]
            while watcher._depth:
                watcher.end_capture()

        self._undo.append(undo)
        forward_step = self.setup.forward_step

        @functools.wraps(forward_step)
        def remembering(*args: Any, **kwargs: Any) -> Any:
            result = forward_step(*args, **kwargs)
            if watcher._depth and isinstance(result, tuple) and len(result) == 2 and len(watcher._loss_funcs) < 4:
                loss = function_of(result[1])
                if loss is not None and all(loss is not f for f in watcher._loss_funcs):
                    watcher._loss_funcs.append(loss)
            return result

        self.setup.forward_step = remembering

        def restore() -> None:
            self.setup.forward_step = forward_step

        self._undo.append(restore)
        optimizer = self.setup.optimizer
        optimizer_step = getattr(optimizer, "step", None)
        if not callable(optimizer_step):
            return

        def step(*args: Any, **kwargs: Any) -> Any:
            watcher.flush(inline=True)
            return optimizer_step(*args, **kwargs)

        step._gd_internal = True  # type: ignore[attr-defined]  # the searches skip it
        try:
            optimizer.step = step
        except (AttributeError, TypeError):
            return

        def unstep() -> None:
            if vars(optimizer).get("step") is step:
                del optimizer.step

        self._undo.append(unstep)

    def flush(self, *, inline: bool = False) -> None:
        """Trace the external inputs of the captures since the last flush to their holders, while the holders
        still hold them: before the optimizer step (Megatron's loss scaler rebinds in it, a schedule after it)."""
        if self._depth or len(self.inputs) <= len(self.traced):
            return
        began = time.perf_counter()
        self._trace()
        spent = time.perf_counter() - began
        self.search_s += spent
        if inline:
            self.inline_s += spent

    def begin_capture(self) -> None:
        """A graph's capture began: operations are read until its end."""
        if self._depth == 0:
            self._mode.__enter__()
        self._depth += 1

    def end_capture(self) -> None:
        """A graph's capture ended."""
        if self._depth:
            self._depth -= 1
            if self._depth == 0:
                self._mode.__exit__(None, None, None)

    def scalar(self, value: Any) -> None:
        """A host number a captured operation took."""
        if len(self.scalars) < MAX_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
            self.scalars.add(float(value))

    def _watch_setattr(self, obj: Any, name: str, watch: Watch) -> None:
        """Record the assignment `obj.name = ...` where it happens (the holder's class gets a `__setattr__`)."""
        cls = type(obj)
        if cls.__module__.startswith(("builtins", "torch")) or not hasattr(obj, "__dict__"):
            return
        self._watched_attrs[(id(obj), name)] = watch
        if cls in self._patched:
            return
        own = cls.__dict__.get("__setattr__")
        watcher = self

        def setattr_(target: Any, key: str, value: Any) -> None:
            watched = watcher._watched_attrs.get((id(target), key))
            if watched is not None:
                watcher._on_setattr(target, key)
            if own is not None:
                own(target, key, value)
            else:
                super(cls, target).__setattr__(key, value)

        try:
            cls.__setattr__ = setattr_  # type: ignore[method-assign,assignment]
        except (TypeError, AttributeError):
            return
        self._patched.add(cls)

        def undo() -> None:
            if own is not None:
                cls.__setattr__ = own  # type: ignore[method-assign]
            else:
                delattr(cls, "__setattr__")

        self._undo.append(undo)

    def _on_setattr(self, obj: Any, name: str) -> None:
        key = (id(obj), name)
        seen = self._setters.get(key)
        if seen is not None:
            seen.count += 1
            return
        location = issuer(2)
        self._setters[key] = _Setter(location=location or "<unknown>", user_location=user_issuer(2),
                                     step=self.step, phase="capture" if self._depth else self.phase)

    # -- tracing -------------------------------------------------------------------------------------
    def _trace(self) -> None:
        """Find the holders of the external inputs not traced yet, and the numbers captured code reads."""
        targets = {ptr for ptr in self.inputs if ptr not in self.made and ptr not in self.traced}
        self.traced.update(self.inputs)
        search = Search(targets, self.names, self.device_type)
        for name, root, links, module in self._roots():
            search.run(name, root, links, module)
        for found in search.found:
            self._add_tensor_watch(found)
        self._watch_numbers()
        self._watch_generators()

    def _roots(self) -> Iterator[tuple[str, Any, tuple[Link, ...], str]]:
        """(path prefix, root object, links from the root, model module) in the order that names a holder."""
        model = self.setup.model
        modules = [(self.names.get(id(m), n), m) for n, m in model.named_modules()]
        for qualname, module in modules:
            yield qualname or "model", Parameters(module), (), qualname
        yield "optimizer", self.setup.optimizer, (), ""
        yield "config", self.setup.config, (), ""
        for name, fn in self._functions():
            yield name, fn, (), ""
        for cls in model_classes(model):
            yield cls.__qualname__, cls, (), ""
        for cls in megatron_holder_classes():
            yield cls.__qualname__, cls, (), ""
        for qualname, module in modules:
            yield qualname or "model", module, (), qualname

    def _functions(self) -> Iterator[tuple[str, Any]]:
        """The user's functions whose closures and globals captured code can read: forward_step and the loss
        functions it returned while a graph was captured."""
        for fn in self._loss_funcs:
            yield short_qualname(fn), fn
        yield "forward_step", unwrapped(self.setup.forward_step)
        for cls in model_classes(self.setup.model):
            forward = cls.__dict__.get("forward")
            if isinstance(forward, types.FunctionType) and user_code(forward):
                yield f"{cls.__qualname__}.forward", forward

    def _add_tensor_watch(self, found: Found) -> None:
        if len(self.watches) >= MAX_WATCHES or any(part in found.path for part in _OWNED_ELSEWHERE):
            return
        tensor = found.value
        user_holder = bool(found.module) and user_class(type(found.owner)) and found.links[-1][0] == "attr"
        watch = Watch(path=found.path, root=found.root, links=found.links, kind="tensor", storage=storage_of(tensor),
                      data_ptr=tensor.data_ptr(), tensor=weakref.ref(tensor), module=found.module,
                      captured_step=self.step, user_holder=user_holder)
        self.watches.append(watch)
        obj = found.root
        for kind, key in found.links:
            if kind in ("attr", "get") and isinstance(key, str) and key not in ("_parameters", "_buffers"):
                self._watch_setattr(obj, key, watch)
            obj = resolve(obj, ((kind, key),))
            if obj is MISSING:
                break

    def _watch_numbers(self) -> None:
        """Numbers read by captured user code from a global, a class attribute or a closure, whose value reached a
        captured operation."""
        seen = {w.path for w in self.watches}
        for path, root, links, value, read_at in captured_numbers(self._read_code(), self.setup.model):
            if path in seen or float(value) not in self.scalars or len(self.watches) >= MAX_WATCHES:
                continue
            seen.add(path)
            self.watches.append(Watch(path=path, root=root, links=links, kind="number", value=value,
                                      captured_step=self.step, read_at=read_at))

    def _watch_generators(self) -> None:
        """The graph-safe generator states of Megatron's RNG tracker, which every graph Megatron captures registers
        (`register_generator_state`): a replay draws from the registered state, eager from whatever the tracker
        holds now. A state is known by its seed: the tracker hands out a new Python object for the same state
        whenever it swaps states (`fork`), so identity says nothing, and replacing a state reseeds it (a state
        replaced by one of the same seed goes unseen). CPU state tensors (a tracker that is not graph-safe) are not
        read by a graph and not watched."""
        module = sys.modules.get("megatron.core.tensor_parallel.random")
        tracker = getattr(module, "_CUDA_RNG_STATE_TRACKER", None)
        states = getattr(tracker, "states_", None)
        if not isinstance(states, dict) or tracker is None:
            return
        seen = {w.path for w in self.watches}
        for name, state in list(states.items()):
            path = f"rng_tracker.states_[{name!r}]"
            if not isinstance(state, torch.Generator) or path in seen or len(self.watches) >= MAX_WATCHES:
                continue
            links: tuple[Link, ...] = (("get", "_CUDA_RNG_STATE_TRACKER"), ("attr", "states_"), ("item", name))
            watch = Watch(path=path, root=module, links=links, kind="generator", value=_seed(state),
                          captured_step=self.step)
            self.watches.append(watch)
            self._watch_setattr(tracker, "states_", watch)

    def _read_code(self) -> list[Any]:
        """Functions whose code runs inside the graphs: the forwards of the user's module classes, and under
        full_iteration the forward_step and the loss functions too."""
        out: list[Any] = []
        for cls in model_classes(self.setup.model):
            forward = cls.__dict__.get("forward")
            if forward is not None and user_code(forward):
                out.append(forward)
        if self.impl == Impl.FULL_ITERATION:
            out += [fn for name, fn in self._functions() if user_code(fn) and not name.endswith(".forward")]
        return out

    # -- evidence ------------------------------------------------------------------------------------
    def _on_change(self, watch: Watch) -> None:
        """The first change of a holder after its capture; later ones are counted against `seen`."""
        watch.changes = 1
        watch.changed_step, watch.changed_phase = self.step, self.phase
        held = watch.tensor() if watch.tensor is not None else None
        watch.freed = watch.kind == "tensor" and held is None
        watch.seen = watch.current()
        current = resolve(watch.root, watch.links)
        if watch.kind == "number" and current is not MISSING:
            watch.new_values.append(current)

    def _setter(self, watch: Watch) -> _Setter | None:
        """The first recorded assignment along the holder's path (the link that was rebound)."""
        obj = watch.root
        for kind, key in watch.links:
            if kind in ("attr", "get") and isinstance(key, str):
                setter = self._setters.get((id(obj), key))
                if setter is not None:
                    return setter
            obj = resolve(obj, ((kind, key),))
            if obj is MISSING:
                return None
        return None

    def _hazard(self, watch: Watch) -> Hazard | None:
        setter = self._setter(watch)
        location, also = _rebinding_site(watch, setter)
        when = f"step {watch.changed_step}" + (f" (changed {watch.changes} times)" if watch.changes > 1 else "")
        if watch.kind == "number":
            shown = ", ".join(repr(v) for v in [watch.value, *watch.new_values][:3])
            where = f" at {location}" if location else ""
            return Hazard(rule="GD518", module=watch.module, subject=watch.path,
                          location=watch.read_at or location, step=watch.changed_step, phase=watch.changed_phase,
                          also_at=tuple(x for x in (location, *also) if x and x != watch.read_at), message=(
                              f"captured code reads the Python number {watch.path} (read at {watch.read_at or '?'}), "
                              f"which changed after the graph was captured at step {watch.captured_step} "
                              f"({shown}; set{where}, {when}); every replay uses the capture-time value"))
        by = f" by {location}" if location else ""
        megatron = bool(location and location.startswith("megatron/"))
        fix = _fix_for(watch.path) if megatron or watch.kind == "generator" else None
        if watch.kind == "generator":
            return Hazard(rule="GD522", module="", subject=watch.path, location=location, step=watch.changed_step,
                          phase=watch.changed_phase, also_at=also, fix=fix, message=(
                              f"{watch.path}, a generator state the graphs registered at capture (step "
                              f"{watch.captured_step}, seed {watch.value}), was replaced by a new generator{by} at "
                              f"{when}; every replay "
                              "keeps drawing from the registered state and eager from the new one, so the random "
                              "draws (dropout masks) differ"))
        state = ("freed: every replay reads memory the allocator may have handed to anything" if watch.freed else
                 "still alive, so every replay reads its stale values")
        return Hazard(rule="GD522", module=watch.module, subject=watch.path, location=location,
                      step=watch.changed_step, phase=watch.changed_phase, also_at=also, fix=fix, message=(
                          f"{watch.path}, a tensor a graph read at capture (step {watch.captured_step}), was rebound to "
                          f"a new tensor{by} at {when}; the graph keeps reading the captured tensor, which is "
                          f"{state}"))


def _fix_for(path: str) -> str | None:
    """The fix of a rebinding the library makes (what the user can change)."""
    if path.startswith("rng_tracker.states_["):
        return ("Reseed the tracker's generators in place (`get_cuda_rng_tracker().get_states()[name].manual_seed("
                "seed)`) rather than calling model_parallel_cuda_manual_seed again after the graphs were captured")
    if path.endswith("grad_scaler._scale"):
        return ("Train in bf16, set a static loss scale (--loss-scale, run.loss_scale), or graph with local or "
                "transformer_engine, which keep the loss scaling outside the graph")
    return None


def _seed(state: Any) -> int | None:
    """A generator state's seed (None: not a generator)."""
    try:
        return int(state.initial_seed()) if isinstance(state, torch.Generator) else None
    except RuntimeError:
        return None


def _rebinding_site(watch: Watch, setter: _Setter | None) -> tuple[str | None, tuple[str, ...]]:
    """(`file:line` of the assignment that rebound the holder, other lines of it): the one seen where it ran (the
    user's line first where library code did it for the user's call), else the one found in the user's source."""
    if setter is not None:
        if setter.user_location and setter.user_location != setter.location:
            if watch.module or watch.kind == "generator" or \
                    not setter.location.startswith(("megatron/", "transformer_engine/")):
                return setter.user_location, (setter.location,)
            return setter.location, (setter.user_location,)
        return setter.location, ()
    found = source_assignments(watch.root, watch.links)
    return (found[0], tuple(found[1:3])) if found else (None, ())


__all__ = ["MAX_WATCHES", "HolderWatcher", "Watch", "resolve"]
