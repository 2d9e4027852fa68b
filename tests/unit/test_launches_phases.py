"""Phase ranges: labels, validation, and the record_function mirror under a CPU-only profiler."""

from __future__ import annotations

import pytest

from graphdoctor.errors import UsageError
from graphdoctor.launches import phase, phase_label


def test_label_format() -> None:
    assert phase_label("local", "replay", 3) == "graphdoctor/local/replay/3"


@pytest.mark.parametrize(("impl", "name"), [("local", "graphed"), ("", "eager")])
def test_bad_phase_is_usage_error(impl: str, name: str) -> None:
    with pytest.raises(UsageError):
        phase(impl, name, 0)


def test_phase_without_profiler_is_a_plain_context_manager() -> None:
    """Outside a profiler a phase opens no record_function and lets the block's exception through."""
    with phase("toy", "warmup", 1) as entered:
        assert entered._record is None  # no profiler: nothing recorded
    with pytest.raises(KeyError, match="inside"):
        with phase("toy", "warmup", 2):
            raise KeyError("inside")


def test_phase_mirrors_into_torch_profiler() -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(2):
            with phase("toy", "replay", step):
                torch.ones(4).add_(1)
    names = [e.name for e in prof.events() if e.name.startswith("graphdoctor/")]
    assert names == ["graphdoctor/toy/replay/0", "graphdoctor/toy/replay/1"]
