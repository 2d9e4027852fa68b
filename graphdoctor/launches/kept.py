"""Keep the cudaGraph_t of graphs that other code creates, and census the graphs Megatron holds.

`keep_graphs()` patches `torch.cuda.CUDAGraph` so new instances default to `keep_graph=True`
(older torch: `enable_debug_mode()`); `megatron_graphs()` finds full_iteration and local graphs.
"""

from __future__ import annotations

import gc
import inspect
import sys
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from graphdoctor.launches.census import GraphCensus, census_graph


class KeptGraphs:
    """Graphs created while keep_graphs() was active (weak references, creation order)."""

    def __init__(self) -> None:
        self._refs: list[weakref.ReferenceType[Any]] = []
        self.mode = "none"
        """"keep_graph" (constructor kwarg) or "debug_mode" (enable_debug_mode fallback)."""

    def add(self, graph: Any) -> None:
        self._refs.append(weakref.ref(graph))

    @property
    def graphs(self) -> list[Any]:
        """The graphs still alive."""
        return [g for g in (ref() for ref in self._refs) if g is not None]


def _supports_keep_graph(cls: type) -> bool:
    methods: tuple[Any, ...] = (cls.__new__, cls.__init__)  # type: ignore[misc]
    for method in methods:
        try:
            if "keep_graph" in inspect.signature(method).parameters:
                return True
        except (TypeError, ValueError):
            continue
    doc = getattr(methods[1], "__doc__", "") or ""
    return "keep_graph" in doc


def _kept_class(original: type, kept: KeptGraphs) -> type:
    """A CUDAGraph subclass whose instances keep their cudaGraph_t unless told otherwise."""
    if _supports_keep_graph(original):
        kept.mode = "keep_graph"

        class KeptCUDAGraph(original):  # type: ignore[valid-type, misc]
            # pybind constructs in __init__ and the Python wrapper forwards in __new__, so both
            # must default keep_graph=True, or __init__ re-runs with keep_graph=False.
            def __new__(cls, keep_graph: bool = True, *args: Any, **kwargs: Any) -> Any:
                return super().__new__(cls, keep_graph, *args, **kwargs)

            def __init__(self, keep_graph: bool = True, *args: Any, **kwargs: Any) -> None:
                super().__init__(keep_graph, *args, **kwargs)
                kept.add(self)

    else:
        kept.mode = "debug_mode"

        class KeptCUDAGraph(original):  # type: ignore[valid-type, misc, no-redef]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.enable_debug_mode()
                kept.add(self)

    KeptCUDAGraph.__name__ = KeptCUDAGraph.__qualname__ = original.__name__
    KeptCUDAGraph.__module__ = original.__module__
    return KeptCUDAGraph


@contextmanager
def keep_graphs() -> Iterator[KeptGraphs]:
    """Make every `torch.cuda.CUDAGraph()` created inside the block keep its cudaGraph_t.

    Patches `torch.cuda.CUDAGraph` and `torch.cuda.graphs.CUDAGraph` (what Megatron,
    `torch.cuda.graph` users and `make_graphed_callables` construct) for the duration of the
    block, so census_graph() works on graphs created by code you do not control. Cost: the
    cudaGraph_t (host memory, roughly proportional to the node count) lives as long as the
    CUDAGraph object, and instantiation moves from capture_end() to the first replay() (or an
    explicit instantiate()), so the first replay is slower. Replays after that are unchanged.

    Yields:
        KeptGraphs, whose `.graphs` lists the graphs created in the block that are still alive.
    """
    import torch.cuda
    import torch.cuda.graphs

    original = torch.cuda.graphs.CUDAGraph
    kept = KeptGraphs()
    patched = _kept_class(original, kept)
    torch.cuda.CUDAGraph = patched  # type: ignore[misc, assignment]
    torch.cuda.graphs.CUDAGraph = patched  # type: ignore[misc, assignment]
    try:
        yield kept
    finally:
        torch.cuda.CUDAGraph = original  # type: ignore[misc]
        torch.cuda.graphs.CUDAGraph = original  # type: ignore[misc]


