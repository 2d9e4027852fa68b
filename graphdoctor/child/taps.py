"""Capture-time taps: fingerprints of dropout masks, random draws, module outputs and output gradients
written into a table graphdoctor owns, by kernels that become part of the captured graphs.

Python does not run when a graph replays, so hooks cannot observe replays; but the kernels a hook
launches while a graph is being captured are captured with it. Every tap launches a few fixed-shape
reductions that write its fingerprint [s0, s1, s2] straight into its own table row; replaying the graph
rewrites the row. Which step wrote a row is known without a kernel per tap: the host records the rows
it wrote eagerly, and each captured graph begins with one node that copies the current step number
into that graph's stamp. After each step two device-to-device copies keep the table and the stamps in
a per-step history; the host reads the history once, at the end. No host synchronisation per step or
per tap.

Operators are intercepted (for random draws) only inside the model's forward and during graph
captures: that is where draws happen, and it keeps Python off the eager backward and optimizer.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from graphdoctor.child.watching_mode import WatchingMode
from graphdoctor.compare.fingerprint import NUM_STATS, fingerprint
from graphdoctor.compare.forensics import Site
from graphdoctor.locations import format_location
from graphdoctor.strict_json import json_safe

DEFAULT_CAPACITY = 2048
"""Rows (tap sites) in the table; sites beyond it are not tapped and the report says so."""

MAX_GRAPHS = 1024
"""Graph captures that get a step stamp; taps in later captures are not reported (the report says so)."""

_RANDOM_OPS = frozenset({
    "native_dropout", "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like",
    "randint", "randint_like", "randperm", "normal", "normal_", "uniform_", "exponential_",
    "geometric_", "log_normal_", "cauchy_", "random_", "multinomial",
})
_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TapBuffer:
    """The owned device table, the graph stamps, their per-step history and the site list."""

    def __init__(self, device: torch.device, num_steps: int, capacity: int = DEFAULT_CAPACITY,
                 max_graphs: int = MAX_GRAPHS) -> None:
        self.capacity = capacity
        self.max_graphs = max_graphs
        f32 = torch.float32
        self.table = torch.zeros((capacity, NUM_STATS), dtype=f32, device=device)
        self.history = torch.zeros((num_steps, capacity, NUM_STATS), dtype=f32, device=device)
        self.stamps = torch.full((max_graphs,), -1.0, dtype=f32, device=device)
        self.stamp_history = torch.full((num_steps, max_graphs), -1.0, dtype=f32, device=device)
        self.step_value = torch.full((), -1.0, dtype=f32, device=device)
        self.sites: list[Site] = []
        self.phases: dict[int, str] = {}
        self.truncated = False
        self.notes: list[str] = []
        self._step = -1
        self._slots: dict[tuple[Any, ...], int] = {}
        self._occurrences: dict[tuple[Any, ...], int] = {}
        self._capture_serial = 0
        self._site_graph: dict[int, int] = {}
        self._eager_written: dict[int, set[int]] = {}
        self.graph_nodes: int | None = 0
        """Nodes the taps added to captured graphs (their kernels and the stamp copies); None where the capture's
        node count could not be read (no cuda-bindings)."""

    @property
    def num_bytes(self) -> int:
        """Device memory the taps own (table, stamps, their histories, step value)."""
        return (self.table.numel() + self.history.numel() + self.stamps.numel()
                + self.stamp_history.numel() + 1) * 4

    def begin_step(self, step: int, phase: str) -> None:
        """Stamp the following writes with `step` (one fill kernel, no sync)."""
        self.step_value.fill_(float(step))
        self._step = step
        self.phases[step] = phase
        self._occurrences.clear()

    def end_step(self, step: int) -> None:
        """Keep this step's table and stamps in the history (two device copies, no sync)."""
        if 0 <= step < self.history.shape[0]:
            self.history[step].copy_(self.table)
            self.stamp_history[step].copy_(self.stamps)

    def new_capture(self) -> None:
        """A graph capture began (call it once the capture is under way): its taps get fresh rows,
        and the graph's first node copies the step number into the graph's stamp at every replay."""
        self._capture_serial += 1
        index = self._capture_serial - 1
        if index < self.max_graphs:
            with self._counting_nodes(capturing=True):
                self.stamps[index].copy_(self.step_value)
        elif not any(n.startswith("more than") for n in self.notes):
            self.notes.append(f"more than {self.max_graphs} graph captures: taps inside later "
                              "captures are not reported")

    def _slot(self, kind: str, module: str | None, op: str, tensor: torch.Tensor,
              p: float | None, location: str | None, capturing: bool) -> int | None:
        scope = ("capture", self._capture_serial) if capturing else ("eager",)
        base = (*scope, kind, module, op)
        occurrence = self._occurrences.get(base, 0)
        self._occurrences[base] = occurrence + 1
        key = (*base, occurrence)
        slot = self._slots.get(key)
        if slot is None:
            if len(self.sites) >= self.capacity:
                self.truncated = True
                return None
            slot = len(self.sites)
            self.sites.append(Site(slot=slot, kind=kind, module=module or "", op=op, location=location,
                                   numel=tensor.numel(), p=p, captured=capturing))
            self._slots[key] = slot
            if capturing:
                self._site_graph[slot] = self._capture_serial - 1
        if not capturing:
            self._eager_written.setdefault(self._step, set()).add(slot)
        return slot

    def write(self, kind: str, module: str | None, op: str, tensor: torch.Tensor, *,
              p: float | None = None, location: str | None = None) -> None:
        """Fingerprint `tensor` into its site's row (captured when a capture is under way)."""
        if tensor.device != self.table.device or tensor.numel() == 0:
            return
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        slot = self._slot(kind, module, op, tensor, p, location, capturing)
        if slot is None:
            return
        try:
            with self._counting_nodes(capturing):
                fingerprint(tensor, kind, out=self.table[slot])
        except (RuntimeError, TypeError, ValueError) as exc:
            # A tap must never end the training run it watches; the report says which one failed.
            if len(self.notes) < 10:
                self.notes.append(f"tap {kind} {module or '?'} {op} failed: {exc}"[:300])

    @contextlib.contextmanager
    def _counting_nodes(self, capturing: bool) -> Iterator[None]:
        """Add the nodes the body puts into the graph being captured, when `capturing`, to graph_nodes (None once
        a capture's count could not be read)."""
        nodes = self.graph_nodes if capturing else None
        before = capture_node_count() if nodes is not None else None
        try:
            yield
        finally:
            if nodes is not None:
                after = capture_node_count() if before is not None else None
                self.graph_nodes = None if before is None or after is None else nodes + after - before

    def _written(self, slot: int, step: int, stamps: list[float]) -> bool:
        graph = self._site_graph.get(slot)
        if graph is None:
            return slot in self._eager_written.get(step, ())
        return graph < len(stamps) and stamps[graph] == float(step)

    def to_dict(self) -> dict[str, Any]:
        """The forensics section (format version 1, see docs/forensics.md). Synchronises once."""
        history = self.history[:, : len(self.sites)].cpu().tolist()
        stamp_history = self.stamp_history[:, : min(self._capture_serial, self.max_graphs)].cpu().tolist()
        steps = []
        for step, phase in sorted(self.phases.items()):
            if step >= len(history):
                continue
            rows = [[slot, slot, *json_safe(row)] for slot, row in enumerate(history[step])
                    if self._written(slot, step, stamp_history[step])]
            steps.append({"step": step, "phase": phase, "rows": rows})
        return {"version": 1, "capacity": self.capacity, "num_slots": len(self.sites),
                "truncated": self.truncated, "num_bytes": self.num_bytes, "num_graph_nodes": self.graph_nodes,
                "notes": list(self.notes),
                "sites": [s.to_dict() for s in self.sites], "steps": steps}


