"""A failed diff fails a test with its verdict lines: `graphdoctor.assert_graphs_match(report)` raises them,
and the plugin adds them to a failing test that asserted something else (`report.exit_code() == 0`).

Every report here is a real one recorded on the H200 (fixtures/data/diff); the inner tests run under
pytester in a subprocess with the installed plugin.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphdoctor
from graphdoctor.diff import DiffReport
from graphdoctor.plugin_session import GraphMismatchError, failure_message
from graphdoctor.pytest_plugin import FAILED_DIFFS_SECTION

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"
ITEM_MLP = "h200_item_mlp_schema2.json"
"""capture-failed in local and full_iteration: GD501, decoder.layers.0.mlp, fixtures/planted/item_mlp.py:19."""
NUMERIC = "h200_te_weakref_unchanged_schema2.json"
"""local numeric-divergence at step 1, full_iteration match."""

ITEM_MLP_LINES = [
    "graphdoctor diff exit code 1: local capture-failed, full_iteration capture-failed",
    "graphdoctor diff: GPTModel 2x128 (4 heads), seq 64, mbs 2x1, fp32, dropout 0, 6 steps, warmup 2, bitwise",
    "local: capture-failed FAIL, first divergence GD501 cudaErrorStreamCaptureUnsupported fixtures/planted/item_mlp.py:19",
    "local: AcceleratorError: CUDA error: operation not permitted when stream is capturing",
    "  at: fixtures/planted/item_mlp.py:19 in module decoder.layers.0.mlp (step 0, capture)",
    "  fix: Move the read before capture or keep the value on device [GD501]",
    "full_iteration: AcceleratorError: CUDA error: operation not permitted when stream is capturing",
    "  at: fixtures/planted/item_mlp.py:19 in module decoder.layers.0.mlp (step 2, capture)",
]
NUMERIC_LINES = [
    "graphdoctor diff exit code 1: local numeric-divergence, full_iteration match",
    "local: numeric-divergence FAIL, first divergence step 1 grads (embedding.word_embeddings.weight), "
    "max abs 0.00443, max rel 4.79e+06",
    "full_iteration: match ok",
    "  at: megatron/core/transformer/transformer_layer.py:746 in module decoder.layers.0 (step 1, replay)",
    "  fix: check what this module reads that eager recomputes each step (tensor attributes rebound between steps, "
    "host values, Python state): a graph replays the addresses and values it saw when local captured it",
]
E_LINE = "E       "
"""How pytest prefixes each line of the failure message (after the first, which follows the exception's name)."""


def assert_in_order(output: list[str], expected: list[str]) -> None:
    """Every expected line is a whole line of output, in this order (fnmatch would read `[GD501]` as a set)."""
    at = 0
    for line in expected:
        assert line in output[at:], f"{line!r} not in the output after line {at}:\n" + "\n".join(output)
        at = output.index(line, at) + 1


def _load(name: str) -> DiffReport:
    return DiffReport.from_dict(json.loads((DATA / name).read_text(encoding="utf-8")))


def _inner_test(body: str) -> str:
    """An inner test file that loads the recorded reports from DATA, then runs `body` in `test_diff`."""
    return (
        "import json\n"
        "import graphdoctor\n"
        "from graphdoctor.diff import DiffReport\n\n"
        "def load(name):\n"
        f"    return DiffReport.from_dict(json.loads(open({str(DATA)!r} + '/' + name, encoding='utf-8').read()))\n\n"
        "def test_diff(request):\n"
        + "".join(f"    {line}\n" for line in body.strip().splitlines())
    )


def test_assert_graphs_match_raises_the_verdict_lines_of_a_failed_diff() -> None:
    report = _load(ITEM_MLP)
    with pytest.raises(AssertionError) as raised:
        graphdoctor.assert_graphs_match(report)
    assert isinstance(raised.value, GraphMismatchError)
    assert isinstance(raised.value, graphdoctor.GraphDoctorError)
    message = str(raised.value)
    assert message == failure_message(report)
    assert_in_order(message.splitlines(), ITEM_MLP_LINES)
    assert message.splitlines()[0] == ITEM_MLP_LINES[0]


@pytest.mark.parametrize("name", ["h200_dropout0.json", "h200_default_dropout0.1_schema2.json"])
def test_assert_graphs_match_passes_a_diff_with_exit_code_0(name: str) -> None:
    report = _load(name)
    assert report.exit_code() == 0
    graphdoctor.assert_graphs_match(report)


def test_failing_inner_test_shows_the_verdict_lines(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=_inner_test(f"graphdoctor.assert_graphs_match(load({ITEM_MLP!r}))"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    output = result.stdout.lines
    first, *rest = ITEM_MLP_LINES
    assert_in_order(output, [">       graphdoctor.assert_graphs_match(load('h200_item_mlp_schema2.json'))",
                             f"{E_LINE}graphdoctor.plugin_session.GraphMismatchError: {first}",
                             *[E_LINE + line for line in rest]])
    assert "raise GraphMismatchError" not in result.stdout.str()  # the helper's own frame is hidden
    assert FAILED_DIFFS_SECTION not in result.stdout.str()


def test_numeric_divergence_names_step_tensor_module_and_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=_inner_test(f"graphdoctor.assert_graphs_match(load({NUMERIC!r}))"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    first, *rest = NUMERIC_LINES
    assert_in_order(result.stdout.lines, [f"{E_LINE}graphdoctor.plugin_session.GraphMismatchError: {first}",
                                          *[E_LINE + line for line in rest]])


def test_plain_exit_code_assert_gets_the_verdict_lines_as_a_section(pytester: pytest.Pytester) -> None:
    # graphdoctor_diff keeps each failed call's message on the item (FAILED_DIFFS_KEY); it skips on a CPU
    # machine, so the inner test stores the message a recorded H200 report gives, as the fixture does
    body = f"""
from graphdoctor.plugin_session import failure_message
from graphdoctor.pytest_plugin import FAILED_DIFFS_KEY
report = load({ITEM_MLP!r})
request.node.stash.setdefault(FAILED_DIFFS_KEY, []).append(failure_message(report))
assert report.exit_code() == 0
"""
    pytester.makepyfile(test_inner=_inner_test(body))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E*assert 1 == 0", f"*- {FAILED_DIFFS_SECTION} -*"])
    section = result.stdout.lines.index(next(line for line in result.stdout.lines if FAILED_DIFFS_SECTION in line))
    assert_in_order(result.stdout.lines[section:], ITEM_MLP_LINES)


def test_the_helpers_own_failure_does_not_repeat_the_lines_in_a_section(pytester: pytest.Pytester) -> None:
    body = f"""
from graphdoctor.plugin_session import failure_message
from graphdoctor.pytest_plugin import FAILED_DIFFS_KEY
report = load({ITEM_MLP!r})
request.node.stash.setdefault(FAILED_DIFFS_KEY, []).append(failure_message(report))
graphdoctor.assert_graphs_match(report)
"""
    pytester.makepyfile(test_inner=_inner_test(body))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert FAILED_DIFFS_SECTION not in result.stdout.str()
    # once in the failure (the short summary repeats the whole message where pytest sees CI=true)
    failures = result.stdout.str().split("short test summary info")[0]
    assert failures.count(ITEM_MLP_LINES[1]) == 1


def test_an_unrelated_failure_without_a_failed_diff_has_no_section(pytester: pytest.Pytester) -> None:
    body = """
report = load("h200_dropout0.json")
graphdoctor.assert_graphs_match(report)
assert report.results[0].impl == "full_iteration"
"""
    pytester.makepyfile(test_inner=_inner_test(body))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert FAILED_DIFFS_SECTION not in result.stdout.str()
    assert "graphdoctor diff exit code" not in result.stdout.str()
