"""DiffConfig: everything one `graphdoctor diff` needs, validated on creation (graphdoctor's run settings and
the model it builds); the same object drives the CLI, the Python API and the pytest plugin."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from graphdoctor.config.builtin import DTYPE_FIELDS, graph_fields, moe_defaults
from graphdoctor.config.codec import encode
from graphdoctor.config.description import TRANSFORMER_CLASSES, ModelDescription
from graphdoctor.config.entry_points import BUILTIN_LAYER_SPECS, check_entry_point
from graphdoctor.config.fp8 import fp8_fields, initialisation
from graphdoctor.config.graph_settings import MODULE_NAMES as CUDA_GRAPH_MODULES
from graphdoctor.config.impl import GRAPHED, Impl
from graphdoctor.config.placement import check_placement
from graphdoctor.config.twins import BUILTIN_SPECS, BY_FIELD, OWNED, RUN_OWNED_NAMES, megatron_of
from graphdoctor.errors import UsageError
from graphdoctor.inputs import describe

DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")

TRANSFORMER_TWINS: tuple[str, ...] = tuple(twin.field for twin in OWNED if twin.names == (twin.field,))
"""TransformerConfig fields that DiffConfig has under the same name (config.twins, `transformer=True` rows). The
DiffConfig field owns the value: a run file's `transformer:` value fills it unless `run:` or a flag sets it
(diff_config_from), and the mapping's copy is then made to agree, so the model the child builds, the placement
graphdoctor starts and checks, and the report all say the same."""

GRAPH_FIELDS: tuple[str, ...] = ("cuda_graph_impl", "enable_cuda_graph", "external_cuda_graph", "cuda_graph_scope",
                                 "cuda_graph_modules")
"""TransformerConfig's CUDA-graph settings. Each child sets its own (the eager reference none); a run file's
values under `transformer:` choose `impls` and `cuda_graph_modules` instead, as a launch line's --cuda-graph-impl
does, and leave the mapping (once they reached every child: `enable_cuda_graph: true` graphed the eager
reference)."""

RUN_OWNED_FIELDS: frozenset[str] = frozenset({*RUN_OWNED_NAMES, *GRAPH_FIELDS})
"""TransformerConfig fields a child takes from DiffConfig and its own request (dropout, impl), never from
`transformer:`: the twins, the graph settings, the dropouts (`dropout`) and the precision flags (`dtype`)."""
IMPLS: tuple[str, ...] = tuple(impl.value for impl in GRAPHED)
"""The graphed implementations diff runs (config.impl.GRAPHED, as plain names): DiffConfig.impls' choices and its
default, every one compared against eager."""


@dataclass(kw_only=True, slots=True)
class DiffConfig:
    """Everything one `graphdoctor diff` needs; the same object drives the CLI and the Python API."""

    impls: tuple[str, ...] = IMPLS
    """Graphed implementations to compare against eager."""

    num_layers: int = 4
    """Transformer layers of the built-in GPT model."""

    hidden_size: int = 256
    """Hidden size of the built-in GPT model."""

    num_attention_heads: int = 8
    """Attention heads of the built-in GPT model."""

    seq_length: int = 128
    """Sequence length of every micro-batch."""

    micro_batch_size: int = 2
    """Sequences per micro-batch."""

    num_microbatches: int = 1
    """Micro-batches per training step (gradient accumulation), and per evaluation iteration."""

    eval_interval: int = 0
    """Evaluate after every `eval_interval` training steps and once after the last step (Megatron's
    forward-only schedule, model.eval(), no grad); 0: no evaluation."""

    eval_iters: int = 2
    """Forward-only iterations per evaluation (Megatron-LM's --eval-iters)."""

    save_at: int = 0
    """Save a Megatron distributed checkpoint after `save_at` training steps; 0: none."""

    resume: bool = False
    """End each run at that checkpoint and train on in a fresh process that loads it (needs save_at)."""

    recompute_granularity: str | None = None
    """TransformerConfig.recompute_granularity (full or selective); None: the run file's or Megatron's."""

    recompute_method: str | None = None
    """TransformerConfig.recompute_method (uniform or block) for full recompute."""

    recompute_num_layers: int | None = None
    """TransformerConfig.recompute_num_layers for full recompute."""

    recompute_modules: tuple[str, ...] = ()
    """TransformerConfig.recompute_modules for selective recompute (e.g. core_attn, mlp); empty: unset."""

    vocab_size: int = 1024
    """Vocabulary size of the built-in GPT model and of the synthetic batches."""

    dtype: str = "fp32"
    """Parameter and compute dtype: fp32, bf16 (Float16Module) or fp16 (Float16Module)."""

    loss_scale: float | None = None
    """fp16's static loss scale (Megatron-LM's --loss-scale, OptimizerConfig.loss_scale); None: Megatron's dynamic
    loss scaler (initial scale 2^32, hysteresis 2, growth every 1000 steps). Only fp16 scales the loss: with
    another dtype it has no effect, which __post_init__ warns of (UserWarning) before it drops the value."""

    dropout: float = 0.1
    """hidden_dropout and attention_dropout (Megatron's default is 0.1)."""

    fp8_format: str | None = None
    """TransformerConfig.fp8 (Megatron-LM's --fp8-format): e4m3 or hybrid; None: the model's own (off for
    graphdoctor's model). FP8 runs in Transformer Engine's layers (layer_spec `te`)."""

    fp8_recipe: str | None = None
    """TransformerConfig.fp8_recipe (--fp8-recipe): delayed, tensorwise, blockwise or mxfp8; None: the model's
    own (Megatron's default delayed)."""

    fp8_param_gather: bool = False
    """FP8 primary weights (Megatron-LM's --fp8-param-gather, TransformerConfig.fp8_param): the model is built
    under Transformer Engine's fp8_model_init; needs the distributed optimizer (Megatron-LM's validate_args)."""

    gpu_init: bool = True
    """Initialise the weights on the GPU (graphdoctor.child.weights): Megatron's own init methods, each tensor filled
    again from a seed of its own (the seed, its name, this rank), so every child starts from the same weights
    whatever RNG tracker its graphs need; False (run file `run: {gpu_init: false}`): on the CPU from the seed
    (Megatron's use_cpu_initialization), minutes at full width. FP8 primary weights are initialised on the GPU
    either way."""

    steps: int = 8
    """Training steps per run; each step sees a different batch."""

    seed: int = 1234
    """Seed for model init, batches and the RNG tracker (the same on both sides)."""

    cuda_graph_warmup_steps: int = 2
    """TransformerConfig.cuda_graph_warmup_steps for the graphed runs."""

    rtol: float = 0.0
    """Relative tolerance; 0 with atol 0 means bitwise comparison."""

    atol: float = 0.0
    """Absolute tolerance; 0 with rtol 0 means bitwise comparison."""

    strict_rng: bool = False
    """Treat `rng-divergence` as a failure (exit code 1)."""

    timeout_s: float = 300.0
    """Wall-clock limit for each child run; a run that exceeds it gets the verdict `timeout`."""

    jobs: int = 0
    """Child runs holding GPU memory at a time: 0 decides (one per GPU when several are visible; on one GPU as
    many as its memory holds, up to one per two CPU cores and 8; else one); 1 runs them in series."""

    layer_spec: str | None = None
    """`local` (Megatron's local GPT spec, the default), `te` (get_gpt_layer_with_transformer_engine_spec,
    needs Transformer Engine) or `pkg.mod:fn` returning the transformer layer ModuleSpec."""

    cuda_graph_modules: tuple[str, ...] = ()
    """TransformerConfig.cuda_graph_modules for local and transformer_engine (empty: whole layer;
    e.g. attn, mlp, moe_router, moe_preprocess); full_iteration always graphs the whole step."""

    graph_layers: tuple[int, ...] = ()
    """Decoder layers (0-based) that `local` and `transformer_engine` graph; empty: every layer
    (Megatron's behaviour). `graphdoctor advise` sets it to bisect a divergence layer by layer."""

    localize: bool | None = None
    """Capture-time taps (dropout masks, random draws, module outputs and gradients) on eager and
    graphed runs; True: the first runs carry them (taps_in_first_runs); None: an extra pair of runs does, only
    after a divergence; False: never."""

    align_rng: bool = False
    """Restore every RNG state around each implementation's warmup and capture, so graphed runs
    draw the same random numbers as eager and dropout runs compare bitwise."""

    model_provider: str | None = None
    """`pkg.mod:fn(config, vocab_size=, max_sequence_length=, ...)` returning the model."""

    forward_step: str | None = None
    """`pkg.mod:fn(data_iterator, model) -> (output, loss_func)`, Megatron's forward_step."""

    memory: bool = True
    """Record allocator history and snapshots around warmup, capture and replay."""

    deterministic: bool = True
    """torch.use_deterministic_algorithms(warn_only) and cuDNN determinism in every child."""

    launches: bool = True
    """Profile the last step of every run: launch accounting and a census of the graphs."""

    trace_dir: str | None = None
    """Keep the Chrome trace of every run's profiled step here (opens in Perfetto)."""

    snapshot_dir: str | None = None
    """Keep the memory snapshots of graphed runs here (gzip pickles for `graphdoctor triage`)."""

    transformer: dict[str, Any] = field(default_factory=dict)
    """Extra TransformerConfig fields from the run file's `transformer:` mapping. The copies of what DiffConfig
    owns (TRANSFORMER_TWINS, the dropouts, bf16/fp16) take the DiffConfig's values; graphdoctor's own model takes
    none of RUN_OWNED_FIELDS from here (diff_config_from reads a run file's graph settings into impls instead).
    With a `model` Megatron resolved, its TransformerConfig fields in plain form, without each child's graph
    settings: what the rule catalogue reads of the run (from_megatron.model_view); the children build `model`."""

    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set in every child run (the run file's `env:` mapping)."""

    allow_env: tuple[str, ...] = ()
    """`env:` keys that change how Python or the dynamic loader start (PYTHONPATH, LD_PRELOAD, ...)
    and are still to be passed to the children."""

    megatron_args: str | None = None
    """A Megatron-LM launch line, or `@FILE` holding one (a torchrun line or a whole shell script): the
    model, graph and run settings it sets sit under the run file's and the explicit flags' values
    (graphdoctor.config.from_megatron; docs/diff.md)."""

    launch_notes: tuple[str, ...] = ()
    """What reading megatron_args left out or decided, listed once (set by diff_config_from)."""

    nproc_per_node: int = 1
    """Processes (GPUs) of every child run; > 1 starts each child's ranks with torch.distributed.run
    (docs/multi-gpu.md)."""

    placement_refusal: str | None = None
    """Why the source's own placement does not fit the processes diff starts (without --fit): the plan describes
    the model as --fit would place it and lists this among its refusals; a run refuses it."""

    fit: bool = False
    """Shrink the model's placement (tensor, pipeline with its layout, expert, expert-tensor, context) and its
    micro-batches per step to the GPUs at hand in one step (graphdoctor.config.fit), as Megatron settings before
    Megatron validates them; only with a launch line, functional test or config file."""

    tensor_model_parallel_size: int = 1
    """Megatron tensor-parallel size T (initialize_model_parallel)."""

    pipeline_model_parallel_size: int = 1
    """Megatron pipeline-parallel size P (non-interleaved 1F1B schedule; any num_microbatches)."""

    sequence_parallel: bool = False
    """TransformerConfig.sequence_parallel (needs tensor_model_parallel_size > 1)."""

    overlap_grad_reduce: bool = False
    """Megatron DDP overlap_grad_reduce (gradient reduction overlapped with the backward pass)."""

    use_distributed_optimizer: bool = False
    """Megatron's distributed optimizer (optimizer state and the gradient reduce-scatter sharded over
    data-parallel ranks)."""

    ddp_bucket_size: int | None = None
    """Megatron DDP bucket_size in elements (None: Megatron's default)."""

    expert_model_parallel_size: int = 1
    """Megatron expert-parallel size E (MoE experts sharded over E data-parallel ranks)."""

    expert_tensor_parallel_size: int | None = None
    """Megatron expert tensor-parallel size (None: the tensor-parallel size, Megatron's default)."""

    model: ModelDescription = None  # type: ignore[assignment]  # set by __post_init__
    """The run's model: as Megatron resolved it from a launch line, functional test, Megatron-Bridge or Megatron
    config (graphdoctor.config.resolve, which sets the fields above from it), else graphdoctor's own GPT model
    (`model.builtin`), which __post_init__ derives from the fields above and `transformer:` on every creation and
    replace, so it always says what the fields say."""

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = ModelDescription.from_dict(self.model)
        own = self.model is None or self.model.builtin
        _check_impls(self.impls)
        if not isinstance(self.transformer, dict):
            raise UsageError(f"transformer: got {describe(self.transformer)}, expected a mapping of "
                             f"TransformerConfig fields")
        self.transformer = self._agreeing_transformer()
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "micro_batch_size", "num_microbatches", "vocab_size", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name}: got {value!r}, expected an integer >= 1")
        _check_schedule(self)
        if own and self.hidden_size % self.num_attention_heads:
            raise UsageError(
                f"hidden_size: got {self.hidden_size}, expected a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.dtype not in DTYPES:
            raise UsageError(f"dtype: got {self.dtype!r}, expected one of {', '.join(DTYPES)}")
        _check_fp8(self, own=own)
        if self.loss_scale is not None and (isinstance(self.loss_scale, bool)
                                            or not isinstance(self.loss_scale, (int, float)) or self.loss_scale <= 0):
            raise UsageError(f"loss_scale: got {self.loss_scale!r}, expected a number > 0 (or unset: dynamic)")
        if self.loss_scale is not None and self.dtype != "fp16":
            # stacklevel 3: past __post_init__ and the generated __init__, at whoever built the config
            warnings.warn(f"loss_scale: got {self.loss_scale!r} with dtype {self.dtype}, expected dtype fp16 (only "
                          f"fp16 scales the loss); the loss scale has no effect and is dropped", stacklevel=3)
            self.loss_scale = None  # what the children run, so the report and the specs say the same
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"dropout: got {self.dropout!r}, expected 0 <= dropout < 1")
        if self.cuda_graph_warmup_steps < 1:
            raise UsageError(
                f"cuda_graph_warmup_steps: got {self.cuda_graph_warmup_steps}, expected >= 1"
            )
        if self.steps < self.cuda_graph_warmup_steps + 2:
            raise UsageError(
                f"steps: got {self.steps}, expected >= cuda_graph_warmup_steps + 2 "
                f"({self.cuda_graph_warmup_steps + 2}) so that graphs replay at least twice"
            )
        for name in ("rtol", "atol"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name}: got {getattr(self, name)!r}, expected >= 0")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 0:
            raise UsageError(f"jobs: got {self.jobs!r}, expected an integer >= 0 (0: decide)")
        if self.timeout_s <= 0:
            raise UsageError(f"timeout_s: got {self.timeout_s!r}, expected > 0")
        for name in ("layer_spec", "model_provider", "forward_step"):
            value = getattr(self, name)
            if value is not None and not (name == "layer_spec" and value in BUILTIN_LAYER_SPECS):
                check_entry_point(name, value)
        refused = sorted(k for k in self.env if k in STARTUP_VARIABLES and k not in self.allow_env)
        if refused:
            raise UsageError(f"env: {refused[0]} changes how Python or the loader start in every child; "
                             f"expected it in --allow-env (run.allow_env) to pass it on")
        for module in self.cuda_graph_modules:
            if module not in CUDA_GRAPH_MODULES:
                raise UsageError(f"cuda_graph_modules: got {module!r}, expected one of "
                                 f"{', '.join(CUDA_GRAPH_MODULES)}")
        if self.cuda_graph_modules and not any(Impl(impl).per_module for impl in self.impls):
            # Megatron's TransformerConfig refuses the pair: full_iteration graphs the whole step, not modules.
            raise UsageError(f"cuda_graph_modules: got {', '.join(self.cuda_graph_modules)} with only "
                             f"{', '.join(self.impls)}, which graphs the whole training step (Megatron requires "
                             f"cuda_graph_modules empty with cuda_graph_impl full_iteration); expected an --impl of "
                             f"local or transformer_engine beside it, or no --cuda-graph-modules")
        if not isinstance(self.graph_layers, (list, tuple)):
            raise UsageError(f"graph_layers: got {self.graph_layers!r}, expected a list of layer indices")
        self.graph_layers = tuple(self.graph_layers)
        for layer in self.graph_layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
                raise UsageError(f"graph_layers: got {layer!r}, expected layer indices 0 to {self.num_layers - 1}")
        check_placement(self)
        if own:
            self.model = self._builtin_model()

    def _builtin_model(self) -> ModelDescription:
        """graphdoctor's own GPT model: the shape, precision, dropout and placement above, then `transformer:`'s
        fields (but what the run owns, RUN_OWNED_FIELDS), the recompute settings, the layer spec (`local`, `te`, or
        the user's `pkg.mod:fn`), weights initialised where `initialisation` says; the eager reference's graphs."""
        fields: dict[str, Any] = {
            "num_layers": self.num_layers, "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads, **initialisation(self.fp8_param_gather),
            **BY_FIELD["dropout"].to_megatron(self.dropout),
            **graph_fields(Impl.EAGER, self.cuda_graph_modules, self.cuda_graph_warmup_steps),
            **DTYPE_FIELDS[self.dtype],
            "transformer_impl": BUILTIN_SPECS.get(self.layer_spec or "local", "local"),  # pkg.mod:fn: the run file's
        }
        if self.tensor_model_parallel_size > 1:
            fields["tensor_model_parallel_size"] = self.tensor_model_parallel_size
        if self.pipeline_model_parallel_size > 1:
            fields["pipeline_model_parallel_size"] = self.pipeline_model_parallel_size
            fields["pipeline_dtype"] = fields["params_dtype"]  # Megatron asserts it is set for P > 1
        if self.expert_model_parallel_size > 1:
            fields["expert_model_parallel_size"] = self.expert_model_parallel_size
        if self.expert_tensor_parallel_size is not None:
            fields["expert_tensor_parallel_size"] = self.expert_tensor_parallel_size
        if self.sequence_parallel:
            fields["sequence_parallel"] = True
        for key, value in {**self.transformer, **self.recompute_settings()}.items():
            if key not in RUN_OWNED_FIELDS:
                fields[key] = encode(value)
        fields.update(moe_defaults(self.transformer))
        fields.update(fp8_fields(self.fp8_format, self.fp8_recipe, self.fp8_param_gather))
        spec = self.layer_spec if self.layer_spec not in (None, *BUILTIN_LAYER_SPECS) else None
        return ModelDescription(kind="gpt", transformer_class=TRANSFORMER_CLASSES[0], transformer=fields,
                                model={"vocab_size": self.vocab_size, "seq_length": self.seq_length},
                                layer_spec=spec)

    def _agreeing_transformer(self) -> dict[str, Any]:
        """The `transformer:` mapping with its copies of what this config owns made to agree with it (the twins,
        the dropouts, the precision flags), so that rules reading the mapping see what the children build."""
        owned = megatron_of(self, OWNED)
        return {key: owned.get(key, value) for key, value in self.transformer.items()}

    @property
    def taps_in_first_runs(self) -> bool:
        """Whether the eager reference and the graphed runs carry the taps themselves: only with --localize. By
        default a separate tapped pair runs after a divergence (at dropout > 0 it starts beside the first runs).
        Taps in the first runs would save those two children, but their step times would count the taps: in
        eager every operator of the step goes through the taps' dispatch mode, while a graph replays its taps'
        kernels only. tests/benchmarks/taps_cost.py at 0.54 B on an H100 measured 1.17x for eager against 1.06x
        (local) and 1.04x (full_iteration), so the speedup of tapped first runs would overstate the graphs' gain
        by about a tenth, past the 10 % of a step taps may cost a timed run (docs/forensics.md, Cost)."""
        return self.localize is True

    @property
    def bitwise(self) -> bool:
        """True when differences are judged bitwise (no tolerance)."""
        return self.rtol == 0.0 and self.atol == 0.0

    def recompute_settings(self) -> dict[str, Any]:
        """The TransformerConfig recompute fields this run sets (over the run file's `transformer:`
        values); TransformerConfig.__post_init__ validates them."""
        settings: dict[str, Any] = {name: getattr(self, name) for name in
                                    ("recompute_granularity", "recompute_method", "recompute_num_layers")
                                    if getattr(self, name) is not None}
        if self.recompute_modules:
            settings["recompute_modules"] = list(self.recompute_modules)
        return settings

    def replace(self, **changes: Any) -> DiffConfig:
        """Return a copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view for JSON reports and child specs."""
        data = dataclasses.asdict(self)
        data["impls"] = list(self.impls)
        data["cuda_graph_modules"] = list(self.cuda_graph_modules)
        data["allow_env"] = list(self.allow_env)
        data["launch_notes"] = list(self.launch_notes)
        data["graph_layers"] = list(self.graph_layers)
        data["recompute_modules"] = list(self.recompute_modules)
        data["model"] = self.model.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiffConfig:
        """Inverse of to_dict (validated again); fields this version does not know are ignored, so
        saved reports of later versions still load."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("impls", "cuda_graph_modules", "allow_env", "launch_notes", "graph_layers",
                    "recompute_modules"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


STARTUP_VARIABLES: tuple[str, ...] = (
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "PYTHONWARNINGS", "PYTHONBREAKPOINT",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PATH",
)
"""Run-file `env:` keys refused unless --allow-env names them: they change which code a child runs."""


def _check_fp8(config: DiffConfig, *, own: bool) -> None:
    """The FP8 flags: known values, a recipe or primary weights only with a format (graphdoctor's model), the
    distributed optimizer for FP8 primary weights, Transformer Engine's layers for graphdoctor's own model."""
    from graphdoctor.config.entry_points import TE_LAYER_SPECS
    from graphdoctor.config.fp8 import FP8_FORMATS, FP8_RECIPES

    if config.fp8_format is not None and config.fp8_format not in FP8_FORMATS:
        raise UsageError(f"fp8_format: got {config.fp8_format!r}, expected one of {', '.join(FP8_FORMATS)}")
    if config.fp8_recipe is not None and config.fp8_recipe not in FP8_RECIPES:
        raise UsageError(f"fp8_recipe: got {config.fp8_recipe!r}, expected one of {', '.join(FP8_RECIPES)}")
    if config.fp8_param_gather and not config.use_distributed_optimizer:
        raise UsageError("fp8_param_gather: FP8 primary weights need the distributed optimizer (Megatron-LM's "
                         "validate_args, training/arguments.py:1060); add --use-distributed-optimizer")
    if not own:
        return
    fp8 = config.fp8_format or config.transformer.get("fp8")
    if (config.fp8_recipe or config.fp8_param_gather) and not fp8:
        raise UsageError("fp8_recipe and fp8_param_gather need an FP8 format: add --fp8-format e4m3 or hybrid")
    if fp8 and config.layer_spec not in TE_LAYER_SPECS and config.model_provider is None:
        raise UsageError(f"fp8 {fp8}: FP8 runs in Transformer Engine's layers and graphdoctor's model is built "
                         f"with the {config.layer_spec or 'local'} spec; add --layer-spec te")


def _check_schedule(config: DiffConfig) -> None:
    """The run schedule's fields: evaluation, checkpoint and resume, recompute (Megatron validates the
    recompute values themselves when the TransformerConfig is built)."""
    for name, low in (("eval_interval", 0), ("eval_iters", 1)):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{name}: got {value!r}, expected an integer >= {low}")
    save_at = config.save_at
    if isinstance(save_at, bool) or not isinstance(save_at, int) or not (save_at == 0 or 0 < save_at < config.steps):
        raise UsageError(f"save_at: got {save_at!r}, expected 0 (none) or 1 to steps - 1 ({config.steps - 1})")
    if config.resume and not save_at:
        raise UsageError("resume: got true without save_at, expected --save-at S (the checkpoint to resume from)")
    if config.recompute_num_layers is not None and (
            isinstance(config.recompute_num_layers, bool) or not isinstance(config.recompute_num_layers, int)
            or config.recompute_num_layers < 1):
        raise UsageError(f"recompute_num_layers: got {config.recompute_num_layers!r}, expected an integer >= 1")
    if not isinstance(config.recompute_modules, (list, tuple)):
        raise UsageError(f"recompute_modules: got {config.recompute_modules!r}, expected a list of module names")
    config.recompute_modules = tuple(config.recompute_modules)


def _check_impls(impls: tuple[str, ...]) -> None:
    if not impls:
        raise UsageError("impls: got an empty list, expected at least one of " + ", ".join(IMPLS))
    for impl in impls:
        if impl not in IMPLS:
            raise UsageError(f"impl: got {impl!r}, expected one of {', '.join(IMPLS)}")
    if len(set(impls)) != len(impls):
        raise UsageError(f"impls: got duplicates in {list(impls)!r}, expected each implementation once")


__all__ = ["CUDA_GRAPH_MODULES", "DTYPES", "GRAPH_FIELDS", "IMPLS", "RUN_OWNED_FIELDS",
           "STARTUP_VARIABLES", "TRANSFORMER_TWINS", "DiffConfig"]
