"""The graphed child's witness: what the user's code does around its captures that a replay cannot follow,
reported as Hazard events (one watcher per job over a shared core; CaptureWitness attaches them all)."""

from __future__ import annotations

from graphdoctor.child.witness.capture_witness import CaptureWitness
from graphdoctor.child.witness.core import MAX_HAZARDS
from graphdoctor.child.witness.frames import issuing_frames, user_issuer
from graphdoctor.child.witness.source import forward_read_line, mode_query_lines

__all__ = ["MAX_HAZARDS", "CaptureWitness", "forward_read_line", "issuing_frames", "mode_query_lines",
           "user_issuer"]
