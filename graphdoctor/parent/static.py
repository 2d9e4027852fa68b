"""Static catalogue findings beside diff's runtime verdicts (parent side): the MoE rules of `graphdoctor
check` (GD201-GD217), GD219 (what a `local` scope graphs in GPT layers), the schedule rules, the ranks'
environment rules and GD310 (Transformer Engine's weak references in `local` graphs) on one implementation's
configuration, as notes on its row, and the MoE capture failure that GD217 explains, diagnosed with its
rule, fix and the Megatron file:line."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config import DiffConfig
from graphdoctor.config.impl import Impl
from graphdoctor.errors import MissingDependencyError, UsageError
from graphdoctor.rules import all_rules, check, rule_fix
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.rules.finding import Finding
from graphdoctor.types import Verdict

MOE_FAMILY = "moe"

SCHEDULE_RULES: tuple[str, ...] = ("GD402", "GD220")
"""Static rules of the run schedule diff notes on a row: evaluation replaying local training graphs
(GD402, when the run evaluates) and parameters used only by a recompute inside local graphs (GD220)."""

MEGATRON_MOE_FRAME = re.compile(r"(megatron/core/transformer/moe/[\w/]+\.py:\d+)")
"""A frame of Megatron's MoE code in a traceback line (`.../site-packages/megatron/core/...py:317 in f`)."""

DISPATCH_LOCATION = re.compile(r"at (megatron/core/transformer/moe/[\w/]+\.py:\d+)")


def _row_transformer(config: DiffConfig) -> dict[str, Any]:
    """The run's transformer: values without cuda_graph_impl: diff owns it (one implementation per child),
    so each row's `impl` stands for it."""
    return {k: v for k, v in config.transformer.items() if k != "cuda_graph_impl"}


def _checked(mapping: dict[str, Any], codes: Sequence[str], **kwargs: Any) -> list[Finding]:
    """check() of one row's mapping with `codes` selected; none where check refuses the mapping (the
    children report a bad transformer: value themselves, with its field)."""
    try:
        return list(check(mapping, select=list(codes), **kwargs).findings)
    except UsageError:
        return []


def _errors_and_warnings(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity in ("error", "warning")]


def moe_static_findings(config: DiffConfig, impl: str) -> list[Finding]:
    """Errors and warnings of the MoE rules for the TransformerConfig diff builds for `impl`, with the
    run's cuda_graph_modules."""
    transformer = _row_transformer(config)
    if not transformer.get("num_moe_experts"):
        return []
    codes = [r.code for r in all_rules() if r.family == MOE_FAMILY and not r.runtime]
    run = {"impls": [impl], "cuda_graph_modules": list(config.cuda_graph_modules)}
    return _errors_and_warnings(_checked({"transformer": transformer, "run": run}, codes))


def schedule_static_findings(config: DiffConfig, impl: str) -> list[Finding]:
    """GD402 and GD220 on the TransformerConfig diff builds for `impl` with the run's recompute settings
    (GD402 only when the run evaluates between steps)."""
    if impl != Impl.LOCAL:
        return []
    transformer = {**_row_transformer(config), **config.recompute_settings(), "cuda_graph_impl": impl}
    if config.cuda_graph_modules and "cuda_graph_modules" not in transformer:
        transformer["cuda_graph_modules"] = list(config.cuda_graph_modules)
    codes = [c for c in SCHEDULE_RULES if c != "GD402" or config.eval_interval > 0]
    return _checked({"transformer": transformer}, codes)


LOCAL_SCOPE_RULE = "GD219"
"""`local` with a non-empty cuda_graph_modules on GPT layers: the whole layer, or nothing, is graphed."""


def local_scope_static_findings(config: DiffConfig, impl: str) -> list[Finding]:
    """GD219 on a `local` row with a non-empty cuda_graph_modules (Megatron's GPT layers only: the rule
    reads the run's layer_spec and model_provider)."""
    return _local_scope_checked(config, impl, [LOCAL_SCOPE_RULE])


