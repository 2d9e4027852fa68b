"""`--target`: which training machine `check` judges the installation rules against.

`local` (this machine), a JSON file written by `graphdoctor env --json` on the training machine, or
`key=value,...` (`te=2.12,torch=2.11,sm=90`); facts a target does not give stay unknown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.rules.facts import (
    INSTALLATION_FACTS,
    OPTIMISTIC,
    EnvironmentFacts,
    detect_facts,
    parse_gpu_arch,
    version_tuple,
)

GRAPH_SAFE_RNG_SINCE = "2.6"
"""First torch release with CUDAGraph.register_generator_state and Generator.graphsafe_get_state."""

STALE_CAPTURE_OVERRIDE_SINCE: str | None = None
"""First torch release with torch.autograd.graph.set_override_stale_capture_stream
(pytorch/pytorch#180090); None: no release has it yet (torch 2.11 does not)."""

RELEVANT_ENV_PREFIXES: tuple[str, ...] = ("NCCL_", "NVTE_", "TORCH_NCCL_", "CUDA_", "PYTORCH_", "CUBLAS_")
"""Environment variables `graphdoctor env` records (the job environment the GD3xx rules read)."""

_ALIASES: dict[str, str] = {
    "te": "te_version", "transformer_engine": "te_version", "te_ext": "te_has_torch_extension",
    "torch": "torch_version", "cuda": "cuda_version", "nccl": "nccl_version",
    "sm": "gpu_arch", "arch": "gpu_arch", "gpu": "gpu_arch", "gpu_capability": "gpu_arch",
    "apex": "apex_installed",
}
_ABSENT = ("", "none", "null", "absent", "missing", "no")


def _bool(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"--target: {key}: got {text!r}, expected true or false")


def _torch_derived(version: str) -> dict[str, Any]:
    """The torch features a declared torch version implies."""
    has = version_tuple(version)
    stale = STALE_CAPTURE_OVERRIDE_SINCE is not None and has >= version_tuple(STALE_CAPTURE_OVERRIDE_SINCE)
    return {"torch_version": version, "torch_has_graph_safe_rng": has >= version_tuple(GRAPH_SAFE_RNG_SINCE),
            "torch_has_stale_capture_override": stale}


def _te_derived(text: str) -> dict[str, Any]:
    if text.strip().lower() in _ABSENT:
        return {"te_version": None, "te_has_torch_extension": False}
    return {"te_version": text.strip(), "te_has_torch_extension": True}


def facts_from_pairs(text: str) -> EnvironmentFacts:
    """`te=2.12,torch=2.11,sm=90` -> facts; what is not given stays unknown.

    Raises:
        UsageError: an item without `=`, an unknown key (with the closest name) or a bad value.
    """
    values: dict[str, Any] = {}
    parsers: dict[str, Callable[[str], dict[str, Any]]] = {
        "te_version": _te_derived,
        "torch_version": _torch_derived,
        "gpu_arch": lambda v: {"gpu_capability": parse_gpu_arch(v)},
        "te_has_torch_extension": lambda v: {"te_has_torch_extension": _bool("te_ext", v)},
        "torch_has_stale_capture_override": lambda v: {"torch_has_stale_capture_override": _bool("stale", v)},
        "torch_has_graph_safe_rng": lambda v: {"torch_has_graph_safe_rng": _bool("graph_safe_rng", v)},
        "apex_installed": lambda v: {"apex_installed": _bool("apex", v)},
        "cuda_version": lambda v: {"cuda_version": None if v.lower() in _ABSENT else v},
        "nccl_version": lambda v: {"nccl_version": None if v.lower() in _ABSENT else v},
    }
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise UsageError(f"--target: got {item!r}, expected local, a file from `graphdoctor env --json` "
                             "or key=value items such as te=2.12,torch=2.11,sm=90")
        name = _ALIASES.get(key.strip().lower(), key.strip().lower())
        if name not in parsers:
            from graphdoctor.suggest import did_you_mean

            known = sorted({*parsers, *_ALIASES} - {"gpu_capability"})
            raise UsageError(f"--target: unknown key {key!r}{did_you_mean(key, known)}, "
                             f"expected one of {', '.join(known)}")
        values.update(parsers[name](value.strip()))
    return _from_values(values, source="target")


def _from_values(values: Mapping[str, Any], *, source: str, env: Mapping[str, str] | None = None) -> EnvironmentFacts:
    unknown = frozenset(name for name in INSTALLATION_FACTS if name not in values)
    base = {name: OPTIMISTIC[name] for name in unknown}
    return EnvironmentFacts(**{**base, **values}, env=dict(env or {}), unknown=unknown, source=source)  # type: ignore[arg-type]


def facts_from_document(data: Any, where: str) -> EnvironmentFacts:
    """Facts from the JSON of `graphdoctor env --json` (or a bare `facts` mapping).

    Raises:
        InputFileError: not such a document.
    """
    facts = data.get("facts") if isinstance(data, dict) and "facts" in data else data
    if not isinstance(facts, dict):
        raise InputFileError(f"{where}: expected the JSON of `graphdoctor env --json`, got {type(data).__name__}")
    declared_unknown = set(facts.get("unknown") or [])
    values: dict[str, Any] = {}
    for name in INSTALLATION_FACTS:
        if name in facts and name not in declared_unknown:
            values[name] = facts[name]
    for name in ("cuda_version", "nccl_version"):
        if facts.get(name) is not None:
            values[name] = str(facts[name])
    if facts.get("gpu_capability") is not None:
        values["gpu_capability"] = parse_gpu_arch(facts["gpu_capability"])
    if "torch_version" in values and values["torch_version"] is None:
        raise InputFileError(f"{where}: facts.torch_version is null, expected a version")
    env = facts.get("env") or (data.get("env") if isinstance(data, dict) else None) or {}
    if not isinstance(env, dict):
        raise InputFileError(f"{where}: env: got {type(env).__name__}, expected a mapping")
    return _from_values(values, source=f"target:{where}", env={str(k): str(v) for k, v in env.items()})


def resolve_target(target: str | None, gpu_arch: Any = None) -> EnvironmentFacts:
    """The facts `check` judges against: unknown machine (None), `local`, a file, or key=value items.

    `gpu_arch` (`--gpu-arch`) overrides the target's GPU in every case.

    Raises:
        UsageError / InputFileError: a target that is none of these, or an unreadable file.
    """
    if target is None:
        return EnvironmentFacts.unknown_machine(gpu_arch)
    if target == "local":
        return detect_facts(gpu_arch)
    path = Path(target)
    if path.is_file() or target.endswith(".json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputFileError(f"--target {target}: cannot read ({exc.strerror or exc})") from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InputFileError(f"--target {target}: not JSON (write it with `graphdoctor env --json`)") from None
        facts = facts_from_document(data, target)
    else:
        facts = facts_from_pairs(target)
    if gpu_arch is not None:
        facts = facts.with_overrides({"gpu_arch": gpu_arch})
    return facts


def relevant_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that the environment rules read (RELEVANT_ENV_PREFIXES)."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(RELEVANT_ENV_PREFIXES)}


__all__ = ["GRAPH_SAFE_RNG_SINCE", "RELEVANT_ENV_PREFIXES", "STALE_CAPTURE_OVERRIDE_SINCE", "facts_from_document",
           "facts_from_pairs", "relevant_env", "resolve_target"]
