"""Megatron's own config container (`megatron.training.config.container.PretrainConfigContainer`, what its
`to_yaml` writes and Megatron-Bridge 0.6's ConfigContainer also accepts): told apart by what the file says it is,
screened so that loading it can run nothing but Megatron's config classes, then loaded by Megatron's own
`PretrainConfigContainer.from_dict` in its lenient mode, as `from_yaml` loads it.

Its `model:` is a GPTModelConfig or HybridModelConfig whose TransformerConfig sits one level down, under
`model.transformer:`; nested_model() lifts it beside the model's own fields, the shape of a Megatron-Bridge
provider (graphdoctor.config.bridge reads both from there).

What loading may run (screen_targets): a `_target_` that is called must be a dataclass config class of
megatron.core or megatron.training, or an enum (torch's, Megatron's, `signal.Signals`) built from its value; one
looked up (`_call_: false`) must be a name under megatron.core, megatron.training or torch; a partial must wrap
one of the functions graphdoctor.config.codec reads (torch's init and activation functions, megatron.core's).
An interpolation must name a plain value of the file. Anything else is refused before Megatron sees the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import logging
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from graphdoctor.config.codec import ALLOWED_PREFIXES as PARTIAL_PREFIXES
from graphdoctor.config.codec import ARGS, CALL, NAME, PARTIAL, TARGET
from graphdoctor.errors import MissingDependencyError, UsageError
from graphdoctor.inputs import describe, describe_error

MEGATRON_CONTAINER = "megatron.training.config.container.PretrainConfigContainer"
BRIDGE_CONTAINER = "megatron.bridge.training.config.ConfigContainer"
CONTAINERS: dict[str, str] = {MEGATRON_CONTAINER: "Megatron's PretrainConfigContainer",
                              BRIDGE_CONTAINER: "Megatron-Bridge's ConfigContainer"}
"""The containers a file may say it is (top-level `_target_`), and how messages name them."""
CONFIG_PREFIXES: tuple[str, ...] = ("megatron.core.", "megatron.training.")
"""Where a config class that loading constructs may live."""
LOOKUP_PREFIXES: tuple[str, ...] = ("megatron.core.", "megatron.training.", "torch.")
"""Where a name that loading only looks up (`_call_: false`: a dtype, a function) may live."""
ENUM_PREFIXES: tuple[str, ...] = ("megatron.core.", "megatron.training.", "torch.", "signal.")
MODEL_KEYS: frozenset[str] = frozenset({"_builder_"})
"""Keys of a `model:` that are the container's bookkeeping, not settings (the builder's class path)."""
_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def container_target(data: Any) -> str | None:
    """The container a loaded file says it is (CONTAINERS' keys), None for another file."""
    if isinstance(data, Mapping) and isinstance(data.get(TARGET), str) and data[TARGET] in CONTAINERS:
        return str(data[TARGET])
    return None


def nested_model(model: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """(`model:` with the TransformerConfig of its `transformer:` lifted beside the model's own fields, whether it
    was nested). A provider-shaped `model:` (Megatron-Bridge's flat dump) comes back as it is."""
    inner = model.get("transformer")
    if not isinstance(inner, Mapping):
        return {str(k): v for k, v in model.items() if str(k) not in MODEL_KEYS}, False
    lifted = {str(k): v for k, v in model.items() if str(k) not in MODEL_KEYS and str(k) != "transformer"}
    for key, value in inner.items():
        if str(key) != TARGET:
            lifted.setdefault(str(key), value)
    lifted[TARGET] = model.get(TARGET, "")
    return lifted, True


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def _resolve(target: str) -> Any:
    """The object a dotted path names (modules imported from the longest importable prefix), None if absent."""
    import importlib

    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


def _target_refusal(node: Mapping[str, Any]) -> str | None:
    """Why loading must not act on this `_target_` mapping (None: it may)."""
    target = node[TARGET]
    if not isinstance(target, str) or not _PATH.fullmatch(target):
        return f"_target_ {describe(target)} is not a dotted name"
    if node.get(PARTIAL) is True:
        if not target.startswith(PARTIAL_PREFIXES):
            return f"a partial of {target}, which is not one of torch's or Megatron-Core's own functions"
        return None
    if node.get(CALL) is False:
        if not target.startswith(LOOKUP_PREFIXES):
            return f"_target_ {target} is outside megatron.core, megatron.training and torch"
        return None
    obj = _resolve(target) if target.startswith(ENUM_PREFIXES) else None
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        if set(node) - {TARGET, CALL, ARGS, NAME}:
            return f"enum {target} with arguments other than its value"
        return None
    if target in CONTAINERS or (target.startswith(CONFIG_PREFIXES) and inspect.isclass(obj)
                                and dataclasses.is_dataclass(obj)):
        return None
    return f"_target_ {target} would be called, and it is not one of Megatron's config classes"


def screen_targets(data: Any, where: str) -> None:
    """Refuse what loading the file by Megatron's own code would run besides constructing its config classes
    (the module docstring's rules), and interpolations other than `${a.b}` naming a plain value of the file.

    Raises:
        UsageError: naming the key path.
    """
    for path, node in _walk(data, ""):
        if isinstance(node, Mapping) and TARGET in node:
            why = _target_refusal(node)
            if why is not None:
                raise UsageError(f"{where}: {path or '(top)'}: {why}; graphdoctor loads only Megatron's config "
                                 "classes, enums, and torch's or Megatron's functions by name")
        if isinstance(node, str) and "${" in node:
            for ref in _INTERPOLATION.findall(node):
                value = _lookup_path(data, ref)
                if not _PATH.fullmatch(ref) or isinstance(value, Mapping | list) or value is _MISSING:
                    raise UsageError(f"{where}: {path}: interpolation ${{{ref}}} must name a plain value of the file "
                                     "(graphdoctor resolves no resolvers and no sections)")


_MISSING = object()


def _lookup_path(data: Any, ref: str) -> Any:
    node = data
    for part in ref.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


@contextlib.contextmanager
def quiet_megatron() -> Iterator[None]:
    """Megatron's warnings and log lines while it loads a config (lenient mode warns for every key it drops):
    kept off the terminal, the caller reports what matters."""
    loggers = [logging.getLogger(), logging.getLogger("megatron")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def load_megatron_container(data: Mapping[str, Any], where: str) -> Any:
    """The PretrainConfigContainer Megatron's own loader makes of the file's `data` (screened first), in the
    lenient mode `from_yaml` uses: what it refuses is the file's error.

    Raises:
        UsageError: screen_targets' refusal, or Megatron's (its exception and message).
        MissingDependencyError: megatron.training or omegaconf is not installed.
    """
    screen_targets(data, where)
    import importlib.util

    if importlib.util.find_spec("omegaconf") is None:  # Megatron imports it only inside its instantiation
        raise MissingDependencyError(f"{where}: reading Megatron's config container needs omegaconf, which is not "
                                     "installed here (pip install omegaconf; graphdoctor depends on it)")
    try:
        from megatron.training.config.container import PretrainConfigContainer
        from megatron.training.config.instantiate_utils import InstantiationMode
    except ImportError as exc:
        raise MissingDependencyError(f"{where}: reading Megatron's config container needs megatron-core's "
                                     f"megatron.training and omegaconf ({describe_error(exc)})") from None
    from graphdoctor.config.megatron_line import MEGATRON_ERRORS, megatron_message

    try:
        with quiet_megatron():
            return PretrainConfigContainer.from_dict(dict(data), mode=InstantiationMode.LENIENT)
    except (*MEGATRON_ERRORS, ImportError) as exc:
        cause: BaseException = exc  # instantiate wraps what the config class said
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise UsageError(f"{where}: Megatron's PretrainConfigContainer refuses it: {megatron_message(cause)}") \
            from None


__all__ = ["BRIDGE_CONTAINER", "CONTAINERS", "MEGATRON_CONTAINER", "container_target", "load_megatron_container",
           "nested_model", "quiet_megatron", "screen_targets"]
