"""GD5xx runtime rules: capture hazards only visible while the model runs. Metadata only: the runtime
probes (GD511: `graphdoctor diff`'s hazard observer) detect them and report
`get_rule(code).finding(locations=(...), detail=..., where=...)`.

Every template takes `detail` (what happened) and `where` (`file:line` of the offending call).
"""

from __future__ import annotations

from graphdoctor.rules.base import Rule
from graphdoctor.rules.finding import FixAvailability, Severity, Status

FAMILY = "runtime"


class RuntimeRule(Rule):
    """Base of the probe-detected rules (never reported by `check`)."""

    runtime = True
    status = Status.PREVIEW


class HostSyncInCapture(RuntimeRule):
    """## What it does
    Reports a host synchronisation inside a captured region: `Tensor.item()`, `.cpu()`, `.tolist()`,
    `bool(tensor)` / `if tensor:`, `torch.cuda.synchronize()`.

    ## Why is this bad?
    A sync during stream capture is illegal: capture fails with `cudaErrorStreamCaptureInvalidated`
    ("operation failed due to a previous error during capture"), or with
    `torch.cuda.set_sync_debug_mode("error")` "called a synchronizing CUDA operation" naming no op
    (pytorch notes section 3). Megatron-LM#2056 is the NaN-check instance of it.

    ## Example
    ```python
    if (logits.max() > 1e4).item():   # [GD501]
        logits = logits.clamp(max=1e4)
    ```

    ## Use instead
    ```python
    logits = torch.clamp(logits, max=1e4)
    ```

    ## Fix
    Move the read before capture, or keep the value on the device.
    """

    code = "GD501"
    name = "host-sync-in-capture"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "host sync inside captured region: {detail} at {where}"
    fix_template = "Move the read before capture or keep the value on device"


class DataDependentShape(RuntimeRule):
    """## What it does
    Reports ops whose output shape depends on tensor values inside a captured region (`nonzero`,
    `masked_select`, `unique`, boolean-mask indexing, `repeat_interleave` with tensor repeats).

    ## Why is this bad?
    The shape is read back to the host (a sync), and a graph replays the captured shape forever;
    dropless MoE is the Megatron instance (`transformer_config.py:2505-2511`).

    ## Example
    ```python
    idx = torch.nonzero(mask)   # [GD502]
    ```

    ## Use instead
    ```python
    idx = torch.nonzero_static(mask, size=max_tokens)
    ```

    ## Fix
    Use a static-size variant (padding to a capacity).
    """

    code = "GD502"
    name = "data-dependent-shape"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "data-dependent output shape inside captured region: {detail} at {where}"
    fix_template = "Use a static-size variant (pad to a fixed capacity)"


class LegacyDefaultStreamWork(RuntimeRule):
    """## What it does
    Reports work launched on the legacy default (NULL) stream while another stream captures.

    ## Why is this bad?
    "CUDA graphs must be captured on a non-default stream" (`CUDAGraph.cpp`); legacy-stream work
    synchronises with the capturing stream and invalidates the capture. Megatron moves to a side
    stream for this reason (`cuda_graphs.py:1837-1845`, `initialize.py:288`).

    ## Example
    ```python
    with torch.cuda.stream(torch.cuda.default_stream()):   # [GD503]
        buf.zero_()
    ```

    ## Use instead
    ```python
    buf.zero_()   # on the current (capturing) stream
    ```

    ## Fix
    Launch on the current stream, or make side streams wait on it.
    """

    code = "GD503"
    name = "legacy-default-stream-work"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "work on the legacy default stream during capture: {detail} at {where}"
    fix_template = "Launch the work on the capturing stream"


class PageableH2dCopy(RuntimeRule):
    """## What it does
    Reports a host-to-device copy from pageable (unpinned) memory inside a captured region.

    ## Why is this bad?
    A pageable copy is staged synchronously, which is illegal during capture, and a replay would
    re-copy the stale host buffer. NVIDIA/Megatron-LM PR #5401 fixed this for the router z-loss.

    ## Example
    ```python
    scale = torch.tensor([coeff]).cuda()   # [GD504]
    ```

    ## Use instead
    ```python
    scale = torch.tensor([coeff], device="cuda")   # created before capture
    ```

    ## Fix
    Create the tensor on the device before capture, or copy from pinned memory.
    """

    code = "GD504"
    name = "pageable-h2d-copy"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "pageable host-to-device copy inside captured region: {detail} at {where}"
    fix_template = "Create the tensor on the device before capture or copy from pinned memory"


