"""GD14x: what Megatron-Bridge itself refuses to start with, judged on Bridge ConfigContainer YAML only.

Mirrors Megatron-Bridge 067f987 (graphdoctor.config.bridge.BRIDGE_SOURCE): utils/cuda_graph.py
`validate_cuda_graph_configuration`, training/config.py `ConfigContainer.validate` and models/gpt_provider.py
`GPTModelProvider.provide`, read from the config's BridgeGuards. On Bridge inputs these rules replace the
Megatron-LM launch-line rules of the same cause (GD115, GD116) and GD219 where Bridge refuses `local` outright.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.config.bridge import BRIDGE_OWNER, BridgeConfig
from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "megatron-bridge"

CUDA_GRAPH_PY = "megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration"
CONFIG_PY = "megatron/bridge/training/config.py ConfigContainer.validate"
GPT_PROVIDER_PY = "megatron/bridge/models/gpt_provider.py GPTModelProvider.provide"

NAN_REFUSAL = ("check_for_nan_in_loss must be disabled when using full_iteration CUDA graph. "
               "Set rerun_state_machine.check_for_nan_in_loss=False.")
RNG_REFUSAL = ("Transformer engine's RNG tracker is required for cudagraphs, it can be "
               "enabled with use_te_rng_tracker=True'.")
PAD_CU_SEQLENS_NEEDS_PADDING = "offline_packing_specs.pad_cu_seqlens=True requires dataset pad_to_max_length=True."
GRAPHS_NEED_PADDING = "Offline packing with CUDA graphs requires dataset pad_to_max_length=True."
ATTENTION_NEEDS_PAD_CU_SEQLENS = ("Packed attention CUDA graphs require offline_packing_specs.pad_cu_seqlens=True. "
                                  "Enable it for full-iteration, whole-layer, or attention-scoped capture.")
MODULE_KEYS = ("model.cuda_graph_modules", "model.cuda_graph_scope")
PADDING_KEYS = ("dataset.pad_to_max_length", "dataset.dataset_kwargs.pad_to_max_length")


def local_refusal(graph_modules: list[str]) -> str:
    """validate_cuda_graph_configuration's own message (config_name `model`)."""
    modules_msg = f" with scopes {graph_modules}" if graph_modules else ""
    return (f'Megatron Bridge supports model.cuda_graph_impl="local" only for full-iteration CUDA graphs{modules_msg}. '
            'Use model.cuda_graph_impl="transformer_engine" for scoped CUDA graph capture such as "attn" or "mlp".')


def bridge_of(ctx: CheckContext) -> BridgeConfig | None:
    """The input's config when Megatron-Bridge runs it (a Megatron PretrainConfigContainer is Megatron's own:
    Bridge's refusals do not apply to it)."""
    return ctx.bridge if ctx.bridge is not None and ctx.bridge.owner == BRIDGE_OWNER else None


def bridge_refuses_local(ctx: CheckContext) -> bool:
    """The input is a Bridge config whose `local` graphs Bridge refuses (GD141; GD219 then stands down)."""
    bridge = bridge_of(ctx)
    return bridge is not None and bridge.guards.local_refused


def _given(bridge: BridgeConfig, *keys: str) -> tuple[str, ...]:
    """The keys the file sets, in order (a finding points at their lines)."""
    return tuple(key for key in keys if key in bridge.guards.given)


def _or_section(bridge: BridgeConfig, key: str) -> tuple[str, ...]:
    """`key` when the file sets it, else its section when the file has one (where the setting belongs)."""
    if key in bridge.guards.given:
        return (key,)
    section = key.rpartition(".")[0]
    return (section,) if section in bridge.where else ()


def _graph_fields(bridge: BridgeConfig, modules: bool) -> tuple[str, ...]:
    """`model.cuda_graph_impl`, and with `modules` the module keys that name a module."""
    named = modules and bool(bridge.guards.graph_names)
    return ("model.cuda_graph_impl", *(_given(bridge, *MODULE_KEYS) if named else ()))


def _state(bridge: BridgeConfig, key: str, value: bool) -> str:
    """`key true`, or `key not set (Bridge's default false)`."""
    text = str(value).lower()
    return f"{key} {text}" if key in bridge.guards.given else f"{key} not set (Bridge's default {text})"


