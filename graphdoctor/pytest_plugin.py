"""pytest plugin (entry point `pytest11: graphdoctor`): `--gd-*` options and a `graphdoctor_diff` fixture.

Hooks and fixtures only; the work is done by the same Python API as the CLI (`graphdoctor.diff.diff`).
Options come from the one table in graphdoctor.options, so CLI and plugin list the same options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from graphdoctor.options import DIFF_OPTIONS, add_pytest_options

MARKER_KWARGS = frozenset(opt.field for opt in DIFF_OPTIONS if opt.field)
"""Keyword arguments a `@pytest.mark.graphdoctor(...)` marker may carry (DiffConfig fields)."""

OPTIONS_KEY = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("graphdoctor", "graphdoctor: eager vs CUDA-graph checks")
    add_pytest_options(group)
    group.addoption("--gd-config", dest="gd_config", default=None, metavar="RUN.yaml",
                    help="Run file with transformer:, env: and run: mappings. Default: none.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "graphdoctor(**fields): DiffConfig fields for the graphdoctor_diff fixture")
    values = {opt.field: config.getoption(f"gd_{opt.field}") for opt in DIFF_OPTIONS
              if opt.field}
    config.stash[OPTIONS_KEY] = {k: v for k, v in values.items() if v is not None}


def _marker_fields(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("graphdoctor")
    if marker is None:
        return {}
    unknown = sorted(set(marker.kwargs) - MARKER_KWARGS)
    if unknown:
        raise ValueError(f"graphdoctor marker can't have {unknown[0]!r} keyword argument")
    return dict(marker.kwargs)


@pytest.fixture
def graphdoctor_diff(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Run `graphdoctor.diff.diff` with --gd-* options, the marker's fields and call overrides.

    Example:
        @pytest.mark.gpu
        def test_graphs_match(graphdoctor_diff):
            report = graphdoctor_diff(impls=("full_iteration",), dropout=0.0)
            assert report.exit_code() == 0
    """
    from graphdoctor.config import diff_config_from, load_run_file
    from graphdoctor.diff import diff

    path = request.config.getoption("gd_config")
    run_file = load_run_file(path) if path else None
    stored: dict[str, Any] = request.config.stash[OPTIONS_KEY]
    base = {**stored, **_marker_fields(request)}

    def run(**overrides: Any) -> Any:
        return diff(diff_config_from(run_file, **{**base, **overrides}))

    return run
