"""GD513-GD514 runtime rules of the run schedule: what only a run that evaluates and logs shows.
Metadata only: `graphdoctor diff` compares every phase (graphdoctor.compare.phases) and names these
rules in the implementation's notes with the phase (train, eval).
"""

from __future__ import annotations

from graphdoctor.checks.gd5xx_runtime import RuntimeRule

from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "runtime"


class FrozenLoggedValue(RuntimeRule):
    """## What it does
    Reports a logged value (a key of the loss function's reported dict, or a Megatron tracker value such
    as the MoE `load_balancing_loss` of `moe_logging.py`'s MoEMetricsTracker) that stays the same number
    at every replay step while the eager run's value changes over those steps.

    ## Why is this bad?
    A value computed on the host (a Python float, a step counter, a host tensor) and turned into a
    device constant while a graph is captured is baked into the graph; every replay reports the
    capture-time value. Training may still match, so only the logs are wrong (Megatron-LM#1494: MoE
    load-balancing loss logged wrong under graphs; Megatron-Bridge#3076).

    ## Example
    ```python
    seen = torch.full((), float(self.num_calls), device="cuda")   # [GD513]
    return loss, {"lm loss": loss.detach(), "calls": seen}
    ```

    ## Use instead
    ```python
    self.num_calls_t += 1                 # a device tensor updated in place, captured as a kernel
    return loss, {"lm loss": loss.detach(), "calls": self.num_calls_t.clone()}
    ```

    ## Fix
    Compute the logged value on the device from tensors the graph reads, or log it outside the graph.
    """

    code = "GD513"
    name = "frozen-logged-value"
    detected_by = "`graphdoctor diff` (every reported and tracker value compared per step)"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    template = "logged value frozen at capture: {detail} at {where}"
    fix_template = "Compute the logged value on the device from tensors the graph reads"


class EvalAfterTrainDivergence(RuntimeRule):
    """## What it does
    Reports an evaluation (Megatron's forward-only schedule in eval mode, between training steps or
    after the last one) whose loss or reported values differ from eager's.

    ## Why is this bad?
    Evaluation that replays a graph captured for training keeps training-mode behaviour (dropout, the
    training graph's static buffers): megatron-core 0.19.2's local runners are reused whenever grad is
    off (`cuda_graphs.py:1881-1890`, GD402), and a module that caches its own graph across modes does
    the same. Validation losses are then wrong, or the training step after the evaluation reads
    buffers the evaluation overwrote.

    ## Example
    ```python
    if self.graph is None:                 # one graph for train and eval   # [GD514]
        self.graph = capture(self.forward_train)
    ```

    ## Use instead
    ```python
    mode = "train" if self.training else "eval"
    if self.graphs.get(mode) is None:
        self.graphs[mode] = capture(self.forward_train if self.training else self.forward_eval)
    ```

    ## Fix
    Keep separate graphs for training and evaluation (full_iteration does: `full_cuda_graph.py:98-143`,
    Megatron-LM#6992), or evaluate eagerly.
    """

    code = "GD514"
    name = "eval-after-train-divergence"
    detected_by = "`graphdoctor diff --eval-interval K` (evaluation losses compared per evaluation)"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "evaluation differs from eager: {detail} at {where}"
    fix_template = "Keep separate graphs for training and evaluation, or evaluate eagerly"


__all__ = ["EvalAfterTrainDivergence", "FrozenLoggedValue"]
