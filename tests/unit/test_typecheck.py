"""The type checker passes on graphdoctor/ and checks/ (the condition for shipping py.typed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_mypy_clean(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is in the dev extra")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "graphdoctor", "checks", "--cache-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
