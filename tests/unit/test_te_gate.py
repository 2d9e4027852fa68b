"""The GPU tests' Transformer Engine gate (tests/gpu/conftest.py): a `needs_te` test skips where TE is absent by
design and fails, with TE's import error, where TE is expected and does not import."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TEST = '''
import pytest

@pytest.mark.needs_te
def test_uses_te():
    import transformer_engine.pytorch  # noqa: F401
'''


@pytest.fixture
def gated(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{REPO / 'tests' / 'gpu'}")  # conftest imports te_gate
    pytester.makeconftest("from tests.gpu.conftest import pytest_runtest_setup  # noqa: F401\n")
    pytester.makeini("[pytest]\nmarkers =\n    needs_te: TE\n")
    pytester.makepyfile(test_te=TEST)
    return pytester


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TE is installed here")
def test_absent_by_design_skips(gated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPHDOCTOR_EXPECT_TE", raising=False)
    gated.runpytest_subprocess().assert_outcomes(skipped=1)


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TE is installed here")
def test_expected_but_missing_fails_loudly(gated: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDOCTOR_EXPECT_TE", "1")
    result = gated.runpytest_subprocess()
    result.assert_outcomes(errors=1)  # in set-up: pytest counts it an error, the run exits non-zero
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*Transformer Engine is expected here but does not import: *transformer_engine*"])
