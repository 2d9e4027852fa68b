"""Operator-level recorder: runs a unit eagerly and notes every operation that is unsafe to capture.

Three layers see different things: a TorchDispatchMode (aten ops, devices, streams, copies), a
TorchFunctionMode (Tensor.item/.cpu/.tolist/bool, explicit generators, boolean indexing) and short-lived
monkeypatches (torch.cuda.synchronize, Module.__setattr__, hook registration). Nothing here captures.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from graphdoctor.locations import format_location
from graphdoctor.probes.types import Observation

# Library roots whose frames are never "user code": the innermost frame outside them is reported.
_SITE_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(next(iter(spec.submodule_search_locations)))


def _library_roots() -> tuple[str, ...]:
    roots = {os.path.realpath(os.path.dirname(torch.__file__))}
    for name in ("megatron", "transformer_engine", "graphdoctor", "pytest", "_pytest", "pluggy"):
        path = _package_dir(name)
        if path is not None:
            roots.add(path)
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots))


_LIBRARY_ROOTS: tuple[str, ...] | None = None
_PROBE_ROOT = os.path.realpath(os.path.dirname(__file__)) + os.sep


def is_user_file(filename: str) -> bool:
    """True when `filename` is user code: not torch, megatron, graphdoctor, stdlib or site-packages."""
    global _LIBRARY_ROOTS
    if _LIBRARY_ROOTS is None:
        _LIBRARY_ROOTS = _library_roots()
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    if any(marker in path for marker in _SITE_MARKERS):
        return False
    return not path.startswith(_LIBRARY_ROOTS)


def pick_location(frames: Iterable[tuple[str, int]]) -> tuple[str, bool]:
    """Choose the frame to report from (filename, lineno) pairs ordered innermost first.

    Returns:
        (`path:line`, True) for the innermost user frame; otherwise the innermost frame outside
        graphdoctor's probes and torch, with False; ("<unknown>", False) when there is none.
    """
    fallback: tuple[str, int] | None = None
    torch_root = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
    for filename, lineno in frames:
        if is_user_file(filename):
            return format_location(filename, lineno), True
        real = os.path.realpath(filename) if not filename.startswith("<") else filename
        if fallback is None and not real.startswith((_PROBE_ROOT, torch_root)) \
                and not filename.startswith("<"):
            fallback = (filename, lineno)
    if fallback is None:
        return "<unknown>", False
    return format_location(*fallback), False


def current_location(skip: int = 2) -> tuple[str, bool]:
    """pick_location over the live Python stack, skipping the recorder's own frames."""
    frame: types.FrameType | None = sys._getframe(skip)
    pairs = []
    while frame is not None:
        pairs.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return pick_location(pairs)


def issued_by_library(skip: int = 2) -> bool:
    """True when the innermost frame outside torch and the recorder (the code that issued the
    operation) is library code, e.g. Megatron, even when a user frame further out calls it."""
    torch_root = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
    frame: types.FrameType | None = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        real = filename if filename.startswith("<") else os.path.realpath(filename)
        if not filename.startswith("<") and not real.startswith((_PROBE_ROOT, torch_root)):
            return not is_user_file(filename)
        frame = frame.f_back
    return False


def traceback_location(exc: BaseException) -> str | None:
    """Innermost user frame of an exception's traceback, or None."""
    pairs = []
    tb = exc.__traceback__
    while tb is not None:
        pairs.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    location, user = pick_location(reversed(pairs))
    return location if user else None