def capture_node_count() -> int | None:
    """Nodes of the graph the current stream is capturing into; None when it captures nothing or cuda-bindings
    cannot say (a query: CUDA permits it on a graph under capture)."""
    if not torch.cuda.is_available() or not torch.cuda.is_current_stream_capturing():
        return None
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    try:
        info = runtime.cudaStreamGetCaptureInfo(torch.cuda.current_stream().cuda_stream)
        if int(info[0]) != 0 or len(info) < 4:
            return None
        result = runtime.cudaGraphGetNodes(info[3], numNodes=0)
        return int(result[-1]) if int(result[0]) == 0 else None
    except Exception:  # noqa: BLE001 - a count the taps cannot read must never end the run they watch
        return None


def call_site(names: dict[int, str], skip: int = 2) -> tuple[str | None, str | None]:
    """(innermost named module on the Python stack, first source line outside torch/graphdoctor)."""
    frame: Any = sys._getframe(skip)
    module = location = None
    depth = 0
    while frame is not None and depth < 40 and (module is None or location is None):
        filename = frame.f_code.co_filename
        if location is None and not filename.startswith((_TORCH_DIR, _HERE_DIR)) \
                and not filename.startswith("<"):
            location = format_location(filename, frame.f_lineno)
        if module is None:
            owner = frame.f_locals.get("self")
            if owner is not None and id(owner) in names:
                module = names[id(owner)]
        frame = frame.f_back
        depth += 1
    return module, location


