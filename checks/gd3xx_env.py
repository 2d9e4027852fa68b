"""GD3xx environment rules: allocator / NCCL / CUDA variables of the job and the torch and
Transformer Engine of the training machine (EnvironmentFacts from --target; never touches CUDA at import).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.config.impl import Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity
from graphdoctor.rules.target import STALE_CAPTURE_OVERRIDE_SINCE

FAMILY = "environment"


class ExpandableSegmentsWithNcclGraphRegister(Rule):
    """## What it does
    Flags `PYTORCH_CUDA_ALLOC_CONF` containing `expandable_segments:True` in the job environment
    without `NCCL_GRAPH_REGISTER=0` while CUDA graphs are on. Error for the transformer_engine impl on
    every GPU (Megatron asserts it whatever the architecture); warning for the other impls on GPUs
    older than sm_100, or when the compute capability is unknown (give `--gpu-arch`).

    ## Why is this bad?
    NCCL registers graph-captured buffers; with expandable segments the registration can point at
    remapped memory, an illegal memory access on pre-Blackwell GPUs. For the transformer_engine impl
    Megatron does not look at the GPU: `TECudaGraphHelper.__init__` asserts
    `"expandable_segments:True" not in os.getenv("PYTORCH_CUDA_ALLOC_CONF", "") or
    os.getenv("NCCL_GRAPH_REGISTER", "") == "0"` with the message "Setting NCCL_GRAPH_REGISTER=0 to
    avoid illegal memory access when using CUDA Graph with
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True." (`cuda_graphs.py:2102-2108`), and Megatron-LM's
    `validate_args` asserts the same for `--cuda-graph-impl transformer_engine` (`arguments.py:1880-1887`).
    CI hit it in NVIDIA/Megatron-LM#5474.

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

    ## Known problems
    Only the job environment is read: the run file's `env:` (or `check(env=...)`) over the variables
    a `--target` file recorded on the training machine; never the shell running graphdoctor. Like Megatron, the rule matches the exact text `expandable_segments:True`.
    """

    code = "GD301"
    name = "expandable-segments-with-nccl-graph-register"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    applies_to_inference = True
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
        if ctx.graph.impl == Impl.TRANSFORMER_ENGINE:
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
    Only checked when a job environment is declared: the run file's `env:` section, or the variables
    a `--target` file from `graphdoctor env --json` recorded (the run file wins).
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
    Construct DDP inside `torch.cuda.stream(get_shared_capture_stream())` (Megatron-LM's trainer
    does), or upgrade torch once a release has the override.

    ## Known problems
    Judges the torch of the training machine (`check --target`); without a target it reports "not
    checked". DDP use is assumed. Info while no torch release has the override
    (pytorch/pytorch#180090 is in none up to 2.11), a warning when upgrading torch would fix it.
    """

    code = "GD303"
    name = "torch-lacks-stale-capture-stream-override"
    severity = Severity.INFO
    fix = FixAvailability.SOMETIMES
    machine_facts = ("torch_has_stale_capture_override",)
    machine_question = "does its torch have set_override_stale_capture_stream?"
    template = "full_iteration graphs with DDP but torch {torch} lacks set_override_stale_capture_stream{upgrade}"
    fix_template = "Build DDP on the shared capture stream (Megatron-LM's trainer does){or_upgrade}"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl != Impl.FULL_ITERATION or ctx.facts.torch_has_stale_capture_override:
            return
        since = STALE_CAPTURE_OVERRIDE_SINCE
        if since is None:
            yield Hit(("transformer.cuda_graph_impl",),
                      {"torch": ctx.facts.torch_version, "upgrade": " (no torch release has it yet)", "or_upgrade": ""})
        else:
            yield Hit(("transformer.cuda_graph_impl",),
                      {"torch": ctx.facts.torch_version, "upgrade": f"; torch >= {since} has it",
                       "or_upgrade": f", or upgrade torch to >= {since}"}, Severity.WARNING)


