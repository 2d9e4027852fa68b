"""GD1xx configuration rules, part 2: module lists, implementation names and inference scopes.

Mirrors cuda_graph_config.py and transformer_config.py:2408-2463 of megatron-core 0.19.2, plus the
Megatron-LM validate_args checks A4, A5, A12 and A14 (training/arguments.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.checks import rewritten, t

from graphdoctor.config.graph_settings import ALLOWED_INFERENCE_SCOPES, INFERENCE_SCOPES
from graphdoctor.config.impl import MEGATRON_EAGER, MEGATRON_IMPLS, Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "configuration"


class FullModuleMixedWithOthers(Rule):
    """## What it does
    Flags `full` listed together with other `cuda_graph_modules` values.

    ## Why is this bad?
    `full` means the whole layer, so it cannot be combined: `full scope cannot be used with other
    scopes.` (`cuda_graph_config.py:39-41`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [full, attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, cuda_graph_modules: [attn]}
    ```

    ## Fix
    Keep either the partial modules, or an empty list for the whole layer.
    """

    code = "GD107"
    name = "full-module-mixed-with-others"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "cuda_graph_modules={modules!r} combines 'full' with other modules"
    fix_template = "Drop 'full' (whole layer = empty list) or drop the other modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.full_mixed:
            yield Hit(t("cuda_graph_modules", "cuda_graph_scope"), {"modules": list(ctx.graph.raw_modules)})


class UnknownCudaGraphModule(Rule):
    """## What it does
    Flags `cuda_graph_modules` entries that are not CudaGraphModule names (attn, mlp, moe,
    moe_router, moe_preprocess, mamba) or the deprecated full/full_iteration/full_iteration_inference.

    ## Why is this bad?
    Megatron fails with a bare `KeyError` from `CudaGraphModule[scope]` or `cuda_graph_modules values
    must be strings or CudaGraphModule enums` (`cuda_graph_config.py:49-57`). A comma-separated string
    with spaces ("attn, mlp") also fails: it is split on ',' only.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attention]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn]}
    ```

    ## Fix
    Use one of the CudaGraphModule names.
    """

    code = "GD108"
    name = "unknown-cuda-graph-module"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    applies_to_inference = True
    template = "cuda_graph_modules entry {entry!r} is not a CudaGraphModule name"
    fix_template = "Use one of attn, mlp, moe, moe_router, moe_preprocess, mamba"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        for entry in ctx.graph.bad_entries:
            yield Hit(t("cuda_graph_modules", "cuda_graph_scope"), {"entry": entry})


class DeprecatedFullIterationModuleValue(Rule):
    """## What it does
    Flags the deprecated `cuda_graph_modules` values `full_iteration` and `full_iteration_inference`.

    ## Why is this bad?
    They are migrated with a DeprecationWarning (`transformer_config.py:2419-2438`):
    `full_iteration` becomes `cuda_graph_impl='full_iteration'` (even when you chose `local`), and
    `full_iteration_inference` becomes `inference_cuda_graph_scope='block'`, or silently does nothing
    when `cuda_graph_impl='none'`.

    ## Example
    ```yaml
    transformer: {cuda_graph_modules: [full_iteration]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, cuda_graph_modules: []}
    ```

    ## Fix
    Set the field the value migrates to and remove the value from `cuda_graph_modules`.
    """

    code = "GD109"
    name = "deprecated-full-iteration-module-value"
    severity = Severity.WARNING
    fix = FixAvailability.ALWAYS
    applies_to_inference = True
    template = "cuda_graph_modules {value!r} is deprecated; {effect}"
    fix_template = "Remove {value!r} from cuda_graph_modules and set {replacement}"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if len(set(ctx.graph.deprecated)) != 1:
            return
        value = ctx.graph.deprecated[0]
        if value == "full_iteration":
            effect, replacement = "it sets cuda_graph_impl='full_iteration'", "cuda_graph_impl='full_iteration'"
        elif ctx.graph.impl == MEGATRON_EAGER:
            effect = "it has no effect with cuda_graph_impl='none'"
            replacement = "cuda_graph_impl='local' with inference_cuda_graph_scope='block'"
        else:
            effect, replacement = "it sets inference_cuda_graph_scope='block'", "inference_cuda_graph_scope='block'"
        yield Hit(t("cuda_graph_modules", "cuda_graph_scope"),
                  {"value": value, "effect": effect, "replacement": replacement}, severity=rewritten(ctx))


class MultipleDeprecatedModuleValues(Rule):
    """## What it does
    Flags `full_iteration` and `full_iteration_inference` listed together in `cuda_graph_modules`.

    ## Why is this bad?
    Each migrates to a different field; Megatron rejects the mix: `cuda_graph_modules cannot contain
    multiple deprecated values at the same time` (`cuda_graph_config.py:97-101`).

    ## Example
    ```yaml
    transformer: {cuda_graph_modules: [full_iteration, full_iteration_inference]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration}
    ```

    ## Fix
    Use `cuda_graph_impl` and `inference_cuda_graph_scope` instead of the deprecated values.
    """

    code = "GD110"
    name = "multiple-deprecated-module-values"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "cuda_graph_modules mixes deprecated values {values!r}"
    fix_template = "Replace the deprecated values with cuda_graph_impl / inference_cuda_graph_scope"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if len(set(ctx.graph.deprecated)) > 1:
            yield Hit(t("cuda_graph_modules", "cuda_graph_scope"), {"values": list(ctx.graph.deprecated)})


class DeprecatedModuleValueConflict(Rule):
    """## What it does
    Flags a deprecated `full_iteration` / `full_iteration_inference` module value that contradicts
    `cuda_graph_impl` or `inference_cuda_graph_scope`.

    ## Why is this bad?
    The migration would overwrite an explicit choice, so Megatron refuses: `cuda_graph_modules=
    'full_iteration' cannot be combined with cuda_graph_impl=...` (`cuda_graph_config.py:107-125`).
    `full_iteration` needs impl none/local/full_iteration and no inference scope; `full_iteration_
    inference` needs impl none/local and inference scope unset or `block`.

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [full_iteration]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration}
    ```

    ## Fix
    Drop the deprecated value and set `cuda_graph_impl` / `inference_cuda_graph_scope` directly.
    """

    code = "GD111"
    name = "deprecated-module-value-conflict"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "cuda_graph_modules {value!r} cannot be combined with {field}={got!r}"
    fix_template = "Remove {value!r} from cuda_graph_modules and set cuda_graph_impl / inference_cuda_graph_scope"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if len(set(ctx.graph.deprecated)) != 1:
            return
        value, impl, scope = ctx.graph.deprecated[0], ctx.graph.impl, ctx.graph.raw_inference_scope
        impls: tuple[str, ...] = (MEGATRON_EAGER, Impl.LOCAL)
        scopes: tuple[str | None, ...] = (None, "block")
        if value == "full_iteration":
            impls, scopes = (*impls, Impl.FULL_ITERATION), (None, "none")
        fields = t("cuda_graph_modules", "cuda_graph_scope")
        if impl not in impls:
            yield Hit((*fields, *t("cuda_graph_impl")), {"value": value, "field": "cuda_graph_impl", "got": impl})
        elif scope not in scopes and scope in INFERENCE_SCOPES:
            yield Hit((*fields, *t("inference_cuda_graph_scope")),
                      {"value": value, "field": "inference_cuda_graph_scope", "got": scope})


class UnknownCudaGraphImpl(Rule):
    """## What it does
    Flags a `cuda_graph_impl` that is not none, local, transformer_engine or full_iteration.

    ## Why is this bad?
    Megatron asserts `Invalid cuda graph implementation: ...` (`transformer_config.py:2445-2450`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: te}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine}
    ```

    ## Fix
    Spell the implementation as one of the four accepted names.
    """

    code = "GD112"
    name = "unknown-cuda-graph-impl"
    severity = Severity.ERROR
    fix = FixAvailability.NONE
    applies_to_inference = True
    template = "cuda_graph_impl={impl!r} is not an implementation Megatron knows"
    fix_template = "Set cuda_graph_impl to one of none, local, transformer_engine, full_iteration"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl not in MEGATRON_IMPLS:
            yield Hit(t("cuda_graph_impl"), {"impl": ctx.value("cuda_graph_impl")})


class InvalidInferenceGraphScope(Rule):
    """## What it does
    Flags an `inference_cuda_graph_scope` that is not a scope name, or not allowed for the
    implementation: local allows `layer`/`block` (default `layer`); every other impl only `none`.

    ## Why is this bad?
    Megatron asserts `Invalid inference CUDA graph scope '<s>' for cuda_graph_impl='<i>'.`
    (`transformer_config.py:2452-2460`, `cuda_graph_config.py:17-22`, `arguments.py:629-636`);
    an unknown name raises a `KeyError` (`cuda_graph_config.py:75-79`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, inference_cuda_graph_scope: block}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: local, inference_cuda_graph_scope: block}
    ```

    ## Fix
    Use `cuda_graph_impl: local` for inference graphs, or drop `inference_cuda_graph_scope`.
    """

    code = "GD113"
    name = "invalid-inference-graph-scope"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "inference_cuda_graph_scope={scope!r} is not valid for cuda_graph_impl={impl!r} (allowed: {allowed})"
    fix_template = "Set inference_cuda_graph_scope to one of {allowed} or unset it"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        impl, scope = ctx.graph.impl, ctx.graph.inference_scope
        if impl not in MEGATRON_IMPLS:
            return
        allowed = ", ".join(sorted(ALLOWED_INFERENCE_SCOPES[impl]))
        if scope is None or scope not in ALLOWED_INFERENCE_SCOPES[impl]:
            raw = ctx.graph.raw_inference_scope
            yield Hit(t("inference_cuda_graph_scope", "cuda_graph_impl"),
                      {"scope": raw if scope is None or raw is not None else scope, "impl": impl, "allowed": allowed})


class ModulesWithFullIterationImpl(Rule):
    """## What it does
    Flags a non-empty `cuda_graph_modules` with `cuda_graph_impl: full_iteration` (also after the
    deprecated `full_iteration` module value migrated the impl).

    ## Why is this bad?
    full_iteration captures the whole forward-backward; per-layer modules are meaningless and
    rejected: `cuda_graph_modules must be empty when cuda_graph_impl="full_iteration".`
    (`transformer_config.py:2461-2463`, `arguments.py:1888-1890`).

    ## Example
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, cuda_graph_modules: [attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: full_iteration, cuda_graph_modules: []}
    ```

    ## Fix
    Empty `cuda_graph_modules`, or use a per-layer implementation for partial graphs.
    """

    code = "GD114"
    name = "modules-with-full-iteration-impl"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    applies_to_inference = True
    template = "cuda_graph_modules={modules!r} with cuda_graph_impl='full_iteration'"
    fix_template = "Empty cuda_graph_modules, or choose cuda_graph_impl='local'/'transformer_engine'"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl == Impl.FULL_ITERATION and ctx.graph.modules:
            yield Hit(t("cuda_graph_modules", "cuda_graph_scope", "cuda_graph_impl"),
                      {"modules": list(ctx.graph.modules)})


class ModulesWithoutGraphImpl(Rule):
    """## What it does
    Flags `cuda_graph_modules` listing modules while `cuda_graph_impl` is `none`.

    ## Why is this bad?
    Nothing is captured: "cuda_graph_modules has no effect when cuda_graph_impl="none""
    (`transformer_config.py:1044`). Usually the impl flag was forgotten and the run is silently eager.

    ## Example
    ```yaml
    transformer: {cuda_graph_modules: [attn]}
    ```

    ## Use instead
    ```yaml
    transformer: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn]}
    ```

    ## Fix
    Set `cuda_graph_impl`, or delete `cuda_graph_modules`.
    """

    code = "GD117"
    name = "modules-without-graph-impl"
    severity = Severity.WARNING
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "cuda_graph_modules={modules!r} has no effect with cuda_graph_impl='none'"
    fix_template = "Set cuda_graph_impl or delete cuda_graph_modules"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.graph.impl == MEGATRON_EAGER and ctx.graph.modules:
            yield Hit(t("cuda_graph_modules", "cuda_graph_scope", "cuda_graph_impl"),
                      {"modules": list(ctx.graph.modules)})
