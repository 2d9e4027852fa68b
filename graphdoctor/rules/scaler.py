"""Whether the installed megatron-core's fp16 loss scaler rebinds its scale tensor: `DynamicGradScaler.update` read
from megatron/core/optimizer/grad_scaler.py with `ast`, never imported (no torch, no CUDA). GD312 reports it; the
diff's explanation of a loss-scale divergence can say the same.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

GRAD_SCALER = "megatron/core/optimizer/grad_scaler.py"
"""The module of Megatron's loss scalers (ConstantGradScaler, DynamicGradScaler)."""

NEWEST_READ = "0.19.2"
"""The newest megatron-core release whose DynamicGradScaler.update was read: every release up to it rebinds."""


@dataclass(frozen=True, slots=True)
class ScalerReading:
    """What DynamicGradScaler.update does with `self._scale` in the megatron-core installed here."""

    rebinds: bool
    """update assigns a new tensor to `self._scale` (or the module could not be read: assumed, as every release
    up to NEWEST_READ does)."""
    lines: tuple[int, ...] = ()
    """The lines of grad_scaler.py that assign `self._scale` in update (143 and 153 in 0.19.2)."""
    version: str | None = None
    """The installed megatron-core's version (None: not installed, or installed without distribution metadata)."""
    installed: bool = True
    """megatron.core is found here."""
    unread: str = ""
    """Why grad_scaler.py could not be judged (empty when it was read)."""

    @property
    def why(self) -> str:
        """One clause for a message: `megatron-core 0.19.2's DynamicGradScaler.update rebinds self._scale
        (grad_scaler.py:143, :153)`."""
        if not self.installed:
            return f"megatron-core not installed here; every release up to {NEWEST_READ} rebinds"
        name = f"megatron-core {self.version}" if self.version else "the installed megatron-core"
        if self.unread:
            return f"{name}'s {self.unread}; every release up to {NEWEST_READ} rebinds"
        if not self.rebinds:
            return f"{name}'s DynamicGradScaler.update does not rebind self._scale"
        where = ", :".join(map(str, self.lines))
        return f"{name}'s DynamicGradScaler.update rebinds self._scale (grad_scaler.py:{where})"


def rebinding_lines(source: str) -> tuple[int, ...] | None:
    """The lines where `DynamicGradScaler.update` in `source` (grad_scaler.py's text) assigns `self._scale`; None
    when the source has no such method. An augmented assignment (`self._scale *= f`) is not one: a tensor's `*=`
    changes it in place and binds the same object again.

    Raises:
        SyntaxError: `source` is not Python.
    """
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "DynamicGradScaler":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "update":
                    return tuple(sorted({n.lineno for n in ast.walk(item)
                                         if isinstance(n, ast.Assign | ast.AnnAssign) and _assigns_scale(n)}))
    return None


def _assigns_scale(node: ast.Assign | ast.AnnAssign) -> bool:
    if isinstance(node, ast.AnnAssign) and node.value is None:
        return False  # a bare annotation binds nothing
    targets: list[ast.expr] = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
    names: list[ast.expr] = []
    for target in targets:
        names.extend(target.elts if isinstance(target, ast.Tuple | ast.List) else [target])
    return any(isinstance(t, ast.Attribute) and t.attr == "_scale" and isinstance(t.value, ast.Name)
               and t.value.id == "self" for t in names)


def _grad_scaler_path() -> Path | None:
    """grad_scaler.py of the megatron.core found here (megatron.core itself is not imported); None: not found."""
    try:
        spec = importlib.util.find_spec("megatron.core")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or [])
    if not roots and spec.origin:
        roots = [str(Path(spec.origin).parent)]
    for root in roots:
        path = Path(root) / "optimizer" / "grad_scaler.py"
        if path.is_file():
            return path
    return Path(roots[0]) / "optimizer" / "grad_scaler.py" if roots else None


def _version() -> str | None:
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def installed_scaler() -> ScalerReading:
    """Read the installed megatron-core's DynamicGradScaler.update once per process (cached)."""
    path = _grad_scaler_path()
    if path is None:
        return ScalerReading(rebinds=True, installed=False)
    version = _version()
    try:
        lines = rebinding_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        return ScalerReading(rebinds=True, version=version, unread=f"grad_scaler.py could not be read ({exc})")
    if lines is None:
        return ScalerReading(rebinds=True, version=version, unread="grad_scaler.py has no DynamicGradScaler.update")
    return ScalerReading(rebinds=bool(lines), lines=lines, version=version)


__all__ = ["GRAD_SCALER", "NEWEST_READ", "ScalerReading", "installed_scaler", "rebinding_lines"]
