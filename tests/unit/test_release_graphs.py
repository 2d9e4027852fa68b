"""The child's release of Megatron-Core's graphs before destroy_process_group (graphdoctor.child.distributed.
release_graphs), on the CPU with megatron-core 0.19.2 imported: the full_iteration wrapper's class-level
graphs are reset and dropped (cuda_graph['training'|'validation'], full_cuda_graph.py:142), the local runners'
record is emptied by Megatron's own delete_cuda_graphs, every runner a CudaGraphManager holds has its
graphs reset and dropped, and nothing fails when no graph exists.
Capturing real graphs needs the GPU: tests/gpu/test_hang_gpu.py checks the counts there."""

from __future__ import annotations

from typing import Any

import pytest

from graphdoctor.child.distributed import release_graphs


class Captured:
    """Stands in for a graph object where only reset() is exercised (the wrapper's bookkeeping is under test)."""

    def __init__(self) -> None:
        self.reset_calls = 0

    def reset(self) -> None:
        self.reset_calls += 1


@pytest.fixture
def full_iteration_graphs() -> Any:
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    saved = dict(FullCudaGraphWrapper.cuda_graph)
    yield FullCudaGraphWrapper.cuda_graph
    FullCudaGraphWrapper.cuda_graph.clear()
    FullCudaGraphWrapper.cuda_graph.update(saved)


def test_nothing_to_release() -> None:
    import megatron.core.transformer.cuda_graphs  # noqa: F401 - the local path is taken when imported

    assert release_graphs() == (0, 0)


def test_full_iteration_graphs_are_reset_and_dropped(full_iteration_graphs: dict[str, Any]) -> None:
    training = Captured()
    full_iteration_graphs["training"] = training
    released, alive = release_graphs()
    assert (released, alive) == (1, 0)
    assert training.reset_calls == 1 and full_iteration_graphs == {"training": None, "validation": None}


def test_a_failing_release_step_leaves_the_rest_running(full_iteration_graphs: dict[str, Any]) -> None:
    class BrokenHelper:
        def graphs_created(self) -> bool:
            return True

        def delete_cuda_graphs(self) -> None:
            raise AssertionError("No CUDA Graphs were created to delete.")

    validation = Captured()
    full_iteration_graphs["validation"] = validation
    assert release_graphs(te_helper=BrokenHelper()) == (1, 0)
    assert validation.reset_calls == 1


def test_local_runner_graphs_are_reset_where_megatrons_delete_does_not_reach() -> None:
    # After create_cudagraphs() Megatron-Core 0.19.2 empties _CudagraphGlobalRecord.cudagraph_record
    # (cuda_graphs.py:655), so its delete_cuda_graphs() resets no runner: the runners are found through
    # their CudaGraphManager instead (real classes, built without __init__, which needs a GPU model).
    from megatron.core.transformer.cuda_graphs import CudaGraphManager, _CudaGraphRunner

    runner = object.__new__(_CudaGraphRunner)
    runner.fwd_graph, runner.bwd_graph = Captured(), Captured()
    runner.mempool, runner.cudagraph_created = object(), True
    fwd, bwd = runner.fwd_graph, runner.bwd_graph
    manager = object.__new__(CudaGraphManager)
    manager.cudagraph_runners = [runner]
    assert release_graphs() == (2, 0)
    assert (fwd.reset_calls, bwd.reset_calls) == (1, 1)
    assert (runner.fwd_graph, runner.bwd_graph, runner.mempool, runner.cudagraph_created) == (None, None, None, False)
    assert release_graphs() == (0, 0)  # nothing left to release
    del manager
