"""Checkpoint save and resume inside a child (`--save-at S`, `--resume`), as Megatron-LM's
`megatron/training/checkpointing.py` does it with ckpt_format torch_dist: Megatron-Core's distributed
checkpointing of the unwrapped model's sharded state dict, the optimizer's sharded state dict built on
it, the RNG states (Python, CPU, CUDA, Megatron's model-parallel tracker) as one ShardedObject per
tensor/pipeline rank, and the iteration. Imported only inside children.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from graphdoctor.errors import GraphDoctorError
from graphdoctor.protocol.events import Checkpoint, Event, Phase
from graphdoctor.protocol.spec import ChildSpec

RNG_KEY = "rng_state"
"""The ShardedObject key of the RNG states (Megatron-LM's get_rng_state)."""


class CheckpointError(GraphDoctorError):
    """A checkpoint this run wrote cannot be written there, or is not the one it expects to load."""


def content_metadata(distributed_optimizer: bool) -> dict[str, Any]:
    """What Megatron-LM's _build_sharded_state_dict_metadata passes to the model's and the optimizer's
    sharded_state_dict (the distributed optimizer's dp_reshardable format, Megatron-LM's default)."""
    from megatron.core import parallel_state

    metadata: dict[str, Any] = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
                                "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    if distributed_optimizer:
        metadata["distrib_optim_sharding_type"] = "dp_reshardable"
    return metadata


def rng_state() -> dict[str, Any]:
    """Every generator's state by value: Python's, the CPU's, each CUDA device's and every tracker's
    (graphdoctor.child.rng.save_rng_states: graph-safe tracker generators as state tensors)."""
    from graphdoctor.child.rng import save_rng_states

    return {"random": random.getstate(), **save_rng_states()}


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put the saved states back in place: the generator objects stay the ones the tracker and any
    later capture use (restore_rng_states sets their states)."""
    from graphdoctor.child.rng import restore_rng_states

    random.setstate(state["random"])
    restore_rng_states(state)


def _rng_object(state: dict[str, Any] | None) -> Any:
    """The RNG states as Megatron-LM shards them: one object per (pipeline, tensor) rank, replicated
    over data-parallel ranks."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    shape = (parallel_state.get_pipeline_model_parallel_world_size(),
             parallel_state.get_tensor_model_parallel_world_size())
    offset = (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank())
    return ShardedObject(RNG_KEY, [state], shape, offset,
                         replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))


def sharded_state(model: Any, optimizer: Any | None, *, iteration: int, loading: bool,
                  distributed_optimizer: bool = False) -> dict[str, Any]:
    """Megatron-LM's generate_state_dict for torch_dist: `model` (unwrapped from DDP and Float16Module,
    as save_checkpoint does), `optimizer` built on the model's sharded state dict, `rng_state`,
    `iteration`. When `loading`, the optimizer creates its state tensors to load into."""
    from megatron.core.utils import unwrap_model

    metadata = content_metadata(distributed_optimizer)
    state: dict[str, Any] = {"checkpoint_version": 3.0, "iteration": iteration}
    state["model"] = unwrap_model(model).sharded_state_dict(metadata=metadata)
    if optimizer is not None:  # None: Megatron-LM's --no-save-optim
        state["optimizer"] = optimizer.sharded_state_dict(state["model"], is_loading=loading, metadata=metadata)
    state[RNG_KEY] = _rng_object(None if loading else rng_state())
    return state


def save(directory: str | Path, model: Any, optimizer: Any | None, *, iteration: int,
         distributed_optimizer: bool = False) -> float:
    """Save at `iteration` (training steps done) into `directory`, which must be new or empty (a
    checkpoint never goes over anything). Returns the seconds it took."""
    from megatron.core import dist_checkpointing

    start = time.perf_counter()
    path = Path(directory)
    if torch.distributed.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        if next(path.iterdir(), None) is not None:
            raise CheckpointError(f"checkpoint directory {path} is not empty; a checkpoint never goes over files")
    torch.distributed.barrier()
    state = sharded_state(model, optimizer, iteration=iteration, loading=False,
                          distributed_optimizer=distributed_optimizer)
    with _write_queue_stopped():
        dist_checkpointing.save(state, str(path), content_metadata=_plain(content_metadata(distributed_optimizer)))
    return time.perf_counter() - start


