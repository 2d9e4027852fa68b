"""What a graphed child sees the user's code do around its captures: the evidence behind a divergence's cause.

A graph replays the addresses and values it saw while it was captured. The witness watches, in a graphed
child, for the user's code doing something a replay cannot follow, and reports each as a Hazard event with
its rule, module, user `file:line` and step:

- GD509: a module's tensor attribute rebound (`self.t = new`) during or after a capture (a patched
  `Module.__setattr__`);
- GD518: a Python number a graphed module's forward reads (`self.x`) set to a new value during or after a
  capture; or a host number turned into a device tensor while capturing (`torch.full`, `torch.tensor`,
  `fill_`, ...) at a call site whose numbers change from call to call;
- GD519: `torch.cuda.is_current_stream_capturing()` asked by the user's code during a capture (it answers
  True there, False eagerly, so the graph holds the other branch);
- GD520: a hook registered by the user's code that keeps a reference to a tensor it receives, when a later
  call of the same hook receives a tensor in that same storage while the kept one is still alive (a graph's
  static buffer, rewritten by every replay);
- GD402 / GD514: a graph captured with grad on replayed with grad off (evaluation replaying the training
  graph; GD402 when Megatron's code replays it, GD514 when the user's does);
- GD521: an FP8 scale or amax tensor of a Transformer Engine quantizer or recipe state replaced by the user's
  code after a capture (`quantizer.scale = torch.ones(...)`), where Transformer Engine is loaded.

Only calls issued by the user's code count (graphdoctor.child.probe.recorder.is_user_file: not torch,
megatron, transformer_engine, graphdoctor, the standard library or site-packages), so a clean model gives no
evidence. The patches are Python wrappers with no kernel and no host synchronisation; they never change
what runs on the device. Attached to graphed children only (the eager reference captures nothing).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import os
import sys
import textwrap
import weakref
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from graphdoctor.child.taps import graph_method_owner
from graphdoctor.compare.cause import FACTORIES, HOOK
from graphdoctor.locations import format_location
from graphdoctor.protocol.events import Event, Hazard

_SKIPPED_ROOTS = (os.path.realpath(os.path.dirname(torch.__file__)) + os.sep,
                  os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep)
"""torch and graphdoctor: the frames between the user's call and the witness."""

_real = functools.lru_cache(maxsize=4096)(os.path.realpath)

MAX_VALUES = 8
"""Distinct values kept per call site or attribute (enough to tell constant from changing)."""

MAX_HAZARDS = 32
"""Hazard events one child reports at most (the first ones; a note-sized report, not a log)."""


_MODE_QUERIES = frozenset({"training"})
"""Attributes a forward reads to take a mode-dependent branch."""

_MODE_FUNCTIONS = frozenset({"is_grad_enabled", "is_inference_mode_enabled"})
"""torch functions a forward calls to take a grad-mode-dependent branch."""


@dataclass(slots=True)
class _Number:
    """A number-valued attribute of a module that the user's code set during or after a capture."""

    module: torch.nn.Module
    attr: str
    location: str
    step: int
    phase: str
    values: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class _Factory:
    """A user call site that made a device tensor from host numbers."""

    op: str
    location: str
    module: str | None
    values: list[Any] = field(default_factory=list)
    captured_step: int | None = None


