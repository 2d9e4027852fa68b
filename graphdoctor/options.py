"""One option table for `graphdoctor diff` and the pytest plugin (`--gd-` prefix).

Each row names a DiffConfig field; click options and pytest `addoption` calls are both rendered from
it, so the two surfaces cannot drift apart (a test compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from graphdoctor.config import IMPLS, DiffConfig

_DEFAULTS = {f.name: f.default for f in fields(DiffConfig) if not callable(f.default)}


@dataclass(frozen=True, slots=True)
class Option:
    """One user-facing option."""

    name: str
    """Flag name without dashes or prefix, e.g. `num-layers`."""

    field: str | None
    """DiffConfig field it sets (None for options that are not config, e.g. json)."""

    type: type
    """int, float, str or bool (bool options are on/off flag pairs)."""

    help: str
    """Help text; the default is appended."""

    metavar: str = ""
    """Placeholder shown in --help."""

    default_text: str | None = None
    """What --help shows as the default when the raw default says nothing (None, empty)."""

    @property
    def default(self) -> Any:
        """Default from DiffConfig (None: unset, the run file or DiffConfig decides)."""
        if self.field is None:
            return None
        value = _DEFAULTS.get(self.field)
        if self.field in ("impls", "cuda_graph_modules", "allow_env", "recompute_modules"):
            return ",".join(value)  # type: ignore[arg-type]
        return value

    @property
    def help_text(self) -> str:
        """Help ending in 'Default: ...'."""
        if self.default_text is not None:
            return f"{self.help} Default: {self.default_text}."
        default = self.default
        shown = "off" if default is False else ("on" if default is True else
                                                 ("none" if default is None else default))
        return f"{self.help} Default: {shown}."


DIFF_OPTIONS: tuple[Option, ...] = (
    Option("megatron-args", "megatron_args", str,
           "A Megatron-LM launch line, @FILE (a torchrun line, a whole shell script, a functional test's "
           "model_config.yaml) or '@FILE FLAGS' (flags over the file): read by Megatron-LM's own parser and "
           "validation and built as Megatron builds it; the other options and the run file go over it; flags "
           "that do not reach the model are listed once (docs/diff.md).",
           "ARGS|@FILE"),
    Option("impl", "impls", str, f"Comma-separated graphed implementations ({', '.join(IMPLS)}).",
           "LIST"),
    Option("num-layers", "num_layers", int, "Transformer layers.", "N"),
    Option("hidden-size", "hidden_size", int, "Hidden size.", "N"),
    Option("num-attention-heads", "num_attention_heads", int, "Attention heads.", "N"),
    Option("seq-length", "seq_length", int, "Sequence length.", "N"),
    Option("micro-batch-size", "micro_batch_size", int, "Sequences per micro-batch.", "N"),
    Option("num-microbatches", "num_microbatches", int, "Micro-batches per step.", "N"),
    Option("eval-interval", "eval_interval", int,
           "Evaluate after every K training steps and after the last (forward-only, eval mode, no "
           "grad); 0: no evaluation.", "K"),
    Option("eval-iters", "eval_iters", int, "Forward-only iterations per evaluation.", "E"),
    Option("save-at", "save_at", int,
           "Save a Megatron distributed checkpoint (model, optimizer, RNG states) after S training "
           "steps; 0: none.", "S"),
    Option("resume", "resume", bool,
           "End each run at the --save-at checkpoint and train on in a fresh process that loads it "
           "(graphs captured again); the steps after the resume are compared like every other.", ""),
    Option("recompute-granularity", "recompute_granularity", str,
           "TransformerConfig.recompute_granularity: full or selective.", "G", default_text="unset"),
    Option("recompute-method", "recompute_method", str,
           "TransformerConfig.recompute_method for full recompute: uniform or block.", "M",
           default_text="unset"),
    Option("recompute-num-layers", "recompute_num_layers", int,
           "TransformerConfig.recompute_num_layers for full recompute.", "N", default_text="unset"),
    Option("recompute-modules", "recompute_modules", str,
           "Comma-separated TransformerConfig.recompute_modules for selective recompute "
           "(core_attn, mlp, moe, ...).", "LIST", default_text="unset"),
    Option("vocab-size", "vocab_size", int, "Vocabulary size.", "N"),
    Option("dtype", "dtype", str, "fp32, bf16 or fp16.", "DTYPE"),
    Option("loss-scale", "loss_scale", float,
           "fp16's static loss scale (Megatron-LM's --loss-scale); another dtype ignores it, with a warning.", "X",
           default_text="Megatron's dynamic loss scaler"),
    Option("fp8-format", "fp8_format", str,
           "Train in FP8 (Megatron-LM's --fp8-format): e4m3 or hybrid; needs Transformer Engine's layers "
           "(--layer-spec te) (docs/fp8.md).", "FORMAT", default_text="the model's own (off)"),
    Option("fp8-recipe", "fp8_recipe", str,
           "FP8 recipe (--fp8-recipe): delayed, tensorwise, blockwise or mxfp8.", "RECIPE",
           default_text="the model's own (delayed)"),
    Option("fp8-param-gather", "fp8_param_gather", bool,
           "FP8 primary weights (Megatron-LM's --fp8-param-gather; needs --use-distributed-optimizer).", ""),
    Option("dropout", "dropout", float,
           "hidden and attention dropout; > 0 adds a dropout-free control pair.", "P"),
    Option("steps", "steps", int, "Training steps per run.", "N"),
    Option("seed", "seed", int, "Seed for init, batches and RNG.", "N"),
    Option("cuda-graph-warmup-steps", "cuda_graph_warmup_steps", int,
           "Megatron cuda_graph_warmup_steps.", "N"),
    Option("rtol", "rtol", float, "Relative tolerance (0 and atol 0: bitwise).", "X"),
    Option("atol", "atol", float, "Absolute tolerance (0 and rtol 0: bitwise).", "X"),
    Option("strict-rng", "strict_rng", bool, "Count rng-divergence as a failure.", ""),
    Option("timeout", "timeout_s", float, "Seconds allowed for each child run.", "SECONDS"),
    Option("jobs", "jobs", int,
           "Child runs at a time (eager and graphed together; timed steps still run alone on their "
           "GPU); 1: in series.", "N",
           default_text="one per GPU; on one GPU as many as fit in its memory, up to one per two CPU "
                        "cores and 8"),
    Option("layer-spec", "layer_spec", str,
           "local (Megatron's local GPT spec), te (its Transformer Engine spec) or pkg.mod:fn "
           "returning the transformer layer ModuleSpec.", "SPEC", default_text="local"),
    Option("cuda-graph-modules", "cuda_graph_modules", str,
           "Comma-separated cuda_graph_modules for local and transformer_engine (attn, mlp, "
           "moe_router, moe_preprocess, ...; refused where only full_iteration runs); empty: whole layer.", "LIST",
           default_text="whole layer"),
    Option("model-provider", "model_provider", str,
           "pkg.mod:fn(config, vocab_size=, max_sequence_length=, ...) returning the model.",
           "PKG.MOD:FN"),
    Option("forward-step", "forward_step", str,
           "pkg.mod:fn(data_iterator, model) -> (output, loss_func).", "PKG.MOD:FN"),
    Option("memory", "memory", bool, "Record allocator history and snapshots in graphed runs.", ""),
    Option("launches", "launches", bool,
           "Profile the last step: launch counts eager vs graphed and a graph census.", ""),
    Option("trace", "trace_dir", str, "Write one Chrome trace per run (Perfetto) into DIR.", "DIR"),
    Option("snapshots", "snapshot_dir", str,
           "Write memory snapshots of graphed runs into DIR (for graphdoctor triage).", "DIR"),
    Option("localize", "localize", bool,
           "Taps that fingerprint dropout masks, random draws, module outputs and gradients "
           "inside graphs; --no-localize never taps.", "",
           default_text="a tapped pair runs only after a divergence"),
    Option("align-rng", "align_rng", bool,
           "Restore RNG states around warmup and capture so graphed dropout matches eager.", ""),
    Option("allow-env", "allow_env", str,
           "Comma-separated run-file env: keys that change how Python or the loader start "
           "(PYTHONPATH, LD_PRELOAD, ...) to pass to the children anyway.", "NAMES",
           default_text="none: such keys are refused"),
    Option("deterministic", "deterministic", bool,
           "Deterministic algorithms (warn-only) and cuDNN determinism in every run.", ""),
    Option("nproc-per-node", "nproc_per_node", int,
           "GPUs (processes) of every child run; > 1 starts its ranks with torch.distributed.run "
           "(docs/multi-gpu.md).", "N"),
    Option("fit", "fit", bool,
           "Shrink the launch line's or config's placement (tensor, pipeline and its layout, expert, "
           "expert-tensor, context) and its micro-batches per step to the GPUs at hand (--nproc-per-node, else "
           "the visible GPUs), keeping every kind of layer; prints what changed and why.", ""),
    Option("tensor-model-parallel-size", "tensor_model_parallel_size", int,
           "Megatron tensor-parallel size; must divide the heads and, with the pipeline size, nproc-per-node.",
           "T"),
    Option("pipeline-model-parallel-size", "pipeline_model_parallel_size", int,
           "Megatron pipeline-parallel size; must divide the layers.", "P"),
    Option("expert-model-parallel-size", "expert_model_parallel_size", int,
           "Megatron expert-parallel size (MoE experts sharded over the data-parallel ranks); must divide the "
           "experts and the ranks of a pipeline stage.", "E"),
    Option("expert-tensor-parallel-size", "expert_tensor_parallel_size", int,
           "Megatron expert tensor-parallel size.", "N", default_text="the tensor-parallel size"),
    Option("sequence-parallel", "sequence_parallel", bool,
           "Megatron sequence parallelism (tensor-parallel size > 1).", ""),
    Option("overlap-grad-reduce", "overlap_grad_reduce", bool,
           "Megatron DDP overlap_grad_reduce.", ""),
    Option("use-distributed-optimizer", "use_distributed_optimizer", bool,
           "Megatron's distributed optimizer (sharded over data-parallel ranks).", ""),
    Option("ddp-bucket-size", "ddp_bucket_size", int, "Megatron DDP bucket size in elements.", "N",
           default_text="Megatron's"),
)


def click_options(options: tuple[Option, ...], prefix: str = "") -> Callable[[Any], Any]:
    """Decorator adding every option as a click option (bool -> --x/--no-x)."""
    import click

    def decorate(func: Any) -> Any:
        for opt in reversed(options):
            flag = f"--{prefix}{opt.name}"
            dest = opt.field or opt.name.replace("-", "_")
            if opt.type is bool:
                decl = f"{flag}/--no-{prefix}{opt.name}"
                func = click.option(decl, dest, default=None, help=opt.help_text)(func)
            else:
                func = click.option(flag, dest, type=opt.type, default=None,
                                    metavar=opt.metavar, help=opt.help_text)(func)
        return func

    return decorate


def add_pytest_options(group: Any, options: tuple[Option, ...] = DIFF_OPTIONS,
                      prefix: str = "gd-") -> None:
    """Add every option to a pytest option group with the `--gd-` prefix."""
    for opt in options:
        dest = f"gd_{opt.field}"
        if opt.type is bool:
            group.addoption(f"--{prefix}{opt.name}", dest=dest, action="store_const", const=True,
                            default=None, help=opt.help_text)
            group.addoption(f"--no-{prefix}{opt.name}", dest=dest, action="store_const",
                            const=False, default=None, help=f"Turn --{prefix}{opt.name} off.")
        else:
            group.addoption(f"--{prefix}{opt.name}", dest=dest, type=opt.type, default=None,
                            metavar=opt.metavar, help=opt.help_text)


__all__ = ["DIFF_OPTIONS", "Option", "click_options", "add_pytest_options"]
