"""Whether Transformer Engine should work here and whether it does, for the GPU tests' `needs_te` mark
(conftest.py): TE's own import in a fresh interpreter, bounded, never graphdoctor's availability check."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

EXPECT_TE_ENV = "GRAPHDOCTOR_EXPECT_TE"
TE_IMPORT_TIMEOUT_S = 180.0


@functools.cache
def te_import_error() -> str | None:
    """Why `import transformer_engine.pytorch` fails in a fresh interpreter (None: it imports)."""
    try:
        proc = subprocess.run([sys.executable, "-c", "import transformer_engine.pytorch"], capture_output=True,
                              text=True, timeout=TE_IMPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"import transformer_engine.pytorch did not finish in {TE_IMPORT_TIMEOUT_S:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"import transformer_engine.pytorch exited {proc.returncode}"


def te_expected() -> bool:
    """TE should work here: it is on the path, or the run says it staged it."""
    return os.environ.get(EXPECT_TE_ENV) == "1" or importlib.util.find_spec("transformer_engine") is not None