def _local_scope_checked(config: DiffConfig, impl: str, codes: Sequence[str]) -> list[Finding]:
    """`codes` on a `local` row with a non-empty cuda_graph_modules, with the run's layer_spec and model_provider
    (the local-scope rules judge Megatron's GPT layers); none on any other row."""
    if impl != Impl.LOCAL or not config.cuda_graph_modules:
        return []
    run = {"impls": [impl], "cuda_graph_modules": list(config.cuda_graph_modules),
           "layer_spec": config.layer_spec, "model_provider": config.model_provider}
    return _checked({"transformer": _row_transformer(config), "run": run}, codes)


SETUP_RULES: tuple[str, ...] = ("GD240",)
"""Rules of a set-up that megatron-core fails while it builds the model (`local` with an `mlp`-only scope): the row
is setup-failed from the catalogue, and its child is never started."""

MEGATRON_FRAME = re.compile(r"(megatron/core/[\w/]+\.py:\d+)")


def predicted_setup_failure(config: DiffConfig, impl: str) -> ImplResult | None:
    """The setup-failed row of `impl` when a SETUP_RULES error says Megatron cannot build it (None: it can)."""
    from graphdoctor.checks.gd2xx_local_scope import SETUP_CRASH
    from graphdoctor.cuda_errors import match_known
    from graphdoctor.types import Diagnosis

    found = [f for f in _local_scope_checked(config, impl, SETUP_RULES) if f.severity == "error"]
    if not found:
        return None
    error = "'TransformerLayer' object has no attribute 'is_moe_layer'"
    known = match_known(error)
    diag = Diagnosis(error_type="AttributeError", message=error, fix=found[0].fix, rule=found[0].code,
                     location=SETUP_CRASH, phase="setup",
                     meaning=f"{known.meaning if known else found[0].message}; known from the rule catalogue, so no "
                             "child was started for it")
    return ImplResult(impl=impl, verdict=Verdict.SETUP_FAILED, diagnosis=diag)


def _setup_rule(result: ImplResult) -> ImplResult:
    """A setup-failed row from a child (its rule, where the error is a known one, graphdoctor.cuda_errors, is the
    diagnosis'): Megatron's innermost frame as its location when the user's code has none."""
    diag = result.diagnosis
    if diag is None or diag.location is not None:
        return result
    frames = [m.group(1) for line in diag.traceback_tail for m in [MEGATRON_FRAME.search(line)] if m]
    return dataclasses.replace(result, diagnosis=dataclasses.replace(diag, location=frames[-1])) if frames else result


TE_WEAK_REFS_RULE = "GD310"
"""`local` graphs with Transformer Engine importable: megatron-core 0.19.2's make_weakref gives up ownership of
graph-pool buffers, and graphed gradients can differ from eager (measured on the H200)."""


def this_machine() -> EnvironmentFacts:
    """The installation facts the rules about this machine read, where diff's children run: Transformer
    Engine and Apex, found by files and metadata (nothing imported, no GPU touched); the rest unknown."""
    from graphdoctor.installed import apex_importable
    from graphdoctor.rules.facts import te_facts

    return EnvironmentFacts.unknown_machine().with_overrides({**te_facts(), "apex_installed": apex_importable()})


def installation_static_findings(config: DiffConfig, impl: str) -> list[Finding]:
    """GD310 on a `local` row, judged on this machine's Transformer Engine (the children's: they run here)."""
    if impl != Impl.LOCAL:
        return []
    return _checked({"transformer": {**_row_transformer(config), "cuda_graph_impl": impl}}, [TE_WEAK_REFS_RULE],
                    facts=this_machine())


INSTALLATION_REFUSALS: tuple[str, ...] = ("GD308", "GD309")
"""Rules on what the installation allows the run's settings: an error from them on this machine is a run that
cannot build its model (eager included), so diff refuses it before any GPU work."""


