"""The child protocol: what the parent asks a child run to do and every event the child sends back.

- graphdoctor.protocol.spec: ChildSpec (diff and count children), ProbeJob (probe workers), Role,
  Placement, run_name(), and the eager/`none` implementation names.
- graphdoctor.protocol.events: the typed events (started, step, capture, memory, launches, taps,
  hazard, error, end, phase, teardown, checkpoint) with the one encoder and decoder.
- graphdoctor.protocol.record: RunRecord, the events of one run folded into one typed record.

docs/protocol.md describes the events and the files a run leaves in `--workdir`.

The names load on first use (graphdoctor.lazy): the template and the command before it asks for the template
import graphdoctor.protocol.processes alone, not the events and records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphdoctor.lazy import names_from

if TYPE_CHECKING:
    from graphdoctor.protocol.events import (
        Capture,
        Checkpoint,
        End,
        Error,
        Eval,
        Event,
        EventLog,
        EventWriter,
        Hazard,
        Launches,
        Memory,
        RunEnv,
        Started,
        Step,
        Taps,
        decode,
        encode,
        read_events,
    )
    from graphdoctor.protocol.record import RunRecord
    from graphdoctor.protocol.spec import (
        EAGER,
        ChildSpec,
        Placement,
        ProbeJob,
        ProtocolError,
        Role,
        impl_name,
        placement_for_child,
        run_name,
    )

__getattr__ = names_from(__name__, {
    "events": ("Capture", "Checkpoint", "End", "Error", "Eval", "Event", "EventLog", "EventWriter", "Hazard",
               "Launches", "Memory", "RunEnv", "Started", "Step", "Taps", "decode", "encode", "read_events"),
    "record": ("RunRecord",),
    "spec": ("EAGER", "ChildSpec", "Placement", "ProbeJob", "ProtocolError", "Role", "impl_name",
             "placement_for_child", "run_name")})

__all__ = [
    "EAGER",
    "Capture",
    "Checkpoint",
    "ChildSpec",
    "End",
    "Error",
    "Eval",
    "Event",
    "EventLog",
    "EventWriter",
    "Hazard",
    "Launches",
    "Memory",
    "Placement",
    "ProbeJob",
    "ProtocolError",
    "Role",
    "RunEnv",
    "RunRecord",
    "Started",
    "Step",
    "Taps",
    "decode",
    "encode",
    "impl_name",
    "placement_for_child",
    "read_events",
    "run_name",
]