class BridgeLocalImplWithoutFullIteration(Rule):
    """## What it does
    Flags a Megatron-Bridge config with `model.cuda_graph_impl: local` that is not a full-iteration graph
    (no `full_iteration` module) and not a local inference graph (an empty module list with
    `inference_cuda_graph_scope` `layer` or `block`).

    ## Why is this bad?
    Megatron-Bridge supports `local` graphs only for full iterations and refuses the config before the model
    is built, in `validate_cuda_graph_configuration` (`megatron/bridge/utils/cuda_graph.py`, called from
    `ConfigContainer.validate` and `GPTModelProvider.provide`): `Megatron Bridge supports
    model.cuda_graph_impl="local" only for full-iteration CUDA graphs with scopes ['attn']. Use
    model.cuda_graph_impl="transformer_engine" for scoped CUDA graph capture such as "attn" or "mlp".`
    Megatron-Core itself accepts per-layer `local` graphs; a launch line does not get this error.

    ## Example
    ```yaml
    model:
      _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
      cuda_graph_impl: local
      cuda_graph_modules: [attn]
    ```

    ## Use instead
    ```yaml
    model:
      _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
      cuda_graph_impl: transformer_engine
      cuda_graph_modules: [attn]
    ```

    ## Fix
    Use `transformer_engine` for per-layer scopes, or `cuda_graph_impl: full_iteration` (empty
    `cuda_graph_modules`) to graph the whole iteration.

    ## Known problems
    Reads `cuda_graph_impl` as the file writes it: the deprecated `enable_cuda_graph` /
    `external_cuda_graph`, which Megatron-Core rewrites to an impl after Bridge's first check, are not
    followed (GD101-GD103 report them).
    """

    code = "GD141"
    name = "bridge-local-impl-without-full-iteration"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    template = "Megatron-Bridge refuses model.cuda_graph_impl='local'{modules} ({site}): \"{bridge}\""
    fix_template = ("Set model.cuda_graph_impl: transformer_engine for per-layer scopes, or full_iteration with an "
                    "empty cuda_graph_modules")

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        bridge = bridge_of(ctx)
        if bridge is None or not bridge.guards.local_refused:
            return
        modules = bridge.guards.graph_modules
        yield Hit(_graph_fields(bridge, True), {"modules": f" with {modules}" if modules else " (whole layers)",
                                              "site": CUDA_GRAPH_PY, "bridge": local_refusal(modules)})


class BridgeNanCheckWithFullIteration(Rule):
    """## What it does
    Flags a Megatron-Bridge config with a full-iteration graph (`model.cuda_graph_impl: full_iteration`,
    or `local` with a `full_iteration` module) whose `rerun_state_machine.check_for_nan_in_loss` is true or
    not set (Bridge's default is true).

    ## Why is this bad?
    The rerun state machine reads the loss on the host to look for NaN, a device sync that cannot run inside
    a captured iteration. `ConfigContainer.validate` (`megatron/bridge/training/config.py`) asserts
    `check_for_nan_in_loss must be disabled when using full_iteration CUDA graph. Set
    rerun_state_machine.check_for_nan_in_loss=False.` and the run does not start. (For a Megatron-LM launch
    line the same cause is GD115.)

    ## Example
    ```yaml
    model: {cuda_graph_impl: full_iteration}
    rerun_state_machine: {check_for_nan_in_loss: true}
    ```

    ## Use instead
    ```yaml
    model: {cuda_graph_impl: full_iteration}
    rerun_state_machine: {check_for_nan_in_loss: false}
    ```

    ## Fix
    Set `rerun_state_machine.check_for_nan_in_loss: false`.

    ## Known problems
    A key the file does not set is judged by Bridge's dataclass default (true): an override file merged
    over a recipe that turns the check off is flagged although the merged config passes. Bridge does not check
    `ddp.check_for_nan_in_grad`, and neither does this rule.
    """

    code = "GD142"
    name = "bridge-nan-check-with-full-iteration"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = "{state} with a full-iteration graph; Megatron-Bridge refuses ({site}): \"{bridge}\""
    fix_template = "Set rerun_state_machine.check_for_nan_in_loss: false"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        bridge = bridge_of(ctx)
        if bridge is None or not bridge.guards.full_iteration or not bridge.guards.check_for_nan_in_loss:
            return
        key = "rerun_state_machine.check_for_nan_in_loss"
        yield Hit((*_or_section(bridge, key), *_graph_fields(bridge, bridge.guards.cuda_graph_impl == Impl.LOCAL)),
                  {"state": _state(bridge, key, True), "site": CONFIG_PY, "bridge": NAN_REFUSAL})