def installation_refusals(config: DiffConfig, facts: EnvironmentFacts | None = None) -> list[Finding]:
    """Errors of INSTALLATION_REFUSALS on the settings the children get: the run file's `transformer:` under
    diff's own recompute settings and sequence parallel, diff's layer spec (None is Megatron's local spec),
    judged on `facts` (default: this machine, this_machine())."""
    from graphdoctor.config.placement import LOCAL_LAYER_SPECS

    transformer = {**config.transformer, **config.recompute_settings()}
    if config.sequence_parallel:
        transformer["sequence_parallel"] = True
    run = {"layer_spec": "local"} if config.layer_spec in LOCAL_LAYER_SPECS else {}
    found = _checked({"transformer": transformer, "run": run}, INSTALLATION_REFUSALS,
                     facts=facts if facts is not None else this_machine())
    return [f for f in found if f.severity == "error"]


def cannot_build(config: DiffConfig) -> list[str]:
    """Every reason diff refuses the run here before any GPU work, each with its fix: a placement that does not
    fit (DiffConfig.placement_refusal), what this machine's installation cannot build (installation_refusals with
    rule and fix), then Megatron's kernels and norms that are not installed here
    (missing_fused_softmax, missing_fused_wgrad, missing_apex_norm, missing_flex_backend). A plan lists them all
    at once."""
    reasons = [config.placement_refusal] if config.placement_refusal else []
    reasons += [f"{found.message} ({found.code}); fix: {found.fix}" for found in installation_refusals(config)]
    for missing in (missing_fused_softmax, missing_fused_wgrad, missing_apex_norm, missing_flex_backend):
        why = missing(config)
        if why:
            reasons.append(why)
    return reasons


def refuse_what_cannot_build(config: DiffConfig) -> None:
    """Refuse, before any GPU work, a run whose model this machine's installation cannot build (diff, advise).

    Raises:
        UsageError: a placement that does not fit (the first of cannot_build(config)), with how many more there are.
        MissingDependencyError: the first of cannot_build(config), with how many more there are.
    """
    reasons = cannot_build(config)
    if reasons:
        more = f" (and {len(reasons) - 1} more: `--plan` lists them)" if len(reasons) > 1 else ""
        if config.placement_refusal:
            raise UsageError(reasons[0] + more)
        raise MissingDependencyError(reasons[0] + more)


FLEX_BACKENDS: dict[str, tuple[str, str]] = {"deepep": ("deep_ep", "DeepEP"), "hybridep": ("deep_ep", "HybridEP"),
                                             "ncclep": ("transformer_engine", "Transformer Engine's ep")}
"""The flex token dispatcher's backends (moe_flex_dispatcher_backend), the package each imports
(megatron/core/transformer/moe/fused_a2a.py) and its name."""


def missing_flex_backend(config: DiffConfig) -> str | None:
    """Why every child's MoE layers would fail for want of the flex dispatcher's backend, or None."""
    import importlib.util

    if config.transformer.get("moe_token_dispatcher_type") != "flex" or not config.transformer.get("num_moe_experts"):
        return None
    backend = str(config.transformer.get("moe_flex_dispatcher_backend") or "deepep")
    package, name = FLEX_BACKENDS.get(backend, ("deep_ep", backend))
    if importlib.util.find_spec(package) is not None:
        return None
    return (f"moe_token_dispatcher_type flex with the {backend} backend needs {name} ({package}), which is not "
            "installed here: every child's MoE layer would fail to dispatch (megatron/core/transformer/moe/"
            "fused_a2a.py); fix: --set model.moe_token_dispatcher_type=alltoall (the same experts, dispatched "
            "by all-to-all), or install it")


