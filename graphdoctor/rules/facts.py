"""Facts about the training machine: TE and torch versions and features, CUDA, NCCL, GPU, job env.

Detected lazily by `detect_facts()` (never at import, never creating a CUDA context unless a GPU is
visible and no `gpu_arch` was given), or declared by a target (graphdoctor.rules.target); without
either the machine is unknown (`EnvironmentFacts.unknown_machine()`) and the rules that depend on
its installation report "not checked" instead of guessing from the machine that runs the check.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sysconfig
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from graphdoctor.errors import UsageError
from graphdoctor.installed import apex_importable, te_findable

_TE_DISTRIBUTIONS: tuple[str, ...] = ("transformer_engine", "transformer-engine", "transformer_engine_torch")
_SHARED_SUFFIXES: tuple[str, ...] = (".so", ".dylib", ".dll")

INSTALLATION_FACTS: tuple[str, ...] = (
    "te_version", "te_has_torch_extension", "torch_version", "torch_has_stale_capture_override",
    "torch_has_graph_safe_rng", "apex_installed",
)
"""Facts about the software installed on the training machine (what an unknown machine lacks)."""

OPTIMISTIC: dict[str, object] = {
    "te_version": "999.0.0",
    "te_has_torch_extension": True,
    "torch_version": "unknown",
    "torch_has_stale_capture_override": True,
    "torch_has_graph_safe_rng": True,
    "apex_installed": True,
}
"""Values an unknown fact takes while rules run: none of them can make a rule report (a rule for which one
of them could, GD310 with its TE, does not judge an unknown fact: EnvironmentFacts.unknown)."""

TE_IMPORTABLE: dict[str, object] = {"te_version": "2.20.2", "te_has_torch_extension": True}
"""A Transformer Engine that imports (the one measured on the H200): the worst case of the rules that a TE
being importable triggers (GD310), which OPTIMISTIC's TE alone cannot decide."""

PESSIMISTIC: tuple[dict[str, object], ...] = (
    {"te_version": None, "te_has_torch_extension": False},
    {"te_version": "0.0.1", "te_has_torch_extension": False},
    TE_IMPORTABLE,
    {"torch_has_stale_capture_override": False, "torch_has_graph_safe_rng": False},
    {"apex_installed": False},
)
"""Worst cases tried for unknown facts: a rule that reports only under one of them is "not checked". In each
case its facts count as known (a rule that does not judge unknown facts, GD310, judges them there)."""


@dataclass(frozen=True, slots=True)
class EnvironmentFacts:
    """Facts about the machine running the check (which may not be the training machine)."""

    te_version: str | None = None
    """Installed Transformer Engine version; None when transformer_engine is not installed."""

    te_has_torch_extension: bool = True
    """TE's compiled PyTorch extension (transformer_engine_torch) is where TE loads it from; without
    it `transformer_engine.pytorch` cannot be imported (detected by file, never by importing)."""

    torch_version: str = "0"
    """Installed torch version."""

    torch_has_stale_capture_override: bool = False
    """torch.autograd.graph.set_override_stale_capture_stream exists (used by full_iteration + DDP)."""

    torch_has_graph_safe_rng: bool = True
    """CUDAGraph.register_generator_state and Generator.graphsafe_get_state exist."""

    apex_installed: bool = True
    """NVIDIA Apex is importable (found by importlib.util.find_spec('apex'), never imported): megatron-core's
    local GPT spec uses Apex's FusedLayerNorm with it, torch LayerNorm (no sequence parallel) without."""

    gpu_capability: tuple[int, int] | None = None
    """(major, minor) compute capability of the training GPU; None when unknown."""

    cuda_version: str | None = None
    """CUDA version torch was built with (torch.version.cuda); None for a CPU build or unknown."""

    nccl_version: str | None = None
    """NCCL version torch was built with; None when unknown."""

    env: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    """Environment variables recorded on the training machine (graphdoctor env); the run file's
    `env:` section overrides them."""

    unknown: frozenset[str] = frozenset()
    """INSTALLATION_FACTS nobody declared: their fields hold OPTIMISTIC values and the rules that
    read them report "not checked" where the answer would matter."""

    source: str = "local"
    """Where the facts come from: `local` (this machine), `unknown`, `target` or `target:<file>`."""

    @classmethod
    def unknown_machine(cls, gpu_arch: object = None) -> EnvironmentFacts:
        """Facts of a training machine nobody described (the default of `graphdoctor check`)."""
        return cls(**OPTIMISTIC, gpu_capability=parse_gpu_arch(gpu_arch),  # type: ignore[arg-type]
                   unknown=frozenset(INSTALLATION_FACTS), source="unknown")

    @property
    def is_known(self) -> bool:
        """True when every installation fact is known."""
        return not self.unknown

    def te_at_least(self, version: str) -> bool:
        """Megatron's is_te_min_version: a missing TE counts as version 0.0.0."""
        return version_tuple(self.te_version or "0.0.0") >= version_tuple(version)

    def with_overrides(self, overrides: dict[str, Any]) -> EnvironmentFacts:
        """Copy with fields replaced (`gpu_arch` is accepted as a spelling of gpu_capability).

        Raises:
            UsageError: an unknown fact name.
        """
        known = {f.name for f in fields(self)}
        values = dict(overrides)
        if "gpu_arch" in values:
            values["gpu_capability"] = parse_gpu_arch(values.pop("gpu_arch"))
        for key in values:
            if key not in known:
                from graphdoctor.suggest import did_you_mean

                raise UsageError(f"facts: got unknown fact {key!r}{did_you_mean(key, known)}, "
                                 f"expected one of {', '.join(sorted(known))}")
        return replace(self, **values, unknown=self.unknown - values.keys())

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the `facts` of `graphdoctor env --json` and `target` of check JSON)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self.unknown:
                value = None
            elif isinstance(value, frozenset):
                value = sorted(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = dict(value) if isinstance(value, dict) else value
        return out


def version_tuple(text: str) -> tuple[int, ...]:
    """'2.10.0.dev0+abc' -> (2, 10, 0); non-numeric parts end the tuple."""
    parts: list[int] = []
    for piece in re.split(r"[.+]", text):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts) or (0,)