class UnregisteredGenerator(RuntimeRule):
    """## What it does
    Reports a CUDA RNG op inside capture that draws from a generator not registered on the graph.

    ## Why is this bad?
    Only registered generators get their offsets advanced on replay (`register_generator_state`,
    pytorch notes 1.3); an unregistered one replays the same mask each step. Megatron asserts a
    graph-safe tracker (`cuda_graphs.py:1821-1826`).

    ## Example
    ```python
    gen = torch.Generator(device="cuda")
    mask = torch.rand(x.shape, generator=gen, device="cuda")   # [GD505]
    ```

    ## Use instead
    ```python
    with get_cuda_rng_tracker().fork():
        mask = torch.rand(x.shape, device="cuda")
    ```

    ## Fix
    Use the graph-safe RNG tracker, or register the generator on the graph.
    """

    code = "GD505"
    name = "unregistered-generator"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "RNG from a generator not registered on the graph: {detail} at {where}"
    fix_template = "Use the graph-safe RNG tracker or register the generator on the graph"


class HostDrawnRandomMask(RuntimeRule):
    """## What it does
    Reports randomness drawn on the host (python `random`, numpy, CPU torch RNG) that feeds a
    captured region.

    ## Why is this bad?
    The host draw happens once, at capture; every replay reuses the captured value.

    ## Example
    ```python
    keep = random.random() > p   # [GD506]
    ```

    ## Use instead
    ```python
    keep = torch.rand((), device="cuda") > p
    ```

    ## Fix
    Draw the random numbers on the device with a registered generator.
    """

    code = "GD506"
    name = "host-drawn-random-mask"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "random value drawn on the host and frozen into the graph: {detail} at {where}"
    fix_template = "Draw the random numbers on the device with a registered generator"


class CpuTensorInCapture(RuntimeRule):
    """## What it does
    Reports a CPU tensor used as an operand inside a captured region. Info, with the reason, when the
    operation touched only host tensors and was issued by library code (Megatron's RNG tracker
    comparing CPU RNG states): it launches no device work.

    ## Why is this bad?
    CPU work is not recorded; its value is frozen at capture or forces a sync (Inductor skips graphs
    for the same reason: "skipping cudagraphs due to cpu device").

    ## Example
    ```python
    y = x * torch.tensor(2.0)   # [GD507]
    ```

    ## Use instead
    ```python
    y = x * 2.0
    ```

    ## Fix
    Move the tensor to the device before capture, or use a Python scalar.

    ## Known problems
    A hit with no user frame on its stack (Megatron's own RNG-tracker check in core attention,
    `tensor_parallel/random.py:332`, on every clean model) is not shown by default: one note counts them, and
    `check --probe --show-library-findings` reports them, marked `extra.library_internal`.
    """

    code = "GD507"
    name = "cpu-tensor-in-capture"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "CPU tensor used inside captured region: {detail} at {where}"
    fix_template = "Move the tensor to the device before capture or use a Python scalar"


class ForwardHookInCapture(RuntimeRule):
    """## What it does
    Reports forward (pre-)hooks that run during capture on graphed modules. An error when the hook is
    registered from user code; a warning when it comes from a library (torch, megatron, ...).

    ## Why is this bad?
    Hooks run once at capture and never on replay, so their side effects silently stop. Megatron
    asserts non-DDP pre-forward hooks on local graphs ("Tried to cudagraph a module with user
    registered pre-forward hooks, which is not allowed.", `cuda_graphs.py:1852-1865`);
    `make_graphed_callables` refuses hooked modules.

    ## Example
    ```python
    layer.register_forward_hook(log_activations)   # [GD508]
    ```

    ## Use instead
    ```python
    # log outside the graphed region, or only in eager steps
    ```

    ## Fix
    Remove the hook before capture, or move its work outside the graphed module.
    """

    code = "GD508"
    name = "forward-hook-in-capture"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "forward hook runs during capture only: {detail} at {where}"
    fix_template = "Remove the hook before capture or move its work outside the graphed module"


