"""RNG save/restore used by --align-rng, and the port-retry predicate, on real tensors (CPU)."""

from __future__ import annotations

import torch

from graphdoctor.child.rng import rng_preserved
from graphdoctor.parent.children import port_taken
from graphdoctor.protocol.record import RunRecord
from graphdoctor.types import Diagnosis


def test_rng_preserved_restores_the_cpu_generator() -> None:
    torch.manual_seed(7)
    with rng_preserved():
        inside = torch.rand(4)
    after = torch.rand(4)
    assert torch.equal(inside, after)


def test_port_taken_only_for_setup_eaddrinuse() -> None:
    taken = Diagnosis(error_type="DistNetworkError", phase="setup",
                      message="The server socket has failed to listen on any local network "
                              "address. port: 41725, useIpv6: false, code: -98, name: EADDRINUSE")
    assert port_taken(RunRecord(impl="eager", dropout=0.1, status="error", diagnosis=taken))
    other = Diagnosis(error_type="RuntimeError", phase="capture", message="EADDRINUSE in a log")
    assert not port_taken(RunRecord(impl="eager", dropout=0.1, status="error", diagnosis=other))
    assert not port_taken(RunRecord(impl="eager", dropout=0.1, status="ok"))
