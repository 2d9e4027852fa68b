"""The package's public API resolves and importing it starts neither torch nor CUDA."""

from __future__ import annotations

import subprocess
import sys

import graphdoctor


def test_every_export_resolves() -> None:
    for name in graphdoctor.__all__:
        assert getattr(graphdoctor, name) is not None, name


def test_import_touches_no_torch() -> None:
    code = ("import sys, graphdoctor, graphdoctor.diff, graphdoctor.memory, graphdoctor.launches; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