class DrawMode(WatchingMode):
    """Sees every operator: taps random draws on the device, and device copies of host random draws."""

    def __init__(self, table: TapBuffer, names: dict[int, str]) -> None:
        super().__init__()
        self.table = table
        self.names = names
        self.host_random: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if name in _RANDOM_OPS:
            self._draw(name, args, out)
        elif len(self.host_random) and self._tainted(args):
            self._propagate(func, out)
        return out

    def _draw(self, name: str, args: Any, out: Any) -> None:
        if name == "native_dropout":
            result = out[1]
            kind, p = "dropout", float(args[1]) if len(args) > 1 else None
        else:
            result = args[0] if name.endswith("_") else out
            kind, p = "random", None
        if not isinstance(result, torch.Tensor):
            return
        if result.device.type == "cpu":
            self.host_random[result] = True
            return
        module, location = call_site(self.names, skip=1)
        self.table.write(kind, module, f"aten.{name}", result, p=p, location=location)

    def _tainted(self, args: Any) -> bool:
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.device.type == "cpu" and arg in self.host_random:
                return True
        return False

    def _propagate(self, func: Any, out: Any) -> None:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for tensor in outs:
            if not isinstance(tensor, torch.Tensor):
                continue
            if tensor.device.type == "cpu":
                self.host_random[tensor] = True
            else:
                module, location = call_site(self.names, skip=1)
                op = f"aten.{func._overloadpacket.__name__}"
                self.table.write("host-random", module, op, tensor, location=location)


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    return None


def tapped_modules(model: torch.nn.Module, names: dict[int, str]) -> list[tuple[str, torch.nn.Module]]:
    """Modules whose outputs and output gradients are tapped: Megatron layers, their direct
    children except norms (self_attention, mlp), and the model's top-level blocks (embedding,
    decoder, output layer). A layer is the outermost module with a `layer_number` (Megatron also
    numbers the attention modules inside a layer; those are not descended into). Each tap is two
    graph nodes per replay, so the set stays small."""
    skip_types = ("Dropout", "IdentityOp", "IdentityFuncOp", "ModuleList")
    numbered = {id(m) for m in model.modules() if hasattr(m, "layer_number")}
    inner = {id(c) for m in model.modules() if id(m) in numbered for c in m.modules() if c is not m}
    layer_ids = numbered - inner
    chosen = []
    for parent in model.modules():
        for child in parent.children():
            name = names.get(id(child))
            if not name or type(child).__name__ in skip_types or "norm" in name.rsplit(".", 1)[-1]:
                continue
            if id(child) in layer_ids or id(parent) in layer_ids or "." not in name:
                chosen.append((name, child))
    seen: set[int] = set()
    return [(n, m) for n, m in chosen if not (id(m) in seen or seen.add(id(m)))]  # type: ignore[func-returns-value]


def _forward_location(module: torch.nn.Module) -> str | None:
    """`file:line` of the module class's forward definition (where its output is computed)."""
    code = getattr(type(module).forward, "__code__", None)
    if code is None:
        return None
    return format_location(code.co_filename, code.co_firstlineno)


def graph_method_owner(*methods: str) -> type:
    """The Python class that defines CUDAGraph's `methods` (capture_begin, capture_end, replay): where a
    patch must go to be seen by every graph (keep_graphs may have subclassed it)."""
    import torch.cuda.graphs

    for klass in type.mro(torch.cuda.graphs.CUDAGraph):
        if all(name in klass.__dict__ for name in methods) and not klass.__module__.startswith("torch._C"):
            return klass
    raise RuntimeError(f"torch.cuda.CUDAGraph has no Python-level {'/'.join(methods)} to observe")


