"""Graph census, keep_graphs and phases on a real CUDA graph (skipped without a GPU by conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from graphdoctor.launches import (
    CensusError,
    census_graph,
    keep_graphs,
    prepare_profiler_for_graphs,
    profile_steps,
)


def _captured(keep: bool) -> tuple[Any, Any]:
    import torch

    prepare_profiler_for_graphs()
    x = torch.randn(32, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda")
    graph = torch.cuda.CUDAGraph(keep_graph=keep)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up cuBLAS outside capture
            torch.nn.functional.dropout(torch.relu(x @ w), 0.1)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        y = torch.nn.functional.dropout(torch.relu(x @ w), 0.1) @ w
    return graph, y


@pytest.mark.gpu
def test_bindings_and_dot_census_agree_and_match_profiler(tmp_path: Path) -> None:
    graph, _ = _captured(keep=True)
    graph.replay()
    by_bindings = census_graph(graph, method="bindings")
    by_dot = census_graph(graph, method="dot")
    assert by_bindings.num_kernels >= 3
    assert by_bindings.num_kernels == by_dot.num_kernels
    assert by_bindings.nodes_by_type == by_dot.nodes_by_type
    run = profile_steps(impl="probe", trace_path=tmp_path / "probe.json", graphed_step=graph.replay)
    replay = run.accounting.phase("probe", "replay")
    assert replay is not None
    assert replay.kernels_per_graph_launch == (by_bindings.num_kernels,)
    assert replay.num_prologue_fill_launches > 0  # dropout registers RNG -> prologue fills
    assert run.accounting.total.launch_calls == run.live_launch_calls


@pytest.mark.gpu
def test_graph_not_kept_raises_census_error() -> None:
    graph, _ = _captured(keep=False)
    with pytest.raises(CensusError, match="keep_graph"):
        census_graph(graph, method="bindings")


@pytest.mark.gpu
def test_keep_graphs_patches_construction_and_restores() -> None:
    import torch

    original = torch.cuda.CUDAGraph
    with keep_graphs() as kept:
        graph, _ = _captured(keep=False)  # keep=False explicitly still wins over the default
        default_graph = torch.cuda.CUDAGraph()
        assert len(kept.graphs) == 2
        assert isinstance(default_graph, original)
    assert torch.cuda.CUDAGraph is original
    with pytest.raises(CensusError):
        census_graph(graph, method="bindings")


@pytest.mark.gpu
def test_keep_graphs_makes_make_graphed_callables_censusable() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).cuda()
    x = torch.randn(8, 64, device="cuda")
    with keep_graphs() as kept:
        graphed = torch.cuda.make_graphed_callables(model, (x,), num_warmup_iters=2)
    graphed(x).sum().backward()
    fwd, bwd = kept.graphs
    assert census_graph(fwd).num_kernels >= 3
    assert census_graph(bwd, method="dot").num_kernels >= 3


@pytest.mark.gpu
def test_eager_and_graphed_phases_in_one_trace(tmp_path: Path) -> None:
    import torch

    graph, _ = _captured(keep=False)
    x = torch.randn(32, 64, device="cuda")

    def eager() -> None:
        torch.relu(x @ x.T).sum()

    run = profile_steps(impl="probe", trace_path=tmp_path / "t.json.gz", eager_step=eager, graphed_step=graph.replay)
    table = run.table
    assert table is not None and table.eager is not None and table.graphed is not None
    assert table.eager.num_graph_launches == 0 and table.eager.num_kernel_launches >= 2
    assert table.graphed.num_graph_launches == 1
    assert (tmp_path / "t.json.gz").stat().st_size > 0
