"""GD513-GD517 runtime rules of the run schedule: what only a run that evaluates, logs and exits shows.
Metadata only: `graphdoctor diff` compares every phase (graphdoctor.compare.phases) and names these
rules in the implementation's notes with the phase (train, eval, capture, exit); GD517 is the `hang`
verdict's rule.
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


class LoggedValueAtCapture(RuntimeRule):
    """## What it does
    Reports a logged value (a reported or Megatron tracker value such as the MoE `z_loss` or
    `load_balancing_loss`) that differs from eager's only at the graphed run's capture iteration,
    while the loss, every gradient and every parameter match there and every replay step's logged
    values match. `graphdoctor diff` then gives `match` with this note instead of a divergence.

    ## Why is this bad?
    It is not a training error: the iteration that captures runs the captured code several times.
    megatron-core 0.19.2's `local` graphs run warmup forward passes and then the capture pass
    (`cuda_graphs.py:1137` `create_fwd_graph`: the "warmup again" loop at `:1258`, then capture), and every pass adds
    the router's aux and z-loss to the MoE aux-loss tracker (`moe_utils.py:1027` `save_to_aux_losses_tracker`).
    The value logged at that iteration is a sum over those passes (2.9x eager's on the H200 record,
    `fixtures/data/moe/`), so Megatron-LM logs inflated aux and z-losses at the capture iteration
    (cf. Megatron-LM#1494) while the step itself computes what eager computes.

    ## Example
    ```yaml
    transformer: {num_moe_experts: 4, moe_router_topk: 2, moe_aux_loss_coeff: 0.01,
                  moe_z_loss_coeff: 0.001, cuda_graph_impl: local}   # [GD515] at the capture step
    ```

    ## Use instead
    ```python
    # after the capture iteration (Megatron's create_cudagraphs), before logging the next one
    clear_aux_losses_tracker()          # megatron.core.transformer.moe.moe_utils:1061
    ```

    ## Fix
    Ignore the aux losses logged at the capture iteration, or clear the tracker after capture.

    ## Known problems
    Severity info: the row stays `match` and diff's exit code 0. A value that differs at a replay or
    eager step is still a divergence (and a value frozen over replays is GD513).
    """

    code = "GD515"
    name = "logged-value-at-capture"
    detected_by = "`graphdoctor diff` (every reported and tracker value compared per step and phase)"
    severity = Severity.INFO
    fix = FixAvailability.SOMETIMES
    template = "logged value differs only at the capture iteration: {detail} at {where}"
    fix_template = "Ignore the aux losses logged at the capture iteration, or clear the tracker after capture"


class TeardownHang(RuntimeRule):
    """## What it does
    Reports a process of a run that wrote its results but did not exit within the teardown bound (20 s):
    `torch.distributed.destroy_process_group()` waited. `graphdoctor diff` releases the graphs Megatron-Core
    holds first (`cuda_graphs.py:681` `delete_cuda_graphs`, full_iteration's `FullCudaGraphWrapper.cuda_graph`,
    `TECudaGraphHelper.delete_cuda_graphs` at `cuda_graphs.py:2769`), counts the `torch.cuda.CUDAGraph`
    objects still alive, and dumps every rank's stack when the bound passes.

    ## Why is this bad?
    A CUDA graph that captured NCCL work keeps its communicator's resources alive; destroying the process
    group then waits for ever (pytorch#115388). The training job finishes and never exits, holding its
    GPUs (Megatron-Bridge#2955: hangs after the final validation with TP > 1 and graphs; Megatron-LM#2130
    and Megatron-Bridge#1185: full-iteration jobs that hang at the end of training). On two H200s, TP = 2
    runs of megatron-core 0.19.2 with `local` and `full_iteration` graphs still alive hung in
    `destroy_process_group` on both ranks.

    ## Example
    ```python
    train(model)                               # graphs captured with TP all-reduces inside
    torch.distributed.destroy_process_group()  # [GD516] waits for the communicator the graphs hold
    ```

    ## Use instead
    ```python
    train(model)
    from megatron.core.transformer.cuda_graphs import delete_cuda_graphs
    delete_cuda_graphs()                       # and reset any graph your own code keeps
    gc.collect()
    torch.distributed.destroy_process_group()
    ```

    ## Fix
    Reset or delete the CUDA graphs (and their memory pools) before destroy_process_group.

    ## Known problems
    The run's verdict stands (its results were written before the exit), but the exit code is 1: the job
    would not have ended. A graph kept by code outside Megatron-Core is counted (`graphs_alive`) but not
    named.
    """

    code = "GD516"
    name = "teardown-hang"
    detected_by = "`graphdoctor diff` (every rank's exit bounded by a watchdog after its results are written)"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "process did not exit after its results: {detail} at {where}"
    fix_template = "Reset or delete the CUDA graphs (and their memory pools) before destroy_process_group"


class RankDivergentCollective(RuntimeRule):
    """## What it does
    Reports a multi-process run in which a rank waits in a collective (or a CUDA synchronize behind one)
    when the run's timeout passes: `graphdoctor diff` asks every rank for its Python stack before the kill
    and names each rank's phase (warmup, capture, replay), last finished step and where it waited.

    ## Why is this bad?
    A collective that one rank issues and another does not (a rank-dependent branch, an extra
    all-reduce on rank 0, a capture that only some ranks reach) waits for ever. Inside a graph it is
    worse: a collective captured on one rank and not another waits at every replay, and NCCL's own
    timeout may not fire for a graphed collective. Megatron users report such hangs after evaluation with
    TP > 1 (Megatron-Bridge#2955) and in the MoE token dispatcher right after capture (Megatron-Bridge#3517).

    ## Example
    ```python
    if torch.distributed.get_rank() == 0:
        torch.distributed.all_reduce(output)   # [GD517] rank 1 never joins
    ```

    ## Use instead
    ```python
    torch.distributed.all_reduce(output)       # every rank, same order, inside and outside graphs
    ```

    ## Fix
    Make every rank issue the same collectives in the same order, inside and outside the graphed region
    (a collective one rank captures and another does not waits forever at replay).

    ## Known problems
    Found at the run's timeout (`--timeout`), not before; the planted GPU fixture is
    `fixtures/planted/rank0_allreduce.py`.
    """

    code = "GD517"
    name = "rank-divergent-collective"
    detected_by = "`graphdoctor diff` (every rank's stack at the run's timeout)"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "ranks wait in different collectives: {detail} at {where}"
    fix_template = ("Make every rank issue the same collectives in the same order, inside and outside the "
                    "graphed region (a collective one rank captures and another does not waits forever at replay)")


__all__ = ["EvalAfterTrainDivergence", "FrozenLoggedValue", "LoggedValueAtCapture", "RankDivergentCollective",
           "TeardownHang"]