class BridgeGraphsWithoutTeRngTracker(Rule):
    """## What it does
    Flags a Megatron-Bridge GPT config (`GPTModelProvider`) with a `model.cuda_graph_impl` other than `none`
    where neither `model.use_te_rng_tracker` nor `rng.te_rng_tracker` is true.

    ## Why is this bad?
    Graphs replay only the RNG states Transformer Engine's tracker registers, so Bridge requires that tracker:
    `GPTModelProvider.provide` (`megatron/bridge/models/gpt_provider.py`) asserts `Transformer engine's RNG
    tracker is required for cudagraphs, it can be enabled with use_te_rng_tracker=True'.` when the model is
    built. `ConfigContainer.validate` first makes the two flags agree (either one true turns both on), so one
    of them is enough; with both false Bridge stops. (Megatron-LM instead turns the tracker on by itself and
    warns: GD116.)

    ## Example
    ```yaml
    model: {_target_: megatron.bridge.models.gpt_provider.GPTModelProvider, cuda_graph_impl: transformer_engine}
    rng: {te_rng_tracker: false}
    ```

    ## Use instead
    ```yaml
    model: {_target_: megatron.bridge.models.gpt_provider.GPTModelProvider, cuda_graph_impl: transformer_engine,
            use_te_rng_tracker: true}
    rng: {te_rng_tracker: true}
    ```

    ## Fix
    Set `model.use_te_rng_tracker: true` (validate() then sets `rng.te_rng_tracker` too).

    ## Known problems
    Only GPT providers: Bridge's hybrid (Mamba) provider does not check, so a hybrid config is not flagged.
    A key the file does not set is judged by Bridge's default (false), which an override file's recipe may
    have changed.
    """

    code = "GD143"
    name = "bridge-graphs-without-te-rng-tracker"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = ("model.cuda_graph_impl={impl!r} without Transformer Engine's RNG tracker ({state}); Megatron-Bridge "
                "refuses ({site}): \"{bridge}\"")
    fix_template = "Set model.use_te_rng_tracker: true (validate() then sets rng.te_rng_tracker too)"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        bridge = bridge_of(ctx)
        if bridge is None or bridge.kind != "gpt":
            return
        guards = bridge.guards
        if guards.cuda_graph_impl == MEGATRON_EAGER or guards.rng_te_rng_tracker or guards.model_use_te_rng_tracker:
            return
        state = (f"{_state(bridge, 'model.use_te_rng_tracker', False)}, "
                 f"{_state(bridge, 'rng.te_rng_tracker', False)}")
        yield Hit(("model.cuda_graph_impl", *_given(bridge, "model.use_te_rng_tracker", "rng.te_rng_tracker")),
                  {"impl": guards.cuda_graph_impl, "state": state, "site": GPT_PROVIDER_PY, "bridge": RNG_REFUSAL})


class BridgePackedGraphsWithoutPadToMaxLength(Rule):
    """## What it does
    Flags a Megatron-Bridge config with offline packed data (`dataset.offline_packing_specs` set) whose
    dataset does not pad to the maximum length (neither `dataset.pad_to_max_length` nor
    `dataset.dataset_kwargs.pad_to_max_length` is true) while it captures training graphs
    (`transformer_engine` or a full-iteration graph) or asks for `pad_cu_seqlens`.

    ## Why is this bad?
    A graph replays fixed shapes: every packed batch must have the same token width. `ConfigContainer.validate`
    (`megatron/bridge/training/config.py`) refuses `Offline packing with CUDA graphs requires dataset
    pad_to_max_length=True.`, and with `pad_cu_seqlens` (padding meant for graphs)
    `offline_packing_specs.pad_cu_seqlens=True requires dataset pad_to_max_length=True.` It tests the flags as
    given, before it turns padding on for pipeline or expert parallelism.

    ## Example
    ```yaml
    model: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [mlp]}
    dataset:
      enable_offline_packing: true
      offline_packing_specs: {packed_sequence_size: 4096}
    ```

    ## Use instead
    ```yaml
    model: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [mlp]}
    dataset:
      enable_offline_packing: true
      offline_packing_specs: {packed_sequence_size: 4096}
      dataset_kwargs: {pad_to_max_length: true}
    ```

    ## Fix
    Set `dataset.dataset_kwargs.pad_to_max_length: true` (what Bridge's packed perf recipes set), or
    `dataset.pad_to_max_length: true` on a dataset config that has the field.
    """

    code = "GD144"
    name = "bridge-packed-graphs-without-pad-to-max-length"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = ("offline packed data {why} but dataset pad_to_max_length is not true; Megatron-Bridge refuses "
                "({site}): \"{bridge}\"")
    fix_template = "Set dataset.dataset_kwargs.pad_to_max_length: true"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        bridge = bridge_of(ctx)
        if bridge is None or not bridge.guards.offline_packing or bridge.guards.pad_to_max_length:
            return
        guards = bridge.guards
        padding = _given(bridge, *PADDING_KEYS)
        if guards.pad_cu_seqlens:
            yield Hit(("dataset.offline_packing_specs.pad_cu_seqlens", *padding),
                      {"why": "with offline_packing_specs.pad_cu_seqlens", "site": CONFIG_PY,
                       "bridge": PAD_CU_SEQLENS_NEEDS_PADDING})
        elif guards.full_iteration or guards.cuda_graph_impl == Impl.TRANSFORMER_ENGINE:
            yield Hit(("dataset.offline_packing_specs", *padding, *_graph_fields(bridge, guards.cuda_graph_impl == Impl.LOCAL)),
                      {"why": f"with CUDA graphs (model.cuda_graph_impl={guards.cuda_graph_impl!r})", "site": CONFIG_PY,
                       "bridge": GRAPHS_NEED_PADDING})