def missing_apex_norm(config: DiffConfig) -> str | None:
    """Why every child's set-up would fail building the local spec's norms, or None: without Apex the local spec's
    LayerNorm/RMSNorm is WrappedTorchNorm (megatron/core/models/gpt/gpt_layer_specs.py, `LNImpl`), which refuses
    zero-centered gamma (`--apply-layernorm-1p`: megatron/core/transformer/torch_norm.py:44)."""
    from graphdoctor.installed import apex_importable

    local = config.layer_spec in (None, "local") and config.model_provider is None
    if not (local and config.transformer.get("layernorm_zero_centered_gamma")) or apex_importable():
        return None
    return ("layernorm_zero_centered_gamma (--apply-layernorm-1p) on the local spec needs Apex's FusedLayerNorm, "
            "which is not installed here: the local spec's torch norm refuses it "
            "(megatron/core/transformer/torch_norm.py:44, \"zero_centered_gamma not supported by torch LayerNorm\"); "
            "fix: the Transformer Engine spec (--layer-spec te), Apex, or no --apply-layernorm-1p")


def missing_fused_wgrad(config: DiffConfig) -> str | None:
    """Why every child's set-up would fail for want of Apex's fused weight-gradient kernel, or None: with
    gradient_accumulation_fusion on (Megatron-LM's default) every Megatron ColumnParallelLinear (GPTModel's output
    layer, whatever the layer spec) refuses to be built without fused_weight_gradient_mlp_cuda
    (megatron/core/tensor_parallel/layers.py:1070; seen on the H200 for Megatron-LM's Llama-3 and Mixtral lines
    on the Transformer Engine spec)."""
    import importlib.util

    if not config.transformer.get("gradient_accumulation_fusion", False) or config.model_provider is not None:
        return None
    if importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None:
        return None
    fix = "--no-gradient-accumulation-fusion on the line" if config.megatron_args else \
        "--set model.gradient_accumulation_fusion=false"
    return ("gradient_accumulation_fusion (Megatron-LM's default) needs Apex's fused_weight_gradient_mlp_cuda, which "
            "is not installed here: every child's set-up would fail building the output layer "
            f"(megatron/core/tensor_parallel/layers.py:1070); fix: {fix}")


FUSED_SOFTMAX_MODULES: tuple[str, ...] = ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda",
                                          "scaled_softmax_cuda")
"""Megatron's fused softmax kernels (built with Megatron-LM's own sources, not shipped in the megatron-core
wheel): FusedScaleMaskSoftmax imports them at the first forward (megatron/core/fusions/fused_softmax.py:357)."""


def missing_fused_softmax(config: DiffConfig) -> str | None:
    """Why every child's first forward would fail for want of Megatron's fused softmax kernel, or None: the local
    spec's attention with masked_softmax_fusion on (Megatron-LM's default) takes the kernel for 16-bit inputs of
    the shapes its is_kernel_available admits (fused_softmax.py:253-259), and imports it then (seen on the H200:
    `ModuleNotFoundError: No module named 'scaled_masked_softmax_cuda'` in the eager reference's step 0)."""
    import importlib.util

    local = config.layer_spec in (None, "local") and config.model_provider is None
    fusion = config.transformer.get("masked_softmax_fusion", False)
    heads = config.num_attention_heads // max(1, config.tensor_model_parallel_size)
    shapes = 16 < config.seq_length <= 4096 and config.seq_length % 4 == 0 \
        and (config.micro_batch_size * heads) % 4 == 0
    if not (local and fusion and config.dtype in ("bf16", "fp16") and shapes):
        return None
    if any(importlib.util.find_spec(name) is not None for name in FUSED_SOFTMAX_MODULES):
        return None
    return ("masked_softmax_fusion (Megatron-LM's default) on the local spec takes Megatron's fused softmax kernel "
            "(scaled_masked_softmax_cuda, built with Megatron-LM's sources), which is not installed here: every "
            "child's first forward would fail (megatron/core/fusions/fused_softmax.py:357); fix: "
            "--no-masked-softmax-fusion on the line")


