"""The pytest plugin: same options as the CLI, marker validation, a fixture that calls the API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
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


FIXTURE_TESTS = """
import pytest


def test_plain(graphdoctor_diff):
    graphdoctor_diff(impls=("full_iteration",), dropout=0.0)


@pytest.mark.gpu
def test_marked(graphdoctor_diff):
    report = graphdoctor_diff(impls=("full_iteration",), dropout=0.0)
    assert report.exit_code() == 0


@pytest.mark.gpu
@pytest.mark.graphdoctor(steps=4)
def test_marked_with_fields(graphdoctor_diff):
    graphdoctor_diff()
"""


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="a CUDA GPU is visible; this is the CPU path")
def test_fixture_skips_on_cpu_under_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FIXTURE_TESTS)
    result = pytester.runpytest_subprocess("--strict-markers", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*needs a CUDA GPU and none is visible*"])
    assert "NoGPUError" not in result.stdout.str() and "Traceback" not in result.stdout.str()


@pytest.mark.parametrize(("args", "needle"), [
    (["--gd-impl", "lokal"], "graphdoctor: impl: got 'lokal', expected one of local, full_iteration, transformer_engine"),
    (["--gd-dtype", "fp12"], "graphdoctor: dtype: got 'fp12'"),
    (["--gd-config", "missing.yaml"], "missing.yaml: no such file"),
])
def test_bad_gd_options_fail_at_start_up_with_one_line(pytester: pytest.Pytester, args: list[str], needle: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and needle in errors[0], result.stderr.lines
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_report_dir_and_markers_in_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--gd-report-dir=DIR*"])
    markers = pytester.runpytest_subprocess("--markers")
    markers.stdout.fnmatch_lines(["@pytest.mark.gpu: needs a CUDA GPU*", "@pytest.mark.graphdoctor(**fields)*"])


def test_session_summary_and_report_dir(tmp_path: Path) -> None:
    from graphdoctor.plugin_session import PluginSession
    from tests.unit.test_report_diff import build_report

    session = PluginSession.start({"steps": 8}, None, str(tmp_path / "reports"))
    report = build_report()
    first = session.record("tests/test_graphs.py::test_match[local]", report)
    second = session.record("tests/test_graphs.py::test_match[local]", report)
    assert first.report_path is not None and first.report_path.name == "tests_test_graphs.py_test_match_local.json"
    assert second.report_path is not None and second.report_path.name.endswith(".2.json")
    assert json.loads(first.report_path.read_text())["impls"][0]["impl"] == "local"
    line = first.line()
    assert line.startswith("tests/test_graphs.py::test_match[local]: local rng-divergence, full_iteration match, "
                           "transformer_engine unavailable [ok] -> ")


def test_one_gpu_per_xdist_worker() -> None:
    from graphdoctor.plugin_session import gpu_for_worker, pin_worker_gpu

    assert [gpu_for_worker(f"gw{i}", 4) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert gpu_for_worker(None, 4) is None and gpu_for_worker("gw3", 1) is None
    environ = {"PYTEST_XDIST_WORKER": "gw5"}
    assert pin_worker_gpu(environ, 4) == 1 and environ["CUDA_VISIBLE_DEVICES"] == "1"
    environ = {"PYTEST_XDIST_WORKER": "gw5", "CUDA_VISIBLE_DEVICES": "7"}
    assert pin_worker_gpu(environ, 4) is None and environ["CUDA_VISIBLE_DEVICES"] == "7"


def test_terminal_summary_lists_the_verdicts_the_reports_carry(pytester: pytest.Pytester) -> None:
    # the fixture adds one ("graphdoctor", line) user property per call; on CPU it never runs, so
    # the test adds the line a recorded H200 report gives (see test_session_summary_and_report_dir)
    pytester.makepyfile(
        """
        def test_x(request):
            request.node.user_properties.append(
                ("graphdoctor", "test_x.py::test_x: local rng-divergence, full_iteration match [ok]"))
        """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= graphdoctor =*", "test_x.py::test_x: local rng-divergence, full_iteration match [ok]"])
