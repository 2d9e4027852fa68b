"""Runtime probes (`graphdoctor check --probe`): find operations that make a unit unsafe to capture.

`probe(config)` builds the model in a child process, records every layer eagerly, captures each in
isolation and returns a ProbeReport of GD501-GD510 findings with module, operator and file:line.
"""

from __future__ import annotations

from graphdoctor.probes.api import probe, report_from_payloads
from graphdoctor.probes.types import CaptureResult, Observation, ProbeReport

__all__ = ["CaptureResult", "Observation", "ProbeReport", "probe", "report_from_payloads"]
