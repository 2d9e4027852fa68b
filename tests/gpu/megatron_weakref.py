"""Layer-spec entry points that change one thing in megatron-core 0.19.2's `local` CUDA graphs before the model
is built: `graphdoctor diff --layer-spec tests.gpu.megatron_weakref:FN` (the working directory is the repo).

With Transformer Engine importable, megatron-core 0.19.2's local graphs differ from eager at dropout 0 (docs/diff.md,
tests/gpu/test_te_gpu.py). megatron/core/transformer/cuda_graphs.py then sets HAVE_TE_GRAPHS, and `make_weakref`
(line 395) replaces graph-mempool buffers by TE weak references that do not own their memory: among them the
static gradient inputs of each backward graph (line 1544: "safe ... as any inuse input grads have a strong ref
stored in 'bwd_cudagraph_buffer'", which holds only where the input was another graph's output). Each function
below returns Megatron's local GPT layer spec, as `--layer-spec local` does, after one change in the child:

- local_spec_without_te_graphs: HAVE_TE_GRAPHS = False, as when TE does not import (every TE branch of
  cuda_graphs.py off: weak references, TE capture hooks, FP8 state);
- local_spec_with_strong_refs: `make_weakref` keeps the tensor it is given (the strong reference the function
  already falls back to for dtypes TE cannot weak-reference); everything else as with TE.
"""

from __future__ import annotations

from typing import Any


def _local_spec() -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec()


def local_spec_without_te_graphs() -> Any:
    """Megatron's local spec, with cuda_graphs.HAVE_TE_GRAPHS off in this process."""
    from megatron.core.transformer import cuda_graphs

    cuda_graphs.HAVE_TE_GRAPHS = False
    return _local_spec()


def _strong(ten: Any, inplace: bool = True) -> Any:
    return ten


def local_spec_with_strong_refs() -> Any:
    """Megatron's local spec, with cuda_graphs.make_weakref returning its tensor unchanged in this process."""
    from megatron.core.transformer import cuda_graphs

    cuda_graphs.make_weakref = _strong
    return _local_spec()


__all__ = ["local_spec_with_strong_refs", "local_spec_without_te_graphs"]
