"""GD3xx environment rules: allocator / NCCL / CUDA variables of the job and the torch and
Transformer Engine installed on the checking machine (EnvironmentFacts; never touches CUDA at import).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "environment"


class ExpandableSegmentsWithNcclGraphRegister(Rule):
    """## What it does
    Flags `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the job environment without
    `NCCL_GRAPH_REGISTER=0` while CUDA graphs are on. Error for the transformer_engine impl (Megatron
    asserts it whatever the GPU); warning for other impls on GPUs older than sm_100, or when the
    compute capability is unknown (give `--gpu-arch` / `run.gpu_arch`).

    ## Why is this bad?
    NCCL registers graph-captured buffers; with expandable segments the registration can point at
    remapped memory, an illegal memory access on pre-Blackwell GPUs. Megatron asserts "Setting
    NCCL_GRAPH_REGISTER=0 to avoid illegal memory access when using CUDA Graph with
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True." (`cuda_graphs.py:2102-2108`, Megatron-LM
    `arguments.py:1880-1887`); CI hit it in NVIDIA/Megatron-LM#5474.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    env: {PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    env: {PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True", NCCL_GRAPH_REGISTER: "0"}
    ```

    ## Fix
    Export `NCCL_GRAPH_REGISTER=0`, or drop `expandable_segments:True`.
    """

    code = "GD301"
    name = "expandable-segments-with-nccl-graph-register"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True but NCCL_GRAPH_REGISTER={reg!r} ({where})"
    fix_template = "Set NCCL_GRAPH_REGISTER=0 in the job environment"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if not ctx.graph.enabled or "expandable_segments:True" not in ctx.env.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            return
        reg = ctx.env.get("NCCL_GRAPH_REGISTER", "")
        if reg == "0":
            return
        fields = ("env.PYTORCH_CUDA_ALLOC_CONF", "env.NCCL_GRAPH_REGISTER")
        cap = ctx.facts.gpu_capability
        if ctx.graph.impl == "transformer_engine":
            yield Hit(fields, {"reg": reg or None, "where": "Megatron asserts this for transformer_engine graphs"})
        elif cap is None:
            yield Hit(fields, {"reg": reg or None, "where": "GPU arch unknown; unsafe before sm_100"},
                      Severity.WARNING)
        elif cap < (10, 0):
            yield Hit(fields, {"reg": reg or None, "where": f"sm_{cap[0]}{cap[1]} is older than sm_100"},
                      Severity.WARNING)


class CudaDeviceMaxConnectionsNotOne(Rule):
    """## What it does
    Reports a declared job environment (`env:`) with CUDA graphs on that does not set
    `CUDA_DEVICE_MAX_CONNECTIONS=1`.

    ## Why is this bad?
    With several hardware queues, kernels from different streams (NCCL, DDP overlap, offload) can be
    scheduled in a different order on every step, so graphed and eager runs are not bitwise
    comparable, and Megatron's TP/SP comm overlap relies on one queue for ordering. Megatron's own
    bitwise graph tests set it to 1 (`tests/unit_tests/transformer/test_cuda_graphs.py:1351-1352`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local}
    env: {CUDA_DEVICE_MAX_CONNECTIONS: "8"}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local}
    env: {CUDA_DEVICE_MAX_CONNECTIONS: "1"}
    ```

    ## Fix
    Export `CUDA_DEVICE_MAX_CONNECTIONS=1`.

    ## Known problems
    Only checked when the run file declares an `env:` section.
    """

    code = "GD302"
    name = "cuda-device-max-connections-not-one"
    severity = Severity.INFO
    fix = FixAvailability.ALWAYS
    template = "CUDA_DEVICE_MAX_CONNECTIONS={value!r}; graph-vs-eager comparisons expect 1"
    fix_template = "Set CUDA_DEVICE_MAX_CONNECTIONS=1 in the job environment"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.enabled and ctx.env and ctx.env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
            yield Hit(("env.CUDA_DEVICE_MAX_CONNECTIONS",), {"value": ctx.env.get("CUDA_DEVICE_MAX_CONNECTIONS")})


class TorchLacksStaleCaptureStreamOverride(Rule):
    """## What it does
    Flags `cuda_graph_impl: full_iteration` when the installed torch has no
    `torch.autograd.graph.set_override_stale_capture_stream` (feature-detected).

    ## Why is this bad?
    With DDP, AccumulateGrad nodes created before capture remember another stream; FullCudaGraphWrapper
    calls the override when it exists (`full_cuda_graph.py:210-218`). Without it the capture warns
    "AccumulateGrad node's stream does not match" or fails unless DDP was built on the shared capture
    stream (`training.py:1870-1876`, NVIDIA/Megatron-LM#6021).

    ## Example
    ```yaml
    # facts: torch_has_stale_capture_override=false
    transformer: {cuda_graph_impl: full_iteration}
    ```

    ## Use instead
    ```yaml
    # facts: torch_has_stale_capture_override=true
    transformer: {cuda_graph_impl: full_iteration}
    ```

    ## Fix
    Upgrade torch, or construct DDP inside `torch.cuda.stream(get_shared_capture_stream())`.

    ## Known problems
    Checks the torch installed where graphdoctor runs; DDP use is assumed.
    """

    code = "GD303"
    name = "torch-lacks-stale-capture-stream-override"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "full_iteration graphs with DDP but torch {torch} lacks set_override_stale_capture_stream"
    fix_template = "Build DDP on the shared capture stream or upgrade torch"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl == "full_iteration" and not ctx.facts.torch_has_stale_capture_override:
            yield Hit(("transformer.cuda_graph_impl",), {"torch": ctx.facts.torch_version})


class TransformerEngineMissing(Rule):
    """## What it does
    Flags `cuda_graph_impl: transformer_engine` when Transformer Engine is not installed here
    (detected with importlib.util.find_spec, never imported).

    ## Why is this bad?
    `TECudaGraphHelper` asserts `CUDA Graphs are not supported without TE.` (`cuda_graphs.py:2098`),
    and without TE's compiled extension `HAVE_TE_GRAPHS` is False (`cuda_graphs.py:42-58`).

    ## Example
    ```yaml
    # facts: te_version=null
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Use instead
    ```yaml
    # facts: te_version=null
    transformer: {cuda_graph_impl: local}
    ```

    ## Fix
    Install `transformer-engine[pytorch]`, or use the local / full_iteration impl.

    ## Known problems
    Describes the checking machine, which may not be the training machine (hence a warning).
    """

    code = "GD304"
    name = "transformer-engine-missing"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "cuda_graph_impl='transformer_engine' but transformer_engine is not installed on this machine"
    fix_template = "Install transformer-engine[pytorch] or use cuda_graph_impl='local'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl == "transformer_engine" and ctx.facts.te_version is None:
            yield Hit(("transformer.cuda_graph_impl",))


class TransformerEngineTooOld(Rule):
    """## What it does
    Flags `cuda_graph_impl: transformer_engine` with an installed Transformer Engine older than 2.10.

    ## Why is this bad?
    Megatron passes `_reuse_graph_input_output_buffers` only from TE 2.7 (`cuda_graphs.py:2568-2597`)
    and `delete_cuda_graphs()` needs `graph.reset()` from TE 2.10 (`cuda_graphs.py:2769-2797`);
    older TE keeps graph memory alive until exit (TE PR #3427, TransformerEngine#2543).

    ## Example
    ```yaml
    # facts: te_version=2.6.0
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Use instead
    ```yaml
    # facts: te_version=2.12.0
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Fix
    Upgrade Transformer Engine to >= 2.10.
    """

    code = "GD305"
    name = "transformer-engine-too-old"
    severity = Severity.WARNING
    fix = FixAvailability.NONE
    template = "Transformer Engine {te} is older than 2.10 ({what})"
    fix_template = "Upgrade transformer-engine to >= 2.10"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        te = ctx.facts.te_version
        if ctx.graph.impl == "transformer_engine" and te is not None and not ctx.facts.te_at_least("2.10.0"):
            what = "no buffer reuse and no graph reset" if not ctx.facts.te_at_least("2.7.0") else "no graph reset"
            yield Hit(("transformer.cuda_graph_impl",), {"te": te, "what": what})


class TorchLacksGraphSafeRng(Rule):
    """## What it does
    Flags CUDA graphs when the installed torch lacks graph-safe RNG
    (`CUDAGraph.register_generator_state`, `Generator.graphsafe_get_state`).

    ## Why is this bad?
    Megatron's graph-safe RNG tracker and TE's (`random.py:297-303`, TE `distributed.py:83`) register
    generators on each graph; without it dropout inside a graph replays a frozen seed.

    ## Example
    ```yaml
    # facts: torch_has_graph_safe_rng=false
    transformer: {cuda_graph_impl: local}
    ```

    ## Use instead
    ```yaml
    # facts: torch_has_graph_safe_rng=true
    transformer: {cuda_graph_impl: local}
    ```

    ## Fix
    Upgrade torch (>= 2.6).
    """

    code = "GD306"
    name = "torch-lacks-graph-safe-rng"
    severity = Severity.WARNING
    fix = FixAvailability.NONE
    template = "torch {torch} has no graph-safe RNG; CUDA-graph RNG state cannot be registered"
    fix_template = "Upgrade torch to >= 2.6"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.enabled and not ctx.facts.torch_has_graph_safe_rng:
            yield Hit(("transformer.cuda_graph_impl",), {"torch": ctx.facts.torch_version})


class NondeterministicTeAlgosAllowed(Rule):
    """## What it does
    Reports a declared job environment with CUDA graphs that does not set
    `NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`.

    ## Why is this bad?
    TE picks non-deterministic kernels by default, so graphed and eager losses differ run to run and
    a real graph bug cannot be told from noise. Megatron's bitwise partial-graph test sets it to 0
    (`test_cuda_graphs.py:1351-1352`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    env: {CUDA_DEVICE_MAX_CONNECTIONS: "1"}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    env: {CUDA_DEVICE_MAX_CONNECTIONS: "1", NVTE_ALLOW_NONDETERMINISTIC_ALGO: "0"}
    ```

    ## Fix
    Export `NVTE_ALLOW_NONDETERMINISTIC_ALGO=0` while comparing graphs with eager.

    ## Known problems
    Only checked when the run file declares an `env:` section.
    """

    code = "GD307"
    name = "nondeterministic-te-algos-allowed"
    severity = Severity.INFO
    fix = FixAvailability.ALWAYS
    template = "NVTE_ALLOW_NONDETERMINISTIC_ALGO={value!r}; graph-vs-eager comparisons will not be bitwise"
    fix_template = "Set NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 in the job environment"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.enabled and ctx.env and ctx.env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") != "0":
            yield Hit(("env.NVTE_ALLOW_NONDETERMINISTIC_ALGO",), {"value": ctx.env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO")})