class Taps:
    """Installs the taps on a model for one child run; begin_step/end_step wrap a training step."""

    def __init__(self, model: torch.nn.Module, names: dict[int, str], num_steps: int,
                 capacity: int = DEFAULT_CAPACITY) -> None:
        device = next(model.parameters()).device
        self.table = TapBuffer(device, num_steps, capacity)
        self.mode = DrawMode(self.table, names)
        self._mode_depth = 0
        self._in_step = False
        self._handles: list[Any] = []
        self._modules = tapped_modules(model, names)
        self.attach_module_hooks()
        # The dispatch mode runs only inside the model's forward (and captures, below).
        self._root_handles = [
            model.register_forward_pre_hook(lambda *_: self._activate()),
            model.register_forward_hook(lambda *_: self._deactivate(), always_call=True),
        ]
        self._owner = graph_method_owner("capture_begin", "capture_end")
        self._originals = {name: self._owner.__dict__[name] for name in ("capture_begin", "capture_end")}
        begin, end = self._originals["capture_begin"], self._originals["capture_end"]
        taps = self

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            result = begin(graph, *args, **kwargs)
            taps.table.new_capture()
            taps._activate()
            return result

        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            taps._deactivate()
            return end(graph, *args, **kwargs)

        self._owner.capture_begin = capture_begin  # type: ignore[attr-defined]
        self._owner.capture_end = capture_end  # type: ignore[attr-defined]

    def _activate(self) -> None:
        if not self._in_step:
            return
        if self._mode_depth == 0:
            self.mode.__enter__()
        self._mode_depth += 1

    def _deactivate(self) -> None:
        if self._mode_depth == 0:
            return
        self._mode_depth -= 1
        if self._mode_depth == 0:
            self.mode.__exit__(None, None, None)

    def detach_module_hooks(self, *, for_te_capture: bool = False) -> None:
        """Remove the module hooks: while Transformer Engine's make_graphed_callables captures (it refuses
        modules with hooks; draws are still tapped through the dispatch mode, and the report says so), and
        during an evaluation (not compared tap by tap; no note)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        te_note = ("transformer_engine refuses module hooks at capture: outputs and gradients of modules "
                   "inside its graphs are not tapped (draws and modules outside the graphs are)")
        if for_te_capture and te_note not in self.table.notes:
            self.table.notes.append(te_note)

    def attach_module_hooks(self) -> None:
        """Register the module hooks again (after graph creation)."""
        for name, module in self._modules:
            self._handles.append(module.register_forward_hook(
                self._output_hook(name, _forward_location(module)), with_kwargs=True))

    def _output_hook(self, name: str, location: str | None) -> Any:
        """After the module's forward (a forward hook: Megatron's local graphs refuse pre-forward hooks on the
        modules they capture): taps its output, and registers taps of the gradients w.r.t. its output and
        w.r.t. its first floating input (`hidden_states`), which together tell whose backward first changes a
        gradient."""
        table = self.table

        def tap_grad(tensor: torch.Tensor, kind: str) -> None:
            def grad_hook(grad: torch.Tensor) -> None:
                table.write(kind, name, "backward", grad, location=location)
            tensor.register_hook(grad_hook)

        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            if tensor is None or not tensor.is_floating_point():
                return
            table.write("output", name, "forward", tensor, location=location)
            if tensor.requires_grad:
                tap_grad(tensor, "grad")
            given = _first_tensor(args)
            given = given if given is not None else kwargs.get("hidden_states")
            if isinstance(given, torch.Tensor) and given.is_floating_point() and given.requires_grad \
                    and given is not tensor:
                tap_grad(given, "input-grad")

        return hook

    def begin_step(self, step: int, phase: str) -> None:
        """Before a step: stamp; operators are intercepted in the model's forwards and in captures
        until end_step."""
        self.table.begin_step(step, phase)
        self._in_step = True

    def end_step(self, step: int) -> None:
        """After a step's forward_backward: stop intercepting, keep the step's table."""
        self._in_step = False
        while self._mode_depth:
            self._deactivate()
        self.table.end_step(step)

    def close(self) -> dict[str, Any]:
        """Remove hooks and the capture patches; return the forensics section."""
        for handle in self._handles + self._root_handles:
            handle.remove()
        for name, original in self._originals.items():
            setattr(self._owner, name, original)
        return self.table.to_dict()


__all__ = ["DEFAULT_CAPACITY", "MAX_GRAPHS", "DrawMode", "Site", "TapBuffer", "Taps", "call_site", "capture_node_count",
           "graph_method_owner", "tapped_modules"]