class TransformerEngineMissing(Rule):
    """## What it does
    Flags `cuda_graph_impl: transformer_engine` (or the legacy `external_cuda_graph`) when
    Transformer Engine is not installed here, or is installed without its compiled PyTorch extension
    `transformer_engine_torch`, so that `transformer_engine.pytorch` cannot be imported.

    ## Why is this bad?
    Megatron imports TE's graph API inside a blanket `try` (`cuda_graphs.py:42-58`); when that fails
    `HAVE_TE_GRAPHS` is False and `TECudaGraphHelper.__init__` asserts `CUDA Graphs are not supported
    without TE.` (`cuda_graphs.py:2098`) before any graph is built. `transformer_engine.pytorch`
    loads the `transformer_engine_torch` shared object on import, so a TE wheel without it (the
    metapackage alone, or an sdist that was never compiled) fails the same way.

    ## Example
    ```yaml
    # facts: te_version=null
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Use instead
    ```yaml
    # facts: te_version=2.12.0
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Fix
    Install Transformer Engine with its PyTorch extension: `pip install 'graphdoctor[transformer-engine]'`
    (pulls `transformer-engine[pytorch]`), or use the local / full_iteration impl.

    ## Known problems
    Judges the training machine that `check --target` describes (`--target local`: the machine
    graphdoctor runs on); without a target it reports "not checked", never an error. Transformer
    Engine is never imported (importing it can crash a machine without a GPU): installed means a
    `transformer_engine` package with distribution metadata, importable means the
    `transformer_engine_torch` shared object is where TE's loader looks for it. A TE whose shared
    objects are present but do not load (CUDA or torch ABI mismatch) is not detected.
    """

    code = "GD304"
    name = "transformer-engine-missing"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    machine_facts = ("te_version", "te_has_torch_extension")
    machine_question = "is Transformer Engine installed there, with its PyTorch extension?"
    template = "cuda_graph_impl='transformer_engine' but {why} on the training machine"
    fix_template = "Install Transformer Engine (pip install 'graphdoctor[transformer-engine]') or use cuda_graph_impl='local'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl != Impl.TRANSFORMER_ENGINE:
            return
        te = ctx.facts.te_version
        if te is None:
            yield Hit(_impl_fields(ctx), {"why": "transformer_engine is not installed"})
        elif not ctx.facts.te_has_torch_extension:
            yield Hit(_impl_fields(ctx), {"why": f"transformer_engine {te} has no compiled PyTorch extension "
                                                 "(transformer_engine_torch), so it cannot be imported"})


def _impl_fields(ctx: CheckContext) -> tuple[str, ...]:
    """The key that selected the transformer_engine impl: cuda_graph_impl, or the legacy flag."""
    if "cuda_graph_impl" not in ctx.transformer and ctx.value("external_cuda_graph"):
        return ("transformer.external_cuda_graph",)
    return ("transformer.cuda_graph_impl",)


TE_GRAPH_GATES: tuple[tuple[str, str, str], ...] = (
    ("2.7.0", "always", "no input/output buffer reuse between graphs (cuda_graphs.py:2592-2595)"),
    ("2.8.0", "fp8_bf16_layers",
     "first/last bf16 layers are captured with fp8 on (cuda_graphs.py:2607-2621)"),
    ("2.10.0", "always", "delete_cuda_graphs() cannot reset graphs (cuda_graphs.py:2775)"),
)
"""(minimum TE, when it matters, what older TE does) for TECudaGraphHelper's make_graphed_callables."""


def _te_gate_applies(ctx: CheckContext, when: str) -> bool:
    if when == "fp8_bf16_layers":
        quantized = ctx.value("fp8") is not None or ctx.value("fp4") is not None
        bf16_layers = (ctx.value("num_layers_at_start_in_bf16") or 0) + (ctx.value("num_layers_at_end_in_bf16") or 0)
        return quantized and bool(ctx.value("first_last_layers_bf16")) and bf16_layers > 0
    return True


