"""Runtime probes (`graphdoctor check --probe`): find operations that make a unit unsafe to capture.

`probe(config)` builds the model `graphdoctor diff` builds, in a child process
(graphdoctor.child.probe.worker), records every layer eagerly, captures each in isolation and returns
a ProbeReport of GD501-GD510 findings with module, operator and file:line;
`check_with_probes` merges them with the static rules into one CheckReport.

The names load on first use: a child imports `probes.types` and `probes.analyze`, and importing the package must
not pull in `probes.api`, which starts children and so imports the parent's modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphdoctor.probes.api import probe, report_from_payloads
    from graphdoctor.probes.combined import ProbedCheck, check_with_probes
    from graphdoctor.probes.types import CaptureResult, Observation, ProbeReport

_HOME = {"probe": "api", "report_from_payloads": "api", "ProbedCheck": "combined", "check_with_probes": "combined",
         "CaptureResult": "types", "Observation": "types", "ProbeReport": "types"}


def __getattr__(name: str) -> Any:
    """One of __all__, imported from its module when first asked for."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"graphdoctor.probes.{_HOME[name]}"), name)


__all__ = ["CaptureResult", "Observation", "ProbeReport", "ProbedCheck", "check_with_probes", "probe",
           "report_from_payloads"]
