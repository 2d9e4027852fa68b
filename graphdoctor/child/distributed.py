"""The distributed side of one child rank: its spec as torch.distributed.run placed it, dying with the
launcher, and the tear-down after the results are written (the hook for bounded tear-down).
Imported only inside children.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from graphdoctor.config import DiffConfig
from graphdoctor.protocol.spec import ChildSpec

PR_SET_PDEATHSIG = 1
"""prctl option: the signal this process gets when its parent (the launcher) dies."""


def rank_spec(spec: ChildSpec) -> ChildSpec:
    """The spec of this rank: unchanged for a one-process child; under graphdoctor's own launch the
    placement comes from torch.distributed.run's environment and the events go to the rank's file."""
    if not spec.placement.launcher or "RANK" not in os.environ:
        return spec
    return spec.for_rank(dict(os.environ))


def die_with_launcher() -> None:
    """SIGKILL this rank when the launcher dies: torch.distributed.run starts each rank in its own
    session, so killing the launcher's process group alone (a timeout) would leave ranks behind."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the launcher's own SIGTERM handling remains
        return
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os._exit(1)


def stage_flags(config: DiffConfig) -> dict[str, bool]:
    """pre_process/post_process of this rank's pipeline stage, as Megatron-LM's get_model passes them
    (none with one stage: GPTModel's defaults)."""
    if config.pipeline_model_parallel_size == 1:
        return {}
    from megatron.core import parallel_state

    return {"pre_process": parallel_state.is_pipeline_first_stage(),
            "post_process": parallel_state.is_pipeline_last_stage()}


def ddp_config(config: DiffConfig | None) -> Any:
    """Megatron's DistributedDataParallelConfig with the run's DDP settings (fp32 reduction, as before)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    if config is None:
        return DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                             use_distributed_optimizer=False)
    return DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=config.overlap_grad_reduce,
                                         use_distributed_optimizer=config.use_distributed_optimizer,
                                         bucket_size=config.ddp_bucket_size)


def sync_hooks(tconfig: Any, model: Any, config: DiffConfig) -> Any:
    """The schedule's gradient-sync hooks Megatron-LM's trainer sets with overlap_grad_reduce
    (training.py:3532-3543 of megatron-core 0.19.2; align_grad_reduce is its default): no reduction
    inside the accumulating micro-batches, then the buckets started as their gradients are ready."""
    if config.overlap_grad_reduce:
        tconfig.no_sync_func = model.no_sync
        tconfig.grad_sync_func = model.start_grad_sync
    return model


def data_parallel_salt() -> int:
    """A number that differs per data-parallel rank (0 with one): every data-parallel rank trains on
    its own batches, as under Megatron-LM's sampler; tensor- and pipeline-parallel peers share them."""
    import torch

    if not torch.distributed.is_initialized():
        return 0
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized() or parallel_state.get_data_parallel_world_size() == 1:
        return 0
    return 7919 * (1 + parallel_state.get_data_parallel_rank())


def delete_te_graphs(te_helper: Any) -> None:
    """TECudaGraphHelper.delete_cuda_graphs() when it created graphs (they hold NCCL buffers): at the end of
    a run, and again (then a no-op) in release_graphs."""
    if te_helper is not None and te_helper.graphs_created():
        te_helper.delete_cuda_graphs()


def release_graphs(model: Any = None, te_helper: Any = None) -> tuple[int, int]:
    """Delete the CUDA graphs Megatron-Core holds before the process groups go, as Megatron's own tests
    and Megatron-Bridge's trainer do (graphs that captured NCCL work keep its communicators alive, and
    destroy_process_group then waits for ever: pytorch#115388, Megatron-Bridge#2955): the Transformer
    Engine graphs of `te_helper`, the local runners' fwd/bwd graphs, full_iteration's
    FullCudaGraphWrapper.cuda_graph. Every graph found is reset (its exec, graph and pool share freed, as
    its destructor would) and dropped: Megatron-Core 0.19.2's delete_cuda_graphs() alone reaches no local
    runner once the graphs are captured (launches.kept.local_runners), and on two H200s its runs' ranks
    then hung in destroy_process_group with all 8 graphs alive.

    `model` (the model or its chunks) is where the local runners are looked for; None: the whole GC heap.
    Returns (graphs released, torch.cuda.CUDAGraph objects still alive that were not Megatron's: graphs
    someone else keeps). Once per child, at exit."""
    import gc

    import torch

    from graphdoctor.launches.kept import local_runners, megatron_graphs

    held = list(megatron_graphs(model).values()) + _te_graphs(te_helper)
    if held and torch.cuda.is_available():
        torch.cuda.synchronize()  # no replay still running when its exec is destroyed
    steps: list[Callable[[], Any]] = [lambda: delete_te_graphs(te_helper)]
    local = sys.modules.get("megatron.core.transformer.cuda_graphs")
    if local is not None:
        steps.append(lambda: _drop_runner_graphs(local_runners(model)))
        steps.append(local.delete_cuda_graphs)
    wrapper = getattr(sys.modules.get("megatron.core.full_cuda_graph"), "FullCudaGraphWrapper", None)
    graphs = getattr(wrapper, "cuda_graph", None)
    if isinstance(graphs, dict):
        steps.append(lambda: graphs.update(dict.fromkeys(graphs)))
    steps.extend(graph.reset for graph in held)  # once each: the runners and the wrapper only drop theirs
    for step in steps:
        try:
            step()
        except Exception:  # noqa: BLE001, S112 - a failed release leaves graphs alive, which is counted
            continue
    ours = {id(graph) for graph in held}
    del held
    gc.collect()
    alive = sum(1 for obj in gc.get_objects() if isinstance(obj, torch.cuda.CUDAGraph) and id(obj) not in ours)
    return len(ours), alive


def _te_graphs(te_helper: Any) -> list[Any]:
    """The graphs of the layers TECudaGraphHelper made graphed (cuda_graphs.py: layer.cuda_graphs)."""
    chunks = getattr(te_helper, "callables_per_chunk", None) or []
    return [graph for layers in chunks for layer in layers for graph in getattr(layer, "cuda_graphs", None) or []]


def _drop_runner_graphs(runners: list[tuple[str, Any]]) -> None:
    """What delete_cuda_graphs() does to the runners it reaches, for every runner (their graphs are reset
    by the caller)."""
    for _name, runner in runners:
        runner.fwd_graph = runner.bwd_graph = runner.mempool = None
        runner.cudagraph_created = runner.fwd_graph_recorded = runner.bwd_graph_recorded = False


def has_peers() -> bool:
    """This process belongs to a process group of more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def teardown_distributed() -> None:
    """Destroy the default process group of a multi-process child. Runs after the results (the end or
    error event) are written, under the teardown watchdog (graphdoctor.child.stacks.exit_within),
    which bounds it: on two H200s ranks once did not exit within 100 s of destroy_process_group
    (/work/shared/notes/h200-findings.md section 6). A one-process child has no peer to release and
    exits without it: on the H200 its destroy_process_group took 4.3-9.3 s (median 8.4 s over 54 exits),
    which every child of every diff paid."""
    import torch.distributed as dist

    if has_peers():
        dist.destroy_process_group()


__all__ = ["data_parallel_salt", "ddp_config", "die_with_launcher", "rank_spec",
           "delete_te_graphs", "has_peers", "release_graphs", "stage_flags", "sync_hooks", "teardown_distributed"]