@dataclass(slots=True)
class _HookSite:
    """One registration site of a user hook: what it kept (weak references) and what it is on."""

    location: str
    function: str
    kind: str
    module: str
    """The module it is on or inside ("" when unknown)."""
    subject: str
    """What it is on, in words."""
    kept: list[tuple[weakref.ref[torch.Tensor], int, int, int]] = field(default_factory=list)
    """(tensor, storage address, step, call index) of each tensor the hook kept a reference to."""
    calls: int = 0
    reported: bool = False


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _storage(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _function_location(fn: Any) -> str:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", repr(fn))
    return format_location(code.co_filename, code.co_firstlineno)


@functools.lru_cache(maxsize=256)
def _user_forwards(cls: type) -> tuple[tuple[str, int, ast.AST], ...]:
    """(file, first line, parsed source) of each `forward` in the class's hierarchy that is the user's code."""
    from graphdoctor.child.probe.recorder import is_user_file

    out = []
    for klass in cls.__mro__:
        forward = klass.__dict__.get("forward")
        code = getattr(forward, "__code__", None)
        if forward is None or code is None or not is_user_file(code.co_filename):
            continue
        try:
            lines, first = inspect.getsourcelines(forward)
            out.append((code.co_filename, first, ast.parse(textwrap.dedent("".join(lines)))))
        except (OSError, TypeError, SyntaxError):
            continue
    return tuple(out)


def _lines(cls: type, hit: Callable[[ast.AST], bool]) -> list[str]:
    """`file:line` of every node of the user's forwards of `cls` that `hit` picks, in line order."""
    found = {format_location(filename, first + node.lineno - 1)
             for filename, first, tree in _user_forwards(cls) for node in ast.walk(tree)
             if isinstance(node, ast.expr) and hit(node)}
    return sorted(found, key=lambda loc: (loc.rsplit(":", 1)[0], int(loc.rsplit(":", 1)[1])))


def _reads_self(node: ast.AST, attrs: Container[str]) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in attrs \
        and isinstance(node.value, ast.Name) and node.value.id == "self"


def forward_read_line(cls: type, attr: str) -> str | None:
    """`file:line` of the first line of the user's forward of `cls` (or of an ancestor) that reads
    `self.<attr>`; None when none does."""
    lines = _lines(cls, lambda node: _reads_self(node, (attr,)))
    return lines[0] if lines else None


def mode_query_lines(cls: type) -> list[str]:
    """`file:line` of each mode-dependent test in the user's forward of `cls`: `self.training`,
    `torch.is_grad_enabled()`, `torch.is_inference_mode_enabled()`."""
    return _lines(cls, lambda node: _reads_self(node, _MODE_QUERIES) or (
        isinstance(node, ast.Attribute) and node.attr in _MODE_FUNCTIONS))


class CaptureWitness:
    """Patches installed for one graphed child run; `finish()` returns its Hazard events.

    Args:
        model: the model (its modules and parameters are named in the evidence).
        names: id(module) -> qualified name.
    """

    def __init__(self, model: torch.nn.Module, names: dict[int, str]) -> None:
        self.names = names
        self.device_type = next((p.device.type for p in model.parameters()), "cuda")
        self.modules = {id(m): m for m in model.modules()}
        self.param_names = {id(p): n for n, p in _named_parameters(model)}
        self.step = -1
        self.phase = "setup"
        self.depth = 0
        self.captures = 0
        self.found: dict[tuple[str, str, str], Hazard] = {}
        self._numbers: dict[tuple[int, str], _Number] = {}
        self._factories: dict[str, _Factory] = {}
        self._hooks: dict[str, _HookSite] = {}
        self._graphs: dict[int, bool] = {}
        """id(graph) -> grad enabled when it was captured."""
        self._replayed_off: set[int] = set()
        self._undo: list[Callable[[], None]] = []
        self._inside = False
        self._install()

    # -- observer ------------------------------------------------------------------------------------
    def begin_step(self, step: int, phase: str) -> None:
        """The step (and phase) later evidence belongs to."""
        self.step = step
        self.phase = phase

    def end_step(self, step: int, phase: str) -> None:
        """Nothing to do after a step (the evidence is kept as it happens)."""

    def finish(self) -> list[Event]:
        """Remove the patches; one Hazard per piece of evidence (at most MAX_HAZARDS)."""
        self.close()
        for number in self._numbers.values():
            self._number_hazard(number)
        for factory in self._factories.values():
            if factory.captured_step is not None and len(set(map(repr, factory.values))) > 1:
                shown = ", ".join(repr(v) for v in factory.values[:3])
                self._add(Hazard(rule="GD518", module=factory.module or "", subject=factory.op,
                                 location=factory.location, step=factory.captured_step, phase="capture", message=(
                                     f"{_qualified(factory.op)} turned host numbers into a device tensor while a graph "
                                     f"was captured at step {factory.captured_step}; its numbers change from call "
                                     f"to call ({shown}), and every replay reuses the one captured")))
        self._place_eval_replays()
        for site in self._hooks.values():
            if site.calls and not site.reported:
                self._add(Hazard(rule=HOOK, module=site.module, subject=site.function, location=site.location,
                                 also_at=(site.function,), message=(
                                     f"{site.kind} hook {site.function} registered at {site.location} on "
                                     f"{site.subject}, called {site.calls} times")))
        events: list[Event] = []
        events.extend(list(self.found.values())[:MAX_HAZARDS])
        return events

    def _place_eval_replays(self) -> None:
        """Training graphs replayed with grad off: one hazard per rule, pointing at the user's mode-dependent
        line (what evaluation should have run differently) with every replay site beside it."""
        for rule in ("GD402", "GD514"):
            keys = [k for k, h in self.found.items() if h.rule == rule]
            if not keys:
                continue
            first = self.found[keys[0]]
            sites = tuple(dict.fromkeys(loc for k in keys if (loc := self.found[k].location)))
            for key in keys:
                del self.found[key]
            hazard = dataclasses.replace(first, also_at=sites)
            for module_id, module in self.modules.items():
                lines = mode_query_lines(type(module))
                if lines:
                    name = self.names.get(module_id, type(module).__name__)
                    hazard = dataclasses.replace(
                        hazard, module=name, location=lines[0], also_at=sites + tuple(lines[1:]),
                        message=hazard.message + f"; {name}.forward branches on the mode at {lines[0]}")
                    break
            self.found[(rule, hazard.module, hazard.location or "")] = hazard

    def close(self) -> None:
        """Undo every patch (idempotent)."""
        while self._undo:
            self._undo.pop()()

    # -- patches -------------------------------------------------------------------------------------
    def _patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
        setattr(owner, attr, make(original))
        self._undo.append(lambda: setattr(owner, attr, original))

    def _install(self) -> None:
        import torch.cuda.graphs as graphs

        witness = self
        klass = graph_method_owner("capture_begin", "capture_end", "replay")

        def make_begin(original: Any) -> Any:
            def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(graph, *args, **kwargs)
                witness.depth += 1
                witness.captures += 1
                witness._graphs[id(graph)] = torch.is_grad_enabled()
                return result
            return capture_begin

        def make_end(original: Any) -> Any:
            def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
                witness.depth = max(0, witness.depth - 1)
                return original(graph, *args, **kwargs)
            return capture_end

        def make_replay(original: Any) -> Any:
            def replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
                if not torch.is_grad_enabled() and witness._graphs.get(id(graph)) is True:
                    witness._on_replay_without_grad(graph)
                return original(graph, *args, **kwargs)
            return replay

        self._patch(klass, "capture_begin", make_begin)
        self._patch(klass, "capture_end", make_end)
        self._patch(klass, "replay", make_replay)

        def make_query(original: Any) -> Any:
            def is_capturing() -> bool:
                result = bool(original())
                if result and witness.depth and not witness._inside:
                    witness._on_capture_query()
                return result
            return is_capturing

        self._patch(graphs, "_cuda_isCurrentStreamCapturing", make_query)

        def make_setattr(original: Any) -> Any:
            def setattr_(module: torch.nn.Module, name: str, value: Any) -> None:
                if witness.captures and not witness._inside and id(module) in witness.modules and (
                        _number(value) or (isinstance(value, torch.Tensor)
                                           and not isinstance(value, torch.nn.Parameter))):
                    witness._on_setattr(module, name, value)
                original(module, name, value)
            return setattr_

        self._patch(torch.nn.Module, "__setattr__", make_setattr)

        def make_register(kind: str) -> Callable[[Any], Any]:
            def make(original: Any) -> Any:
                def register(owner: Any, hook: Any, *args: Any, **kwargs: Any) -> Any:
                    where = None if witness._inside else user_issuer(1)
                    if where is not None:
                        hook = witness._observed_hook(kind, owner, hook, where)
                    return original(owner, hook, *args, **kwargs)
                return register
            return make

        self._patch(torch.Tensor, "register_hook", make_register("tensor"))
        self._patch(torch.nn.Module, "register_forward_hook", make_register("forward"))
        self._patch(torch.nn.Module, "register_full_backward_hook", make_register("backward"))

        te_state = _te_state_classes()
        for owner in te_state:
            self._patch(owner, "__setattr__", self._fp8_setattr_wrapper())

        for op in FACTORIES:  # the value becomes a kernel argument or a copied constant of a captured graph
            method = op.endswith("_")
            self._patch(torch.Tensor if method else torch, op, self._factory_wrapper(op, method=method))

    def _fp8_setattr_wrapper(self) -> Callable[[Any], Any]:
        witness = self

        def make(original: Any) -> Any:
            def setattr_(obj: Any, name: str, value: Any) -> None:
                if witness.captures and not witness._inside and isinstance(value, torch.Tensor):
                    witness._on_fp8_setattr(obj, name, value)
                original(obj, name, value)
            return setattr_
        return make

    def _fp8_owner(self, obj: Any) -> tuple[str, str] | None:
        """(module name, `fwd.q3` / `bwd`) of a quantizer or recipe state held by one of the model's modules."""
        for module_id, module in self.modules.items():
            meta = getattr(module, "fp8_meta", None)
            quantizers = getattr(module, "quantizers", None)
            if not isinstance(meta, dict):
                continue
            for key, short in (("scaling_fwd", "fwd"), ("scaling_bwd", "bwd")):
                if meta.get(key) is obj:
                    return self.names.get(module_id, type(module).__name__), short
                held = quantizers.get(key, ()) if isinstance(quantizers, dict) else ()
                for index, quantizer in enumerate(held):
                    if quantizer is obj:
                        return self.names.get(module_id, type(module).__name__), f"{short}.q{index}"
        return None

    def _on_fp8_setattr(self, obj: Any, name: str, value: torch.Tensor) -> None:
        def handle() -> None:
            location = user_issuer(2)
            old = obj.__dict__.get(name) if hasattr(obj, "__dict__") else None
            if location is None or not isinstance(old, torch.Tensor) or _storage(old) == _storage(value):
                return
            owner = self._fp8_owner(obj)
            if owner is None:
                return
            module, what = owner
            self._add(Hazard(rule="GD521", module=module, subject=f"{what}.{name}", location=location,
                             step=self.step, phase=self._phase, message=(
                                 f"FP8 state {what}.{name} of {module} was replaced by a new tensor {self._when} "
                                 f"(step {self.step}); the graph keeps quantizing with the tensor it captured, so "
                                 "the new scale never reaches a replay")))
        self._guarded(handle)

    def _factory_wrapper(self, op: str, *, method: bool = False) -> Callable[[Any], Any]:
        witness = self
        position, keyword = (1, "fill_value") if method or op in ("full", "full_like") else (0, "data")

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def factory(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                if not witness._inside:
                    value = args[position] if len(args) > position else kwargs.get(keyword)
                    if _host_numbers(value) and isinstance(result, torch.Tensor) \
                            and result.device.type == witness.device_type:
                        witness._on_factory(op, value)
                return result
            return factory
        return make

    # -- evidence ------------------------------------------------------------------------------------
    @property
    def _when(self) -> str:
        return "during a capture" if self.depth else "after the first capture"

    @property
    def _phase(self) -> str:
        return "capture" if self.depth else self.phase

    def _module(self, skip: int = 1) -> str | None:
        """The innermost named module on the stack (a frame whose `self` is one of the model's modules)."""
        frame: Any = sys._getframe(skip + 1)
        while frame is not None:
            owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
            if owner is not None and id(owner) in self.names and isinstance(owner, torch.nn.Module):
                return self.names[id(owner)]
            frame = frame.f_back
        return None

    def _guarded(self, fn: Callable[[], None]) -> None:
        """Run one evidence handler with the witness's own patches bypassed, never raising into training."""
        self._inside = True
        try:
            fn()
        except Exception:  # noqa: BLE001, S110 - evidence is best effort; training must go on
            pass
        finally:
            self._inside = False

    def _add(self, hazard: Hazard) -> None:
        key = (hazard.rule, hazard.module, hazard.location or hazard.subject or "")
        if key not in self.found and len(self.found) < MAX_HAZARDS:
            self.found[key] = hazard

    def _on_setattr(self, module: torch.nn.Module, name: str, value: Any) -> None:
        def handle() -> None:
            location = user_issuer(2)
            if location is None:
                return
            old = module.__dict__.get(name, module.__dict__.get("_buffers", {}).get(name))
            qualname = self.names.get(id(module), type(module).__name__)
            if isinstance(value, torch.Tensor):
                if isinstance(old, torch.Tensor) and old is not value and _storage(old) != _storage(value):
                    self._add(Hazard(rule="GD509", module=qualname, subject=name, location=location, step=self.step,
                                     phase=self._phase,
                                     message=(f"{qualname}.{name} was rebound to a new tensor {self._when} (step "
                                              f"{self.step}); a graph keeps reading the tensor it captured, so the "
                                              "new values never reach a replay")))
                return
            if not _number(old) or old == value:
                return
            number = self._numbers.get((id(module), name))
            if number is None:
                number = self._numbers[(id(module), name)] = _Number(module, name, location, self.step, self._phase, [old])
            if len(number.values) < MAX_VALUES:
                number.values.append(value)
        self._guarded(handle)

    def _number_hazard(self, number: _Number) -> None:
        read = forward_read_line(type(number.module), number.attr)
        if read is None:
            return
        qualname = self.names.get(id(number.module), type(number.module).__name__)
        shown = ", ".join(repr(v) for v in number.values[:4])
        self._add(Hazard(rule="GD518", module=qualname, subject=number.attr, location=read, step=number.step,
                         phase=number.phase,
                         also_at=(number.location,), message=(
                             f"{qualname}.forward reads the Python number self.{number.attr}, which changes from "
                             f"step {number.step} on ({shown}, set at {number.location}); a graph captured the "
                             "value it had at capture and every replay uses that one")))

    def _on_factory(self, op: str, value: Any) -> None:
        def handle() -> None:
            location = user_issuer(2)
            if location is None:
                return
            module = self._module(2)
            site = self._factories.get(location)
            if site is None:
                site = self._factories[location] = _Factory(op=op, location=location, module=module)
            if len(site.values) < MAX_VALUES and value not in site.values:
                site.values.append(value)
            if self.depth and site.captured_step is None:
                site.captured_step = self.step
        self._guarded(handle)

    def _on_capture_query(self) -> None:
        def handle() -> None:
            location = user_issuer(2)
            if location is None:
                return
            module = self._module(2)
            self._add(Hazard(rule="GD519", module=module or "", location=location, step=self.step, phase="capture",
                             subject="torch.cuda.is_current_stream_capturing", message=(
                                 f"{module or 'the code'} asks torch.cuda.is_current_stream_capturing() at "
                                 f"{location}: True while the graph is captured (step {self.step}), False in eager "
                                 "runs, so the graph holds the other branch and every replay runs it")))
        self._guarded(handle)

    def _on_replay_without_grad(self, graph: Any) -> None:
        def handle() -> None:
            if id(graph) in self._replayed_off:
                return
            self._replayed_off.add(id(graph))
            module = self._module(2)
            location = _innermost_outside_torch(2)
            library = user_issuer(2) is None
            rule = "GD402" if library else "GD514"
            who = "Megatron's graph runner" if library else "the user's code"
            self._add(Hazard(rule=rule, module=module or "", location=location, step=self.step, subject="replay",
                             phase="eval",
                             message=(f"a graph captured with grad on (training) was replayed with grad off "
                                      f"(evaluation) by {who} at {location}: evaluation runs what the training "
                                      "capture recorded, training-mode branches included")))
        self._guarded(handle)

    def _observed_hook(self, kind: str, owner: Any, hook: Any, location: str) -> Any:
        site = self._hooks.get(location)
        if site is None:
            module, subject = self._subject(kind, owner)
            site = self._hooks[location] = _HookSite(location=location, function=_function_location(hook),
                                                     kind=kind, module=module, subject=subject)
        witness = self

        @functools.wraps(hook)
        def observed(*args: Any) -> Any:
            if witness._inside:
                return hook(*args)
            received = [t for t in _tensors(args[-1] if kind == "tensor" else args[1:])
                        if t.device.type == witness.device_type]
            before = [sys.getrefcount(t) for t in received]
            result = hook(*args)
            witness._guarded(lambda: witness._after_hook(site, received, before, result))
            return result

        return observed

    def _subject(self, kind: str, owner: Any) -> tuple[str, str]:
        """(module name, what the hook is on in words)."""
        if kind != "tensor":
            name = self.names.get(id(owner), type(owner).__name__)
            return name, f"module {name}"
        if id(owner) in self.param_names:
            name = self.param_names[id(owner)]
            return name.rsplit(".", 1)[0] if "." in name else name, f"parameter {name}"
        module = self._module(2)
        return module or "", f"an output of {module}" if module else "a tensor"

    def _after_hook(self, site: _HookSite, received: list[torch.Tensor], before: list[int], result: Any) -> None:
        after = [sys.getrefcount(t) for t in received]  # the same expression as `before`: the same baseline
        site.calls += 1
        returned = {id(t) for t in _tensors(result)}
        for tensor, count, now in zip(received, before, after, strict=True):
            storage = _storage(tensor)
            for ref, kept_storage, kept_step, kept_call in site.kept:
                kept = ref()
                if kept is None or kept_storage != storage or not storage or site.reported:
                    continue
                site.reported = True
                self._add(Hazard(rule="GD520", module=site.module, subject=site.function, location=site.location,
                                 step=self.step, phase=self.phase, also_at=(site.function,), message=(
                                     f"the hook registered at {site.location} ({site.function}) keeps a reference to "
                                     f"the tensor it receives ({site.subject}); call {site.calls} (step {self.step}) "
                                     f"received a tensor in the same storage as the one kept at call {kept_call} "
                                     f"(step {kept_step}), which is still alive: a graph's static buffer, rewritten "
                                     "by every replay, so the kept reference no longer holds its own values")))
            grew = now - count - (1 if id(tensor) in returned else 0)
            if grew > 0:
                site.kept.append((weakref.ref(tensor), storage, self.step, site.calls))
        site.kept = [k for k in site.kept if k[0]() is not None][-64:]


def _te_state_classes() -> tuple[type, ...]:
    """Transformer Engine's quantizer and recipe-state base classes, where TE is already loaded (never imported
    here: a run without FP8 does not load it)."""
    if "transformer_engine.pytorch" not in sys.modules:
        return ()
    found: list[type] = []
    for module_name, attr in (("transformer_engine.pytorch.quantized_tensor", "Quantizer"),
                              ("transformer_engine.pytorch.quantization", "RecipeState")):
        module = sys.modules.get(module_name)
        cls = getattr(module, attr, None) if module is not None else None
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def issuing_frames(frame: Any) -> Iterator[Any]:
    """The frames from `frame` outwards that are outside torch, graphdoctor and generated code (`<...>`),
    innermost first: the first is the code that issued the current call."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not _real(filename).startswith(_SKIPPED_ROOTS):
            yield frame
        frame = frame.f_back


def _issuing_frame(skip: int) -> Any:
    """The innermost frame outside torch, graphdoctor and generated code (`<...>`), above the caller's
    `skip` frames: the code that issued the current call; None when the stack holds none."""
    return next(issuing_frames(sys._getframe(skip + 2)), None)


def user_issuer(skip: int = 1) -> str | None:
    """`file:line` of the code that issued the current call when that code is the user's: the issuing frame
    is a user file. None when it is library code (Megatron, Transformer Engine, the standard library) or when
    the stack holds no issuing frame (a callback from autograd's device thread)."""
    from graphdoctor.child.probe.recorder import is_user_file

    frame = _issuing_frame(skip)
    if frame is None or not is_user_file(frame.f_code.co_filename):
        return None
    return format_location(frame.f_code.co_filename, frame.f_lineno)


def _qualified(op: str) -> str:
    """`torch.full`, `Tensor.fill_`: how the user's code spells the factory."""
    return f"Tensor.{op}" if op.endswith("_") else f"torch.{op}"


def _host_numbers(value: Any) -> bool:
    if _number(value):
        return True
    return isinstance(value, (list, tuple)) and 0 < len(value) <= 64 and all(_number(v) for v in value)


def _innermost_outside_torch(skip: int) -> str:
    """`file:line` of the issuing frame, library code included."""
    frame = _issuing_frame(skip)
    return "<unknown>" if frame is None else format_location(frame.f_code.co_filename, frame.f_lineno)


def _named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    from graphdoctor.child.names import strip_wrappers

    return [(strip_wrappers(n), p) for n, p in model.named_parameters()]


__all__ = ["MAX_HAZARDS", "CaptureWitness", "forward_read_line", "mode_query_lines"]
