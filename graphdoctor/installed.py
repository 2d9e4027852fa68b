"""What is installed on this machine, found by importlib without importing it (no CUDA, no side effects):
Apex, Transformer Engine and mamba_ssm, which decide what Megatron-Core can build here."""

from __future__ import annotations

import importlib.util


def apex_importable() -> bool:
    """Whether `import apex` would find a module (without importing it)."""
    return importlib.util.find_spec("apex") is not None


def te_findable() -> bool:
    """transformer_engine is installed here (found by importlib, never imported)."""
    return importlib.util.find_spec("transformer_engine") is not None


def mamba_findable() -> bool:
    """mamba_ssm, which Megatron-Core's Mamba layers need, is installed here (never imported)."""
    return importlib.util.find_spec("mamba_ssm") is not None


__all__ = ["apex_importable", "mamba_findable", "te_findable"]
