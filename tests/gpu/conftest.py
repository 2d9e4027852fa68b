"""Shared marks of the GPU tests: `without_te` skips a test where Transformer Engine is importable; `needs_te`
skips one only where TE is absent by design, and fails it with TE's own import error where TE is installed (found
on the path) or expected (GRAPHDOCTOR_EXPECT_TE=1, set by tests/gpu/device_call.sh for its TE parts). The gate is
this file's own import in a bounded subprocess, not graphdoctor's availability check, so a regression there cannot
turn the TE tests into skips."""

from __future__ import annotations

import importlib.util

import pytest
from te_gate import te_expected, te_import_error


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_te") is None:
        return
    if not te_expected():
        pytest.skip("Transformer Engine is not installed here (stage it: tests/gpu/te_env.sh)")
    error = te_import_error()
    if error is not None:
        pytest.fail(f"Transformer Engine is expected here but does not import: {error}", pytrace=False)

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