class TransformerEngineTooOld(Rule):
    """## What it does
    Flags `cuda_graph_impl: transformer_engine` with an installed Transformer Engine older than a
    `make_graphed_callables` feature Megatron's TECudaGraphHelper relies on: 2.7 (graph input/output
    buffer reuse), 2.8 when fp8/fp4 runs with `first_last_layers_bf16` (per-layer `fp8_enabled`),
    2.10 (graph reset in `delete_cuda_graphs()`).

    ## Why is this bad?
    Megatron gates each feature on the installed TE and silently degrades without it
    (`cuda_graphs.py:2588-2622`, `2769-2797`): before 2.7 every graph keeps its own static buffers;
    before 2.8 `fp8_enabled=True` is passed for every layer, so the bf16 first/last layers are captured
    with fp8 and graphed numerics differ from eager; before 2.10 `delete_cuda_graphs()` cannot call
    `graph.reset()` and graph memory (and NCCL buffers) stay alive until exit (TE PR #3427,
    TransformerEngine#2543).

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
    Upgrade Transformer Engine to the version the message names (>= 2.10 covers all of them).

    ## Known problems
    Checks the TE of the training machine (`check --target`; without one, "not checked"). A missing TE is GD304, not this rule.
    `delay_wgrad_compute` has its own TE gates (GD213, GD215).
    """

    code = "GD305"
    name = "transformer-engine-too-old"
    severity = Severity.WARNING
    fix = FixAvailability.NONE
    applies_to_inference = True
    machine_facts = ("te_version",)
    machine_question = "which Transformer Engine is installed there?"
    template = "Transformer Engine {te} is older than {need}: {what}"
    fix_template = "Upgrade transformer-engine to >= {need}"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        te = ctx.facts.te_version
        if ctx.graph.impl != Impl.TRANSFORMER_ENGINE or te is None:
            return
        missing = [(need, what) for need, when, what in TE_GRAPH_GATES
                   if not ctx.facts.te_at_least(need) and _te_gate_applies(ctx, when)]
        if missing:
            need = missing[-1][0].removesuffix(".0")
            yield Hit(_impl_fields(ctx), {"te": te, "need": need, "what": "; ".join(w for _, w in missing)})


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
    machine_facts = ("torch_has_graph_safe_rng",)
    machine_question = "does its torch have graph-safe RNG (torch >= 2.6)?"
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
    Only checked when a job environment is declared: the run file's `env:` section, or the variables
    a `--target` file from `graphdoctor env --json` recorded (the run file wins).
    """

    code = "GD307"
    name = "nondeterministic-te-algos-allowed"
    severity = Severity.INFO
    fix = FixAvailability.ALWAYS
    template = "NVTE_ALLOW_NONDETERMINISTIC_ALGO {value}; graph-vs-eager comparisons will not be bitwise"
    fix_template = "Set NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 in the job environment"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.enabled and ctx.env and ctx.env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") != "0":
            value = ctx.env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO")
            yield Hit(("env.NVTE_ALLOW_NONDETERMINISTIC_ALGO",),
                      {"value": "unset (Transformer Engine allows them)" if value is None else f"={value!r}"})


class LocalGraphsWeakRefsWithTransformerEngine(Rule):
    """## What it does
    Flags `cuda_graph_impl: local` (or the legacy `enable_cuda_graph`) when Transformer Engine is importable
    on the training machine: megatron-core 0.19.2 then replaces graph-memory-pool buffers of its per-layer
    graphs by weak references, and graphed gradients differ from eager.

    ## Why is this bad?
    Megatron imports TE's `make_weak_ref` inside a `try` and sets `HAVE_TE_GRAPHS` when it imports
    (`cuda_graphs.py:42-58`). `make_weakref` (`cuda_graphs.py:395`) then swaps every graph-pool tensor it is
    given for a weak reference that does not own its memory: forward inputs and outputs after capture
    (`_weakref_forward_buffers`, `:1079`) and each backward graph's static gradient inputs and outputs
    (`:1544-1545`, "safe ... as any inuse input grads have a strong ref stored in 'bwd_cudagraph_buffer'",
    which holds only where the input is another graph's output). Memory nobody owns can be handed to another
    tensor while a graph still reads or writes it: the same class of bug as sgl-project/sglang#37606. The
    weak references came with NVIDIA/Megatron-LM#5451 (memory of partial graphs); 0.19.2 already carries
    NVIDIA/Megatron-LM#5975 ("Fix CUDA graph correctness issues due to memory bugs": the saved-for-backward
    observer, `cuda_graphs.py:128-137`, `:491-496`) and still differs.
    Measured on the H200 (megatron-core 0.19.2, TE 2.20.2, local spec, fp32, dropout 0, 2 layers): eager
    repeated against eager is bitwise, the graphed run differs from the first replay, first in the gradient
    w.r.t. the output of `decoder.layers.0` (embedding gradient max abs 0.0044, loss 4.3e-4). The same run
    matches bitwise with TE not importable, with `HAVE_TE_GRAPHS` off, and with `make_weakref` keeping
    strong references (`tests/gpu/test_te_weakref_gpu.py`); keeping them cost 0.4 MB of 212 MB allocated.

    ## Example
    ```yaml
    # facts: te_version=2.20.2
    transformer: {cuda_graph_impl: local}
    ```

    ## Use instead
    ```yaml
    # facts: te_version=2.20.2
    transformer: {cuda_graph_impl: full_iteration}
    ```

    ## Fix
    Keep strong references before the model is built (`import megatron.core.transformer.cuda_graphs as cg;
    cg.make_weakref = lambda ten, inplace=True: ten`, the fallback `make_weakref` itself uses for dtypes TE
    cannot weak-reference), or graph with `full_iteration` (`FullCudaGraphWrapper` takes no weak references);
    then compare with `graphdoctor diff --impl local` on the training machine.

    ## Known problems
    Judges the training machine that `check --target` describes (without one, "not checked"). Written against
    megatron-core 0.19.2; other versions are not told apart. How large the difference is depends on what the
    allocator hands the freed memory to, so a run can also match; `graphdoctor diff` says which on your model.
    """

    code = "GD310"
    name = "te-weak-refs-in-local-graphs"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    machine_facts = ("te_version", "te_has_torch_extension")
    machine_question = "does Transformer Engine import there, with its PyTorch extension?"
    template = ("local CUDA graphs with Transformer Engine {te} importable: megatron-core 0.19.2's make_weakref "
                "gives up ownership of graph-pool buffers (static gradients among them), and graphed gradients "
                "can differ from eager")
    fix_template = ("Keep strong references (cuda_graphs.make_weakref = lambda ten, inplace=True: ten) or graph "
                    "with full_iteration; compare with graphdoctor diff --impl local")

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        te = ctx.facts.te_version
        if ctx.facts.unknown.intersection(self.machine_facts):
            return  # OPTIMISTIC's TE would report: an unknown machine is "not checked" (engine._unchecked_hits)
        if ctx.graph.impl != Impl.LOCAL or te is None or not ctx.facts.te_has_torch_extension:
            return
        legacy = "cuda_graph_impl" not in ctx.transformer and ctx.value("enable_cuda_graph")
        yield Hit(("transformer.enable_cuda_graph",) if legacy else ("transformer.cuda_graph_impl",), {"te": te})
