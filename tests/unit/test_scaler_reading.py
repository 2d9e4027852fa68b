"""graphdoctor.rules.scaler: DynamicGradScaler.update read with `ast` (never imported), on the installed
megatron-core and on planted grad_scaler.py texts; megatron-core missing reads as "rebinds"."""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphdoctor.rules import scaler
from graphdoctor.rules.scaler import installed_scaler, rebinding_lines

REBINDING = """\
class DynamicGradScaler:
    def update(self, found_inf):
        if found_inf:
            self._scale = max(self._scale * 0.5, 1.0)
        else:
            self._scale, other = self._scale * 2.0, 1
"""
IN_PLACE = """\
class DynamicGradScaler:
    def update(self, found_inf):
        self._scale *= 0.5
        self._scale.copy_(self._scale * 2.0)
        self.other._scale = 1
"""


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    installed_scaler.cache_clear()
    yield
    installed_scaler.cache_clear()


def test_rebinding_lines_of_update_only() -> None:
    assert rebinding_lines(REBINDING) == (4, 6)
    assert rebinding_lines(IN_PLACE) == ()
    assert rebinding_lines("class MegatronGradScaler:\n    def __init__(self):\n        self._scale = 1\n") is None


def test_installed_megatron_core_is_read_without_importing_it() -> None:
    imported = "megatron.core" in sys.modules
    reading = installed_scaler()
    assert ("megatron.core" in sys.modules) == imported
    assert reading.installed and reading.rebinds and reading.lines
    assert reading.why.endswith(f"rebinds self._scale (grad_scaler.py:{', :'.join(map(str, reading.lines))})")
    if reading.version == "0.19.2":
        assert reading.why == ("megatron-core 0.19.2's DynamicGradScaler.update rebinds self._scale "
                               "(grad_scaler.py:143, :153)")
    assert installed_scaler() is reading


def test_not_installed_assumes_it_rebinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaler.importlib.util, "find_spec", lambda name: None)
    reading = installed_scaler()
    assert reading.rebinds and not reading.installed
    assert reading.why == "megatron-core not installed here; every release up to 0.19.2 rebinds"


@pytest.mark.parametrize(("text", "rebinds", "why"), [
    (IN_PLACE, False, "DynamicGradScaler.update does not rebind self._scale"),
    ("x = 1\n", True, "grad_scaler.py has no DynamicGradScaler.update; every release up to 0.19.2 rebinds"),
    ("def (:\n", True, "grad_scaler.py could not be read"),
], ids=["in-place", "no-update", "not-python"])
def test_a_planted_megatron_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, rebinds: bool,
                                 why: str) -> None:
    core = tmp_path / "megatron" / "core"
    (core / "optimizer").mkdir(parents=True)
    (core / "optimizer" / "grad_scaler.py").write_text(text, encoding="utf-8")
    spec = importlib.machinery.ModuleSpec("megatron.core", None, origin=str(core / "__init__.py"))
    monkeypatch.setattr(scaler.importlib.util, "find_spec", lambda name: spec)
    reading = installed_scaler()
    assert reading.rebinds is rebinds and why in reading.why
