"""GD518-GD521 runtime rules: causes of a numeric divergence that the graphed child's witness sees in the
user's code (graphdoctor.child.witness). Metadata only: `graphdoctor diff` names the one that explains a
divergence in the row's diagnosis, and the others in its notes.
"""

from __future__ import annotations

from graphdoctor.checks.gd5xx_runtime import RuntimeRule

from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "runtime"

DETECTED_BY = "`graphdoctor diff` (the graphed child's witness of the user's code at capture and replay)"


class HostValueBaked(RuntimeRule):
    """## What it does
    Reports a Python number that graphed code reads and that changes after the graph was captured: a
    module attribute its `forward` reads (`self.temperature`) set to a new value during or after capture,
    or a host number turned into a device tensor while capturing (`torch.full((), float(x))`,
    `torch.tensor(x)`, `t.fill_(x)`) at a call site whose numbers change from call to call.

    ## Why is this bad?
    A CUDA graph records kernels and their arguments. A Python number read while capturing becomes a
    constant of the graph: every replay uses the capture-time value, and nothing fails (pytorch notes,
    "what a replay cannot see"; failure modes 3 and 4: Megatron-LM#1494, Megatron-Bridge#3076). Annealed
    coefficients, step-dependent scales and counters stop changing under graphs and training drifts
    from eager.

    ## Example
    ```python
    def forward(self, x):
        return self.fc(x) * self.temperature     # [GD518] set by the training loop every step
    ```

    ## Use instead
    ```python
    self.register_buffer("temperature", torch.ones(()))
    ...
    model.mlp.temperature.fill_(new_value)        # in place: the graph reads the buffer's storage
    ```

    ## Fix
    Keep values that change after capture in device tensors updated in place, and read those.

    ## Known problems
    Attributes are followed on modules whose `forward` is the user's code (read from its source), and
    numbers the user's code sets. A number read from a global, a class attribute or a closure is followed where a
    captured forward (under `full_iteration` also the forward_step and loss function) reads it and its value
    reached a captured operation unchanged; a number read from another object is not followed.
    """

    code = "GD518"
    name = "host-value-baked"
    detected_by = DETECTED_BY
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "host value baked into the graph at capture: {detail} at {where}"
    fix_template = "Keep values that change after capture in device tensors updated in place"


class CaptureDependentBranch(RuntimeRule):
    """## What it does
    Reports user code that asks `torch.cuda.is_current_stream_capturing()` while a graph is captured: it
    answers True there and False in every eager run, so the graph records the other branch.

    ## Why is this bad?
    Code that skips work, picks another kernel or another formula when it is being captured makes every
    replay run what eager never runs (failure mode 4, "eager-only control flow baked into the graph":
    Megatron-Bridge#3076, TransformerEngine#1204). A capture-only branch is sometimes deliberate (a
    host sync skipped), but whatever it changes numerically is then always changed under graphs.

    ## Example
    ```python
    if not torch.cuda.is_current_stream_capturing():   # [GD519]
        out = out * self.gain
    ```

    ## Use instead
    ```python
    out = out * self.gain      # the same arithmetic in eager and captured runs
    ```

    ## Fix
    Compute the same thing whether or not a graph is being captured; branch only around host work.
    """

    code = "GD519"
    name = "capture-dependent-branch"
    detected_by = DETECTED_BY
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "code branches on whether a graph is being captured: {detail} at {where}"
    fix_template = "Compute the same thing whether or not a graph is being captured"


class GraphBufferKept(RuntimeRule):
    """## What it does
    Reports a hook the user's code registered (`Tensor.register_hook`, `register_forward_hook`,
    `register_full_backward_hook`) that keeps a reference to a tensor it receives, when a later call of
    the same hook (the next micro-batch, the next replay) receives a tensor in that same storage while the
    kept one is still alive.

    ## Why is this bad?
    Under graphs, the tensors a hook receives are often a graph's static buffers: Megatron's `local`
    backward returns one static input-gradient buffer for every micro-batch
    (`runner.static_grad_inputs`), a replay rewrites its outputs in place. A kept reference then no
    longer holds its own values: deferred sums over micro-batches become n times the last one
    (pytorch#181723, TransformerEngine#2937, failure mode 5), and activations kept for logging all show
    the last replay's.

    ## Example
    ```python
    def keep(grad):
        self.kept.append(grad)          # [GD520] a reference into the graph's buffer
    output.register_hook(keep)
    ```

    ## Use instead
    ```python
    def keep(grad):
        self.kept.append(grad.clone())  # the values, not the buffer
    ```

    ## Fix
    Keep copies (`clone()`) of the tensors a hook receives, not references.
    """

    code = "GD520"
    name = "graph-buffer-kept"
    detected_by = DETECTED_BY
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "a hook keeps references to a graph's buffers: {detail} at {where}"
    fix_template = "Keep copies (clone()) of the tensors a hook receives, not references"


