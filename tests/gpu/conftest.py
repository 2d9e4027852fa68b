"""Shared marks of the GPU tests: `without_te` skips a test where Transformer Engine is importable; `needs_te`
skips one only where TE is absent by design, and fails it with TE's own import error where TE is installed (found
on the path) or expected (GRAPHDOCTOR_EXPECT_TE=1, set by tests/gpu/device_call.sh for its TE parts). The gate is
this file's own import in a bounded subprocess, not graphdoctor's availability check, so a regression there cannot
turn the TE tests into skips."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

import pytest

EXPECT_TE_ENV = "GRAPHDOCTOR_EXPECT_TE"
TE_IMPORT_TIMEOUT_S = 180.0


@functools.cache
def te_import_error() -> str | None:
    """Why `import transformer_engine.pytorch` fails in a fresh interpreter (None: it imports)."""
    try:
        proc = subprocess.run([sys.executable, "-c", "import transformer_engine.pytorch"], capture_output=True,
                              text=True, timeout=TE_IMPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"import transformer_engine.pytorch did not finish in {TE_IMPORT_TIMEOUT_S:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"import transformer_engine.pytorch exited {proc.returncode}"


def te_expected() -> bool:
    """TE should work here: it is on the path, or the run says it staged it."""
    return os.environ.get(EXPECT_TE_ENV) == "1" or importlib.util.find_spec("transformer_engine") is not None


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