def _graph_managers(model: Any | Iterable[Any] | None) -> list[tuple[str, Any]]:
    """(name, CudaGraphManager) pairs from the model chunks, or from the GC heap without a model."""
    module = sys.modules.get("megatron.core.transformer.cuda_graphs")
    manager_cls = getattr(module, "CudaGraphManager", None)
    if manager_cls is None:
        return []
    if model is None:
        # No model given: any live manager will do; gc only tracks containers, which modules are.
        found = [obj for obj in gc.get_objects() if isinstance(obj, manager_cls)]
        return [(f"manager{i}", obj) for i, obj in enumerate(found)]
    chunks: list[Any] = list(model) if isinstance(model, (list, tuple)) else [model]
    pairs = []
    for index, chunk in enumerate(chunks):
        prefix = f"chunk{index}." if len(chunks) > 1 else ""
        for module_name, sub in chunk.named_modules():
            if isinstance(sub, manager_cls):
                pairs.append((prefix + (module_name or "<root>"), sub))
    return pairs


def megatron_graphs(model: Any | Iterable[Any] | None = None) -> dict[str, Any]:
    """The torch.cuda.CUDAGraph objects Megatron-Core currently holds, by descriptive name.

    full_iteration: `FullCudaGraphWrapper.cuda_graph['training'|'validation']`. local: the
    `fwd_graph` / `bwd_graph` of every `_CudaGraphRunner` in each `CudaGraphManager.cudagraph_runners`.
    Only already-imported Megatron modules are looked at; nothing is imported here.

    Args:
        model: The model (or list of model chunks) whose CudaGraphManagers to search; None
            searches every live CudaGraphManager.

    Returns:
        {"full_iteration/training": g, "local/<module>/runner<i>/fwd": g, ...}; empty when
        Megatron is not loaded or holds no graphs.
    """
    found: dict[str, Any] = {}
    full = sys.modules.get("megatron.core.full_cuda_graph")
    wrapper = getattr(full, "FullCudaGraphWrapper", None)
    for key, graph in (getattr(wrapper, "cuda_graph", None) or {}).items():
        if graph is not None:
            found[f"full_iteration/{key}"] = graph
    for name, runner in local_runners(model):
        for attr in ("fwd_graph", "bwd_graph"):
            graph = getattr(runner, attr, None)
            if graph is not None:
                found[f"local/{name}/{attr[:3]}"] = graph
    return found


def local_runners(model: Any | Iterable[Any] | None = None) -> list[tuple[str, Any]]:
    """("<module>/runner<i>", _CudaGraphRunner) of every CudaGraphManager (as megatron_graphs() finds them):
    where local graphs live once captured. Megatron-Core 0.19.2's own delete_cuda_graphs() walks
    `_CudagraphGlobalRecord.cudagraph_record`, which create_cudagraphs() empties (cuda_graphs.py:655), so
    after a capture it reaches none of them."""
    return [(f"{manager_name}/runner{index}", runner)
            for manager_name, manager in _graph_managers(model)
            for index, runner in enumerate(getattr(manager, "cudagraph_runners", ()))]


def census_megatron(model: Any | Iterable[Any] | None = None, *, method: str = "auto") -> dict[str, GraphCensus]:
    """census_graph() of every graph megatron_graphs() finds.

    The graphs must have been captured inside keep_graphs() (Megatron constructs its
    CUDAGraph objects without keep_graph).

    Args:
        model: As for megatron_graphs().
        method: As for census_graph().

    Returns:
        {name: GraphCensus} in the order megatron_graphs() returns.

    Raises:
        CensusError: A graph did not keep its cudaGraph_t, or the census failed.
    """
    return {name: census_graph(g, name=name, method=method) for name, g in megatron_graphs(model).items()}


__all__ = ["KeptGraphs", "census_megatron", "keep_graphs", "local_runners", "megatron_graphs"]
