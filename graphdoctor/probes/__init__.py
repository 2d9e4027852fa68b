"""Runtime probes (`graphdoctor check --probe`): find operations that make a unit unsafe to capture.

`probe(config)` builds the model `graphdoctor diff` builds, in a child process
(graphdoctor.child.probe.worker), records every layer eagerly, captures each in isolation and returns
a ProbeReport of GD501-GD510 findings with module, operator and file:line;
`check_with_probes` merges them with the static rules into one CheckReport.

The names load on first use: a child imports `probes.types` and `probes.analyze`, and importing the package must
not pull in `probes.api`, which starts children and so imports the parent's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphdoctor.lazy import names_from

if TYPE_CHECKING:
    from graphdoctor.probes.api import probe, report_from_payloads
    from graphdoctor.probes.combined import ProbedCheck, check_with_probes
    from graphdoctor.probes.types import CaptureResult, Observation, ProbeReport

__getattr__ = names_from(__name__, {"api": ("probe", "report_from_payloads"),
                                   "combined": ("ProbedCheck", "check_with_probes"),
                                   "types": ("CaptureResult", "Observation", "ProbeReport")})

__all__ = ["CaptureResult", "Observation", "ProbeReport", "ProbedCheck", "check_with_probes", "probe",
           "report_from_payloads"]