class Fp8StateRebound(RuntimeRule):
    """## What it does
    Reports FP8 state of a Transformer Engine module that stops being the tensor a CUDA graph captured: a
    delayed-scaling `scale` or `amax_history`, a quantizer's `scale` or `amax`, or an FP8 weight's data or
    scale inverse replaced by a new tensor after capture (`quantizer.scale = torch.ones(...)`, a recipe
    state rebuilt, an amax history resized by a new `fp8_amax_history_len`, a checkpoint loaded into FP8
    weights by assignment). The graphed child names the module, the tensor and the step, and the user's
    `file:line` where it made the assignment.

    ## Why is this bad?
    A graph quantizes with the scale tensors it captured and writes amaxes into the history it captured.
    After a replacement, eager quantizes with the new tensor and the graph with the old one, which Transformer
    Engine keeps updating: the FP8 GEMMs of the two runs use other scales and training drifts without an
    error. Transformer Engine's own graphs must be made with FP8 enabled and their amax and scale state
    updated per step (`make_graphed_callables(enabled=True)`); FP8 weights loaded from a checkpoint after
    graphs were made gave graphed garbage in Megatron-LM#6036 (fixed by Megatron-LM PR#6038 and
    TransformerEngine PR#3123; failure mode 25).

    ## Example
    ```python
    for quantizer in module.quantizers["scaling_fwd"]:
        quantizer.scale = torch.ones_like(quantizer.scale)   # [GD521] a new tensor after capture
    ```

    ## Use instead
    ```python
    module.fp8_meta["scaling_fwd"].scale.fill_(1.0)        # in place: the graph reads this storage
    module.fp8_meta["scaling_fwd"].amax_history.zero_()
    ```

    ## Fix
    Change FP8 state in place (`copy_`, `fill_`, `zero_`), or change it before the graphs are captured; load
    checkpoints before capture.

    ## Known problems
    The replacement is seen at the end of a step (the module and tensor), and at the assignment where the
    user's code assigns a quantizer's or recipe state's tensor attribute (the line). A change inside Transformer
    Engine names no line. `full_iteration` replays skip the forward_step's Python, so an assignment there never
    runs under that implementation.
    """

    code = "GD521"
    name = "fp8-state-rebound"
    detected_by = "`graphdoctor diff` (the graphed child's FP8 state watch and witness)"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "FP8 state replaced after capture: {detail} at {where}"
    fix_template = "Change FP8 state in place (copy_, fill_, zero_) or before the graphs are captured"


class CapturedTensorRebound(RuntimeRule):
    """## What it does
    Reports a tensor a CUDA graph read when it was captured that its holder later replaced by a new tensor,
    wherever the holder is: the optimizer (Megatron's fp16 loss scaler: `DynamicGradScaler.update` rebinds
    `self._scale` on every back-off and growth, `grad_scaler.py:143` and `:153` in megatron-core 0.19.2), a
    parameter group, a TransformerConfig callback (`grad_scale_func`), a closure cell or a global of the
    forward_step or loss function, a class attribute, a model module's attribute set by library code. The graphed
    child takes each captured graph's external inputs (the tensors its operations read that the capture did not
    allocate), names each by the path that held it (`optimizer.chained_optimizers[0].grad_scaler._scale`,
    `forward_step.<closure>.w`, `mymodule.AUX`), checks every path after every step, and names the line that
    rebound it and whether the captured tensor is still alive. The generator states of Megatron's RNG tracker,
    which Megatron's graphs register, are watched the same way (`rng_tracker.states_['model-parallel-rng']`,
    replaced by `model_parallel_cuda_manual_seed` after the capture): replays keep drawing from the registered
    states, so the dropout masks differ from eager's.

    ## Why is this bad?
    A graph replays the device addresses it captured. After the rebinding eager reads the new tensor and every
    replay the old one. If the old tensor is freed, the caching allocator hands its memory to whatever asks next,
    so what the graphed run computes depends on allocation order; if it is alive, the graph reads stale values.
    Nothing fails. Under `full_iteration` with fp16 and Megatron's dynamic loss scaler, the captured step keeps
    multiplying the loss by the scale it read at capture: measured on an H200, eager takes its first optimizer
    update at step 15 and the graphed run at step 16, and the losses differ from then on.

    ## Example
    ```python
    def update_schedule(optimizer, args, kwargs):          # runs after every optimizer step
        global AUX_WEIGHT
        AUX_WEIGHT = torch.full((), next_weight(), device="cuda")   # [GD522] a new tensor after capture
    ```

    ## Use instead
    ```python
    AUX_WEIGHT.fill_(next_weight())       # in place: the graph reads this storage
    ```

    ## Fix
    Update tensors a graph reads in place (`copy_`, `fill_`). For Megatron's fp16 loss scaler: train in bf16,
    set a static loss scale (`--loss-scale`), or graph with `local` or `transformer_engine`, which keep the loss
    scaling outside the graph.

    ## Known problems
    Operations outside PyTorch's dispatcher (Transformer Engine's extension kernels) are not seen as reads. The
    assignment's line is seen where it runs when the holder is an attribute of a Python object; for a global, a
    closure cell, a dictionary entry or a class attribute it is the assignment found in the user's source files.
    A module attribute the user's code rebinds is GD509.
    """

    code = "GD522"
    name = "captured-tensor-rebound"
    detected_by = "`graphdoctor diff` (the graphed child's watch of every tensor a graph read, traced to its holder)"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "a tensor a graph read was rebound after capture: {detail} at {where}"
    fix_template = "Update tensors a graph reads in place (copy_, fill_), or keep them out of the graph"