class BridgePackedAttentionGraphsWithoutPadCuSeqlens(Rule):
    """## What it does
    Flags a Megatron-Bridge config with offline packed data whose graphs capture attention (a full-iteration
    graph, or `transformer_engine` with an empty module list or `attn`) without
    `dataset.offline_packing_specs.pad_cu_seqlens: true`.

    ## Why is this bad?
    Packed attention reads the sequence boundaries (`cu_seqlens`), whose length changes with the number of
    sequences in a pack; a captured graph needs them padded to a fixed shape. `ConfigContainer.validate`
    (`megatron/bridge/training/config.py`) refuses `Packed attention CUDA graphs require
    offline_packing_specs.pad_cu_seqlens=True. Enable it for full-iteration, whole-layer, or
    attention-scoped capture.` Graphs of `mlp` or MoE scopes only do not need it.

    ## Example
    ```yaml
    model: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn]}
    dataset:
      offline_packing_specs: {packed_sequence_size: 4096}
      dataset_kwargs: {pad_to_max_length: true}
    ```

    ## Use instead
    ```yaml
    model: {cuda_graph_impl: transformer_engine, cuda_graph_modules: [attn]}
    dataset:
      offline_packing_specs: {packed_sequence_size: 4096, pad_cu_seqlens: true}
      dataset_kwargs: {pad_to_max_length: true}
    ```

    ## Fix
    Set `dataset.offline_packing_specs.pad_cu_seqlens: true` (it needs dataset padding too: GD144).
    """

    code = "GD145"
    name = "bridge-packed-attention-graphs-without-pad-cu-seqlens"
    severity = Severity.ERROR
    fix = FixAvailability.ALWAYS
    template = ("offline packed data with attention captured ({what}) but offline_packing_specs.pad_cu_seqlens is "
                "not true; Megatron-Bridge refuses ({site}): \"{bridge}\"")
    fix_template = "Set dataset.offline_packing_specs.pad_cu_seqlens: true"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        bridge = bridge_of(ctx)
        if bridge is None or not bridge.guards.offline_packing or bridge.guards.pad_cu_seqlens:
            return
        guards, modules = bridge.guards, bridge.guards.graph_modules
        if guards.full_iteration:
            what = "a full-iteration graph"
        elif guards.cuda_graph_impl == Impl.TRANSFORMER_ENGINE and (not modules or "attn" in modules):
            what = f"transformer_engine {modules}" if modules else "transformer_engine whole layers"
        else:
            return
        yield Hit((*_or_section(bridge, "dataset.offline_packing_specs.pad_cu_seqlens"), *_graph_fields(bridge, True)),
                  {"what": what, "site": CONFIG_PY, "bridge": ATTENTION_NEEDS_PAD_CU_SEQLENS})


__all__ = ["BridgeGraphsWithoutTeRngTracker", "BridgeLocalImplWithoutFullIteration", "BridgeNanCheckWithFullIteration",
           "BridgePackedAttentionGraphsWithoutPadCuSeqlens", "BridgePackedGraphsWithoutPadToMaxLength",
           "bridge_refuses_local", "local_refusal"]