# aten overload packets, by rule. Composite ops (argwhere, unique, ...) arrive decomposed.
_SYNC_OPS = frozenset({"_local_scalar_dense", "item", "equal", "is_nonzero"})
_DYNAMIC_SHAPE_OPS = frozenset({
    "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "unique_dim_consecutive", "argwhere", "nonzero_numpy",
})
_INDEX_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl", "_index_put_impl_"})
_RANDOM_OPS = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
    "bernoulli_", "uniform_", "normal", "normal_", "random_", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "multinomial", "native_dropout", "poisson",
})
_COPY_OPS = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})
_VIEW_ONLY_OPS = frozenset({"detach", "alias", "view", "_unsafe_view", "lift_fresh", "lift_fresh_copy"})
# Tensor methods seen by the function mode, by __qualname__.
_SYNC_METHODS = {
    "TensorBase.item": "Tensor.item()", "TensorBase.tolist": "Tensor.tolist()",
    "TensorBase.__bool__": "bool(Tensor)", "TensorBase.__int__": "int(Tensor)",
    "TensorBase.__float__": "float(Tensor)", "TensorBase.__index__": "Tensor.__index__()",
    "TensorBase.cpu": "Tensor.cpu()", "TensorBase.numpy": "Tensor.numpy()",
}


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten((args, kwargs))
    return [a for a in flat if isinstance(a, torch.Tensor)]


def _generators(args: Any, kwargs: Any) -> list[torch.Generator]:
    flat, _ = tree_flatten((args, kwargs))
    return [a for a in flat if isinstance(a, torch.Generator)]


def _op_name(func: Any) -> str:
    schema = getattr(func, "_schema", None)
    return schema.name if schema is not None else str(func)


def _storage_key(t: torch.Tensor) -> int | None:
    if t.device.type != "cpu" or t.numel() == 0:
        return None
    return t.untyped_storage().data_ptr()


