"""pytest plugin (entry point `pytest11: graphdoctor`): `--gd-*` options, the `gpu` and
`graphdoctor` markers, a `graphdoctor_diff` fixture, the verdict lines of its failed diffs in a
failing test's report and a terminal summary of its verdicts.

Hooks and fixtures only; the logic is in graphdoctor.plugin_session and the work is done by the
same Python API as the CLI (`graphdoctor.diff.diff`). Options come from the one table in
graphdoctor.options, so CLI and plugin list the same options.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from graphdoctor.options import DIFF_OPTIONS, add_pytest_options

MARKER_KWARGS = frozenset(opt.field for opt in DIFF_OPTIONS if opt.field)
"""Keyword arguments a `@pytest.mark.graphdoctor(...)` marker may carry (DiffConfig fields)."""

OPTIONS_KEY = pytest.StashKey[dict[str, Any]]()
SESSION_KEY = pytest.StashKey[Any]()
FAILED_DIFFS_KEY = pytest.StashKey[list[str]]()
"""On a test item: the verdict lines (one message per call) of its graphdoctor_diff calls that did not pass."""
FAILED_DIFFS_SECTION = "graphdoctor: diffs in this test that did not pass"
GPU_MARKER = "gpu: needs a CUDA GPU; skipped, with the reason, where none is visible (graphdoctor plugin)"
GRAPHDOCTOR_MARKER = "graphdoctor(**fields): DiffConfig fields for the graphdoctor_diff fixture"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("graphdoctor", "graphdoctor: eager vs CUDA-graph checks")
    add_pytest_options(group)
    group.addoption("--gd-config", dest="gd_config", default=None, metavar="RUN.yaml",
                    help="Run file (transformer:, env:, run:), a Megatron-LM functional test's model_config.yaml or a "
                         "Megatron-Bridge ConfigContainer YAML. Default: none.")
    group.addoption("--gd-report-dir", dest="gd_report_dir", default=None, metavar="DIR",
                    help="Write the JSON report of every graphdoctor_diff call into DIR, one file per "
                         "test (named after its node id). Default: none.")


def pytest_configure(config: pytest.Config) -> None:
    from graphdoctor.errors import GraphDoctorError
    from graphdoctor.plugin_session import PluginSession, set_up_worker_gpu

    config.addinivalue_line("markers", GPU_MARKER)
    config.addinivalue_line("markers", GRAPHDOCTOR_MARKER)
    values = {opt.field: config.getoption(f"gd_{opt.field}") for opt in DIFF_OPTIONS if opt.field}
    options = {k: v for k, v in values.items() if v is not None}
    config.stash[OPTIONS_KEY] = options
    try:
        session = PluginSession.start(options, config.getoption("gd_config"), config.getoption("gd_report_dir"))
    except GraphDoctorError as exc:
        raise pytest.UsageError(f"graphdoctor: {exc}") from None
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(_SummaryCollector(session), "graphdoctor-summary")
    set_up_worker_gpu()


class _SummaryCollector:
    """Collects the summary lines test reports carry (in the pytest-xdist controller too)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.user_properties:
            self.session.collect(report.user_properties)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    from graphdoctor.plugin_session import num_visible_gpus

    if num_visible_gpus() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA GPU and none is visible (torch.cuda.device_count() == 0)")
        for item in marked:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test that made a graphdoctor_diff call which did not pass gets that call's verdict lines as a
    section of its failure (whatever the assertion was: `report.exit_code() == 0` compares two ints, which
    pytest_assertrepr_compare cannot tie to the report); not when assert_graphs_match raised, whose message
    holds them already."""
    report = yield
    messages = item.stash.get(FAILED_DIFFS_KEY, None)
    if report.when != "call" or not report.failed or not messages:
        return report
    from graphdoctor.plugin_session import GraphMismatchError

    if call.excinfo is not None and call.excinfo.errisinstance(GraphMismatchError):
        return report
    content = "\n\n".join(messages)
    addsection = getattr(report.longrepr, "addsection", None)  # an ExceptionRepr, the usual failure
    if callable(addsection):
        addsection(FAILED_DIFFS_SECTION, content)
    else:
        report.sections.append((FAILED_DIFFS_SECTION, content))
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from graphdoctor.plugin_session import count_line

    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.summary:
        return
    terminalreporter.section("graphdoctor")
    for line in session.summary:
        terminalreporter.write_line(line)
    terminalreporter.write_line(count_line(session.summary))


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

    Skips (with the reason) when no CUDA GPU is visible, when megatron-core is missing, and when
    only the transformer_engine implementation is asked for and Transformer Engine does not import.

    Example:
        @pytest.mark.gpu
        def test_graphs_match(graphdoctor_diff):
            report = graphdoctor_diff(impls=("full_iteration",), dropout=0.0)
            graphdoctor.assert_graphs_match(report)  # fails with the verdict lines
    """
    from graphdoctor.plugin_session import USER_PROPERTY, failure_message, num_visible_gpus, skip_reason

    session = request.config.stash[SESSION_KEY]
    base = {**session.options, **_marker_fields(request)}
    num_gpus = num_visible_gpus()
    reason = skip_reason(base, num_gpus)
    if reason is not None:
        pytest.skip(reason)

    def run(**overrides: Any) -> Any:
        from graphdoctor.diff.decide import diff
        from graphdoctor.parent.stopping import Stopped, stop_children_on_signals

        why = skip_reason({**base, **overrides}, num_gpus)
        if why is not None:
            pytest.skip(why)
        try:
            # Ctrl-C or SIGTERM ends the diff's children at once (their sessions never get the terminal's
            # SIGINT), then pytest stops as on its own Ctrl-C.
            with stop_children_on_signals():
                report = diff(session.config_for(_marker_fields(request), overrides))
        except Stopped as stop:
            raise KeyboardInterrupt(f"graphdoctor: stopped by {stop.signal_name}: every child process was "
                                    "ended") from stop
        verdicts = session.record(request.node.nodeid, report)
        request.node.user_properties.append((USER_PROPERTY, verdicts.line()))
        if verdicts.exit_code != 0:
            request.node.stash.setdefault(FAILED_DIFFS_KEY, []).append(failure_message(report))
        return report

    return run
