"""Run configuration: the run file (`transformer:`, `env:`, `run:`) and DiffConfig, validated on load.

One file feeds both `graphdoctor diff --config` and `graphdoctor check --config`, with one schema
(graphdoctor.runfile_schema): strict YAML, plain values, common ranges; a non-empty `transformer:`
section is type-checked against megatron-core's TransformerConfig (imported for that only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphdoctor.entry_points import BUILTIN_LAYER_SPECS, check_entry_point
from graphdoctor.errors import InputFileError, UsageError, where_from
from graphdoctor.inputs import describe, read_text
from graphdoctor.runfile_schema import load_yaml_strict, validate_section
from graphdoctor.suggest import did_you_mean

IMPLS: tuple[str, ...] = ("local", "full_iteration", "transformer_engine")
"""Graphed implementations graphdoctor knows, in the order they are reported."""

DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")

CUDA_GRAPH_MODULES: tuple[str, ...] = ("attn", "mlp", "moe", "moe_router", "moe_preprocess",
                                       "mamba")
"""Values TransformerConfig.cuda_graph_modules accepts in megatron-core 0.19.2."""

RUN_FILE_SECTIONS: tuple[str, ...] = ("transformer", "env", "run")

TRANSFORMER_TWINS: tuple[str, ...] = ("num_layers", "hidden_size", "num_attention_heads",
                                      "tensor_model_parallel_size", "pipeline_model_parallel_size",
                                      "sequence_parallel", "cuda_graph_warmup_steps")
"""TransformerConfig fields that DiffConfig has under the same name. The DiffConfig field owns the value: a run
file's `transformer:` value fills it unless `run:` or a flag sets it (diff_config_from), and the mapping's copy
is then made to agree, so the model the child builds, the placement graphdoctor starts and checks, and the report
all say the same (a run file's tensor_model_parallel_size once reached only the child)."""

GRAPH_FIELDS: tuple[str, ...] = ("cuda_graph_impl", "enable_cuda_graph", "external_cuda_graph", "cuda_graph_scope",
                                 "cuda_graph_modules")
"""TransformerConfig's CUDA-graph settings. Each child sets its own (the eager reference none); a run file's
values under `transformer:` choose `impls` and `cuda_graph_modules` instead, as a launch line's --cuda-graph-impl
does, and leave the mapping (once they reached every child: `enable_cuda_graph: true` graphed the eager
reference)."""

RUN_OWNED_FIELDS: frozenset[str] = frozenset({*TRANSFORMER_TWINS, *GRAPH_FIELDS, "hidden_dropout",
                                              "attention_dropout", "bf16", "fp16"})
"""TransformerConfig fields a child takes from DiffConfig and its own request (dropout, impl), never from
`transformer:`: the twins, the graph settings, the dropouts (`dropout`) and the precision flags (`dtype`)."""

MAX_RUN_FILE_BYTES = 1 << 20


@dataclass(kw_only=True, slots=True)
class DiffConfig:
    """Everything one `graphdoctor diff` needs; the same object drives the CLI and the Python API."""

    impls: tuple[str, ...] = ("local", "full_iteration", "transformer_engine")
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

    dropout: float = 0.1
    """hidden_dropout and attention_dropout (Megatron's default is 0.1)."""

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
    """Child runs at a time: 0 decides (one per GPU when several are visible, two on one GPU when
    its memory holds both, else one); 1 runs them in series."""

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
    graphed runs; None: only after a divergence, in an extra pair of runs."""

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
    owns (TRANSFORMER_TWINS, the dropouts, bf16/fp16) take the DiffConfig's values; the children take none of
    RUN_OWNED_FIELDS from here (diff_config_from reads a run file's graph settings into impls instead)."""

    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set in every child run (the run file's `env:` mapping)."""

    allow_env: tuple[str, ...] = ()
    """`env:` keys that change how Python or the dynamic loader start (PYTHONPATH, LD_PRELOAD, ...)
    and are still to be passed to the children."""

    megatron_args: str | None = None
    """A Megatron-LM launch line, or `@FILE` holding one (a torchrun line or a whole shell script): the
    model, graph and run settings it sets sit under the run file's and the explicit flags' values
    (graphdoctor.launch_line; docs/diff.md)."""

    launch_notes: tuple[str, ...] = ()
    """What reading megatron_args left out or decided, listed once (set by diff_config_from)."""

    nproc_per_node: int = 1
    """Processes (GPUs) of every child run; > 1 starts each child's ranks with torch.distributed.run
    (docs/multi-gpu.md)."""

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

    def __post_init__(self) -> None:
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
        if self.hidden_size % self.num_attention_heads:
            raise UsageError(
                f"hidden_size: got {self.hidden_size}, expected a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.dtype not in DTYPES:
            raise UsageError(f"dtype: got {self.dtype!r}, expected one of {', '.join(DTYPES)}")
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
        if not isinstance(self.graph_layers, (list, tuple)):
            raise UsageError(f"graph_layers: got {self.graph_layers!r}, expected a list of layer indices")
        self.graph_layers = tuple(self.graph_layers)
        for layer in self.graph_layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
                raise UsageError(f"graph_layers: got {layer!r}, expected layer indices 0 to {self.num_layers - 1}")
        from graphdoctor.placement import check_placement

        check_placement(self)

    def _agreeing_transformer(self) -> dict[str, Any]:
        """The `transformer:` mapping with its copies of what this config owns made to agree with it (the twins,
        the dropouts, the precision flags), so that rules reading the mapping see what the children build."""
        owned: dict[str, Any] = {name: getattr(self, name) for name in TRANSFORMER_TWINS}
        owned.update(hidden_dropout=self.dropout, attention_dropout=self.dropout, bf16=self.dtype == "bf16",
                     fp16=self.dtype == "fp16")
        return {key: owned.get(key, value) for key, value in self.transformer.items()}

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


@dataclass(frozen=True, slots=True)
class RunFile:
    """The parsed run file: three optional mappings."""

    path: str
    """Where it was read from (for messages)."""

    transformer: dict[str, Any]
    """TransformerConfig field name -> value."""

    env: dict[str, str]
    """Environment variable -> value."""

    run: dict[str, Any]
    """graphdoctor run field (a DiffConfig field) -> value."""


def load_run_file(path: str | os.PathLike[str]) -> RunFile:
    """Read and validate a run file (YAML; JSON is valid YAML too).

    Args:
        path: the file.

    Returns:
        The parsed RunFile; keys are checked for shape, `run:` keys against DiffConfig fields,
        `transformer:` values against TransformerConfig's types, every value for NaN/infinity,
        64-bit integers and the ranges of graphdoctor.runfile_schema.

    Raises:
        InputFileError: not a regular file, over 1 MiB, bad YAML, a duplicate key (with its line),
            a document too deep or too large once aliases expand, or a section of the wrong type.
        UsageError: an unknown `run:` key or top-level section, or a value of the wrong type or range.
    """
    p = Path(path)
    text = read_text(p, "run file", max_bytes=MAX_RUN_FILE_BYTES)
    data, lines = load_yaml_strict(text, str(p))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputFileError(f"{p}: expected a mapping with transformer:/env:/run:, got {describe(data)}")
    unknown = sorted(set(map(str, data)) - set(RUN_FILE_SECTIONS))
    if unknown:
        raise UsageError(
            f"{p}: unknown section {describe(unknown[0])}{did_you_mean(str(unknown[0]), RUN_FILE_SECTIONS)}, "
            f"expected one of {', '.join(RUN_FILE_SECTIONS)}"
        )
    sections: dict[str, dict[str, Any]] = {}
    for name in RUN_FILE_SECTIONS:
        value = data.get(name) or {}
        if not isinstance(value, dict):
            raise InputFileError(f"{p}: section {name!r} must be a mapping, got {describe(value)}")
        for key in value:
            if not isinstance(key, str):
                raise InputFileError(f"{p}: {name}: key {describe(key)} must be a string")
        validate_section(name, value, str(p), lines.get(id(value), {}))
        sections[name] = dict(value)
    env = {}
    for key, value in sections["env"].items():
        if isinstance(value, (dict, list)):
            raise InputFileError(f"{p}: env.{key} must be a scalar, got {describe(value)}")
        env[key] = "" if value is None else str(value)
    run_fields = {f.name for f in dataclasses.fields(DiffConfig)} - {"transformer", "env", "launch_notes"}
    for key in sections["run"]:
        if key not in run_fields:
            raise UsageError(f"{p}: run.{key[:100]} is not a graphdoctor run field"
                             f"{did_you_mean(str(key), run_fields)} (see `graphdoctor diff --help`)")
    if sections["transformer"]:
        # The same TransformerConfig types for `check` and `diff` (imports megatron-core, CPU only;
        # diff needs it anyway): offload_modules: [[1]] fails here, before any GPU work.
        from graphdoctor.rules.context import validate_transformer

        validate_transformer(sections["transformer"], str(p))
    return RunFile(path=str(p), transformer=sections["transformer"], env=env, run=sections["run"])


def diff_config_from(run_file: RunFile | None, **overrides: Any) -> DiffConfig:
    """Build a DiffConfig: defaults, then the launch line of `megatron_args` (run file or flag), then the
    run file's `run:` and `transformer:`, then explicit overrides (flags).

    Raises:
        UsageError: a value of the wrong type or range (the message names the field).
    """
    values: dict[str, Any] = {}
    if run_file is not None:
        values.update(run_file.run)
        values["transformer"] = dict(run_file.transformer)
        values["env"] = dict(run_file.env)
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values.get("transformer"):
        _fill_from_transformer(values, f"{run_file.path}: " if run_file is not None else "")
    if values.get("megatron_args") is not None:
        # The launch line sits under the run file and the flags (graphdoctor.launch_line).
        from graphdoctor.launch_line import apply_launch_line

        from_file = run_file is not None and overrides.get("megatron_args") is None
        source = f"{run_file.path}: run.megatron_args" if run_file is not None and from_file else None
        with where_from(source) if source else contextlib.nullcontext():
            values = apply_launch_line(values)
    if "impls" in values:
        impls = values["impls"]
        if isinstance(impls, str):
            impls = [s.strip() for s in impls.split(",") if s.strip()]
        if not isinstance(impls, (list, tuple)):
            raise UsageError(f"impls: got {describe(impls)}, expected a list of implementation names")
        values["impls"] = tuple(impls)
    if "allow_env" in values:
        allowed = values["allow_env"]
        if isinstance(allowed, str):
            allowed = [s.strip() for s in allowed.split(",") if s.strip()]
        if not isinstance(allowed, (list, tuple)):
            raise UsageError(f"allow_env: got {allowed!r}, expected a list of variable names")
        values["allow_env"] = tuple(allowed)
    for key in ("cuda_graph_modules", "recompute_modules"):
        if key not in values:
            continue
        mods = values[key]
        if isinstance(mods, str):
            mods = [s.strip() for s in mods.split(",") if s.strip()]
        if not isinstance(mods, (list, tuple)):
            raise UsageError(f"{key}: got {describe(mods)}, expected a list of module names")
        values[key] = tuple(mods)
    field_types = {f.name: f.type for f in dataclasses.fields(DiffConfig)}
    for key, value in values.items():
        _check_type(key, value, str(field_types.get(key, "")))
    try:
        return DiffConfig(**values)
    except TypeError as exc:
        raise UsageError(str(exc)) from None


def _fill_from_transformer(values: dict[str, Any], where: str) -> None:
    """Fill the DiffConfig fields a `transformer:` mapping sets, where `run:` and the flags do not, as a launch line
    sets them from the same Megatron settings (graphdoctor.launch_line): the TRANSFORMER_TWINS; `dropout`, the
    larger of hidden_dropout and attention_dropout (diff applies one to both, as for a launch line); `dtype` from
    bf16/fp16; `layer_spec` from transformer_impl; `impls` and `cuda_graph_modules` from the graph settings, which
    then leave the mapping (GRAPH_FIELDS). Called before the launch line is applied: the run file sits over it.

    Raises:
        UsageError: graph settings Megatron refuses (launch_line.graph_choice), named `<where>transformer.<field>`.
    """
    from graphdoctor.launch_line import graph_choice

    transformer = dict(values["transformer"])
    for name in TRANSFORMER_TWINS:
        if name in transformer:
            values.setdefault(name, transformer[name])
    dropouts = [transformer[k] for k in ("hidden_dropout", "attention_dropout") if k in transformer]
    if dropouts and all(isinstance(d, int | float) and not isinstance(d, bool) for d in dropouts):
        values.setdefault("dropout", max(dropouts))
    for flag in ("bf16", "fp16"):
        if transformer.get(flag) is True:
            values.setdefault("dtype", flag)
    if transformer.get("transformer_impl") in ("local", "transformer_engine"):
        values.setdefault("layer_spec", "local" if transformer["transformer_impl"] == "local" else "te")
    if any(name in transformer for name in GRAPH_FIELDS):
        settings = graph_choice(transformer.get, lambda name: f"{where}transformer.{name}")
        if settings.legacy_with_impl:
            raise UsageError(f"{where}transformer.enable_cuda_graph: expected it, or external_cuda_graph, without "
                             f"cuda_graph_impl {settings.impl} (TransformerConfig refuses the pair)")
        if settings.impl != "none":
            values.setdefault("impls", (settings.impl,))
        if settings.modules:
            values.setdefault("cuda_graph_modules", settings.modules)
        values["transformer"] = {k: v for k, v in transformer.items() if k not in GRAPH_FIELDS}


def _check_type(key: str, value: Any, annotation: str) -> None:
    expected: tuple[type, ...]
    if annotation in ("int", "int | None"):
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (value is None and "None" in annotation)
        what = "an integer"
    elif annotation == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        what = "a number"
    elif annotation in ("bool", "bool | None"):
        ok = isinstance(value, bool) or (value is None and "None" in annotation)
        what = "true or false"
    elif annotation.startswith("str"):
        expected = (str, type(None)) if "None" in annotation else (str,)
        ok = isinstance(value, expected)
        what = "a string"
    else:
        return
    if not ok:
        raise UsageError(f"{key}: got {describe(value)} ({type(value).__name__}), expected {what}")


__all__ = ["DTYPES", "GRAPH_FIELDS", "IMPLS", "RUN_OWNED_FIELDS", "STARTUP_VARIABLES", "TRANSFORMER_TWINS", "DiffConfig",
           "RunFile", "diff_config_from", "load_run_file"]
