"""Graph census without a profiler: node types and kernel names of a captured CUDA graph.

Two sources, same result type: cuda.bindings on `raw_cuda_graph()` (exact, descends into child
graphs) and Graphviz DOT from `debug_dump()` (pure-Python parser, CPU-testable). Also
`keep_graphs()`, which makes graphs created by other code (Megatron) keep their cudaGraph_t.
torch and cuda.bindings are imported lazily; nothing here touches CUDA at import.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.errors import GraphDoctorError, UsageError

_DOT_NODE = re.compile(r'^"(graph_\d+)_node_(\d+)"\s*\[.*?label="\{([A-Za-z_ ]+?)\s*$', re.M)
_DOT_ID_LINE = re.compile(r"^\| \{ID \| (.*)\}\s*$", re.M)
_CHILD_GRAPH_TYPES = frozenset({"GRAPH", "CHILD_GRAPH", "CHILDGRAPH"})
_DOT_UNESCAPE = re.compile(r"\\([<>{}|\"\\])")
METHODS = ("auto", "bindings", "dot")


class CensusError(GraphDoctorError):
    """The census cannot be taken (graph not kept, bindings missing, CUDA call failed)."""


@dataclass(frozen=True, slots=True)
class GraphCensus:
    """Static node census of one captured graph, child graphs included."""

    name: str
    """Caller's name for the graph (e.g. "local/decoder.layers.0/runner0/fwd")."""
    source: str
    """"cuda-bindings" or "dot"."""
    nodes_by_type: dict[str, int] = field(default_factory=dict)
    """Node count per type: KERNEL, MEMCPY, MEMSET, GRAPH (child graph), EMPTY, HOST, ..."""
    kernel_names: dict[str, int] = field(default_factory=dict)
    """Kernel node count per kernel name (as the driver reports it; often mangled)."""
    num_child_graphs: int = 0
    """Child-graph nodes, at any depth (their contents are counted in the totals)."""

    @property
    def num_nodes(self) -> int:
        """All nodes at every depth, child-graph container nodes included."""
        return sum(self.nodes_by_type.values())

    @property
    def num_kernels(self) -> int:
        """Kernel nodes at every depth: the GPU kernels one launch of this graph runs."""
        return self.nodes_by_type.get("KERNEL", 0)

    def top_kernels(self, n: int = 10) -> list[tuple[str, int]]:
        """The n most frequent kernel names, most frequent first (ties by name)."""
        return sorted(self.kernel_names.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict including num_nodes and num_kernels."""
        return {
            "name": self.name,
            "source": self.source,
            "num_nodes": self.num_nodes,
            "num_kernels": self.num_kernels,
            "num_child_graphs": self.num_child_graphs,
            "nodes_by_type": dict(sorted(self.nodes_by_type.items())),
            "kernel_names": dict(self.top_kernels(len(self.kernel_names))),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphCensus:
        """Inverse of to_dict (num_nodes and num_kernels are recomputed from nodes_by_type)."""
        return cls(name=str(data["name"]), source=str(data["source"]),
                   nodes_by_type={str(k): int(v) for k, v in data.get("nodes_by_type", {}).items()},
                   kernel_names={str(k): int(v) for k, v in data.get("kernel_names", {}).items()},
                   num_child_graphs=int(data.get("num_child_graphs", 0)))


def _kernel_name_from_id_line(body: str) -> str:
    """Kernel name from the DOT `{ID | 3 (topoId: 5) | name\\<\\<\\<grid,block,smem\\>\\>\\>}` line."""
    name = body.rsplit(" | ", 1)[-1]
    name = name.split("\\<\\<\\<", 1)[0]
    return _DOT_UNESCAPE.sub(r"\1", name).strip()


def parse_dot(text: str, *, name: str = "graph") -> GraphCensus:
    """Census from the DOT text `CUDAGraph.debug_dump()` (cudaGraphDebugDotPrint) writes.

    Every `"graph_G_node_N"` record counts once, whatever cluster (child graph) it is in; its type
    is the first word of the record label (KERNEL, MEMSET, ...), and KERNEL records carry the
    kernel name before the `<<<grid,block,smem>>>` launch configuration.

    Args:
        text: DOT file contents.
        name: Name to record in the census.

    Returns:
        GraphCensus with source "dot".

    Raises:
        UsageError: text is not a CUDA graph DOT dump (no `digraph` or no node records).
    """
    if "digraph" not in text:
        raise UsageError(f"parse_dot: {name!r} got text without 'digraph', expected a DOT dump")
    matches = list(_DOT_NODE.finditer(text))
    by_type: Counter[str] = Counter()
    names: Counter[str] = Counter()
    for i, match in enumerate(matches):
        node_type = match.group(3).strip().upper().replace(" ", "_")
        if node_type in _CHILD_GRAPH_TYPES:
            node_type = "GRAPH"
        by_type[node_type] += 1
        if node_type == "KERNEL":
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            id_line = _DOT_ID_LINE.search(text, match.end(), end)
            names[_kernel_name_from_id_line(id_line.group(1)) if id_line else "<unknown>"] += 1
    if not matches and "graph_" not in text:
        raise UsageError(f"parse_dot: {name!r} has no graph_N_node_M records, expected a CUDA graph dump")
    return GraphCensus(
        name=name,
        source="dot",
        nodes_by_type=dict(by_type),
        kernel_names=dict(names),
        num_child_graphs=by_type.get("GRAPH", 0),
    )


def parse_dot_file(path: str | os.PathLike[str], *, name: str | None = None) -> GraphCensus:
    """parse_dot on a file; the census name defaults to the file stem."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    return parse_dot(text, name=name or os.path.basename(os.fspath(path)).split(".")[0])


def census_graph(graph: Any, *, name: str = "graph", method: str = "auto") -> GraphCensus:
    """Count the nodes of a captured `torch.cuda.CUDAGraph` by type, and its kernels by name.

    The graph must have kept its cudaGraph_t: capture with `CUDAGraph(keep_graph=True)`, or
    inside `keep_graphs()`, or (older torch) after `enable_debug_mode()`.

    Args:
        graph: A captured torch.cuda.CUDAGraph.
        name: Name recorded in the census.
        method: "bindings" (cuda.bindings node walk), "dot" (debug_dump + parse_dot), or "auto"
            (bindings when importable, else dot).

    Returns:
        GraphCensus of the graph, child graphs included.

    Raises:
        UsageError: Unknown method.
        CensusError: The graph was not kept, or the chosen method is unavailable or failed.
    """
    if method not in METHODS:
        raise UsageError(f"census_graph: method got {method!r}, expected one of {', '.join(METHODS)}")
    if method == "dot":
        return _census_from_dump(graph, name)
    try:
        from cuda.bindings import runtime  # noqa: F401
    except ImportError as exc:
        if method == "bindings":
            raise CensusError("census_graph: method 'bindings' needs the cuda-bindings package") from exc
        return _census_from_dump(graph, name)
    return census_raw_graph(_raw_handle(graph), name=name)


def _raw_handle(graph: Any) -> int:
    if not hasattr(graph, "raw_cuda_graph"):
        raise CensusError("census_graph: this torch has no CUDAGraph.raw_cuda_graph(); use method='dot'")
    try:
        return int(graph.raw_cuda_graph())
    except RuntimeError as exc:
        raise CensusError(
            "census_graph: the cudaGraph_t was not kept; capture with CUDAGraph(keep_graph=True) "
            f"or inside graphdoctor.launches.keep_graphs() ({exc})"
        ) from exc


def _census_from_dump(graph: Any, name: str) -> GraphCensus:
    with tempfile.TemporaryDirectory(prefix="graphdoctor-dot-") as tmp:
        path = os.path.join(tmp, "graph.dot")
        with warnings.catch_warnings():
            # torch 2.11's C++ debug_dump warns "DEBUG: calling debug_dump()" on every call.
            warnings.filterwarnings("ignore", message="DEBUG: ", category=UserWarning)
            try:
                graph.debug_dump(path)
            except RuntimeError as exc:
                raise CensusError(f"census_graph: debug_dump failed: {exc}") from exc
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            raise CensusError(
                "census_graph: debug_dump wrote nothing; the graph was not kept (capture with "
                "keep_graph=True or inside keep_graphs())"
            )
        return parse_dot_file(path, name=name)


def _check(result: tuple[Any, ...], what: str) -> tuple[Any, ...]:
    """cuda.bindings calls return (err, *outputs); raise on a non-success err."""
    err = result[0]
    if int(err) != 0:
        raise CensusError(f"census_graph: {what} failed with {err!r}")
    return result[1:]


def _node_type_name(node_type: Any) -> str:
    """cudaGraphNodeTypeKernel -> KERNEL, cudaGraphNodeTypeWaitEvent -> WAIT_EVENT."""
    raw = getattr(node_type, "name", str(node_type)).rsplit(".", 1)[-1]
    raw = raw.removeprefix("cudaGraphNodeType")
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", raw).upper()
    return "GRAPH" if snake in _CHILD_GRAPH_TYPES else snake


def _kernel_node_name(node: Any) -> str:
    """Kernel name through the driver API; "<unknown>" when the driver cannot say."""
    from cuda.bindings import driver

    err, params = driver.cuGraphKernelNodeGetParams(driver.CUgraphNode(init_value=int(node)))
    if int(err) != 0:
        return "<unknown>"
    # CUDA 12+ kernels launched through the library API carry a CUkernel instead of a CUfunction.
    for attr, getter in (("func", "cuFuncGetName"), ("kern", "cuKernelGetName")):
        handle = getattr(params, attr, None)
        if handle is None or int(handle) == 0 or not hasattr(driver, getter):
            continue
        err, raw_name = getattr(driver, getter)(handle)
        if int(err) == 0 and raw_name:
            return raw_name.decode("utf-8", "replace") if isinstance(raw_name, bytes) else str(raw_name)
    return "<unknown>"


def census_raw_graph(handle: int, *, name: str = "graph") -> GraphCensus:
    """Census of a raw cudaGraph_t through cuda.bindings, descending into child graphs.

    Args:
        handle: The cudaGraph_t as an int (`CUDAGraph.raw_cuda_graph()`).
        name: Name recorded in the census.

    Returns:
        GraphCensus with source "cuda-bindings".

    Raises:
        CensusError: A CUDA call failed.
    """
    from cuda.bindings import runtime

    kernel_type = runtime.cudaGraphNodeType.cudaGraphNodeTypeKernel
    child_type = runtime.cudaGraphNodeType.cudaGraphNodeTypeGraph
    by_type: Counter[str] = Counter()
    names: Counter[str] = Counter()
    pending: list[Any] = [handle]
    while pending:
        graph = pending.pop()
        (_, num_nodes) = _check(runtime.cudaGraphGetNodes(graph, numNodes=0), "cudaGraphGetNodes")
        if not num_nodes:
            continue
        nodes, num_nodes = _check(runtime.cudaGraphGetNodes(graph, numNodes=num_nodes), "cudaGraphGetNodes")
        for node in list(nodes)[:num_nodes]:
            (node_type,) = _check(runtime.cudaGraphNodeGetType(node), "cudaGraphNodeGetType")
            by_type[_node_type_name(node_type)] += 1
            if node_type == kernel_type:
                names[_kernel_node_name(node)] += 1
            elif node_type == child_type:
                (child,) = _check(runtime.cudaGraphChildGraphNodeGetGraph(node), "cudaGraphChildGraphNodeGetGraph")
                pending.append(child)
    return GraphCensus(
        name=name,
        source="cuda-bindings",
        nodes_by_type=dict(by_type),
        kernel_names=dict(names),
        num_child_graphs=by_type.get("GRAPH", 0),
    )


__all__ = [
    "METHODS",
    "CensusError",
    "GraphCensus",
    "census_graph",
    "census_raw_graph",
    "parse_dot",
    "parse_dot_file",
]
