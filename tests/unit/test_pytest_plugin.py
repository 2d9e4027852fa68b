"""The pytest plugin: same options as the CLI, marker validation, a fixture that calls the API."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.options import DIFF_OPTIONS


def test_plugin_and_cli_list_the_same_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    plugin = " ".join(result.stdout.lines)
    cli = " ".join(CliRunner().invoke(main, ["diff", "--help"]).output.split())
    assert "graphdoctor: eager vs CUDA-graph checks" in plugin
    for opt in DIFF_OPTIONS:
        assert f"--gd-{opt.name}" in plugin, opt.name
        assert f"--{opt.name}" in cli, opt.name
    assert "--gd-config" in plugin and "--config" in cli


def test_marker_rejects_unknown_kwargs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.graphdoctor(stepz=3)
        def test_x(graphdoctor_diff):
            pass
        """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*graphdoctor marker can't have 'stepz' keyword argument*"])


def test_options_reach_the_config(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from graphdoctor.pytest_plugin import OPTIONS_KEY

        def test_x(request):
            assert request.config.stash[OPTIONS_KEY] == {"steps": 6, "strict_rng": True}
        """
    )
    result = pytester.runpytest_subprocess("--gd-steps", "6", "--gd-strict-rng")
    result.assert_outcomes(passed=1)
