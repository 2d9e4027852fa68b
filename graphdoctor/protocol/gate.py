"""The gate between the parent's plan-time checks and its children's first training step.

The parent starts its first children at once and runs the checks that need Megatron imported beside them
(graphdoctor.parent.preflight); each child builds its model meanwhile and waits at the gate before its first
training step. The parent opens the gate (`<prefix>.go`) when the checks pass, or shuts it (`<prefix>.stop`)
when one refuses the run: the children then end without training, and the parent exits 2 as it would have
before starting them. Both sides read these names.
"""

from __future__ import annotations

import time
from pathlib import Path

POLL_S = 0.02
"""How often a waiting child looks at the gate."""


class GateShut(Exception):
    """The parent refused the run while this child was setting up."""


def open_gate(prefix: str | Path) -> None:
    """The checks passed: every child waiting at `prefix` trains on."""
    Path(f"{prefix}.go").touch()


def shut_gate(prefix: str | Path) -> None:
    """A check refused the run: every child waiting at `prefix` ends without training."""
    Path(f"{prefix}.stop").touch()


def wait_at_gate(prefix: str | Path, timeout_s: float) -> float:
    """Wait until the gate at `prefix` opens; the seconds waited.

    Raises:
        GateShut: the parent shut it, or it stayed closed for `timeout_s` (the parent is gone or stuck).
    """
    began = time.perf_counter()
    go, stop = Path(f"{prefix}.go"), Path(f"{prefix}.stop")
    while not go.exists():
        if stop.exists():
            raise GateShut("graphdoctor refused the run before its first training step")
        if time.perf_counter() - began > timeout_s:
            raise GateShut(f"the parent's plan-time checks did not finish within {timeout_s:.0f} s")
        time.sleep(POLL_S)
    return time.perf_counter() - began


__all__ = ["GateShut", "open_gate", "shut_gate", "wait_at_gate"]