def parse_gpu_arch(value: Any) -> tuple[int, int] | None:
    """'sm_90', '9.0', '90', 90, [9, 0] or 'sm_100a' -> (major, minor); None/'unknown' -> None.

    Raises:
        UsageError: a value that is none of these forms.
    """
    if value is None or value == "unknown":
        return None
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    text = str(value).strip().lower().removeprefix("sm_").removeprefix("sm").rstrip("af")
    match = re.fullmatch(r"(\d+)\.(\d)", text) or re.fullmatch(r"(\d+)(\d)", text)
    if match is None:
        raise UsageError(f"gpu_arch: got {value!r}, expected a compute capability like sm_90 or 9.0")
    return (int(match.group(1)), int(match.group(2)))


def _te_version() -> str | None:
    if not te_findable():
        return None
    for dist in _TE_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "0.0.0"


def _te_torch_extension_present() -> bool:
    """Mirror of TE's own search (common/__init__.py `_get_shared_object_file("torch")`): a
    `transformer_engine_torch*` shared object at the top of the TE install root, in its
    `transformer_engine/` or `transformer_engine/wheel_lib/` folder, for the root that holds the
    transformer_engine package and for site-packages."""
    if importlib.util.find_spec("transformer_engine_torch") is not None:
        return True
    spec = importlib.util.find_spec("transformer_engine")
    roots: list[Path] = []
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        roots.append(Path(location).parent)
    roots.append(Path(sysconfig.get_paths()["purelib"]))
    for root in roots:
        for folder in (root, root / "transformer_engine", root / "transformer_engine" / "wheel_lib"):
            try:
                if any(f.name.startswith("transformer_engine_torch") and f.suffix in _SHARED_SUFFIXES
                       for f in folder.iterdir()):
                    return True
            except OSError:  # folder missing or unreadable: TE would not find the library there either
                continue
    return False


def te_facts() -> dict[str, object]:
    """This machine's Transformer Engine facts (`te_version`, `te_has_torch_extension`), found by files and
    metadata: neither TE nor torch is imported, and no GPU is touched (what diff's parent may read)."""
    te_version = _te_version()
    return {"te_version": te_version, "te_has_torch_extension": te_version is not None and _te_torch_extension_present()}


def detect_facts(gpu_arch: Any = None) -> EnvironmentFacts:
    """Detect the facts of this machine.

    Args:
        gpu_arch: compute capability of the training GPU (`sm_90`, `9.0`, ...); when None it is
            read from torch if a CUDA GPU is visible, else left unknown.

    Returns:
        The detected EnvironmentFacts.
    """
    import torch

    capability = parse_gpu_arch(gpu_arch)
    if capability is None and gpu_arch is None and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        capability = tuple(torch.cuda.get_device_capability(0))  # type: ignore[assignment]
    graph_safe = hasattr(torch.cuda.CUDAGraph, "register_generator_state") and hasattr(
        torch.Generator, "graphsafe_get_state"
    )
    try:
        nccl: str | None = ".".join(str(v) for v in torch.cuda.nccl.version())
    except (AttributeError, RuntimeError, TypeError):  # CPU-only torch builds have no NCCL
        nccl = None
    return EnvironmentFacts(
        **te_facts(),  # type: ignore[arg-type]
        torch_version=torch.__version__,
        torch_has_stale_capture_override=hasattr(torch.autograd.graph, "set_override_stale_capture_stream"),
        torch_has_graph_safe_rng=graph_safe,
        apex_installed=apex_importable(),
        gpu_capability=capability,
        cuda_version=torch.version.cuda,
        nccl_version=nccl,
    )


__all__ = ["INSTALLATION_FACTS", "OPTIMISTIC", "PESSIMISTIC", "TE_IMPORTABLE", "EnvironmentFacts", "detect_facts", "parse_gpu_arch", "te_facts",
           "version_tuple"]