def refuse_before_gpu_work(config: DiffConfig, command: str, *, gpu: bool = True) -> None:
    """What diff, advise and live count refuse before they start any child, in this order: a setting this
    machine's installation cannot build (refuse_what_cannot_build: said even without a GPU), no visible GPU,
    and a Transformer Engine layer spec where Transformer Engine does not import (refuse_at_once, then
    refuse_beside_children: diff runs the latter beside its first children, graphdoctor.parent.preflight).

    Args:
        config: the run.
        command: the command, as NoGPUError names it (`graphdoctor advise`).
        gpu: whether a GPU is needed (False: `diff --plan`, which refuses what no machine could build as diff does;
            what only this machine lacks, Transformer Engine, makes its rows unavailable instead).

    Raises:
        MissingDependencyError: a model this machine cannot build (Megatron asks for Transformer Engine), GD308/GD309,
            or the TE layer spec without Transformer Engine.
        NoGPUError: no CUDA GPU is visible.
    """
    if gpu:
        refuse_unbuildable_model(config)
    refuse_what_cannot_build(config)
    if gpu:
        from graphdoctor.parent.availability import require_gpu

        require_gpu(command)
        refuse_te_spec_without_te(config)


def refuse_at_once(config: DiffConfig) -> None:
    """What needs neither Megatron nor torch imported, once nvidia-smi has listed a GPU: a model this machine
    cannot build.

    Raises:
        MissingDependencyError: the model needs what is not installed.
    """
    refuse_unbuildable_model(config)


def refuse_beside_children(config: DiffConfig) -> None:
    """The refusals that import Megatron (the rule catalogue's installation refusals) or Transformer Engine
    (its import probe): seconds of the parent's own, so diff runs them while its first children set up.

    Raises:
        MissingDependencyError: refuse_what_cannot_build, or the TE layer spec without Transformer Engine.
    """
    refuse_what_cannot_build(config)
    refuse_te_spec_without_te(config)


def refuse_unbuildable_model(config: DiffConfig) -> None:
    """A model description this installation cannot build (Transformer Engine asked for), or a hybrid model
    without mamba_ssm."""
    from graphdoctor.installed import mamba_findable
    from graphdoctor.parent.availability import MAMBA_MISSING, TE_INSTALL_HINT

    if config.model is not None and config.model.unavailable is not None:
        raise MissingDependencyError(f"{config.model.unavailable}; {TE_INSTALL_HINT}")
    if config.model is not None and config.model.kind == "hybrid" and not mamba_findable():
        raise MissingDependencyError(MAMBA_MISSING)


def refuse_te_spec_without_te(config: DiffConfig) -> None:
    """The Transformer Engine layer spec where Transformer Engine does not import."""
    from graphdoctor.config.entry_points import TE_LAYER_SPECS
    from graphdoctor.parent.availability import TE_INSTALL_HINT, te_available

    if config.layer_spec in TE_LAYER_SPECS:
        ok, why = te_available()
        if not ok:
            raise MissingDependencyError(f"--layer-spec {config.layer_spec} needs Transformer Engine "
                                         f"({why}); {TE_INSTALL_HINT}")


ENV_RULES: tuple[str, ...] = ("GD301", "GD302", "GD307")
"""The environment rules checked on a multi-GPU child's ranks' environment."""
ENV_RULE_VARIABLES: tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF", "NCCL_GRAPH_REGISTER", "CUDA_DEVICE_MAX_CONNECTIONS",
                                       "NVTE_ALLOW_NONDETERMINISTIC_ALGO")


