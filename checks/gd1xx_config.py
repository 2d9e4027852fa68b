"""GD1xx configuration rules, part 1: legacy flags and deprecated spellings of the CUDA-graph fields.

Mirrors megatron-core 0.19.2 transformer_config.py:2365-2463, cuda_graph_config.py and Megatron-LM
training/arguments.py (A1-A5, A12, A14 in docs/research notes section 2).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import given, rewritten, t

from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "configuration"


class LegacyFlagWithCudaGraphImpl(Rule):
    """## What it does
    Flags `enable_cuda_graph` or `external_cuda_graph` set together with a `cuda_graph_impl` other
    than `none`.

    ## Why is this bad?
    The legacy flags are rewritten into `cuda_graph_impl`; Megatron refuses to guess which one wins:
    `AssertionError: Do not use enable_cuda_graph or external_cuda_graph with cuda_graph_impl.`
    (megatron-core 0.19.2 `transformer_config.py:2365-2368`; Megatron-LM `arguments.py:593-596`).

    ## Example
    ```yaml
    transformer:
      enable_cuda_graph: true
      cuda_graph_impl: local
    ```

    ## Use instead
    ```yaml
    transformer:
      cuda_graph_impl: local
    ```

    ## Fix
    Delete the legacy flag; `cuda_graph_impl` alone selects the implementation.
    """

    code = "GD101"
    name = "legacy-flag-with-cuda-graph-impl"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    applies_to_inference = True
    template = "{flag}=True together with cuda_graph_impl={impl!r}; Megatron rejects the combination"
    fix_template = "Remove {flag} and keep cuda_graph_impl={impl!r}"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.legacy_with_impl:
            flag = "enable_cuda_graph" if ctx.value("enable_cuda_graph") else "external_cuda_graph"
            yield Hit(t(flag, "cuda_graph_impl"), {"flag": flag, "impl": ctx.value("cuda_graph_impl")})


class LegacyFlagsBothEnabled(Rule):
    """## What it does
    Flags `enable_cuda_graph` and `external_cuda_graph` both set.

    ## Why is this bad?
    They select different implementations (local vs transformer_engine). Megatron asserts
    `enable_cuda_graph and external_cuda_graph cannot be enabled at the same time.`
    (`transformer_config.py:2369-2371`, `arguments.py:597-599`).

    ## Example
    ```yaml
    transformer: {enable_cuda_graph: true, external_cuda_graph: true}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Fix
    Replace both flags with one `cuda_graph_impl` value.
    """

    code = "GD102"
    name = "legacy-flags-both-enabled"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "enable_cuda_graph and external_cuda_graph are both True; they select different implementations"
    fix_template = "Replace both flags with cuda_graph_impl='local' or 'transformer_engine'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.legacy_both:
            yield Hit(t("enable_cuda_graph", "external_cuda_graph"))


class DeprecatedLegacyCudaGraphFlag(Rule):
    """## What it does
    Flags the deprecated boolean `enable_cuda_graph` / `external_cuda_graph` (`--enable-cuda-graph`,
    `--external-cuda-graph`) used on their own.

    ## Why is this bad?
    They still work but emit a deprecation warning and are rewritten to `cuda_graph_impl='local'` /
    `'transformer_engine'` (`transformer_config.py:2373-2381`). Some code paths read only the legacy
    flag, e.g. the hybrid-context-parallel guard (`arguments.py:1406`), so mixed configs are confusing.

    ## Example
    ```yaml
    transformer: {external_cuda_graph: true}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Fix
    Mechanical: enable_cuda_graph -> cuda_graph_impl: local; external_cuda_graph -> transformer_engine.
    """

    code = "GD103"
    name = "deprecated-legacy-cuda-graph-flag"
    severity = Severity.WARNING
    fix = FixAvailability.ALWAYS
    applies_to_inference = True
    template = "{flag} is deprecated; Megatron rewrites it to cuda_graph_impl={impl!r}"
    fix_template = "Replace {flag}: true with cuda_graph_impl: {impl}"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.legacy_with_impl or ctx.graph.legacy_both:
            return
        for flag, impl in (("enable_cuda_graph", Impl.LOCAL.megatron),
                           ("external_cuda_graph", Impl.TRANSFORMER_ENGINE.megatron)):
            if ctx.value(flag):
                yield Hit(t(flag), {"flag": flag, "impl": impl}, severity=rewritten(ctx))


class CudaGraphScopeWithModules(Rule):
    """## What it does
    Flags the deprecated `cuda_graph_scope` given together with a non-empty `cuda_graph_modules`.

    ## Why is this bad?
    `cuda_graph_scope` is migrated into `cuda_graph_modules`; with both set Megatron cannot tell which
    list you meant: `cuda_graph_scope and cuda_graph_modules cannot be set together.`
    (`transformer_config.py:2383-2388`; `--cuda-graph-scope and --cuda-graph-modules cannot be used
    together.` at `arguments.py:615-617`).

    ## Example
    ```yaml
    transformer: {cuda_graph_scope: attn, cuda_graph_modules: [mlp]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_modules: [attn, mlp]}
    ```

    ## Fix
    Merge the scope values into `cuda_graph_modules` and delete `cuda_graph_scope`.
    """

    code = "GD104"
    name = "cuda-graph-scope-with-modules"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "cuda_graph_scope={scope!r} and cuda_graph_modules={modules!r} are both set"
    fix_template = "Move the cuda_graph_scope values into cuda_graph_modules and delete cuda_graph_scope"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.scope_with_modules:
            yield Hit(t("cuda_graph_scope", "cuda_graph_modules"),
                      {"scope": ctx.value("cuda_graph_scope"), "modules": ctx.value("cuda_graph_modules")})


class DeprecatedCudaGraphScope(Rule):
    """## What it does
    Flags the deprecated `cuda_graph_scope` field (`--cuda-graph-scope`).

    ## Why is this bad?
    It was renamed to `cuda_graph_modules`; Megatron migrates it with a DeprecationWarning
    (`transformer_config.py:2389-2406`) and will remove it.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_scope: [attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn]}
    ```

    ## Fix
    Rename the key (and `--cuda-graph-scope` to `--cuda-graph-modules`); values are unchanged.
    """

    code = "GD105"
    name = "deprecated-cuda-graph-scope"
    severity = Severity.WARNING
    fix = FixAvailability.ALWAYS
    applies_to_inference = True
    template = "cuda_graph_scope={scope!r} is deprecated"
    fix_template = "Rename cuda_graph_scope to cuda_graph_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.value("cuda_graph_scope") is not None and not ctx.graph.scope_with_modules:
            yield Hit(t("cuda_graph_scope"), {"scope": ctx.value("cuda_graph_scope")}, severity=rewritten(ctx))


class DeprecatedFullModuleValue(Rule):
    """## What it does
    Flags an explicit `cuda_graph_modules: full` (or scope `full`).

    ## Why is this bad?
    `full` is deprecated: "full scope is deprecated. Use empty cuda_graph_modules to capture the whole
    layer." (`transformer_config.py:2414-2418`). It means the same as an empty list. (The dataclass
    default is also `"full"` (`:1047`), so every default config warns; only explicit use is flagged.)

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: full}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: []}
    ```

    ## Fix
    Replace `full` with an empty list.
    """

    code = "GD106"
    name = "deprecated-full-module-value"
    severity = Severity.WARNING
    fix = FixAvailability.ALWAYS
    applies_to_inference = True
    template = "cuda_graph_modules 'full' is deprecated (it means the whole layer)"
    fix_template = "Replace 'full' with an empty cuda_graph_modules list"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        fields = given(ctx, "cuda_graph_modules", "cuda_graph_scope")
        if ctx.graph.used_full and not ctx.graph.full_mixed and fields:
            yield Hit(fields, severity=rewritten(ctx))


class NanCheckWithFullIteration(Rule):
    """## What it does
    Flags a Megatron-LM launch with `--cuda-graph-impl full_iteration` that keeps the default NaN
    check of loss and gradients (no `--no-check-for-nan-in-loss-and-grad`).

    ## Why is this bad?
    The NaN check reads the loss on the host, a device sync that cannot run inside a captured
    iteration. Megatron-LM asserts `--no-check-for-nan-in-loss-and-grad should be set with
    --cuda-graph-impl=full_iteration for training.` (`arguments.py:1195-1197`; requests in
    NVIDIA/Megatron-LM#2056 and NVIDIA-NeMo/Megatron-Bridge#1562).

    ## Example
    ```
    pretrain_gpt.py --cuda-graph-impl full_iteration
    ```

    ## Use instead
    ```
    pretrain_gpt.py --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad
    ```

    ## Fix
    Add `--no-check-for-nan-in-loss-and-grad`.

    ## Known problems
    Only the launch-line flag is checked; DDP's `check_for_nan_in_grad` and the rerun state machine
    settings are not visible to a static check.
    """

    code = "GD115"
    name = "nan-check-with-full-iteration"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "check_for_nan_in_loss_and_grad is on with cuda_graph_impl='full_iteration' (host sync in the graph)"
    fix_template = "Add --no-check-for-nan-in-loss-and-grad"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.bridge is not None:
            return  # a Megatron-Bridge config: Bridge's own rerun_state_machine check is GD142
        if ctx.megatron_lm and ctx.graph.impl == Impl.FULL_ITERATION and ctx.arg("check_for_nan_in_loss_and_grad"):
            yield Hit(("args.check_for_nan_in_loss_and_grad", *t("cuda_graph_impl", "cuda_graph_modules")))


class TeRngTrackerNotEnabled(Rule):
    """## What it does
    Flags a Megatron-LM launch with CUDA graphs and Transformer Engine (as `--transformer-impl`, the
    default, or as `--cuda-graph-impl`) whose run gets no TE RNG tracker: only where Megatron-LM's
    `validate_args` could not be asked (megatron.training does not import where the check runs).

    ## Why is this bad?
    TE graphs register only TE's RNG states (TE `graph.py:485-490`); NVIDIA/Megatron-LM#1566 shows the
    tracker clash when it is missing. Megatron-LM's `validate_args` turns it on by itself, with the
    warning "te_rng_tracker is not enabled, enabling it for CUDA graphs." (`arguments.py:1873-1879`):
    wherever `check` reads a line through Megatron-LM, that is what the run gets, and the note says so
    instead of a finding. Megatron-Bridge refuses the same configuration (its own rule).

    ## Example
    ```
    pretrain_gpt.py --cuda-graph-impl transformer_engine
    ```

    ## Use instead
    ```
    pretrain_gpt.py --cuda-graph-impl transformer_engine --te-rng-tracker
    ```

    ## Fix
    Add `--te-rng-tracker` (and pass `te_rng_tracker=True` to `model_parallel_cuda_manual_seed`).

    ## Known problems
    With megatron-core installed (a dependency of graphdoctor) validate_args is always asked, so this rule
    does not report; it stays for a check made where megatron.training cannot import.
    """

    code = "GD116"
    name = "te-rng-tracker-not-enabled"
    severity = Severity.WARNING
    fix = FixAvailability.ALWAYS
    template = "CUDA graphs with Transformer Engine ({which}) but te_rng_tracker is off"
    fix_template = "Add --te-rng-tracker"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        impl, transformer_impl = ctx.graph.impl, ctx.value("transformer_impl")
        if not ctx.megatron_lm or impl == MEGATRON_EAGER or ctx.arg("te_rng_tracker"):
            return
        if ctx.bridge is not None:
            return  # a Megatron-Bridge config: Bridge refuses instead of turning the tracker on (GD143)
        if ctx.megatron is not None and (ctx.megatron.args is not None or ctx.megatron.refusal is not None):
            return  # Megatron-LM read the line: validate_args turns the tracker on (the reading's note)
        if impl == Impl.TRANSFORMER_ENGINE or transformer_impl == "transformer_engine":
            which = "cuda_graph_impl" if impl == Impl.TRANSFORMER_ENGINE else "transformer_impl"
            yield Hit(("args.te_rng_tracker", *t("cuda_graph_impl")), {"which": which})
