"""The pytest plugin's `graphdoctor_diff` on a real GPU, on a planted numeric divergence: the inner tests fail, and
their failure messages hold the verdict lines (verdict, first divergence, module, file:line, fix), both through
`graphdoctor.assert_graphs_match` and as the plugin's section under a plain `assert report.exit_code() == 0`.

Set GD_SAMPLE_OUT to a file name to keep the inner run's output (docs/pytest.md quotes it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graphdoctor.pytest_plugin import FAILED_DIFFS_SECTION

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
PLANTED = REPO / "fixtures" / "planted" / "reassigned_scale.py"
READ_LINE = next(i for i, line in enumerate(PLANTED.read_text(encoding="utf-8").splitlines(), 1)
                 if "def forward(" in line)
"""The forward of the module whose output first differs (24): the line a numeric divergence names."""
E_LINE = "E       "

INNER = """\
import pytest

import graphdoctor

# one diff for both tests: the second asserts the first's report with the helper
SMALL = dict(impls=("local",), dropout=0.0, layer_spec="fixtures.planted.reassigned_scale:layer_spec",
             num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=64, vocab_size=512, steps=6,
             cuda_graph_warmup_steps=2, timeout_s=240.0, memory=False, launches=False)
REPORTS = []


@pytest.mark.gpu
def test_plain_assert(graphdoctor_diff):
    report = graphdoctor_diff(**SMALL)
    REPORTS.append(report)
    assert report.exit_code() == 0


@pytest.mark.gpu
def test_helper():
    if not REPORTS:
        pytest.skip("test_plain_assert made no diff")
    graphdoctor.assert_graphs_match(REPORTS[0])
"""


@pytest.mark.without_te  # with TE importable, GD310 makes local differ first elsewhere (tests/gpu/conftest.py)
def test_a_failed_diff_fails_the_inner_tests_with_its_verdict_lines(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    inner = pytester.makepyfile(test_planted=INNER)
    # from the repo root: the children import fixtures.planted.* from the working directory, and file:line
    # reads relative to it
    monkeypatch.chdir(REPO)
    result = pytester.runpytest_subprocess(str(inner), "-p", "no:cacheprovider", f"--rootdir={pytester.path}",
                                           timeout=500)
    output = "\n".join([*result.stdout.lines, *result.stderr.lines])
    sample = os.environ.get("GD_SAMPLE_OUT")
    if sample:
        Path(sample).parent.mkdir(parents=True, exist_ok=True)
        Path(sample).write_text(output + "\n", encoding="utf-8")
    print(output[-6000:])  # noqa: T201 - for the closing note
    outcomes = {k: v for k, v in result.parseoutcomes().items() if k not in ("warning", "warnings")}
    assert outcomes == {"failed": 2}, output

    lines = result.stdout.lines
    helper = lines.index(next(line for line in lines if "GraphMismatchError: graphdoctor diff exit code" in line))
    assert lines[helper] == (f"{E_LINE}graphdoctor.plugin_session.GraphMismatchError: graphdoctor diff exit code 1: "
                             "local numeric-divergence"), lines[helper]
    _starts_in_order(lines[helper:], [
        f"{E_LINE}local: numeric-divergence FAIL, first divergence step ",
        f"{E_LINE}local: numeric-divergence: first difference inside the step: ",
        f"{E_LINE}  at: fixtures/planted/reassigned_scale.py:{READ_LINE} in module decoder.layers.0.mlp (step 1",
        f"{E_LINE}  fix: ",
    ])
    section = lines.index(next(line for line in lines if FAILED_DIFFS_SECTION in line))
    assert section < helper, "the plain assert's section comes first (test_plain_assert runs first)"
    assert any(line.startswith("E") and "assert 1 == 0" in line for line in lines[:section]), output
    _starts_in_order(lines[section:helper], [
        "graphdoctor diff exit code 1: local numeric-divergence",
        "local: numeric-divergence FAIL, first divergence step ",
        f"  at: fixtures/planted/reassigned_scale.py:{READ_LINE} in module decoder.layers.0.mlp (step 1",
        "  fix: ",
    ])


def _starts_in_order(lines: list[str], prefixes: list[str]) -> None:
    """Each prefix begins a line of `lines`, in this order."""
    at = 0
    for prefix in prefixes:
        found = next((i for i in range(at, len(lines)) if lines[i].startswith(prefix)), None)
        assert found is not None, f"no line starting {prefix!r} after line {at}:\n" + "\n".join(lines)
        at = found + 1
