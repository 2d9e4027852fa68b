"""Shared marks of the GPU tests: `without_te` skips a test where Transformer Engine is importable."""

from __future__ import annotations

import importlib.util

import pytest

WITHOUT_TE_REASON = (
    "Megatron-Core 0.19.2's local graphs differ from eager at dropout 0 when Transformer Engine is importable: "
    "its make_weakref gives up ownership of graph-pool buffers (GD310; measured on the H200: "
    "tests/gpu/test_te_weakref_gpu.py); this verdict holds without TE"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("transformer_engine") is None:
        return
    for item in items:
        if item.get_closest_marker("without_te") is not None:
            item.add_marker(pytest.mark.skip(reason=WITHOUT_TE_REASON))