class Recorder:
    """Context manager that records unsafe operations while a unit runs eagerly.

    Args:
        device_type: device the captured work runs on (`cuda`; tests use `cpu` or `meta`). Tensors
            on any other device count as host tensors.
        module_names: id(module) -> qualified name, for the module stack.
        registered_generators: generators the graph will register besides the default one.
        check_streams: flag device work on the legacy default stream (the recording pass must then
            run on a side stream).
    """

    def __init__(
        self,
        *,
        device_type: str = "cuda",
        module_names: dict[int, str] | None = None,
        registered_generators: Iterable[torch.Generator] = (),
        check_streams: bool = False,
    ) -> None:
        self.device_type = device_type
        self.module_names = dict(module_names or {})
        self.registered_ids = {id(g) for g in registered_generators}
        self.check_streams = check_streams and device_type == "cuda"
        self.observations: list[Observation] = []
        self.failed: tuple[Observation, ...] = ()
        """What the recorder classified for the first operation that raised (the culprit of a failed
        capture): empty until an operation it classified raises."""
        self.module_inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._stack: list[str | None] = []
        self._taint: dict[int, tuple[str, str, bool, str]] = {}
        self._undo: list[Callable[[], None]] = []
        self._modes: list[Any] = []

    # -- module stack ------------------------------------------------------------------------
    @property
    def current_module(self) -> str:
        """Innermost named module on the stack ('' outside any)."""
        for name in reversed(self._stack):
            if name is not None:
                return name
        return ""

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        self._stack.append(self.module_names.get(id(module)))

    def _post_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    # -- recording ---------------------------------------------------------------------------
    def add(self, code: str, operator: str, detail: str = "", *, skip: int = 3,
            location: tuple[str, bool] | None = None, host_only: bool = False) -> None:
        """Append one observation at the current stack position; `host_only` when the operation
        touched only host tensors (then who issued it is recorded too)."""
        where, user = location if location is not None else current_location(skip)
        self.observations.append(Observation(
            code=code, operator=operator, module=self.current_module, location=where,
            user_code=user, seq=len(self.observations), detail=detail, host_only=host_only,
            library_issuer=host_only and issued_by_library(skip),
        ))

    def note_failure(self, first: int) -> None:
        """The operation whose classification began at observation `first` raised: keep what was
        recorded for it as the culprit (the first raising operation that was classified wins)."""
        if not self.failed and len(self.observations) > first:
            self.failed = tuple(self.observations[first:])

    def _is_device(self, t: torch.Tensor) -> bool:
        return t.device.type == self.device_type

    def _is_registered(self, gen: torch.Generator) -> bool:
        if id(gen) in self.registered_ids:
            return True
        if gen.device.type == "cpu":
            return gen is torch.default_generator
        if gen.device.type == "cuda" and torch.cuda.is_available():
            return any(gen is g for g in torch.cuda.default_generators)
        return False

    def on_function(self, func: Any, args: Any, kwargs: Any) -> None:
        """Classify one torch-function call (outer layer: Python-visible Tensor methods)."""
        qualname = getattr(func, "__qualname__", "")
        label = _SYNC_METHODS.get(qualname)
        if label is not None and args and isinstance(args[0], torch.Tensor) and self._is_device(args[0]):
            self.add("GD501", label, f"on a {args[0].device.type} tensor")
        for gen in _generators(args, kwargs):
            if gen.device.type == self.device_type and not self._is_registered(gen):
                name = getattr(func, "__name__", str(func))
                self.add("GD505", f"{name}(generator=...)",
                         f"torch.Generator(device='{gen.device}') not registered with the graph")

    def on_dispatch(self, func: Any, args: Any, kwargs: Any) -> None:
        """Classify one aten op before it runs."""
        packet = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
        name = _op_name(func)
        tensors = _tensors(args, kwargs)
        on_device = [t for t in tensors if self._is_device(t)]
        if packet in _SYNC_OPS and on_device:
            self.add("GD501", name)
        elif packet in _DYNAMIC_SHAPE_OPS and on_device:
            self.add("GD502", name)
        elif packet in _INDEX_OPS and on_device and any(
                t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1:], {})):
            self.add("GD502", f"{name} (boolean mask)")
        if self.check_streams and on_device and torch.cuda.current_stream().cuda_stream == 0:
            self.add("GD503", name, "launched on the legacy default stream")
        if packet in _COPY_OPS:
            self._on_copy(name, packet, args, kwargs)
            return
        if self.device_type != "cpu" and tensors and not on_device and packet not in _VIEW_ONLY_OPS:
            host = [t for t in tensors if t.device.type == "cpu"]
            if host and not any(self._tainted(t) for t in host) and packet not in _RANDOM_OPS:
                self.add("GD507", name, "computed on the host inside the captured region",
                         host_only=True)

    def _on_copy(self, name: str, packet: str, args: Any, kwargs: Any) -> None:
        if packet == "_to_copy":
            src = args[0]
            dst_device = kwargs.get("device")
            dst_type = torch.device(dst_device).type if dst_device is not None else src.device.type
        else:
            dst, src = args[0], args[1]
            dst_type = dst.device.type
        if not isinstance(src, torch.Tensor):
            return
        if src.device.type == self.device_type and dst_type == "cpu" and self.device_type != "cpu":
            self.add("GD501", f"{name} (device to host)", "copy back to the host waits for the device")
        if src.device.type == "cpu" and dst_type == self.device_type and self.device_type != "cpu":
            tainted = self._tainted(src)
            if tainted is not None:
                draw_op, where, user, _ = tainted
                copy_where, _ = current_location(4)
                self.add("GD506", draw_op, f"host-drawn random values copied in at {copy_where}",
                         location=(where, user))
            if not _is_pinned(src):
                self.add("GD504", f"{name} (pageable host to device)", f"{tuple(src.shape)} {src.dtype}")

    def after_dispatch(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """Propagate host-random taint from inputs to host outputs."""
        packet = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
        outputs = [t for t in _tensors(out, {}) if t.device.type == "cpu"]
        if not outputs:
            return
        source = None
        if packet in _RANDOM_OPS:
            gens = _generators(args, kwargs)
            if not gens or all(g.device.type == "cpu" for g in gens):
                where, user = current_location(4)
                source = (_op_name(func), where, user, "")
        else:
            for t in _tensors(args, kwargs):
                source = self._tainted(t)
                if source is not None:
                    break
        if source is not None:
            for t in outputs:
                key = _storage_key(t)
                if key is not None:
                    self._taint[key] = source

    def _tainted(self, t: torch.Tensor) -> tuple[str, str, bool, str] | None:
        key = _storage_key(t)
        return None if key is None else self._taint.get(key)

    # -- patches -----------------------------------------------------------------------------
    def _patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, attr)
        setattr(owner, attr, make(original))
        self._undo.append(lambda: setattr(owner, attr, original))

    def _install_patches(self) -> None:
        recorder = self

        def sync_wrapper(label: str) -> Callable[[Any], Any]:
            def make(original: Any) -> Any:
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    first = len(recorder.observations)
                    recorder.add("GD501", label)
                    try:
                        return original(*args, **kwargs)
                    except BaseException:
                        recorder.note_failure(first)
                        raise
                return wrapper
            return make

        self._patch(torch.cuda, "synchronize", sync_wrapper("torch.cuda.synchronize()"))
        self._patch(torch.cuda.Stream, "synchronize", sync_wrapper("torch.cuda.Stream.synchronize()"))
        self._patch(torch.cuda.Event, "synchronize", sync_wrapper("torch.cuda.Event.synchronize()"))

        def make_setattr(original: Any) -> Any:
            def setattr_wrapper(module: torch.nn.Module, name: str, value: Any) -> None:
                if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                    recorder._on_tensor_setattr(module, name, value)
                original(module, name, value)
            return setattr_wrapper

        self._patch(torch.nn.Module, "__setattr__", make_setattr)
        pre = torch.nn.modules.module.register_module_forward_pre_hook(self._pre_hook)
        post = torch.nn.modules.module.register_module_forward_hook(self._post_hook, always_call=True)
        self._undo.append(pre.remove)
        self._undo.append(post.remove)

    def _on_tensor_setattr(self, module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
        old = module.__dict__.get(name)
        buffers = module.__dict__.get("_buffers")
        if old is None and buffers is not None:
            old = buffers.get(name)
        if isinstance(old, torch.Tensor) and old is not value and not _same_storage(old, value):
            qualname = self.module_names.get(id(module), type(module).__name__)
            self.add("GD509", f"{type(module).__name__}.{name} = <new tensor>",
                     f"attribute {qualname}.{name} rebound during forward", skip=4)

    def __enter__(self) -> Recorder:
        self._stack.clear()
        self._install_patches()
        function_mode = _FunctionMode(self)
        dispatch_mode = _DispatchMode(self)
        function_mode.__enter__()
        self._modes.append(function_mode)
        dispatch_mode.__enter__()
        self._modes.append(dispatch_mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._modes:
            self._modes.pop().__exit__(None, None, None)
        while self._undo:
            self._undo.pop()()
        self._stack.clear()


def _is_pinned(t: torch.Tensor) -> bool:
    try:
        return bool(t.is_pinned())
    except RuntimeError:
        # CPU-only builds without an accelerator cannot pin; nothing is pinned then.
        return False


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.is_meta or b.is_meta:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class _FunctionMode(TorchFunctionMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        first = len(self.recorder.observations)
        self.recorder.on_function(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except BaseException:
            self.recorder.note_failure(first)
            raise


class _DispatchMode(TorchDispatchMode):
    """Every aten operator. A plain dispatch mode on purpose: torch.compile'd code runs op by op under it, so a
    probe sees the operators a compiled function is made of (unlike graphdoctor.child.watching_mode's modes, which
    must leave a diff child's compiled kernels as the user's run has them)."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        first = len(self.recorder.observations)
        self.recorder.on_dispatch(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except BaseException:
            self.recorder.note_failure(first)
            raise
        self.recorder.after_dispatch(func, args, kwargs, out)
        return out


__all__ = [
    "Recorder",
    "current_location",
    "format_location",
    "is_user_file",
    "issued_by_library",
    "pick_location",
    "traceback_location",
]