@contextlib.contextmanager
def _write_queue_stopped() -> Iterator[None]:
    """Stop the process dist_checkpointing's save starts: its writer reports through the queue of a
    multiprocessing Manager (a spawned server process, filesystem_async.get_write_results_queue) that
    megatron-core 0.19.2 keeps for the life of the process. A child ends with os._exit, which skips the
    finalizer that would stop it, so the server would outlive the run."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    try:
        yield
    finally:
        queue = filesystem_async._results_queue
        filesystem_async._results_queue = None
        manager = getattr(queue, "_manager", None)
        if manager is not None:
            manager.shutdown()


TE_PICKLED_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"
"""Transformer Engine's opt-in (transformer_engine/pytorch/_extra_state.py, TE 2.20) to load a module's pickled
extra state: delayed-scaling FP8 keeps its scales and amax histories as a pickle in the checkpoint, and TE refuses to
unpickle it without this variable."""


@contextlib.contextmanager
def own_extra_state() -> Iterator[None]:
    """Let Transformer Engine load the pickled FP8 extra state of the checkpoint being loaded, for the load alone.
    Only `load` uses it, and `load` reads only the checkpoint this run's own first process wrote into its own new
    directory moments before (parent/resume.py): no file from elsewhere is unpickled. The variable is put back as
    it was afterwards."""
    before = os.environ.get(TE_PICKLED_STATE_ENV)
    os.environ[TE_PICKLED_STATE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TE_PICKLED_STATE_ENV, None)
        else:
            os.environ[TE_PICKLED_STATE_ENV] = before


def load(directory: str | Path, model: Any, optimizer: Any | None, *, iteration: int,
         distributed_optimizer: bool = False) -> float:
    """Load what `save` wrote at `iteration` into the model (through its wrappers, as Megatron-LM's
    load_checkpoint does), the optimizer and the RNG states. Returns the seconds it took.

    Raises:
        CheckpointError: there is no checkpoint in `directory`, or it is of another iteration.
    """
    from megatron.core import dist_checkpointing

    start = time.perf_counter()
    if not dist_checkpointing.check_is_distributed_checkpoint(str(directory)):
        raise CheckpointError(f"no distributed checkpoint in {directory}")
    state = sharded_state(model, optimizer, iteration=iteration, loading=True,
                          distributed_optimizer=distributed_optimizer)
    with own_extra_state():
        loaded = dist_checkpointing.load(state, str(directory))
        if loaded.get("iteration") != iteration:
            raise CheckpointError(f"checkpoint {directory} is of iteration {loaded.get('iteration')!r}, "
                                  f"expected {iteration}")
        load_model_state(model, loaded["model"])
    if optimizer is not None:
        optimizer.load_state_dict(loaded["optimizer"])
    restore_rng_state(loaded[RNG_KEY][0])
    return time.perf_counter() - start


def save_run(spec: ChildSpec, setup: Any, state: Any, emit: Callable[[Event], None]) -> None:
    """The run's save after config.save_at training steps (and the evaluation there, as Megatron-LM's
    train loop evaluates before it checkpoints): phase `checkpoint`, then a `checkpoint` event."""
    assert spec.checkpoint_dir is not None
    cfg = spec.config
    state.phase = "checkpoint"
    emit(Phase(phase="checkpoint", step=cfg.save_at - 1))
    seconds = save(spec.checkpoint_dir, setup.model, setup.optimizer, iteration=cfg.save_at,
                   distributed_optimizer=cfg.use_distributed_optimizer)
    emit(Checkpoint(action="save", iteration=cfg.save_at, seconds=seconds))


def resume_run(spec: ChildSpec, setup: Any, state: Any, emit: Callable[[Event], None]) -> None:
    """The resumed process's load, after the model and optimizer are built the way the first process
    built them and before anything else touches them: phase `resume` (an error here is the resume's)."""
    assert spec.checkpoint_dir is not None
    cfg = spec.config
    state.step, state.phase = cfg.save_at - 1, "resume"
    emit(Phase(phase="resume", step=cfg.save_at))
    seconds = load(spec.checkpoint_dir, setup.model, setup.optimizer, iteration=cfg.save_at,
                   distributed_optimizer=cfg.use_distributed_optimizer)
    emit(Checkpoint(action="load", iteration=cfg.save_at, seconds=seconds))


EXTRA_STATE_SUFFIX = "._extra_state"
"""State-dict keys of a module's extra state (Transformer Engine's FP8 metadata; None for Megatron's
local layers)."""


def load_model_state(model: Any, state: dict[str, Any]) -> None:
    """Load a model state dict into the unwrapped model (Megatron's DDP and Float16Module only pass it
    on). Megatron-LM's load_checkpoint retries with strict=False when a strict load fails, which would
    accept any missing key; here only extra states may be missing (megatron-core 0.19.2's GPTModel
    leaves `output_layer._extra_state` out of its sharded state dict).

    Raises:
        CheckpointError: a parameter or buffer is missing from the checkpoint, or it holds one the
            model does not have.
    """
    from megatron.core.utils import unwrap_model

    result = unwrap_model(model).load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(EXTRA_STATE_SUFFIX)]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"checkpoint does not fit the model: missing {missing[:5]}, unexpected "
                              f"{list(result.unexpected_keys)[:5]}")


def _plain(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata without its process group (Megatron-LM's _clean_metadata_for_serialization)."""
    return {k: v for k, v in metadata.items() if k != "dp_cp_group"}


__all__ = ["EXTRA_STATE_SUFFIX", "RNG_KEY", "TE_PICKLED_STATE_ENV", "CheckpointError", "content_metadata", "load", "load_model_state",
           "own_extra_state", "restore_rng_state", "resume_run", "rng_state",
           "save", "save_run", "sharded_state"]
