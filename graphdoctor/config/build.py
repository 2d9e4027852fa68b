"""The one Megatron settings builder: a ModelDescription -> Megatron's TransformerConfig, its model config
(GPTModelConfig or HybridModelConfig) and the model, built by Megatron's own GPTModelBuilder / HybridModelBuilder.

Every process that builds a model goes through here: the diff and count children and the probe worker on the GPU,
and, without a GPU, advise's screening (the TransformerConfig) and `--plan` (the model on the meta device). Megatron
is imported only when a function runs.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphdoctor.config.child_model import child_model
from graphdoctor.config.codec import CALL, TARGET, decode
from graphdoctor.config.description import MODEL_KINDS, ModelDescription
from graphdoctor.config.diff_config import DiffConfig
from graphdoctor.config.entry_points import resolve_entry_point
from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.errors import UsageError

MEGATRON_SPEC_PREFIX = "megatron."
"""A launch line's --spec is imported only from Megatron's own packages (a file never names code to run)."""


def transformer_config(description: ModelDescription) -> Any:
    """The TransformerConfig (or MLATransformerConfig) of the description; its __post_init__ validates it.

    Raises:
        UsageError: a field that does not decode.
        Whatever TransformerConfig raises for settings Megatron refuses (ValueError, AssertionError, ...).
    """
    cls = decode({TARGET: description.transformer_class, CALL: False}, "model.transformer_class")
    fields = decode(dict(description.transformer), "model.transformer")
    return cls(**fields)


def child_transformer_config(config: DiffConfig, impl: str, dropout: float) -> Any:
    """The TransformerConfig one child builds (child_model), refusing an eager reference that would build graphs:
    described_transformer_config of the child's description.

    Raises:
        UsageError: Megatron refuses the settings, or a setting turns graphs on in the eager reference.
        MissingDependencyError: the settings need Transformer Engine or megatron.training, missing here.
    """
    return described_transformer_config(child_model(config, impl, dropout), impl)


def described_transformer_config(description: ModelDescription, impl: str) -> Any:
    """The TransformerConfig of one child's own description (child_model), refusing an eager reference that would
    build graphs.

    Raises:
        UsageError: Megatron refuses the settings, or a setting turns graphs on in the eager reference.
        MissingDependencyError: the settings need Transformer Engine or megatron.training, missing here.
    """
    built = transformer_config(description)
    graphs = built.cuda_graph_impl != MEGATRON_EAGER or built.enable_cuda_graph or built.external_cuda_graph
    if impl == Impl.EAGER and graphs:
        raise UsageError(f"the eager reference would build CUDA graphs (cuda_graph_impl {built.cuda_graph_impl!r}): "
                         f"a setting of transformer: turns them on; expected graphs only in the graphed runs")
    return built


def uses_te_layers(description: ModelDescription) -> bool:
    """The model's layers are Transformer Engine's (Megatron's layer spec for transformer_impl
    transformer_engine)."""
    return description.layer_spec is None and \
        description.value("transformer_impl", "transformer_engine") == "transformer_engine"


def layer_spec(description: ModelDescription) -> Any:
    """The layer (or stack) spec the description names; None: Megatron chooses (default_layer_spec).

    Raises:
        UsageError: a spec that cannot be imported, or a launch line's spec outside Megatron's packages.
    """
    name = description.layer_spec
    if not name:
        return None
    module, _, attr = name.partition(":")
    if description.line and not module.startswith(MEGATRON_SPEC_PREFIX):
        raise UsageError(f"--spec {module} {attr}: diff imports a launch line's layer spec only from Megatron's "
                         "own packages; pass --layer-spec pkg.mod:fn to build your own")
    if module.startswith(MEGATRON_SPEC_PREFIX):
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"--spec {module} {attr}: not found in this installation ({exc})") from None
    return resolve_entry_point(name, "layer_spec")()


def model_config(description: ModelDescription, tconfig: Any) -> Any:
    """The GPTModelConfig or HybridModelConfig around `tconfig` (the description's TransformerConfig).

    Raises:
        UsageError: a model field that does not decode or that the model config does not take.
    """
    module, _, name = MODEL_KINDS[description.kind].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    fields = decode(dict(description.model), "model.model")
    spec = layer_spec(description)
    if spec is not None:
        fields["transformer_layer_spec" if description.kind == "gpt" else "hybrid_stack_spec"] = spec
    try:
        return cls(transformer=tconfig, **fields)
    except TypeError as exc:
        raise UsageError(f"model: {exc}") from None


def build_model(description: ModelDescription, tconfig: Any, *, pg_collection: Any = None,
                pre_process: bool | None = None, post_process: bool | None = None) -> Any:
    """The model of one pipeline stage (pre/post_process None: Megatron decides from the pipeline rank), built by
    Megatron's builder for the model kind; the process and model-parallel groups must exist
    (pg_collection None: Megatron's global ones)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    config = model_config(description, tconfig)
    builder = config.get_builder_cls()(config)
    groups = pg_collection if pg_collection is not None else ProcessGroupCollection.use_mpu_process_groups()
    return builder.build_model(groups, pre_process=pre_process, post_process=post_process)


def padded_vocab_size(description: ModelDescription, tensor_model_parallel_size: int) -> int:
    """The vocabulary the model's embedding holds: padded as Megatron's builder pads it (vocab_utils) when the
    description asks for padding."""
    vocab = int(description.value("vocab_size") or 0)
    if not description.value("should_pad_vocab", False):
        return vocab
    divisor = int(description.value("make_vocab_size_divisible_by", 128)) * tensor_model_parallel_size
    return -(-vocab // divisor) * divisor


__all__ = ["MEGATRON_SPEC_PREFIX", "build_model", "child_transformer_config", "described_transformer_config",
           "layer_spec", "model_config", "padded_vocab_size", "transformer_config", "uses_te_layers"]
