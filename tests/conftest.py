"""Shared test setup: gpu-marked tests skip, with one reason, where no CUDA device is visible."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
GPU_SKIP_REASON = "needs a CUDA GPU (torch.cuda.device_count() == 0)"


def _num_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    num_gpus = _num_gpus()
    skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("gpu") is not None and num_gpus == 0:
            item.add_marker(skip_gpu)
        multi = item.get_closest_marker("multi_gpu")
        if multi is not None:
            need = int(multi.args[0]) if multi.args else 2
            if num_gpus < need:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPUs"))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The repository's fixtures/ directory."""
    return FIXTURES