class AttributeTensorReassigned(RuntimeRule):
    """## What it does
    Reports a module attribute tensor captured by a graph and later rebound to a new tensor
    (`self.buf = new` instead of `self.buf.copy_(new)`), inside the captured forward or by code that runs
    after the capture (a training loop, a `forward_step`). An error when the rebinding line is user
    code; a warning inside libraries (the probes; `graphdoctor diff` follows the user's code only).

    ## Why is this bad?
    The graph keeps reading the old storage; the new value is silently ignored on replay.

    ## Example
    ```python
    self.scale = new_scale   # [GD509]
    ```

    ## Use instead
    ```python
    self.scale.copy_(new_scale)
    ```

    ## Fix
    Update captured tensors in place.
    """

    code = "GD509"
    name = "attribute-tensor-reassigned"
    detected_by = ("runtime probes (`graphdoctor check --probe`) and `graphdoctor diff` (the graphed child's "
                   "witness of the user's code at capture and replay)")
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "captured tensor attribute rebound after capture: {detail} at {where}"
    fix_template = "Update the captured tensor in place with copy_()"


class CaptureInvalidatedCascade(RuntimeRule):
    """## What it does
    Reports a capture that was invalidated (every later CUDA call fails with "operation failed due to
    a previous error during capture"), grouped under the first cause the recording saw. Info when that
    first cause is itself reported (under its own GD501-GD505 code); error when nothing recorded in
    the failing unit explains the failure, since no other finding reports it then.

    ## Why is this bad?
    The first error is the real one; the cascade hides it and its stack is often misleading
    (pytorch notes section 3). A capture that fails with no recorded cause (a custom CUDA extension
    that syncs internally, for instance) still means the unit cannot be graphed.

    ## Example
    ```python
    loss.item()   # [GD510] first error; later calls fail with cudaErrorStreamCaptureInvalidated
    ```

    ## Use instead
    ```python
    loss_value = loss.detach()   # read after replay
    ```

    ## Fix
    Fix the first reported capture error; the rest follow from it. Without a recorded cause, capture
    the unit's submodules separately (the probes do, two levels down) to narrow it.
    """

    code = "GD510"
    name = "capture-invalidated-cascade"
    severity = Severity.INFO
    fix = FixAvailability.NONE
    template = "capture invalidated by an earlier error: {detail} at {where}"
    fix_template = "Fix the first capture error reported; the later errors are its cascade"


class TeGraphNoneAttentionMask(RuntimeRule):
    """## What it does
    Reports `cuda_graph_impl="transformer_engine"` with a layer spec whose core attention is Megatron's
    local `DotProductAttention` while the forward step passes `attention_mask=None` (seen by
    `graphdoctor diff` on the first step).

    ## Why is this bad?
    On replay Megatron replaces a None mask by an all-False one (`transformer_layer.py:1394-1402`), and
    the local softmax applies a given mask instead of generating the causal one
    (`fused_softmax.py:319-327`): graphed attention is non-causal, eager is causal, and the loss differs
    from the first graphed step.

    ## Example
    ```python
    output = model(tokens, position_ids, attention_mask=None)   # [GD511]
    ```

    ## Use instead
    ```python
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device="cuda"), 1)  # True = masked
    output = model(tokens, position_ids, attention_mask=mask.expand(b, 1, s, s))
    ```

    ## Fix
    Pass an explicit causal `[b, 1, s, s]` bool mask, or use `get_gpt_layer_with_transformer_engine_spec`,
    whose attention generates the causal mask itself.
    """

    code = "GD511"
    name = "te-graph-none-attention-mask"
    detected_by = "`graphdoctor diff` when it drives transformer_engine graphs"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "attention_mask=None replayed as an all-False mask (non-causal): {detail} at {where}"
    fix_template = "Pass an explicit causal attention_mask (or use the Transformer Engine layer spec)"