def env_static_findings(config: DiffConfig, impl: str) -> list[Finding]:
    """Errors and warnings of the environment rules (ENV_RULES) on the environment every rank of a
    multi-GPU child gets (graphdoctor.parent.launch.launch_env: ours, the deterministic defaults, the
    run file's env:); none for a one-GPU diff."""
    if config.nproc_per_node == 1:
        return []
    from graphdoctor.parent.launch import launch_env

    env = {k: v for k, v in launch_env(config.env, None).items() if k in ENV_RULE_VARIABLES}
    transformer = {"cuda_graph_impl": impl, "cuda_graph_modules": list(config.cuda_graph_modules)}
    return _errors_and_warnings(_checked({"transformer": transformer}, ENV_RULES, env=env))


def static_findings(config: DiffConfig, impl: str) -> list[Finding]:
    """Every static finding diff notes on `impl`'s row: MoE, local scope, schedule, ranks' environment and
    installation rules."""
    return (moe_static_findings(config, impl) + local_scope_static_findings(config, impl)
            + schedule_static_findings(config, impl) + env_static_findings(config, impl)
            + installation_static_findings(config, impl))


def with_static_findings(result: ImplResult, config: DiffConfig, findings: list[Finding] | None = None) -> ImplResult:
    """The row with its static findings (static_findings, or `findings` when they were made already) as notes. A
    capture failure that GD217 predicts gets GD217's rule and fix, and the innermost Megatron MoE frame of its
    traceback (else the rule's file:line) as its location; any other capture failure without a location that died
    in Megatron's MoE code gets that frame as its location."""
    if findings is None:
        findings = static_findings(config, result.impl)
    if findings:
        notes = tuple(_static_note(f, result) for f in findings)
        result = dataclasses.replace(result, notes=(*result.notes, *notes))
    diag = result.diagnosis
    if result.verdict == Verdict.SETUP_FAILED:
        return _setup_rule(result)
    if result.verdict != Verdict.CAPTURE_FAILED or diag is None:
        return result
    frames = [m.group(1) for line in diag.traceback_tail for m in [MEGATRON_MOE_FRAME.search(line)] if m]
    dispatch = next((f for f in findings if f.code == "GD217"), None)
    if dispatch is not None and (diag.rule is None or _in_moe_code(diag.location, diag.traceback_tail)):
        static = DISPATCH_LOCATION.search(dispatch.message)
        location = frames[-1] if frames else (static.group(1) if static else diag.location)
        return dataclasses.replace(result, diagnosis=dataclasses.replace(
            diag, rule="GD217", fix=rule_fix("GD217"), location=location))
    if diag.location is None and frames:
        return dataclasses.replace(result, diagnosis=dataclasses.replace(diag, location=frames[-1]))
    return result


def _static_note(finding: Finding, result: ImplResult) -> str:
    """A static finding as the row's note. GD310 says graphed gradients *can* differ; on a row that matches bitwise
    the run measured that they did not, and the note says so instead of warning."""
    if finding.code == TE_WEAK_REFS_RULE and result.verdict == Verdict.MATCH:
        return (f"static {finding.code} {finding.name}, not seen in this run (the row matches bitwise, gradients "
                f"included): {finding.message}")
    return f"static {finding.code} {finding.name}: {finding.message}"


def _in_moe_code(location: str | None, tail: list[str]) -> bool:
    return any(MEGATRON_MOE_FRAME.search(text or "") for text in (location, *tail))


__all__ = ["ENV_RULES", "FUSED_SOFTMAX_MODULES", "INSTALLATION_REFUSALS", "SETUP_RULES",
           "predicted_setup_failure", "missing_fused_softmax",
           "missing_fused_wgrad", "LOCAL_SCOPE_RULE", "TE_WEAK_REFS_RULE", "env_static_findings",
           "installation_refusals", "installation_static_findings", "local_scope_static_findings", "moe_static_findings",
           "refuse_at_once", "refuse_before_gpu_work", "refuse_beside_children", "refuse_te_spec_without_te",
           "refuse_unbuildable_model", "refuse_what_cannot_build", "cannot_build", "missing_apex_norm", "missing_flex_backend", "FLEX_BACKENDS", "schedule_static_findings", "static_findings", "this_machine",
           "with_static_findings"]
